"""Loaded models of both kinds and their lifecycle: load, serve, unload, reload.

A tensor model version is an executor (batcher and backend instances, in process: a
:class:`Scheduler`) behind a :class:`ModelVersion`; a generative model version is an
engine core on its own thread, reached through its :class:`EngineClient`.
Both load, drain and stop the same way: a load builds the new versions completely
(``server/build.py``: sessions, warmup, engines) before they replace the old ones in the
catalog (``server/catalog.py``), and old versions finish what they accepted before they
close, so loading a model again under traffic loses no request.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import threading
import uuid
from collections.abc import Awaitable
from typing import Any

from tradeoff.backends.registry import GENERATIVE
from tradeoff.errors import InvalidInput, TradeoffError
from tradeoff.generate.engine_client import EngineClient
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.repository import ROUTER, ROUTER_FILE, ModelRepository
from tradeoff.scheduling.scheduler import Scheduler
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.build import (
    BuildLimits,
    adopt_pool_signatures,
    build_generative,
    build_router,
    build_tensor,
    clear_finished_frames,
    load_failure,
)
from tradeoff.server.catalog import ModelCatalog, ModelEntry, ModelState, ModelVersion, Served
from tradeoff.server.executor_process import (
    ExecutorProcesses,
    RemoteExecutor,
    SharedExecutors,
    device_of,
)
from tradeoff.server.router import RoutedModel

__all__ = ["NO_CACHE_WARNING", "ModelManager"]

log = logging.getLogger("tradeoff.server")

NO_CACHE_WARNING = ("response_cache is enabled but the server runs without --cache; every "
                    "request is computed")


class ModelManager(ModelCatalog):
    """Every model of a repository, by name, with its state (the catalog it keeps), and
    their loads, unloads and shutdown."""

    def __init__(self, repository: ModelRepository, *, default_intra_op_threads: int = 1,
                 allow_fault_injection: bool = False, drain_timeout_s: float = 30.0,
                 max_instances: int = 16, inline_batch_us: int = 500,
                 warmup_timeout_s: float = 300.0,
                 executor_processes: ExecutorProcesses | None = None) -> None:
        super().__init__(repository)
        self.limits = BuildLimits(default_intra_op_threads=default_intra_op_threads,
                                  allow_fault_injection=allow_fault_injection,
                                  max_instances=max_instances,
                                  warmup_timeout_s=warmup_timeout_s)
        self.inline_batch_us = inline_batch_us  # see scheduling/scheduler.py
        # None: tensor models run in this process; else in one process per device
        self.executor_processes = executor_processes
        self._restarting: set[str] = set()
        self.drain_timeout_s = drain_timeout_s  # generations still running then end
        self.cache_enabled = False  # the server runs with --cache
        self._locks: dict[str, asyncio.Lock] = {}
        self._stopping: set[asyncio.Task] = set()
        self._cancels: dict[str, threading.Event] = {}  # loads in progress, by model

    @property
    def shared(self) -> SharedExecutors | None:
        """As one of ``serve --workers``' front ends: where the processes it shares with
        the others are; None for a server of its own."""
        return self.executor_processes.shared if self.executor_processes else None

    async def load(self, name: str, config_override: dict[str, Any] | None = None,
                   share: str | None = None) -> ModelEntry:
        """Load (or reload) a model; raises ConfigError/ModelLoadError/NotFound.

        ``config_override`` replaces the config file for this load (Triton's JSON form).
        In an executor process several front ends share (``serve --workers``), the front
        ends that load with the same ``share`` (one repository change) hold one build;
        None builds anew.
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
                if kind == GENERATIVE:  # weights, tokenizer and KV cache: seconds to minutes
                    log.info("model %s: loading (a generative model: weights, tokenizer, "
                             "KV cache)", name)
                if kind == ROUTER:
                    versions = await self._load_router(name, config_override)
                elif kind == GENERATIVE:
                    versions = await self._load_generative(name, config_override, share)
                else:
                    versions = await self._load_tensor(name, config_override, entry, share)
            except Exception as exc:  # whatever a runtime raises: this model alone fails
                clear_finished_frames(exc)  # releases the failed build's sessions now
                error = load_failure(name, exc)
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
                           entry: ModelEntry, share: str | None) -> dict[int, Served]:
        if self.executor_processes is not None:
            return await self._load_in_executor(name, config_override, entry,
                                                self.executor_processes,
                                                share or uuid.uuid4().hex)
        cancel = self._cancels[name] = threading.Event()
        try:
            config, built = await asyncio.to_thread(build_tensor, self.repository, name,
                                                    config_override, self.limits, cancel)
        finally:
            if self._cancels.get(name) is cancel:
                del self._cancels[name]
        versions: dict[int, Served] = {}
        for version, (backends, path) in built.items():
            previous = entry.versions.get(version)
            stats = previous.stats if isinstance(previous, ModelVersion) else \
                ModelStats(name, version)
            executor = Scheduler(config, backends, stats,
                                 inline_limit_ns=self.inline_batch_us * 1000)
            await executor.start()
            served = versions[version] = ModelVersion(
                name, version, config, executor, stats, path,
                self.repository.backends.tensor(config.backend).check_bytes)
            executor.on_dead = functools.partial(self._version_died, name, served,
                                                 "instances died")
        self._loaded_tensor(name, config, versions)
        return versions

    async def _load_in_executor(self, name: str, config_override: dict[str, Any] | None,
                                entry: ModelEntry, processes: ExecutorProcesses, share: str
                                ) -> dict[int, Served]:
        """A tensor model's versions built in its device's executor process."""
        source = await asyncio.to_thread(self.repository.read, name, config_override)
        config = source.config
        process = await processes.get(device_of(config))
        cancel = self._cancels[name] = threading.Event()
        try:
            numbers = await process.load(name, self.repository.root, config_override,
                                         self.limits, self.inline_batch_us * 1000, cancel,
                                         share)
        finally:
            if self._cancels.get(name) is cancel:
                del self._cancels[name]
        check_bytes = self.repository.backends.tensor(config.backend).check_bytes
        versions: dict[int, Served] = {}
        for version, number in numbers.items():
            previous = entry.versions.get(version)
            stats = previous.stats if isinstance(previous, ModelVersion) else \
                ModelStats(name, version)
            executor = RemoteExecutor(process, number, name, stats)
            served = versions[version] = ModelVersion(
                name, version, config, executor, stats, source.versions[version], check_bytes)
            executor.on_dead = functools.partial(self._version_died, name, served,
                                                 "instances died")
        self._loaded_tensor(name, config, versions)
        return versions

    def _loaded_tensor(self, name: str, config: ModelConfig, versions: dict[int, Served]
                       ) -> None:
        warnings = list(config.warnings)
        if config.response_cache and not self.cache_enabled:
            warnings.append(NO_CACHE_WARNING)
        for warning in warnings:
            log.warning("model %s: %s", name, warning)
        log.info("model %s versions=%s %s", name, sorted(versions), config.summary())

    async def _load_generative(self, name: str, config_override: dict[str, Any] | None,
                               share: str | None) -> dict[int, Served]:
        if config_override is not None:
            raise InvalidInput(f"model {name!r} is generative: its settings come from "
                               "generate.yaml, not a 'config' load parameter")
        engine = None
        if self.shared is not None:  # serve --workers: one engine process, which every
            engine = await self.shared.engine(  # front end dials
                self.repository.root, name, self.limits, share or uuid.uuid4().hex)
        model = await asyncio.to_thread(build_generative, self.repository, name, self.limits,
                                        asyncio.get_running_loop(), engine)
        model.on_dead = functools.partial(self._version_died, name, model, "engine stopped")
        log.info("generative model %s: %s", name, model.config)
        if model.config.response_cache and not self.cache_enabled:
            log.warning("model %s: %s", name, NO_CACHE_WARNING)
        return {1: model}

    async def _load_router(self, name: str, config_override: dict[str, Any] | None
                           ) -> dict[int, Served]:
        if config_override is not None:
            raise InvalidInput(f"model {name!r} is a router: its rules come from "
                               f"{ROUTER_FILE}, not a 'config' load parameter")
        routed = build_router(self.repository, name, self.loaded)
        entry = self.models.get(name)
        previous = entry.versions.get(1) if entry is not None else None
        if isinstance(previous, RoutedModel):  # a reload: what its pools learnt stays
            routed.adopt(previous)
        try:
            await routed.start()
            await adopt_pool_signatures(routed)
        except BaseException:
            await routed.stop(0)
            raise
        return {1: routed}

    def _version_died(self, name: str, dead: Served, what: str, cause: str) -> None:
        """A served version can no longer run (every instance died, or its engine
        stopped): stop serving it. An engine in a process of its own is started again
        (a new process loads the model); anything else comes back with a load."""
        entry = self.models.get(name)
        version = dead.version
        if entry is None or entry.versions.get(version) is not dead:
            return  # an older copy (replaced by a reload) died while it drained
        entry.versions.pop(version)
        entry.latest = entry.versions[max(entry.versions)] if entry.versions else None
        entry.reason = f"version {version}: {what}: {cause}"
        if entry.latest is None:
            entry.state = ModelState.UNAVAILABLE
        # an engine process, or a model whose executor process died: a new one loads it
        restart = (isinstance(dead, EngineClient) and dead.core_pid is not None) or (
            isinstance(dead, ModelVersion) and isinstance(dead.executor, RemoteExecutor)
            and dead.executor.process_died)
        log.error("model %s: %s; %s", name, entry.reason,
                  "loading it again in a new process" if restart else
                  f"POST /v2/repository/models/{name}/load to bring it back")
        if restart and name not in self._restarting:  # once for all its versions
            self._restarting.add(name)
            # front ends sharing the dead process load one build again in the next
            died_in = dead.executor.process.pid if isinstance(dead, ModelVersion) and \
                isinstance(dead.executor, RemoteExecutor) else \
                dead.core_pid if isinstance(dead, EngineClient) else None
            self._background(self._restart(name, f"after process {died_in}"))
        self._background(dead.stop())  # releases its sessions, joins its engine

    def _background(self, work: Awaitable[Any]) -> None:
        task = asyncio.ensure_future(work)
        self._stopping.add(task)
        task.add_done_callback(self._stopping.discard)

    async def _restart(self, name: str, share: str) -> None:
        try:
            await self.load(name, share=share)
        except Exception as exc:
            log.error("model %s: could not load it again: %s", name, exc)
        finally:
            self._restarting.discard(name)

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
            try:  # front ends that share executors share the builds of the start
                await self.load(name, share="start" if self.shared else None)
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
        if self.executor_processes is not None:
            await self.executor_processes.close()
