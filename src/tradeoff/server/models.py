"""Loaded models of both kinds and their lifecycle: load, warm up, serve, unload, reload.

A tensor model version is a scheduler over backend instances (:class:`ModelVersion`); a
generative model version is an engine on its own thread (:class:`GenerativeModel`).
Both load, drain and stop the same way: a load builds the new versions completely
(sessions, warmup, schedulers or engines) before they replace the old ones, and old
versions finish what they accepted before they close, so loading a model again under
traffic loses no request.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import os
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff import dtypes
from tradeoff.backends.base import Backend
from tradeoff.backends.faults import PARAMETERS as fault_parameters
from tradeoff.backends.faults import FaultInjectingBackend, NaNLogitsDecoder, fault_values
from tradeoff.backends.registry import GENERATIVE
from tradeoff.errors import (
    ConfigError,
    InvalidInput,
    InvalidValue,
    ModelLoadError,
    NotFound,
    TradeoffError,
    Unavailable,
)
from tradeoff.generate.bridge import GenerativeModel
from tradeoff.generate.loader import load_generative
from tradeoff.repository.config import ModelConfig, Warmup
from tradeoff.repository.repository import ROUTER, ROUTER_FILE, ModelRepository, confined
from tradeoff.repository.router import RouterConfig, Signature, common_signature
from tradeoff.scheduling.request import InferenceRequest
from tradeoff.scheduling.scheduler import Scheduler, run_batch
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.router import RoutedModel

__all__ = [
    "NETWORK_WARMUP_BYTES",
    "NETWORK_WARMUP_COUNT",
    "NO_CACHE_WARNING",
    "ModelEntry",
    "ModelManager",
    "ModelState",
    "ModelVersion",
    "Served",
]

log = logging.getLogger("tradeoff.server")

# config parameters that mark a config `tradeoff tune serve` loaded for a trial: who
# applied it (shown in the repository index), and the config it replaced
TUNE_MARKER, TUNE_ORIGINAL = "tradeoff_tune", "tradeoff_tune_original"


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ModelVersion:
    """One served version: its config, scheduler and statistics."""

    name: str
    version: int
    config: ModelConfig
    scheduler: Scheduler
    stats: ModelStats
    path: Path
    check_bytes: Callable[[str, np.ndarray], None] | None = None  # the backend's
    # a request header (protocol/v2.py keeps them) found valid for this version -> what
    # the data plane derived from it (see DataPlane.prepare)
    checked: dict[Any, tuple] = field(default_factory=dict)

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata: platform and tensors (shapes with the batch dimension)."""
        config = self.config

        def tensor(t: Any) -> dict[str, Any]:
            return {"name": t.name, "datatype": t.datatype, "shape": config.full_shape(t)}

        return {"name": self.name, "versions": versions, "platform": config.platform,
                "inputs": [tensor(t) for t in config.inputs],
                "outputs": [tensor(t) for t in config.outputs]}

    def model_config(self) -> dict[str, Any]:
        """The model configuration extension's document: the config as Triton's JSON."""
        return self.config.to_dict()

    def begin_drain(self, timeout_s: float) -> None:
        """Shutdown begins: run what is queued now, without waiting for more."""
        self.scheduler.drain()

    async def stop(self, timeout_s: float | None = None) -> None:
        """Answer every accepted request, then release the instances."""
        await self.scheduler.stop()


# every served kind offers metadata(versions), model_config(), stats, begin_drain(), stop()
Served = ModelVersion | GenerativeModel | RoutedModel


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[int, Served] = field(default_factory=dict)
    latest: Served | None = None


# What a config sent with a network load may ask of warmups (an operator's file may ask
# more): runs per warmup, and bytes of one warmup request's inputs.
NETWORK_WARMUP_COUNT = 1000
NETWORK_WARMUP_BYTES = 64 << 20


