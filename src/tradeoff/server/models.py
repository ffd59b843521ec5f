"""Loaded models and their lifecycle: load, warm up, serve, unload, reload.

A load builds the new versions completely (sessions, warmup, schedulers) before they
replace the old ones, and old versions drain their queues before they close, so loading
a model again under traffic loses no request.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff import dtypes
from tradeoff.backends.base import Backend
from tradeoff.backends.faults import PARAMETERS as fault_parameters
from tradeoff.backends.faults import FaultInjectingBackend, fault_values
from tradeoff.backends.onnxruntime import OnnxRuntimeBackend
from tradeoff.errors import ConfigError, ModelLoadError, NotFound, TradeoffError, Unavailable
from tradeoff.repository.config import ModelConfig, Warmup
from tradeoff.repository.repository import ModelRepository, confined
from tradeoff.scheduling.request import InferenceRequest
from tradeoff.scheduling.scheduler import Scheduler, run_batch
from tradeoff.server.stats import ModelStats

log = logging.getLogger("tradeoff.server")


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


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[int, ModelVersion] = field(default_factory=dict)
    latest: ModelVersion | None = None


def _warmup_inputs(config: ModelConfig, warmup: Warmup, model_dir: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    inputs = {}
    for tensor in config.inputs:
        spec = warmup.inputs.get(tensor.name)
        dims = spec.dims if spec is not None and spec.dims else tensor.dims
        shape = tuple(1 if d == -1 else d for d in dims)
        if config.max_batch_size > 0:
            shape = (warmup.batch_size, *shape)
        dtype = dtypes.numpy_dtype(tensor.datatype)
        source = spec.source if spec is not None else "zero"
        if source == "file" and spec is not None:
            raw = confined(model_dir / "warmup", spec.file, f"model {config.name!r}",
                           "model_warmup.inputs.input_data_file").read_bytes()
            if tensor.datatype == "BYTES":
                from tradeoff.protocol.v2 import decode_bytes_elements
                count = int(np.prod(shape))
                array = decode_bytes_elements(memoryview(raw), count, f"warmup {spec.file}")
            else:
                array = np.frombuffer(raw, dtype=dtype)
            inputs[tensor.name] = array.reshape(shape)
        elif tensor.datatype == "BYTES":
            inputs[tensor.name] = np.full(shape, b"", dtype=object)
        elif source == "random":
            inputs[tensor.name] = (rng.random(shape) * 10).astype(dtype)
        else:
            inputs[tensor.name] = np.zeros(shape, dtype=dtype)
    return inputs


def _run_warmup(config: ModelConfig, backends: list[Backend], model_dir: Path) -> None:
    """Run the configured warmup (or one zero request) on every instance."""
    explicit = bool(config.warmup)
    plans = config.warmup or (Warmup("default_zero", 1, {}),)
    outputs = [t.name for t in config.outputs]
    for plan in plans:
        try:
            inputs = _warmup_inputs(config, plan, model_dir)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"model {config.name!r}: warmup {plan.name!r} cannot build "
                                 f"its inputs: {exc}") from exc
        rows = plan.batch_size if config.max_batch_size > 0 else 1
        request = InferenceRequest(inputs=inputs, rows=rows)
        for backend in backends:
            for _ in range(plan.count):
                try:
                    run_batch(backend, config, [request], outputs)
                except TradeoffError as exc:
                    if explicit:
                        raise ModelLoadError(f"model {config.name!r}: warmup {plan.name!r} "
                                             f"failed: {exc}") from exc
                    log.warning("model %s: default warmup skipped: %s", config.name, exc)
                    return


class ModelManager:
    """Every model of a repository, by name, with its state."""

    def __init__(self, repository: ModelRepository, *, default_intra_op_threads: int = 1,
                 allow_fault_injection: bool = False) -> None:
        self.repository = repository
        self.default_intra_op_threads = default_intra_op_threads
        self.allow_fault_injection = allow_fault_injection
        self.models: dict[str, ModelEntry] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping: set[asyncio.Task] = set()

    def _build(self, name: str, config_override: dict[str, Any] | None
               ) -> tuple[ModelConfig, dict[int, tuple[list[Backend], Path]]]:
        """Blocking part of a load: read config, create sessions, warm up."""
        source = self.repository.read(name, config_override)
        config = source.config
        faults = [k for k in fault_parameters if k in config.parameters]
        if faults and not self.allow_fault_injection:
            raise ConfigError(f"model {name!r}", f"parameters.{faults[0]}",
                              "fault injection is for tests; start the server with "
                              "--allow-fault-injection to use it")
        fail_on, die_on = fault_values(config.parameters, f"model {name!r}")
        built: dict[int, tuple[list[Backend], Path]] = {}
        try:
            for version, path in source.versions.items():
                backends: list[Backend] = []
                built[version] = (backends, path)
                for group in config.instance_groups:
                    for device in group.devices():
                        for _ in range(group.count):
                            backend: Backend = OnnxRuntimeBackend(
                                path, config, self.default_intra_op_threads,
                                kind=group.kind, device_id=device)
                            if faults:
                                backend = FaultInjectingBackend(backend, fail_on, die_on)
                            backends.append(backend)
                _run_warmup(config, backends, path.parent.parent)
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
                config, built = await asyncio.to_thread(self._build, name, config_override)
            except TradeoffError as exc:
                entry.reason = str(exc)
                if previous_state is not ModelState.READY:
                    entry.state = ModelState.UNAVAILABLE
                log.error("model %s: load failed: %s", name, exc)
                raise
            versions = {}
            for version, (backends, path) in built.items():
                stats = entry.versions[version].stats if version in entry.versions else \
                    ModelStats(name, version)
                scheduler = Scheduler(config, backends, stats)
                scheduler.on_dead = functools.partial(self._instances_died, name, version,
                                                      scheduler)
                await scheduler.start()
                versions[version] = ModelVersion(name, version, config, scheduler, stats, path)
            old = entry.versions
            entry.versions = versions
            entry.latest = versions[max(versions)]
            entry.state = ModelState.READY
            entry.reason = ""
            for warning in config.warnings:
                log.warning("model %s: %s", name, warning)
            log.info("model %s versions=%s %s", name, sorted(versions), config.summary())
            for old_version in old.values():
                await old_version.scheduler.stop()
            return entry

    def _instances_died(self, name: str, version: int, scheduler: Scheduler,
                        cause: str) -> None:
        """Every instance of a served version died: stop serving it (load brings it back)."""
        entry = self.models.get(name)
        served = entry.versions.get(version) if entry is not None else None
        if entry is None or served is None or served.scheduler is not scheduler:
            return  # an older copy (replaced by a reload) died while it drained
        dead = entry.versions.pop(version)
        entry.latest = entry.versions[max(entry.versions)] if entry.versions else None
        entry.reason = f"version {version}: instances died: {cause}"
        if entry.latest is None:
            entry.state = ModelState.UNAVAILABLE
        log.error("model %s: %s; POST /v2/repository/models/%s/load to bring it back",
                  name, entry.reason, name)
        task = asyncio.ensure_future(dead.scheduler.stop())  # releases its sessions
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def unload(self, name: str) -> None:
        """Stop new requests to the model, answer the queued ones, release it."""
        entry = self.models.get(name)
        if entry is None:
            self.repository.model_dir(name)  # NotFound if it does not exist at all
            return
        lock = self._locks.setdefault(name, asyncio.Lock())
        async with lock:
            if not entry.versions:
                entry.state = ModelState.UNAVAILABLE
                return
            entry.state = ModelState.UNLOADING
            versions, entry.versions, entry.latest = entry.versions, {}, None
            for version in versions.values():
                await version.scheduler.stop()
            entry.state = ModelState.UNAVAILABLE
            entry.reason = "unloaded"
            log.info("model %s unloaded", name)

    async def load_all(self) -> None:
        """Load every model in the repository; a model that fails does not stop the others."""
        for name in self.repository.names():
            try:
                await self.load(name)
            except TradeoffError:
                pass

    async def close(self) -> None:
        for name in list(self.models):
            await self.unload(name)
        if self._stopping:  # versions whose instances died, still releasing
            await asyncio.gather(*self._stopping, return_exceptions=True)

    def get(self, name: str, version: str | None = None) -> ModelVersion:
        """The version that serves a request, or NotFound/Unavailable saying why not."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"unknown model {name!r}")
        if version:
            if not version.isdigit():
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
                for version in sorted(entry.versions):
                    rows.append({"name": name, "version": str(version),
                                 "state": entry.state.value, "reason": entry.reason})
            else:
                rows.append({"name": name, "state": entry.state.value, "reason": entry.reason})
        if ready_only:
            rows = [r for r in rows if r["state"] == "READY"]
        return rows

    def served_versions(self) -> list[ModelVersion]:
        return [v for e in self.models.values() for _, v in sorted(e.versions.items())]
