"""Which runtimes can serve a model: the backend registry.

A backend is one module that declares what it serves in a module-level ``BACKEND``:

* :class:`TensorBackendType` for models that run a batch of tensors (ONNX Runtime):
  the config ``backend`` name and Triton ``platform`` names it answers to, the model
  file it looks for, how to read the file's inputs and outputs, how to create one
  instance from an :class:`InstanceSpec`;
* :class:`GenerativeBackendType` for models that generate tokens (the Llama decoder):
  the ``generate.yaml`` formats it reads and how to load a decoder and tokenizer.

The registry imports the built-in modules of a kind, and those named by that kind's entry
point group of installed packages (``tradeoff.backends.tensor``,
``tradeoff.backends.generative``), when first asked for that kind: a server of tensor
models never imports PyTorch (measured: importing it costs a tensor server about 12% of
its throughput at 64 concurrent requests). The repository, the model manager and the
generation loader ask the registry, never a backend module directly::

    registry = BackendRegistry()
    backend_type = registry.tensor("onnxruntime")
    backend = backend_type.create(InstanceSpec(name="mlp", path=model_file))
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.backends.base import Backend, TensorSpec
from tradeoff.backends.clock import REAL_CLOCK, Clock
from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.errors import ConfigError, ModelLoadError

__all__ = [
    "BUILTIN_MODULES",
    "ENTRY_POINT_GROUPS",
    "BackendRegistry",
    "GenerativeBackendType",
    "InstanceSpec",
    "TensorBackendType",
    "default_registry",
]

TENSOR, GENERATIVE = "tensor", "generative"
BUILTIN_MODULES = {TENSOR: ("tradeoff.backends.onnxruntime", "tradeoff.backends.text_encoder",
                            "tradeoff.backends.synthetic", "tradeoff.backends.pytorch"),
                   GENERATIVE: ("tradeoff.backends.llama_loader",
                                "tradeoff.backends.synthetic_generative")}
ENTRY_POINT_GROUPS = {TENSOR: "tradeoff.backends.tensor",
                      GENERATIVE: "tradeoff.backends.generative"}


@dataclass(frozen=True)
class InstanceSpec:
    """What a tensor backend needs to create one model instance: plain values, and the
    clock a backend whose cost is modelled spends it on (the real one but in tests)."""

    name: str
    path: Path
    parameters: Mapping[str, str] = field(default_factory=dict)
    intra_op_threads: int = 1
    graph_optimization_level: int = 0  # Triton's optimization.graph.level
    gpu_accelerators: tuple[str, ...] = ()
    kind: str = "KIND_CPU"
    device_id: int | None = None
    # the config's tensors in its order (dims without the batch dim): a runtime whose
    # file does not name them binds by these
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    max_batch_size: int = 0
    clock: Clock = REAL_CLOCK


@dataclass(frozen=True)
class TensorBackendType:
    """A runtime that runs batches of tensors. ``describe`` reads a model file's inputs
    and outputs, or returns None for a format that does not say them (the config must)."""

    name: str
    platforms: tuple[str, ...]
    default_filename: str
    describe: Callable[[Path], tuple[list[TensorSpec], list[TensorSpec]] | None]
    create: Callable[[InstanceSpec], Backend]
    # checks a BYTES input of one request before it is batched (one client's bad bytes
    # must fail its own request, not the batch); raises InvalidInput
    check_bytes: Callable[[str, np.ndarray], None] | None = None
    # platform -> model file name, where a platform's file differs from default_filename
    platform_filenames: Mapping[str, str] = field(default_factory=dict)

    def filename(self, platform: str) -> str:
        return self.platform_filenames.get(platform, self.default_filename)


@dataclass(frozen=True)
class GenerativeBackendType:
    """A runtime that generates tokens: ``load(path, format, device, precision)`` returns
    the decoder and its tokenizer."""

    name: str
    formats: tuple[str, ...]
    load: Callable[[Path, str, str, str], tuple[Decoder, Tokenizer]]


class BackendRegistry:
    """Every backend type that could be imported, by name, platform and format."""

    def __init__(self, modules: Mapping[str, Sequence[str]] = BUILTIN_MODULES,
                 entry_points: bool = True) -> None:
        self._modules = {kind: tuple(names) for kind, names in modules.items()}
        self._entry_points = entry_points
        self._tensor: dict[str, TensorBackendType] | None = None
        self._generative: dict[str, GenerativeBackendType] | None = None
        # kind -> {module or entry point -> why it could not be imported}
        self.failures: dict[str, dict[str, str]] = {TENSOR: {}, GENERATIVE: {}}

    def _declared(self, kind: str, want: type) -> list[Any]:
        """The ``BACKEND`` of every module of ``kind`` that imports."""
        sources: list[tuple[str, Callable[[], Any]]] = [
            (name, functools.partial(importlib.import_module, name))
            for name in self._modules.get(kind, ())]
        if self._entry_points:  # "package.module" or "package.module:BACKEND"
            sources += [(ep.value, ep.load) for ep in
                        importlib.metadata.entry_points(group=ENTRY_POINT_GROUPS[kind])]
        found = []
        for source, load in sources:
            try:
                loaded = load()
                declared = getattr(loaded, "BACKEND", loaded)
            except Exception as exc:  # a broken backend must not take the others down
                self.failures[kind][source] = f"{type(exc).__name__}: {exc}"
                continue
            if not isinstance(declared, want):
                self.failures[kind][source] = f"BACKEND is not a {want.__name__}"
                continue
            found.append(declared)
        return found

    def _tensor_types(self) -> dict[str, TensorBackendType]:
        if self._tensor is None:
            self._tensor = {t.name: t for t in self._declared(TENSOR, TensorBackendType)}
        return self._tensor

    def _missing(self, kind: str = TENSOR) -> str:
        failures = self.failures[kind]
        if not failures:
            return ""
        failed = "; ".join(f"{m}: {why}" for m, why in sorted(failures.items()))
        return f" (backends that could not be imported: {failed})"

    def generative_formats(self) -> list[str]:
        """Every ``generate.yaml`` format a generative backend reads."""
        return sorted(self._generative_types())

    def _generative_types(self) -> dict[str, GenerativeBackendType]:
        if self._generative is None:
            self._generative = {fmt: g for g in self._declared(GENERATIVE, GenerativeBackendType)
                                for fmt in g.formats}
        return self._generative

    def tensor_names(self) -> list[str]:
        return sorted(self._tensor_types())

    def platforms(self) -> list[str]:
        return sorted(p for t in self._tensor_types().values() for p in t.platforms)

    def tensor(self, name: str) -> TensorBackendType:
        """The backend named by a config's ``backend`` field."""
        found = self._tensor_types().get(name)
        if found is None:
            raise ModelLoadError(f"no backend {name!r}; installed: "
                                 f"{', '.join(self.tensor_names())}{self._missing()}")
        return found

    def for_platform(self, platform: str) -> TensorBackendType | None:
        return next((t for t in self._tensor_types().values() if platform in t.platforms), None)

    def resolve(self, backend: str, platform: str, source: str) -> TensorBackendType:
        """The backend a model config asks for by ``backend`` or ``platform`` (the first
        one registered when it names neither); ConfigError when none serves it."""
        types = self._tensor_types()
        if backend:
            if backend not in types:
                raise ConfigError(source, "backend", f"{backend!r} is not served; tradeoff "
                                  f"serves {', '.join(sorted(types))}{self._missing()}")
            chosen = types[backend]
            if platform and platform not in chosen.platforms:
                raise ConfigError(source, "platform", f"{platform!r} does not match backend "
                                  f"{backend!r} (platforms: {', '.join(chosen.platforms)})")
            return chosen
        if platform:
            found = self.for_platform(platform)
            if found is None:
                raise ConfigError(source, "platform", f"{platform!r} is not served; tradeoff "
                                  f"serves {', '.join(self.platforms())}{self._missing()}")
            return found
        if not types:
            raise ModelLoadError(f"no tensor backend could be imported{self._missing()}")
        return next(iter(types.values()))

    def generative(self, fmt: str) -> GenerativeBackendType:
        """The backend that reads a ``generate.yaml`` format."""
        found = self._generative_types().get(fmt)
        if found is None:
            failures = self.failures[GENERATIVE].values()
            hint = " (generative models need torch: pip install 'tradeoff[llm]')" \
                if any("torch" in why for why in failures) else ""
            raise ModelLoadError(f"no backend reads generative format {fmt!r}"
                                 f"{hint}{self._missing(GENERATIVE)}")
        return found


@functools.cache
def default_registry() -> BackendRegistry:
    """The registry of the built-in and installed backends, made on first use."""
    return BackendRegistry()