def _warmup_inputs(config: ModelConfig, warmup: Warmup, model_dir: Path, *,
                   from_network: bool) -> dict[str, np.ndarray]:
    """The tensors of one warmup request, as the config declares them: its dims and its
    ``data_type`` (Triton sends what the warmup says; a model that rejects it fails its
    load, rather than being warmed up with data nobody configured). A config sent over
    the network may not ask for more than NETWORK_WARMUP_BYTES of inputs."""
    rng = np.random.default_rng(0)
    inputs = {}
    total = 0
    for tensor in config.inputs:
        spec = warmup.inputs.get(tensor.name)
        dims = spec.dims if spec is not None and spec.dims else tensor.dims
        shape = tuple(1 if d == -1 else d for d in dims)
        if config.max_batch_size > 0:
            shape = (warmup.batch_size, *shape)
        datatype = spec.datatype if spec is not None and spec.datatype else tensor.datatype
        dtype = dtypes.numpy_dtype(datatype)
        total += int(np.prod(shape, dtype=np.float64)) * max(dtype.itemsize, 1)
        if from_network and total > NETWORK_WARMUP_BYTES:
            raise InvalidValue(f"its inputs would take over {NETWORK_WARMUP_BYTES >> 20} MiB; "
                               "a config sent with a load may ask at most that")
        source = spec.source if spec is not None else "zero"
        if source == "file" and spec is not None:
            raw = confined(model_dir / "warmup", spec.file, f"model {config.name!r}",
                           "model_warmup.inputs.input_data_file",
                           from_network=from_network).read_bytes()
            if datatype == "BYTES":
                from tradeoff.protocol.v2 import decode_bytes_elements
                count = int(np.prod(shape))
                array = decode_bytes_elements(memoryview(raw), count, f"warmup {spec.file}")
            else:
                array = np.frombuffer(raw, dtype=dtype)
            inputs[tensor.name] = array.reshape(shape)
        elif datatype == "BYTES":
            inputs[tensor.name] = np.full(shape, b"", dtype=object)
        elif source == "random":
            inputs[tensor.name] = (rng.random(shape) * 10).astype(dtype)
        else:
            inputs[tensor.name] = np.zeros(shape, dtype=dtype)
    return inputs


def _run_warmup(config: ModelConfig, backends: list[Backend], model_dir: Path, *,
                from_network: bool, cancel: threading.Event | None = None,
                deadline: float = float("inf")) -> None:
    """Run the configured warmup (or one zero request) on every instance. A configured
    warmup that fails raises ModelLoadError: the load fails and the caller releases the
    instances. The default request is ours, not the operator's (Triton has none), so its
    failure is only logged. Between runs, ``cancel`` (set by unload or shutdown) and the
    ``deadline`` (time.monotonic()) stop it with ModelLoadError."""
    explicit = bool(config.warmup)
    plans = config.warmup or (Warmup("default_zero", 1, {}),)
    outputs = [t.name for t in config.outputs]
    for plan in plans:
        if from_network and plan.count > NETWORK_WARMUP_COUNT:
            raise ConfigError(f"model {config.name!r}", "model_warmup.count",
                              f"asks for {plan.count} runs; a config sent with a load may "
                              f"ask at most {NETWORK_WARMUP_COUNT}")
        try:
            inputs = _warmup_inputs(config, plan, model_dir, from_network=from_network)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"model {config.name!r}: warmup {plan.name!r} cannot build "
                                 f"its inputs: {exc}") from exc
        rows = plan.batch_size if config.max_batch_size > 0 else 1
        request = InferenceRequest(inputs=inputs, rows=rows)
        for backend in backends:
            for _ in range(plan.count):
                if cancel is not None and cancel.is_set():
                    raise ModelLoadError(f"model {config.name!r}: load cancelled during "
                                        f"warmup {plan.name!r} (unloaded, or the server "
                                        "is stopping)")
                if time.monotonic() > deadline:
                    raise ModelLoadError(f"model {config.name!r}: warmup {plan.name!r} ran "
                                        "past the warmup deadline (serve --warmup-timeout)")
                try:
                    run_batch(backend, config, [request], outputs)
                except Exception as exc:  # InferenceFailed, or a config reshape that fails
                    if explicit:
                        raise ModelLoadError(f"model {config.name!r}: warmup {plan.name!r} "
                                             f"failed: {exc}") from exc
                    log.warning("model %s: default warmup skipped: %s", config.name, exc)
                    return


