"""The one data plane behind every transport: admission, readiness, metadata, load and
unload, tensor inference, generation, statistics, shutdown, for both model kinds.

Transports (HTTP, gRPC, the OpenAI-compatible API) only translate wire formats and call
these methods. A tensor request is checked by :mod:`tradeoff.server.validation` and
answered directly, through its router or through the response cache
(:meth:`DataPlane.dispatch_of`); generations are started by the data plane's
:class:`~tradeoff.server.generations.Generations`.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, Literal, Protocol, cast

from tradeoff.errors import InvalidInput, NotFound, Overloaded, Unavailable
from tradeoff.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tradeoff.protocol.v2 import RelayedAnswer, TensorOutput, V2Request
from tradeoff.repository.router import Target
from tradeoff.scheduling.executor import Outputs
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import merge_model_stats, response_cache_only
from tradeoff.server.asgi import OFF_LOOP_BYTES
from tradeoff.server.cache import ResponseCache
from tradeoff.server.catalog import ModelVersion
from tradeoff.server.front_end import InflightCounts
from tradeoff.server.gateway import GenerationCopy, RemoteAnswer, infer_v2
from tradeoff.server.generation import Generation
from tradeoff.server.generations import Generations, Prompt
from tradeoff.server.models import ModelManager
from tradeoff.server.router import RoutedModel, check_direct, merge_router_stats
from tradeoff.server.validation import (
    config_override,
    expected_outputs,
    select_outputs,
    validate,
    wanted_outputs,
)
from tradeoff.version import __version__

__all__ = [
    "EXTENSIONS",
    "Admission",
    "Answer",
    "Answered",
    "Answerer",
    "DataPlane",
    "Dispatch",
    "Peers",
    "TensorTarget",
]

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "parameters",
              "schedule_policy", "statistics"]


TensorTarget = ModelVersion | RoutedModel  # what answers a tensor request
# what a tensor request's callback gets: the version that answered, its timings and the
# outputs the client asked for; or the error
# what answered a tensor request: a model version here, or a pool's replica elsewhere
Answerer = ModelVersion | RemoteAnswer
# the outputs the client asked for, or a replica's answer passed on as it came
Answer = tuple[Answerer, Timings, list[TensorOutput] | RelayedAnswer]
Answered = Callable[[Answer | BaseException], None]


# How the data plane answers a tensor request (DataPlane.dispatch_of): "direct", the
# model's scheduler calls it back (no coroutine, no future); "routed", a router's choice,
# its fallbacks and its shadow copies; "cached", the response cache (a hit, an identical
# request's answer, or run). Strings, not an Enum: a member's lookup costs ~0.1 µs, twice
# per request on the hot path.
Dispatch = Literal["direct", "routed", "cached"]


class Peers(Protocol):
    """The other replicas of a deployment (Ray Serve): what this one tells and asks them."""

    async def publish(self, change: dict[str, Any]) -> None:
        """Apply a repository change (load or unload) on every other replica; raises
        when one of them fails it."""

    async def statistics(self, name: str | None, version: str | None
                         ) -> list[dict[str, Any]]:
        """The other replicas' statistics documents."""


