"""A tensor model's warmup: the requests its config declares (or one zero request), run on
every new instance before the version serves.

What a config sent with a network load may ask is bounded (NETWORK_WARMUP_COUNT runs per
warmup, NETWORK_WARMUP_BYTES of one request's inputs); an operator's file may ask more.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np

from tradeoff import dtypes
from tradeoff.backends.base import Backend
from tradeoff.errors import ConfigError, InvalidValue, ModelLoadError
from tradeoff.repository.config import ModelConfig, Warmup
from tradeoff.repository.repository import confined
from tradeoff.scheduling.request import InferenceRequest
from tradeoff.scheduling.scheduler import run_batch

__all__ = ["NETWORK_WARMUP_BYTES", "NETWORK_WARMUP_COUNT", "run_warmup", "warmup_inputs"]

log = logging.getLogger("tradeoff.server")

NETWORK_WARMUP_COUNT = 1000
NETWORK_WARMUP_BYTES = 64 << 20


def warmup_inputs(config: ModelConfig, warmup: Warmup, model_dir: Path, *,
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


def run_warmup(config: ModelConfig, backends: list[Backend], model_dir: Path, *,
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
            inputs = warmup_inputs(config, plan, model_dir, from_network=from_network)
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
