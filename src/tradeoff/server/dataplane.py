"""The one data plane behind every transport: admission, readiness, metadata, load and
unload, tensor inference, generation, statistics, shutdown, for both model kinds.

Transports (HTTP, gRPC, the OpenAI-compatible API) only translate wire formats and call
these methods.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, cast

from tradeoff.errors import (
    Forbidden,
    InferenceFailed,
    InvalidInput,
    NotFound,
    Overloaded,
    RequestError,
    Unavailable,
)
from tradeoff.generate.bridge import GenerativeModel, Handle
from tradeoff.generate.events import Done, Token
from tradeoff.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tradeoff.protocol.v2 import (
    TensorOutput,
    V2Request,
    parse_json_object,
)
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.router import Target
from tradeoff.scheduling.priority import (
    DEFAULT_GENERATION_PRIORITY,
    GenerationPriority,
    tensor_priority,
)
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.scheduler import Outputs
from tradeoff.scheduling.stats import merge_model_stats
from tradeoff.server.asgi import OFF_LOOP_BYTES
from tradeoff.server.cache import ResponseCache
from tradeoff.server.cache.values import Expected
from tradeoff.server.generation import Generation
from tradeoff.server.models import ModelManager, ModelVersion
from tradeoff.server.openai_requests import Message
from tradeoff.server.router import RoutedModel
from tradeoff.version import __version__

__all__ = [
    "EXTENSIONS",
    "KNOWN_HEADERS",
    "Admission",
    "Answered",
    "DataPlane",
    "Dispatch",
    "Peers",
    "TensorTarget",
    "expected_outputs",
    "select_outputs",
    "wanted_outputs",
]

# request headers remembered as valid, per model version (see validate)
KNOWN_HEADERS = 256

EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "parameters",
              "schedule_policy", "statistics"]


TensorTarget = ModelVersion | RoutedModel  # what answers a tensor request


class Dispatch(enum.Enum):
    """How the data plane answers a tensor request (:meth:`DataPlane.dispatch_of`)."""

    DIRECT = "direct"  # the model's scheduler, called back: no coroutine, no future
    ROUTED = "routed"  # a router's choice, its fallbacks and its shadow copies
    CACHED = "cached"  # the response cache: a hit, an identical request's answer, or run
# what a tensor request's callback gets: the version that answered, its timings and the
# outputs the client asked for; or the error
Answered = Callable[[tuple[ModelVersion, Timings, list[TensorOutput]] | BaseException], None]


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
        self.overload_refusals = 0
        self._background: set[asyncio.Task] = set()  # shadow copies in flight
        self.peers: Peers | None = None  # a replica of a Ray Serve deployment

    # ------------------------------------------------------------ admission

    def check_admission(self) -> None:
        """Refuse at once (503) what :meth:`admit` would refuse, without taking a slot:
        the cheap check before a request body is read."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        if self.max_inflight is not None and self.in_flight >= self.max_inflight:
            self.overload_refusals += 1
            raise Overloaded(f"the server holds its limit of {self.max_inflight} requests in "
                             "flight (--max-inflight); retry after a short wait")

    def admit(self) -> None:
        """Take one inference request in, or refuse it at once (503) when the server is
        shutting down or holds ``max_inflight`` requests. Pair with :meth:`release`."""
        self.check_admission()
        self.in_flight += 1

    def release(self) -> None:
        self.in_flight -= 1

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
        """``statistics``, summed over every replica when this is one of several."""
        mine = self.statistics(name, version)
        if self.peers is None:
            return mine
        return merge_model_stats([mine, *await self.peers.statistics(name, version)])

    async def load_model(self, name: str, parameters: dict[str, Any] | None = None, *,
                         publish: bool = True) -> None:
        """The repository extension's load. ``parameters`` may carry Triton's ``config``
        (the model config as a JSON string) to use instead of the config file; any
        failure but an unknown model is a 400 naming the model and the cause. A replica
        then has every other replica load it too (``publish``)."""
        override = _config_override(parameters or {})
        try:
            await self.manager.load(name, override)
        except NotFound:
            raise
        except Exception as exc:
            raise InvalidInput(f"failed to load {name!r}: {exc}") from exc
        if publish and self.peers is not None:
            await self.peers.publish({"op": "load", "model": name,
                                      "parameters": parameters or {}})

    async def unload_model(self, name: str, *, publish: bool = True) -> None:
        """The repository extension's unload, on every replica (``publish``)."""
        await self.manager.unload(name)
        if publish and self.peers is not None:
            await self.peers.publish({"op": "unload", "model": name})

    # ------------------------------------------------------------ inference

    def prepare(self, name: str, version: str | None,
                request: V2Request) -> tuple[ModelVersion, InferenceRequest]:
        """Validate a decoded request against the config of the model that serves it."""
        served = self.manager.tensor(name, version)
        return served, self.validate(served, request)

    def validate(self, served: ModelVersion, request: V2Request) -> InferenceRequest:
        """The scheduler's request for a decoded one, checked against ``served``'s config
        (InvalidInput saying what does not fit)."""
        name = served.name
        header = request.header
        if header is not None:
            known = served.checked.get(header)
            if known is not None:  # this header passed every check below already
                shape_key, rows, priority, timeout = known
                return InferenceRequest(
                    inputs={t.name: t.array for t in request.inputs}, rows=rows,
                    shape_key=shape_key, priority=priority, timeout_us=timeout)
        config = served.config
        expected_shapes = config.input_shapes
        batching = config.max_batch_size > 0
        inputs = {}
        rows = None
        for tensor in request.inputs:
            spec = config.input(tensor.name)
            if spec is None:
                raise InvalidInput(f"unexpected input {tensor.name!r} for model {name!r}; it "
                                   f"takes {[t.name for t in config.inputs]}")
            if tensor.name in inputs:
                raise InvalidInput(f"input {tensor.name!r} is given twice")
            if tensor.datatype != spec.datatype:
                raise InvalidInput(f"input {tensor.name!r}: datatype {tensor.datatype} does not "
                                   f"match the model's {spec.datatype}")
            if tensor.datatype == "BYTES" and served.check_bytes is not None:
                served.check_bytes(tensor.name, tensor.array)  # before it joins a batch
            shape = tensor.shape
            expected = expected_shapes[tensor.name]
            if len(shape) != len(expected) or any(
                    want != -1 and got != want for got, want in zip(shape, expected, strict=True)):
                raise InvalidInput(f"input {tensor.name!r}: shape {list(shape)} does not match "
                                   f"the model's {list(expected)}")
            tensor_rows = shape[0] if batching else 1
            if batching and not 1 <= tensor_rows <= config.max_batch_size:
                raise InvalidInput(f"input {tensor.name!r}: batch size {tensor_rows} is outside"
                                   f" 1..{config.max_batch_size} (max_batch_size)")
            if rows is None:
                rows = tensor_rows
            elif tensor_rows != rows:
                raise InvalidInput(f"input {tensor.name!r} has batch size {tensor_rows} but "
                                   f"other inputs have {rows}")
            inputs[tensor.name] = tensor.array
        if len(inputs) != len(expected_shapes):
            missing = [t.name for t in config.inputs if t.name not in inputs and not t.optional]
            if missing:
                raise InvalidInput(f"model {name!r} needs inputs {missing}")
        if request.outputs is not None:
            for out in request.outputs:
                if config.output(out.name) is None:
                    raise InvalidInput(f"unknown output {out.name!r} for model {name!r}; it "
                                       f"has {[t.name for t in config.outputs]}")
        params = request.parameters
        priority = tensor_priority(params.get("priority", 0))
        if not isinstance(params.get("cache", True), bool):
            raise InvalidInput("parameter 'cache' must be true or false")
        timeout = params.get("timeout")
        if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                    or timeout < 0):
            raise InvalidInput("parameter 'timeout' must be a non-negative integer "
                               "(microseconds)")
        # Which inputs, in config order, with their non-batch dims: only requests with
        # equal keys can be concatenated into one batch.
        shape_key = tuple((n, inputs[n].shape[1:] if batching else inputs[n].shape)
                          for n in expected_shapes if n in inputs)
        # BYTES elements are checked one by one (check_bytes): never taken as known
        if header is not None and len(served.checked) < KNOWN_HEADERS and \
                all(t.datatype != "BYTES" for t in request.inputs):
            served.checked[header] = (shape_key, rows or 1, priority, timeout or None)
        return InferenceRequest(inputs=inputs, rows=rows or 1, shape_key=shape_key,
                                priority=priority, timeout_us=timeout or None)

    def tensor_target(self, name: str, version: str | None) -> TensorTarget:
        """What answers a tensor request for ``name`` (and ``version``): the model's serving
        version, or a router that sends to tensor models. The cheap checks before a body
        is read: the one lookup of the request, raising NotFound, Unavailable or
        InvalidInput (a generative model)."""
        served = self.manager.get(name, version)
        if isinstance(served, RoutedModel):
            served.check_takes_tensors()
            return served
        self.check_direct(name)
        return self.manager.as_tensor(served)

    def dispatch_of(self, target: TensorTarget, request: V2Request) -> Dispatch:
        """How a request for ``target`` is answered, decided once: through the router
        ``target`` is; through the response cache when the server has one, the model
        keeps answers (``response_cache``) and the request did not say ``cache: false``;
        else directly, by the model's scheduler."""
        if isinstance(target, RoutedModel):
            return Dispatch.ROUTED
        if self.cache is not None and target.config.response_cache and \
                request.parameters.get("cache") is not False:
            return Dispatch.CACHED
        return Dispatch.DIRECT

    def submit(self, served: ModelVersion, request: V2Request, on_done: Answered
               ) -> InferenceRequest:
        """Queue a request that :meth:`dispatch_of` answers ``DIRECT``, without a
        coroutine or a future; returns the scheduler's request (to cancel it, with
        ``served.scheduler.cancel``), and ``on_done`` gets what :meth:`infer` returns, or
        the error."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        internal = self.validate(served, request)
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

        served.scheduler.submit_call(internal, done)
        return internal

    async def infer(self, name: str, version: str | None,
                    request: V2Request) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        """Run one request through the model's scheduler (a router's: its target's)."""
        return await self.infer_target(self.tensor_target(name, version), request)

    async def infer_target(self, target: TensorTarget, request: V2Request,
                           dispatch: Dispatch | None = None
                           ) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        """:meth:`infer` for the target :meth:`tensor_target` returned, ``dispatch`` its
        :meth:`dispatch_of` when the caller knows it already."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        dispatch = dispatch or self.dispatch_of(target, request)
        if dispatch is Dispatch.ROUTED:
            return await self._route(cast(RoutedModel, target), request)
        return await self._infer_served(cast(ModelVersion, target), request, dispatch)

    async def _route(self, routed: RoutedModel, request: V2Request
                     ) -> tuple[ModelVersion, Timings, list[TensorOutput]]:
        """Send a request through a router of tensor models (RoutedModel.send: its
        choice, then its fallbacks); a shadow copy, if the router takes one, is compared
        with the answer in the background (``routed`` takes tensors: tensor_target made
        sure)."""
        def attempt(target: Target) -> Awaitable[tuple[ModelVersion, Timings,
                                                       list[TensorOutput]]]:
            return self._infer_model(target.model, _version(target.version), request)

        (served, timings, outputs), target = await routed.send(request.parameters, attempt)
        timings.route = target.label

        def busy(shadow: Target) -> bool:
            return self.manager.tensor(shadow.model,
                                       _version(shadow.version)).scheduler.queue_depth > 0

        async def copy(shadow: Target) -> None:
            _, _, answer = await self._infer_model(shadow.model, _version(shadow.version),
                                                   request)
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
        internal = self.validate(served, request)
        if dispatch is Dispatch.DIRECT:
            timings, outputs = await served.scheduler.infer(internal)
            return served, timings, select_outputs(served.config, request, outputs)
        assert self.cache is not None  # CACHED: dispatch_of found one
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
            timings, raw = await served.scheduler.infer(internal)
            return select_outputs(served.config, request, raw)

        answer, how, lookup_ns = await cache.get_or_compute(
            key, str(internal.priority).encode(),
            expected_outputs(served.config, wanted, internal.rows), compute, served.stats)
        timings.cache, timings.cache_ns = how, lookup_ns
        return served, timings, answer

    # ------------------------------------------------------------ generation

    def generative_models(self) -> list[GenerativeModel]:
        """The generative models that serve now and take calls by their own name (none
        a router hides)."""
        return [m for m in self.manager.generative_versions()
                if self.manager.models[m.name].latest is m and m.name not in
                self.manager.hidden]

    def check_direct(self, name: str) -> None:
        """Forbidden (403) when a router hides model ``name`` (its ``hide_targets``):
        only that router sends to it."""
        router = self.manager.hidden.get(name)
        if router is not None:
            raise Forbidden(f"model {name!r} answers only through router {router!r} (its "
                            f"router.yaml hides its targets): send the request to {router!r}")

    async def route_generation(self, routed: RoutedModel, parameters: dict[str, Any]
                               ) -> tuple[str, GenerationPriority | None]:
        """The generative model a router sends this request to (RoutedModel.send: its
        rules' choice, or the first fallback that accepts requests now), and the priority
        its route sets (None: the request's own)."""
        if not routed.generative:
            raise InvalidInput(f"router {routed.name!r} sends to tensor models: POST "
                               f"/v2/models/{routed.name}/infer")

        async def attempt(target: Target) -> str:
            self.manager.generative(target.model).check_accepting()
            return target.model

        decision = routed.decide(parameters)
        name, _ = await routed.send(parameters, attempt, timed=False, decision=decision)
        priority = routed.config.routes[decision.route].priority  # router.yaml's, checked
        return name, None if priority is None else GenerationPriority(priority)

    async def generate(self, name: str, prompt: str | list[Message], params: Any,
                       priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY,
                       cache: bool = False,
                       route_parameters: dict[str, Any] | None = None,
                       tenant: bytes = b"") -> Generation:
        """Tokenize a prompt (or apply the chat template to messages), check it fits the
        model, and queue it; returns the :class:`Generation` whose outputs the transport
        formats. With ``cache`` (a whole, deterministic answer is
        wanted) and the model's ``response_cache``, a cached answer replays instead. A
        router of generative models sends it on by ``route_parameters`` (class, user).
        ``tenant`` is the API key that asked (its cache entries are its own)."""
        if self.shutting_down:
            raise Unavailable("the server is shutting down and takes no new requests")
        routed = self.manager.get(name)
        shadow = None
        route = ""
        if isinstance(routed, RoutedModel):  # an alias: the answer names its target
            name, route_priority = await self.route_generation(routed, route_parameters or {})
            route, shadow = name, routed
            if route_priority is not None:
                priority = route_priority
        else:
            self.check_direct(name)
        model = self.manager.generative(name)
        for _ in range(3):  # a reload may replace the version while the prompt is tokenized
            model.check_accepting()  # the cheap refusals before the tokenizer's work
            _check_prompt_size(model, prompt, params.max_tokens)
            tokens = await asyncio.to_thread(_tokenize, model.tokenizer, prompt)
            current = self.manager.generative(name)
            if current is model:
                break
            model = current
        if not tokens:
            raise InvalidInput("the prompt is empty")
        limit = model.decoder.config.max_position
        if len(tokens) + params.max_tokens > limit:
            raise InvalidInput(f"prompt ({len(tokens)} tokens) + max_tokens "
                               f"({params.max_tokens}) is over the model's {limit} positions")
        if not (cache and self.cache is not None and model.config.response_cache):
            handle = model.submit(tokens, params, priority)
            handle.shadow, handle.route = shadow, route
            return Generation(model, handle, len(tokens), self._generated)
        model.check_accepting()  # a stopping model answers 503, cached or not
        started = time.perf_counter_ns()
        key = self.cache.generation_key(tenant, model.name, model.version, tokens, params)
        found = await self.cache.lookup_generation(key, model.engine.vocab, params.max_tokens)
        lookup_ns = time.perf_counter_ns() - started
        if found is not None:
            model.stats.cache_hit[0] += 1
            model.stats.cache_hit[1] += lookup_ns
            handle = Handle.replay(tokens, params, *found, model.tokenizer.decode)
        else:
            model.stats.cache_miss[0] += 1
            model.stats.cache_miss[1] += lookup_ns
            handle = model.submit(tokens, params, priority)
            handle.cache_key, handle.cache = key, "miss"
        handle.cache_ns = lookup_ns
        handle.shadow, handle.route = shadow, route
        return Generation(model, handle, len(tokens), self._generated)

    def _generated(self, handle: Handle, tokens: list[int], reason: str) -> None:
        """A whole answer ended: keep it when it was asked to be cached and ended
        normally (never an error or an abort), and send a shadow copy of a deterministic
        one if its router takes one."""
        if handle.cache_key is not None and self.cache is not None and \
                reason in ("stop", "length"):
            self.cache.keep_generation(handle.cache_key, tokens, reason)
        # a sampled answer differs from any other by design: only deterministic ones,
        # streamed or whole, are compared
        if handle.shadow is not None and reason in ("stop", "length") and \
                handle.params.deterministic:
            self._shadow_generation(handle.shadow, handle, tokens)

    def _shadow_generation(self, routed: RoutedModel, handle: Handle,
                           tokens: list[int]) -> None:
        """A shadow copy of a whole generation, if the router takes one: the same prompt
        on the shadow model in the background, and how many of the answer's tokens it
        chose alike."""
        def busy(shadow: Target) -> bool:
            model = self.manager.generative(shadow.model)
            model.check_accepting()
            return bool(model.engine.scheduler.waiting)

        async def copy(shadow: Target) -> None:
            model = self.manager.generative(shadow.model)
            events = model.submit(handle.prompt, handle.params, handle.priority).events
            shadow_tokens: list[int] = []
            while isinstance(event := await events.get(), Token):
                shadow_tokens.append(event.token)
            if not isinstance(event, Done):
                raise InferenceFailed(f"the shadow generation failed: {event}")
            routed.stats.shadow.compare_tokens(tokens, shadow_tokens)

        self._in_background(routed.shadow(busy, copy))


def _version(version: int | None) -> str | None:
    return None if version is None else str(version)


def _check_prompt_size(model: GenerativeModel, prompt: str | list[Message],
                       max_tokens: int) -> None:
    """Refuse, before any tokenizing, a prompt that cannot fit the model's positions: one
    with more characters than the free positions times the longest token of the
    vocabulary, or a chat with more messages than positions."""
    free = model.decoder.config.max_position - max_tokens
    if free < 1:
        raise InvalidInput(f"max_tokens ({max_tokens}) leaves no room for a prompt in the "
                           f"model's {model.decoder.config.max_position} positions")
    if isinstance(prompt, str):
        characters = len(prompt)
    else:
        if len(prompt) > free:
            raise InvalidInput(f"{len(prompt)} messages cannot fit the model's "
                               f"{free} free positions (max_tokens is {max_tokens})")
        characters = sum(len(m["content"]) + len(m["role"]) for m in prompt)
    most = free * model.tokenizer.longest_token_chars
    if characters > most:
        raise InvalidInput(f"the prompt ({characters} characters) cannot fit the model's "
                           f"{free} free positions (max_tokens is {max_tokens}; a token "
                           f"holds at most {model.tokenizer.longest_token_chars} characters)")


def _tokenize(tokenizer: Any, prompt: str | list[Message]) -> list[int]:
    """Token ids of a prompt, or of messages through the chat template (CPU work: called
    in a worker thread)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    try:
        text = tokenizer.chat(prompt)
    except RequestError:
        raise
    except Exception as exc:  # the template's own checks (raise_exception, undefined)
        raise InvalidInput(f"the chat template refused these messages: {exc}") from None
    return list(tokenizer.encode(text))


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


def _config_override(parameters: dict[str, Any]) -> dict[str, Any] | None:
    """The ``config`` load parameter parsed, or None; model files in a request are refused."""
    unsupported = sorted(k for k in parameters if k.startswith("file:"))
    if unsupported:
        raise InvalidInput(f"load parameters {unsupported} (model files in the request) are "
                           "not supported; put the files in the model repository")
    config = parameters.get("config")
    if config is None:
        return None
    if not isinstance(config, str):
        raise InvalidInput("load parameter 'config' must be a string holding the model "
                           "config as JSON")
    return parse_json_object(config, "load parameter 'config'")


def wanted_outputs(config: ModelConfig, request: V2Request) -> list[tuple[str, bool]]:
    """The outputs the client asked for, in answer order, each with whether it is sent
    as binary data."""
    default_binary = request.binary_output
    if request.outputs is None:
        return [(t.name, default_binary) for t in config.outputs]
    return [(o.name, default_binary if o.binary is None else o.binary)
            for o in request.outputs]


def expected_outputs(config: ModelConfig, wanted: list[tuple[str, bool]],
                     rows: int) -> Expected:
    """What a stored answer to this request must hold: each output as the config declares
    it (the batch dimension is the request's rows)."""
    batch = [rows] if config.max_batch_size > 0 else []
    return [(name, tensor.datatype, binary, [*batch, *tensor.dims])
            for name, binary in wanted
            if (tensor := config.output(name)) is not None]


def select_outputs(config: ModelConfig, request: V2Request,
                   outputs: dict[str, Any]) -> list[TensorOutput]:
    """The outputs the client asked for, each marked binary or JSON."""
    result = []
    for name, binary in wanted_outputs(config, request):
        array = outputs[name]
        datatype = config.output(name).datatype  # type: ignore[union-attr]
        if datatype == "BYTES" and array.dtype.kind == "U":
            array = array.astype(object)
        result.append(TensorOutput(name, array, datatype, binary))
    return result
