"""A load's new versions built, before they replace the old ones: a tensor model's
backend instances (the config checked against the server's limits, faults wrapped,
warmed up), a generative model's engine, a router over the models it sends to.

The builds are blocking (but the router's): the model manager runs them off the loop.
"""

from __future__ import annotations

import asyncio
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

from tradeoff.backends.base import Backend
from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.backends.faults import PARAMETERS as fault_parameters
from tradeoff.backends.faults import FaultInjectingBackend, NaNLogitsDecoder, fault_values
from tradeoff.errors import ConfigError, InvalidValue, ModelLoadError, TradeoffError
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.engine_client import EngineClient
from tradeoff.generate.loader import load_generative
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.repository import ROUTER_FILE, ModelRepository
from tradeoff.repository.router import RouterConfig, Signature, common_signature
from tradeoff.server.catalog import ModelVersion, Served
from tradeoff.server.engine_process import ProcessCore
from tradeoff.server.gateway import pool_signature
from tradeoff.server.router import RoutedModel
from tradeoff.server.warmup import run_warmup

__all__ = [
    "BuildLimits",
    "TensorInstances",
    "adopt_pool_signatures",
    "build_generative",
    "build_router",
    "build_tensor",
    "clear_finished_frames",
    "engine_loader",
    "load_engine_parts",
    "load_failure",
]

log = logging.getLogger("tradeoff.server")

# a tensor model's config, and each version's instances with the version's directory
TensorInstances = tuple[ModelConfig, dict[int, tuple[list[Backend], Path]]]


@dataclass(frozen=True)
class BuildLimits:
    """What one load may ask of this server (``tradeoff serve``'s flags)."""

    default_intra_op_threads: int = 1
    allow_fault_injection: bool = False
    max_instances: int = 16  # per model version: a load asking more is refused
    # intra-op threads one instance may ask for: a load asking thousands is refused
    max_threads: int = field(default_factory=lambda: 4 * (os.cpu_count() or 1))
    warmup_timeout_s: float = 300.0  # a load's warmups, all instances together


def build_tensor(repository: ModelRepository, name: str,
                 config_override: dict[str, Any] | None, limits: BuildLimits,
                 cancel: threading.Event | None = None) -> TensorInstances:
    """Read the config, create every version's sessions, warm them up (until ``cancel``
    is set or the warmup deadline passes). A failure closes what was created."""
    deadline = time.monotonic() + limits.warmup_timeout_s
    source = repository.read(name, config_override)
    config = source.config
    faults = [k for k in fault_parameters if k in config.parameters]
    if faults and not limits.allow_fault_injection:
        raise ConfigError(f"model {name!r}", f"parameters.{faults[0]}",
                          "fault injection is for tests; start the server with "
                          "--allow-fault-injection to use it")
    fail_on, die_on = fault_values(config.parameters, f"model {name!r}")
    if config.instance_count > limits.max_instances:
        raise ConfigError(f"model {name!r}", "instance_group",
                          f"asks for {config.instance_count} instances; this server "
                          f"allows at most {limits.max_instances} per model "
                          "(serve --max-instances)")
    threads = config.parameters.get("intra_op_thread_count", "")
    if threads.isascii() and threads.isdigit() and int(threads) > limits.max_threads:
        raise ConfigError(f"model {name!r}", "parameters.intra_op_thread_count",
                          f"asks for {int(threads)} threads per instance; this server "
                          f"allows at most {limits.max_threads} (4 per core it sees)")
    backend_type = repository.backends.tensor(config.backend)
    built: dict[int, tuple[list[Backend], Path]] = {}
    try:
        for version, path in source.versions.items():
            backends: list[Backend] = []
            built[version] = (backends, path)
            for group in config.instance_groups:
                for device in group.devices():
                    for _ in range(group.count):
                        backend = backend_type.create(config.instance_spec(
                            path, intra_op_threads=limits.default_intra_op_threads,
                            kind=group.kind, device_id=device))
                        if faults:
                            backend = FaultInjectingBackend(backend, fail_on, die_on)
                        backends.append(backend)
            run_warmup(config, backends, repository.model_dir(name),
                       from_network=source.from_network, cancel=cancel, deadline=deadline)
    except BaseException:
        for backends, _ in built.values():
            for backend in backends:
                backend.close()
        raise
    return config, built


def load_engine_parts(repository: ModelRepository, name: str, limits: BuildLimits
                      ) -> tuple[GenerativeConfig, Decoder, Tokenizer]:
    """A generative model's settings, decoder (faults wrapped) and tokenizer."""
    config, decoder, tokenizer = load_generative(repository.model_dir(name),
                                                 repository.backends)
    if config.fault_nan_on_token >= 0:
        if not limits.allow_fault_injection:
            raise ConfigError(f"model {name!r}", "fault_nan_on_token",
                              "fault injection needs --allow-fault-injection")
        decoder = NaNLogitsDecoder(decoder, config.fault_nan_on_token)
    return config, decoder, tokenizer


def _load_in_child(root: Path, name: str, limits: BuildLimits
                   ) -> tuple[GenerativeConfig, Decoder, Tokenizer]:
    return load_engine_parts(ModelRepository(root), name, limits)


def engine_loader(root: Path, name: str, limits: BuildLimits
                  ) -> Callable[[], tuple[GenerativeConfig, Decoder, Tokenizer]]:
    """What an engine process calls to load a generative model (picklable)."""
    return functools.partial(_load_in_child, root, name, limits)