class DataPlane:
    """What the server can do, independent of the wire protocol."""

    def __init__(self, manager: ModelManager, max_inflight: int | None = None,
                 limits: RequestLimits = DEFAULT_LIMITS,
                 cache: ResponseCache | None = None) -> None:
        self.manager = manager
        self.limits = limits
        self.cache = cache  # None: no --cache; models with response_cache still compute
        self.started = False
        self.shutting_down = False
        self.strict_readiness = False
        self.max_inflight = max_inflight  # server-wide; None: no limit
        self.in_flight = 0  # inference requests admitted and not yet answered
        # every front end's, where this is one of serve --workers' (server/front_end.py)
        self.shared_in_flight: InflightCounts | None = None
        self.overload_refusals = 0
        self._background: set[asyncio.Task] = set()  # shadow copies in flight
        self.peers: Peers | None = None  # a replica of a Ray Serve deployment
        self.generations = Generations(manager, cache, self._in_background)

    # ------------------------------------------------------------ admission

    def check_admission(self) -> None:
        """Refuse at once (503) what :meth:`admit` would refuse, without taking a slot:
        the cheap check before a request body is read."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        if self.max_inflight is not None and self.max_inflight <= (
                self.in_flight if self.shared_in_flight is None
                else self.shared_in_flight.total()):
            self.overload_refusals += 1
            raise Overloaded(f"the server holds its limit of {self.max_inflight} requests in "
                             "flight (--max-inflight); retry after a short wait")

    def admit(self) -> None:
        """Take one inference request in, or refuse it at once (503) when the server is
        shutting down or holds ``max_inflight`` requests. Pair with :meth:`release`."""
        self.check_admission()
        self.in_flight += 1
        if self.shared_in_flight is not None:
            self.shared_in_flight.set(self.in_flight)

    def release(self) -> None:
        self.in_flight -= 1
        if self.shared_in_flight is not None:
            self.shared_in_flight.set(self.in_flight)

    def admitted(self) -> Admission:
        """``with dataplane.admitted():`` a slot taken on entry (or a 503), given back on
        exit, whatever happens inside."""
        admission = Admission(self)
        admission.take()
        return admission

    # ------------------------------------------------------------ health, metadata

    async def close(self) -> None:
        """After ``begin_shutdown`` and the transports' drain: unload the models and
        close the response cache."""
        await self.manager.close()
        if self.cache is not None:
            await self.cache.close()

    def begin_shutdown(self) -> None:
        """Refuse new work and flush every queue; accepted requests are still answered,
        generations until the drain deadline."""
        self.shutting_down = True
        self.manager.cancel_loads()
        for served in self.manager.served_versions():
            served.begin_drain(self.manager.drain_timeout_s)

    def live(self) -> bool:
        return not self.shutting_down

    def ready(self) -> bool:
        """Started, not stopping, and serving: at least one model (every model with
        ``--strict-readiness``). A server with nothing to serve is not ready."""
        if not self.started or self.shutting_down:
            return False
        entries = self.manager.models.values()
        if self.strict_readiness:
            return bool(entries) and all(e.latest is not None for e in entries)
        return any(e.latest is not None for e in entries)

    def server_metadata(self) -> dict[str, Any]:
        return {"name": "tradeoff", "version": __version__, "extensions": EXTENSIONS}

    def model_ready(self, name: str, version: str | None) -> bool:
        """Whether the model (version) serves now; NotFound when there is no such model
        or version."""
        try:
            self.manager.get(name, version)
        except Unavailable:
            return False
        return True

    def model_metadata(self, name: str, version: str | None) -> dict[str, Any]:
        served = self.manager.get(name, version)
        return served.metadata([str(v) for v in sorted(self.manager.models[name].versions)])

    def model_config(self, name: str, version: str | None) -> dict[str, Any]:
        return self.manager.get(name, version).model_config()

    def statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        if name is None:
            entries = [v.stats.to_dict() for v in self.manager.served_versions()]
        elif version:
            entries = [self.manager.get(name, version).stats.to_dict()]
        else:
            self.manager.get(name)  # NotFound / Unavailable
            versions = self.manager.models[name].versions
            entries = [v.stats.to_dict() for _, v in sorted(versions.items())]
        return {"model_stats": entries}

    async def all_statistics(self, name: str | None, version: str | None) -> dict[str, Any]:
        """``statistics``, summed over every replica when this is one of several; front
        ends that share a generative model's engine (``serve --workers``) add only their
        response caches' counts to its."""
        mine = self.statistics(name, version)
        if self.peers is None:
            return mine
        others = await self.peers.statistics(name, version)
        if self.manager.shared is not None:
            shared = {v.name for v in self.manager.generative_versions()}
            others = [{**doc, "model_stats": [
                response_cache_only(entry) if entry["name"] in shared else entry
                for entry in doc.get("model_stats", [])]} for doc in others]
        documents = [mine, *others]
        merged = merge_model_stats(documents)
        for entry in merged["model_stats"]:
            if "routes" in entry:  # a router: its arms, fallbacks and shadow copies too
                entry.update(merge_router_stats([
                    e for doc in documents for e in doc.get("model_stats", [])
                    if (e["name"], e["version"]) == (entry["name"], entry["version"])]))
        return merged

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None, *,
                         publish: bool = True, share: str | None = None) -> None:
        """The repository extension's load. ``parameters`` may carry Triton's ``config``
        (the model config as a JSON string) to use instead of the config file; any
        failure but an unknown model is a 400 naming the model and the cause. A replica
        then has every other replica load it too (``publish``), naming the load alike
        (``share``: front ends that share executor processes hold one build)."""
        override = config_override(parameters or {})
        if share is None and publish and self.peers is not None:
            share = uuid.uuid4().hex
        try:
            await self.manager.load(name, override, share)
        except NotFound:
            raise
        except Exception as exc:
            raise InvalidInput(f"failed to load {name!r}: {exc}") from exc
        if publish and self.peers is not None:
            await self.peers.publish({"op": "load", "model": name,
                                      "parameters": parameters or {}, "share": share})

    async def unload_model(self, name: str, *, publish: bool = True) -> None:
        """The repository extension's unload, on every replica (``publish``)."""
        await self.manager.unload(name)
        if publish and self.peers is not None:
            await self.peers.publish({"op": "unload", "model": name})

    # ------------------------------------------------------------ inference

    def tensor_target(self, name: str, version: str | None) -> TensorTarget:
        """What answers a tensor request for ``name`` (and ``version``): the model's serving
        version, or a router that sends to tensor models. The cheap checks before a body
        is read: the one lookup of the request, raising NotFound, Unavailable or
        InvalidInput (a generative model)."""
        served = self.manager.get(name, version)
        if isinstance(served, RoutedModel):
            served.check_takes_tensors()
            return served
        check_direct(self.manager.hidden, name)
        return self.manager.as_tensor(served)

    def dispatch_of(self, target: TensorTarget, request: V2Request) -> Dispatch:
        """How a request for ``target`` is answered, decided once: through the router
        ``target`` is; through the response cache when the server has one, the model
        keeps answers (``response_cache``) and the request did not say ``cache: false``;
        else directly, by the model's scheduler."""
        if isinstance(target, RoutedModel):
            return "routed"
        if self.cache is not None and target.config.response_cache and \
                request.parameters.get("cache") is not False:
            return "cached"
        return "direct"

    def submit(self, served: ModelVersion, request: V2Request, on_done: Answered
               ) -> InferenceRequest:
        """Queue a request that :meth:`dispatch_of` answers ``"direct"``, without a
        coroutine or a future; returns the scheduler's request (to cancel it, with
        ``served.executor.cancel``), and ``on_done`` gets what :meth:`infer` returns, or
        the error."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        internal = validate(served, request)
        config = served.config

        def done(result: tuple[Timings, Outputs] | BaseException) -> None:
            if isinstance(result, BaseException):
                on_done(result)
                return
            try:
                outputs = select_outputs(config, request, result[1])
            except Exception as exc:
                on_done(exc)
                return
            on_done((served, result[0], outputs))

        served.executor.submit_call(internal, done)
        return internal

    async def infer(self, name: str, version: str | None, request: V2Request) -> Answer:
        """Run one request through the model's scheduler (a router's: its target's)."""
        return await self.infer_target(self.tensor_target(name, version), request)

    async def infer_target(self, target: TensorTarget, request: V2Request,
                           dispatch: Dispatch | None = None,
                           headers: dict[bytes, bytes] | None = None) -> Answer:
        """:meth:`infer` for the target :meth:`tensor_target` returned, ``dispatch`` its
        :meth:`dispatch_of` when the caller knows it already; ``headers``: the client's
        (a pool passes on those its ``forward_headers`` names)."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        dispatch = dispatch or self.dispatch_of(target, request)
        if dispatch == "routed":
            return await self._route(cast(RoutedModel, target), request, headers or {})
        return await self._infer_served(cast(ModelVersion, target), request, dispatch)

    async def _route(self, routed: RoutedModel, request: V2Request,
                     headers: dict[bytes, bytes]) -> Answer:
        """Send a request through a router of tensor models (RoutedModel.send: its
        choice, then its fallbacks); a target that is a pool is sent to one of its
        replicas, and a request that came as a v2 HTTP body goes on as it came (its
        answer too) unless a shadow copy needs the tensors. A shadow copy, if the router
        takes one, is compared with the answer in the background (``routed`` takes
        tensors: tensor_target made sure)."""
        relay = routed.config.shadow is None

        async def attempt(target: Target) -> Answer:
            pool = routed.pools.get(target.model)
            if pool is not None:
                answer = await infer_v2(pool, request, headers, routed.config.idempotent,
                                        relay)
                return answer, answer.timings, answer.outputs
            served, timings, outputs = await self._infer_model(
                target.model, _version(target.version), request)
            timings.route = target.label
            return served, timings, outputs

        (served, timings, outputs), _ = await routed.send(request.parameters, attempt)

        def busy(shadow: Target) -> bool:
            pool = routed.pools.get(shadow.model)
            if pool is not None:
                return not pool.has_idle_replica()
            return self.manager.tensor(shadow.model,
                                       _version(shadow.version)).executor.queue_depth > 0

        async def copy(shadow: Target) -> None:
            _, _, answer = await attempt(shadow)
            assert isinstance(outputs, list) and isinstance(answer, list)  # not relayed
            routed.stats.shadow.compare(outputs, answer)

        self._in_background(routed.shadow(busy, copy))
        return served, timings, outputs

    def _in_background(self, task: asyncio.Task[None] | None) -> None:
        """Hold a background task (a shadow copy) until it ends."""
        if task is not None:
            self._background.add(task)
            task.add_done_callback(self._background.discard)

    async def _infer_model(self, name: str, version: str | None, request: V2Request
                           ) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        served = self.manager.tensor(name, version)
        return await self._infer_served(served, request, self.dispatch_of(served, request))

    async def _infer_served(self, served: ModelVersion, request: V2Request,
                            dispatch: Dispatch
                            ) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        internal = validate(served, request)
        if dispatch == "direct":
            timings, outputs = await served.executor.infer(internal)
            return served, timings, select_outputs(served.config, request, outputs)
        assert self.cache is not None  # "cached": dispatch_of found one
        return await self._infer_cached(self.cache, served, internal, request)

    async def _infer_cached(self, cache: ResponseCache, served: ModelVersion,
                            internal: InferenceRequest, request: V2Request
                            ) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        """Answer from the cache, or wait for an identical request already computing, or
        compute (joining a batch) and keep the answer."""
        inputs = [(t.name, t.datatype, t.array) for t in request.inputs]
        wanted = wanted_outputs(served.config, request)
        key_args = (request.tenant, served.name, served.version, inputs, wanted,
                    request.parameters)
        size = sum(t.array.nbytes for t in request.inputs)
        key = cache.tensor_key(*key_args) if size <= OFF_LOOP_BYTES else \
            await asyncio.to_thread(cache.tensor_key, *key_args)
        timings = Timings()

        async def compute() -> list[TensorOutput]:
            nonlocal timings
            timings, raw = await served.executor.infer(internal)
            return select_outputs(served.config, request, raw)

        answer, how, lookup_ns = await cache.get_or_compute(
            key, str(internal.priority).encode(),
            expected_outputs(served.config, wanted, internal.rows), compute, served.stats)
        timings.cache, timings.cache_ns = how, lookup_ns
        return served, timings, answer

    # ------------------------------------------------------------ generation

    async def generate(self, name: str, prompt: Prompt, params: Any,
                       priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY,
                       cache: bool = False, route_parameters: dict[str, Any] | None = None,
                       tenant: bytes = b"", *, via: RoutedModel | None = None,
                       copy: GenerationCopy | None = None) -> Generation:
        """Start a generation (:meth:`Generations.start`), unless the server is shutting
        down."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        return await self.generations.start(name, prompt, params, priority, cache,
                                            route_parameters, tenant, via=via, copy=copy)


def _version(version: int | None) -> str | None:
    return None if version is None else str(version)


class Admission:
    """One request's slot under ``--max-inflight``, whichever transport carries it:
    refused at once (503) when the server is full or stopping, before any body is read;
    taken when the request is whole (:meth:`take`); given back once (:meth:`release`,
    which may be called again, from whichever way the request ends)."""

    __slots__ = ("dataplane", "held")

    def __init__(self, dataplane: DataPlane) -> None:
        dataplane.check_admission()
        self.dataplane = dataplane
        self.held = False

    def take(self) -> None:
        if not self.held:
            self.dataplane.admit()
            self.held = True

    def release(self) -> None:
        if self.held:
            self.held = False
            self.dataplane.release()

    def __enter__(self) -> Admission:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