def _signature(config: ModelConfig) -> Signature:
    """A tensor model's inputs and outputs as a router compares them."""
    return Signature(tuple((t.name, t.datatype, tuple(config.full_shape(t)))
                           for t in config.inputs),
                     tuple((t.name, t.datatype, tuple(config.full_shape(t)))
                           for t in config.outputs))


def _clear_finished_frames(error: BaseException) -> None:
    """Drop the locals of the finished frames in ``error``'s tracebacks (causes included).

    A failure inside a runtime's call keeps that call's frames, and so the runtime's own
    session objects (ONNX Runtime's ``InferenceSession.run`` has the session as ``self``),
    alive in a reference cycle through the exception: a failed load's threads and memory
    would stay until the next garbage collection, however large the model."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # skips frames still running
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)


NO_CACHE_WARNING = ("response_cache is enabled but the server runs without --cache; every "
                    "request is computed")


class ModelManager:
    """Every model of a repository, by name, with its state."""

    def __init__(self, repository: ModelRepository, *, default_intra_op_threads: int = 1,
                 allow_fault_injection: bool = False, drain_timeout_s: float = 30.0,
                 max_instances: int = 16, inline_batch_us: int = 500,
                 warmup_timeout_s: float = 300.0) -> None:
        self.repository = repository
        self.warmup_timeout_s = warmup_timeout_s  # a load's warmups, all instances together
        self.inline_batch_us = inline_batch_us  # see scheduling/scheduler.py
        self.max_instances = max_instances  # per model version: a load asking more is refused
        # intra-op threads one instance may ask for: a load asking thousands is refused
        self.max_threads = 4 * (os.cpu_count() or 1)
        self.default_intra_op_threads = default_intra_op_threads
        self.allow_fault_injection = allow_fault_injection
        self.drain_timeout_s = drain_timeout_s  # generations still running then end
        self.cache_enabled = False  # the server runs with --cache
        self.models: dict[str, ModelEntry] = {}
        # a model -> the serving router whose router.yaml hides it (hide_targets)
        self.hidden: dict[str, str] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping: set[asyncio.Task] = set()
        self._cancels: dict[str, threading.Event] = {}  # loads in progress, by model

    def _build(self, name: str, config_override: dict[str, Any] | None,
               cancel: threading.Event | None = None
               ) -> tuple[ModelConfig, dict[int, tuple[list[Backend], Path]]]:
        """Blocking part of a load: read config, create sessions, warm up (until
        ``cancel`` is set or the warmup deadline passes)."""
        deadline = time.monotonic() + self.warmup_timeout_s
        source = self.repository.read(name, config_override)
        config = source.config
        faults = [k for k in fault_parameters if k in config.parameters]
        if faults and not self.allow_fault_injection:
            raise ConfigError(f"model {name!r}", f"parameters.{faults[0]}",
                              "fault injection is for tests; start the server with "
                              "--allow-fault-injection to use it")
        fail_on, die_on = fault_values(config.parameters, f"model {name!r}")
        if config.instance_count > self.max_instances:
            raise ConfigError(f"model {name!r}", "instance_group",
                              f"asks for {config.instance_count} instances; this server "
                              f"allows at most {self.max_instances} per model "
                              "(serve --max-instances)")
        threads = config.parameters.get("intra_op_thread_count", "")
        if threads.isascii() and threads.isdigit() and int(threads) > self.max_threads:
            raise ConfigError(f"model {name!r}", "parameters.intra_op_thread_count",
                              f"asks for {int(threads)} threads per instance; this server "
                              f"allows at most {self.max_threads} (4 per core it sees)")
        backend_type = self.repository.backends.tensor(config.backend)
        built: dict[int, tuple[list[Backend], Path]] = {}
        try:
            for version, path in source.versions.items():
                backends: list[Backend] = []
                built[version] = (backends, path)
                for group in config.instance_groups:
                    for device in group.devices():
                        for _ in range(group.count):
                            backend = backend_type.create(config.instance_spec(
                                path, intra_op_threads=self.default_intra_op_threads,
                                kind=group.kind, device_id=device))
                            if faults:
                                backend = FaultInjectingBackend(backend, fail_on, die_on)
                            backends.append(backend)
                _run_warmup(config, backends, self.repository.model_dir(name),
                            from_network=source.from_network, cancel=cancel,
                            deadline=deadline)
        except BaseException:
            for backends, _ in built.values():
                for backend in backends:
                    backend.close()
            raise
        return config, built

    async def load(self, name: str, config_override: dict[str, Any] | None = None) -> ModelEntry:
        """Load (or reload) a model; raises ConfigError/ModelLoadError/NotFound.

        ``config_override`` replaces the config file for this load (Triton's JSON form).
        """
        self.repository.model_dir(name)  # NotFound before any state changes
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            entry = self.models.setdefault(name, ModelEntry(name))
            previous_state = entry.state
            if entry.state is not ModelState.READY:
                entry.state = ModelState.LOADING
            try:
                kind = self.repository.kind(name)
                if kind == ROUTER:
                    versions = self._load_router(name, config_override)
                elif kind == GENERATIVE:
                    versions = await self._load_generative(name, config_override)
                else:
                    versions = await self._load_tensor(name, config_override, entry)
            except Exception as exc:  # whatever a runtime raises: this model alone fails
                _clear_finished_frames(exc)  # releases the failed build's sessions now
                if isinstance(exc, InvalidValue):  # a bad value met deep down: name the model
                    error: Exception = ModelLoadError(f"model {name!r}: {exc}")
                elif isinstance(exc, TradeoffError):  # the project's errors name their source
                    error = exc
                else:
                    error = ModelLoadError(f"model {name!r}: {type(exc).__name__}: {exc}")
                entry.reason = str(error)
                if previous_state is not ModelState.READY:
                    entry.state = ModelState.UNAVAILABLE
                log.error("model %s: load failed: %s", name, error)
                if error is exc:
                    raise
                raise error from exc
            old = entry.versions
            entry.versions = versions
            entry.latest = versions[max(versions)]
            entry.state = ModelState.READY
            entry.reason = ""
            self._hide_targets()
            for old_version in old.values():  # they finish what they accepted
                await old_version.stop()
            return entry

    async def _load_tensor(self, name: str, config_override: dict[str, Any] | None,
                           entry: ModelEntry) -> dict[int, Served]:
        cancel = self._cancels[name] = threading.Event()
        try:
            config, built = await asyncio.to_thread(self._build, name, config_override, cancel)
        finally:
            if self._cancels.get(name) is cancel:
                del self._cancels[name]
        versions: dict[int, Served] = {}
        for version, (backends, path) in built.items():
            previous = entry.versions.get(version)
            stats = previous.stats if isinstance(previous, ModelVersion) else \
                ModelStats(name, version)
            scheduler = Scheduler(config, backends, stats,
                                  inline_limit_ns=self.inline_batch_us * 1000)
            scheduler.on_dead = functools.partial(self._instances_died, name, version,
                                                  scheduler)
            await scheduler.start()
            versions[version] = ModelVersion(
                name, version, config, scheduler, stats, path,
                self.repository.backends.tensor(config.backend).check_bytes)
        warnings = list(config.warnings)
        if config.response_cache and not self.cache_enabled:
            warnings.append(NO_CACHE_WARNING)
        for warning in warnings:
            log.warning("model %s: %s", name, warning)
        log.info("model %s versions=%s %s", name, sorted(versions), config.summary())
        return versions

    async def _load_generative(self, name: str, config_override: dict[str, Any] | None
                               ) -> dict[int, Served]:
        if config_override is not None:
            raise InvalidInput(f"model {name!r} is generative: its settings come from "
                               "generate.yaml, not a 'config' load parameter")
        directory = self.repository.model_dir(name)
        loop = asyncio.get_running_loop()

        def build() -> GenerativeModel:  # weights, tokenizer, KV cache: off the loop
            config, decoder, tokenizer = load_generative(directory, self.repository.backends)
            if config.fault_nan_on_token >= 0:
                if not self.allow_fault_injection:
                    raise ConfigError(f"model {name!r}", "fault_nan_on_token",
                                      "fault injection needs --allow-fault-injection")
                decoder = NaNLogitsDecoder(decoder, config.fault_nan_on_token)
            return GenerativeModel(name, 1, config, decoder, tokenizer, loop)

        model = await asyncio.to_thread(build)
        log.info("generative model %s: %s", name, model.config)
        if model.config.response_cache and not self.cache_enabled:
            log.warning("model %s: %s", name, NO_CACHE_WARNING)
        return {1: model}

    def _load_router(self, name: str, config_override: dict[str, Any] | None
                     ) -> dict[int, Served]:
        """A router over loaded models: its targets must be served now and agree on their
        inputs and outputs (or all be generative)."""
        if config_override is not None:
            raise InvalidInput(f"model {name!r} is a router: its rules come from "
                               f"{ROUTER_FILE}, not a 'config' load parameter")
        config = RouterConfig.read(self.repository.model_dir(name) / ROUTER_FILE)
        targets = [arm for route in config.routes for arm in route.arms]
        targets += list(config.fallback) + ([config.shadow.target] if config.shadow else [])
        served: dict[str, Served] = {}
        for target in targets:
            entry = self.models.get(target.model)
            version = entry.latest if entry is not None and target.version is None else \
                entry.versions.get(target.version) if entry is not None and \
                target.version is not None else None
            if version is None:
                raise ModelLoadError(f"router {name!r}: target {target.label!r} is not "
                                     "loaded (load it before the router)")
            if isinstance(version, RoutedModel):
                raise ModelLoadError(f"router {name!r}: target {target.label!r} is a router;"
                                     " a router sends to models only")
            served[target.label] = version
        kinds = {isinstance(v, GenerativeModel) for v in served.values()}
        if kinds == {True}:
            routed = RoutedModel(name, config, None, generative=True)
        elif kinds == {False}:
            if any(route.priority is not None for route in config.routes):
                raise ModelLoadError(f"router {name!r}: a route's priority orders a "
                                     "generative engine; a tensor request carries its own "
                                     "(parameter priority, the model's priority_levels)")
            tensors = {label: v for label, v in served.items() if isinstance(v, ModelVersion)}
            signature = common_signature(name, {label: _signature(v.config)
                                                for label, v in tensors.items()})
            batch = min(v.config.max_batch_size for v in tensors.values())
            routed = RoutedModel(name, config, signature, max_batch_size=batch)
        else:
            raise ModelLoadError(f"router {name!r}: mixes generative and tensor targets")
        log.info("router %s: %d routes over %s", name, len(config.routes),
                 ", ".join(sorted(served)))
        return {1: routed}

    def _instances_died(self, name: str, version: int, scheduler: Scheduler,
                        cause: str) -> None:
        """Every instance of a served version died: stop serving it (load brings it back)."""
        entry = self.models.get(name)
        served = entry.versions.get(version) if entry is not None else None
        if entry is None or not isinstance(served, ModelVersion) or \
                served.scheduler is not scheduler:
            return  # an older copy (replaced by a reload) died while it drained
        dead = entry.versions.pop(version)
        entry.latest = entry.versions[max(entry.versions)] if entry.versions else None
        entry.reason = f"version {version}: instances died: {cause}"
        if entry.latest is None:
            entry.state = ModelState.UNAVAILABLE
        log.error("model %s: %s; POST /v2/repository/models/%s/load to bring it back",
                  name, entry.reason, name)
        task = asyncio.ensure_future(dead.stop())  # releases its sessions
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def unload(self, name: str, drain_timeout_s: float | None = None) -> None:
        """Stop new requests to the model, answer the accepted ones, release it. With
        ``drain_timeout_s`` (shutdown), generations still running then end with an
        error event."""
        entry = self.models.get(name)
        if entry is None:
            self.repository.model_dir(name)  # NotFound if it does not exist at all
            return
        loading = self._cancels.get(name)
        if loading is not None:  # stop its warmup: the load fails, then this unload runs
            loading.set()
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if not entry.versions:
                entry.state = ModelState.UNAVAILABLE
                return
            entry.state = ModelState.UNLOADING
            versions, entry.versions, entry.latest = entry.versions, {}, None
            self._hide_targets()
            for version in versions.values():
                await version.stop(drain_timeout_s)
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "unloaded"
            log.info("model %s unloaded", name)

    async def load_all(self) -> None:
        """Load every model in the repository, routers last (they check their targets); a
        model that fails does not stop the others."""
        names = self.repository.names()
        routers = [n for n in names if self.repository.kind(n) == ROUTER]
        for name in [n for n in names if n not in routers] + routers:
            try:
                await self.load(name)
            except TradeoffError:
                pass

    def cancel_loads(self) -> None:
        """Stop every load's warmup at its next run: those loads fail (shutdown)."""
        for cancel in list(self._cancels.values()):
            cancel.set()

    async def close(self) -> None:
        """Shutdown: cancel the loads in progress, unload every model (generations get
        ``drain_timeout_s``)."""
        self.cancel_loads()
        for name in list(self.models):
            await self.unload(name, self.drain_timeout_s)
        if self._stopping:  # versions whose instances died, still releasing
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def get(self, name: str, version: str | None = None) -> Served:
        """The version that serves a request, or NotFound/Unavailable saying why not."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"unknown model {name!r}")
        if version:
            if not (version.isascii() and version.isdigit()):
                raise NotFound(f"model {name!r} has no version {version!r}")
            served = entry.versions.get(int(version))
            if served is None:
                if entry.state is ModelState.READY:
                    raise NotFound(f"model {name!r} has no version {version}; served: "
                                   f"{sorted(entry.versions)}")
                raise Unavailable(f"model {name!r} is not ready ({entry.state.value}"
                                  f"{': ' + entry.reason if entry.reason else ''})")
            return served
        if entry.latest is None:
            raise Unavailable(f"model {name!r} is not ready ({entry.state.value}"
                              f"{': ' + entry.reason if entry.reason else ''})")
        return entry.latest

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """The repository index: every model on disk with its state."""
        rows = []
        for name in self.repository.names():
            entry = self.models.get(name)
            if entry is None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": "not loaded"})
                continue
            if entry.versions:
                for version, served in sorted(entry.versions.items()):
                    rows.append({"name": name, "version": str(version),
                                 "state": entry.state.value,
                                 "reason": entry.reason or _applied_by(served)})
            else:
                rows.append({"name": name, "state": entry.state.value, "reason": entry.reason})
        if ready_only:
            rows = [r for r in rows if r["state"] == "READY"]
        return rows

    def _hide_targets(self) -> None:
        """Which models answer only through a router: the targets of every serving
        router with ``hide_targets`` (after each load and unload)."""
        self.hidden = {model: entry.name for entry in self.models.values()
                       if isinstance(entry.latest, RoutedModel)
                       and entry.latest.config.hide_targets
                       for model in entry.latest.config.models()}

    def served_versions(self) -> list[Served]:
        return [v for e in self.models.values() for _, v in sorted(e.versions.items())]

    def tensor_versions(self) -> list[ModelVersion]:
        return [v for v in self.served_versions() if isinstance(v, ModelVersion)]

    def generative_versions(self) -> list[GenerativeModel]:
        return [v for v in self.served_versions() if isinstance(v, GenerativeModel)]

    def tensor(self, name: str, version: str | None = None) -> ModelVersion:
        """A tensor model's serving version; a generative model is a 400 saying where
        to send it."""
        return self.as_tensor(self.get(name, version))

    @staticmethod
    def as_tensor(served: Served) -> ModelVersion:
        """``served`` as a tensor model's version; a generative model is a 400."""
        if not isinstance(served, ModelVersion):
            raise InvalidInput(f"model {served.name!r} is generative: send it text at "
                               "/v1/completions or /v1/chat/completions")
        return served

    def generative(self, name: str) -> GenerativeModel:
        """A generative model's serving version; a tensor model is a 400."""
        served = self.get(name)
        if not isinstance(served, GenerativeModel):
            raise InvalidInput(f"model {name!r} takes tensors, not text: POST "
                               f"/v2/models/{name}/infer")
        return served


def _applied_by(served: Served) -> str:
    """The index's reason for a version on a config a tune serve applied ("" if not)."""
    parameters = getattr(getattr(served, "config", None), "parameters", None) or {}
    marker = parameters.get(TUNE_MARKER)
    return f"on a trial config applied by {marker}" if marker else ""