def build_generative(repository: ModelRepository, name: str, limits: BuildLimits,
                     loop: asyncio.AbstractEventLoop,
                     shared: tuple[str, bytes, int] | None = None) -> EngineClient:
    """A generative model's engine: weights, tokenizer, KV cache, on a thread of this
    process or (``process: true``) in a process of its own; its events go to ``loop``.
    ``shared``: the engine process ``serve --workers``' front ends share (its address,
    key and pid)."""
    config = GenerativeConfig.of_model(repository.model_dir(name),
                                       repository.backends.generative_formats())
    if shared is not None:
        core = ProcessCore.dial(name, *shared, limits.warmup_timeout_s)
        return EngineClient(name, 1, config, core.tokenizer, core, loop)
    if config.process:
        core = ProcessCore.spawn(name, 1, engine_loader(repository.root, name, limits),
                                 limits.warmup_timeout_s)
        return EngineClient(name, 1, config, core.tokenizer, core, loop)
    config, decoder, tokenizer = load_engine_parts(repository, name, limits)
    return EngineClient.in_process(name, 1, config, decoder, tokenizer, loop)


def build_router(repository: ModelRepository, name: str,
                 loaded: Callable[[str, int | None], Served | None]) -> RoutedModel:
    """A router over loaded models: each target must be ``loaded`` now, and they must
    agree on their inputs and outputs (or all be generative)."""
    config = RouterConfig.read(repository.model_dir(name) / ROUTER_FILE)
    targets = [arm for route in config.routes for arm in route.arms]
    targets += list(config.fallback) + ([config.shadow.target] if config.shadow else [])
    served: dict[str, Served] = {}
    for pool in config.pools:
        if pool in repository.names():
            raise ModelLoadError(f"router {name!r}: pool {pool!r} has the name of a model "
                                 "of this repository; name the pool apart")
    for target in targets:
        if target.model in config.pools:
            continue
        version = loaded(target.model, target.version)
        if version is None:
            raise ModelLoadError(f"router {name!r}: target {target.label!r} is not "
                                 "loaded (load it before the router)")
        if isinstance(version, RoutedModel):
            raise ModelLoadError(f"router {name!r}: target {target.label!r} is a router;"
                                 " a router sends to models only")
        served[target.label] = version
    kinds = {isinstance(v, EngineClient) for v in served.values()}
    kinds |= {pool.protocol == "openai" for pool in config.pools.values()}
    if kinds == {True}:
        routed = RoutedModel(name, config, None, generative=True)
    elif kinds == {False}:
        if any(route.priority is not None for route in config.routes):
            raise ModelLoadError(f"router {name!r}: a route's priority orders a "
                                 "generative engine; a tensor request carries its own "
                                 "(parameter priority, the model's priority_levels)")
        tensors = {label: v for label, v in served.items() if isinstance(v, ModelVersion)}
        # a gateway's signature comes from its replicas once its pools have started
        signature = common_signature(name, {label: _signature(v.config)
                                            for label, v in tensors.items()}) \
            if tensors else None
        batch = min((v.config.max_batch_size for v in tensors.values()), default=0)
        routed = RoutedModel(name, config, signature, max_batch_size=batch)
    else:
        raise ModelLoadError(f"router {name!r}: mixes generative and tensor targets")
    log.info("router %s: %d routes over %s", name, len(config.routes),
             ", ".join(sorted(served)))
    return routed


async def adopt_pool_signatures(routed: RoutedModel) -> None:
    """A tensor router's signature and max_batch_size with its v2 pools' (as a ready
    replica of each tells them) merged in; ModelLoadError when they disagree or none can
    tell."""
    if routed.generative:
        return
    signatures = {} if routed.signature is None else {"local targets": routed.signature}
    batches = [routed.max_batch_size] if routed.signature is not None else []
    for name, pool in routed.pools.items():
        signatures[f"pool {name}"], batch = await pool_signature(pool)
        batches.append(batch)
    routed.signature = common_signature(routed.name, signatures)
    routed.max_batch_size = min(batches)


def _signature(config: ModelConfig) -> Signature:
    """A tensor model's inputs and outputs as a router compares them."""
    return Signature(tuple((t.name, t.datatype, tuple(config.full_shape(t)))
                           for t in config.inputs),
                     tuple((t.name, t.datatype, tuple(config.full_shape(t)))
                           for t in config.outputs))


def load_failure(name: str, exc: Exception) -> Exception:
    """What a failed load of ``name`` says: the project's own errors as they are (they
    name their source), a bad value met deep down or a runtime's error with the model
    named."""
    if isinstance(exc, InvalidValue):
        return ModelLoadError(f"model {name!r}: {exc}")
    if isinstance(exc, TradeoffError):
        return exc
    return ModelLoadError(f"model {name!r}: {type(exc).__name__}: {exc}")


def clear_finished_frames(error: BaseException) -> None:
    """Drop the locals of the finished frames in ``error``'s tracebacks (causes included).

    A failure inside a runtime's call keeps that call's frames, and so the runtime's own
    session objects (ONNX Runtime's ``InferenceSession.run`` has the session as ``self``),
    alive in a reference cycle through the exception: a failed build's threads and memory
    would stay until the next garbage collection, however large the model."""
    pending, seen = [error], set()
    while pending:
        current = pending.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        traceback.clear_frames(current.__traceback__)  # skips frames still running
        pending.extend(e for e in (current.__cause__, current.__context__) if e is not None)
