"""PyTorch backend: TorchScript (``model.pt``, Triton's ``pytorch_libtorch``) and
``torch.export`` programs (``model.pt2``), one module per model instance.

Tensors are bound as Triton's PyTorch backend binds them:

* inputs named ``<anything>__<i>`` are the forward's i-th argument; inputs named like the
  forward's arguments go to those; any other names go in the config's order;
* outputs named ``<anything>__<i>`` are the i-th returned tensor; a forward that returns
  a dict is read by key; any other names take the returned tensors in the config's order.

A TorchScript file does not say its tensors' types, so its config lists them (as Triton
requires); an exported program does, and a config may leave them out.

Per-model ``parameters``: ``precision`` (``fp32``, ``tf32``, ``bf16``, ``fp16``),
``precision_mode`` (``autocast``, the default, or ``cast``: the weights converted once),
``compile`` (a ``torch.compile`` mode for an exported program: ``default``,
``reduce-overhead``, ``max-autotune``; unset: eager). On ``KIND_GPU`` each instance runs
on its own CUDA stream; a batch's inputs go up through pinned host buffers, one copy per
input, and its outputs come back once. PyTorch is imported when a model of this backend
loads, never by a server that serves none.
"""

from __future__ import annotations

import logging
import re
import stat
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from tradeoff import dtypes
from tradeoff.backends.base import Backend, TensorSpec
from tradeoff.backends.registry import InstanceSpec, TensorBackendType
from tradeoff.errors import ConfigError, InferenceFailed, ModelLoadError, capped

if TYPE_CHECKING:
    import torch

__all__ = [
    "BACKEND",
    "COMPILE_MODES",
    "EXPORTED_SUFFIX",
    "PRECISIONS",
    "PRECISION_MODES",
    "TorchBackend",
    "TorchSettings",
    "batch_sizes_to_warm",
    "check_code_file",
    "describe",
    "forward_names",
    "input_positions",
    "is_exported",
    "load_exported",
    "output_keys",
    "torchscript_quietly",
]

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "tf32", "bf16", "fp16")
PRECISION_MODES = ("autocast", "cast")
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
EXPORTED_SUFFIX = ".pt2"
_INDEXED = re.compile(r"^.*__(\d+)$")
_TF32_LOCK = threading.Lock()


@dataclass(frozen=True)
class TorchSettings:
    """What a model's ``parameters`` ask of this backend."""

    precision: str = "fp32"
    precision_mode: str = "autocast"
    compile_mode: str = ""  # "": eager

    @classmethod
    def of(cls, spec: InstanceSpec) -> TorchSettings:
        params = spec.parameters
        source = f"model {spec.name!r}"
        settings = cls(precision=params.get("precision", "fp32").lower(),
                       precision_mode=params.get("precision_mode", "autocast").lower(),
                       compile_mode=params.get("compile", "").lower())
        for field, value, allowed in (("precision", settings.precision, PRECISIONS),
                                      ("precision_mode", settings.precision_mode,
                                       PRECISION_MODES)):
            if value not in allowed:
                raise ConfigError(source, f"parameters.{field}",
                                  f"{value!r}; expected one of {', '.join(allowed)}")
        if settings.compile_mode not in ("", "none", *COMPILE_MODES):
            raise ConfigError(source, "parameters.compile",
                              f"{settings.compile_mode!r}; expected one of "
                              f"{', '.join(COMPILE_MODES)} (or leave it out for eager)")
        return settings

    def low_dtype(self) -> torch.dtype | None:
        """The 16-bit dtype asked for, or None for fp32/tf32."""
        import torch

        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.precision)


def _torch() -> Any:
    try:
        import torch
    except ImportError as exc:
        raise ModelLoadError("the pytorch backend needs torch: pip install "
                             "'tradeoff[llm]' (or torch==2.13.0 for the CPU build)") from exc
    return torch


def is_exported(path: Path) -> bool:
    return path.suffix == EXPORTED_SUFFIX


def check_code_file(path: Path) -> None:
    """ModelLoadError when a model file that runs code as it loads (TorchScript and
    torch.export archives unpickle) could have been written by any user of this machine:
    the file, or a folder of the model holding it, writable by others. A repository is
    trusted code, as an installed package is; this keeps it the operator's."""
    real = path.resolve()
    for item in (real, real.parent, real.parent.parent):
        try:
            mode = item.stat().st_mode
        except OSError:
            continue
        if mode & stat.S_IWOTH and not (stat.S_ISDIR(mode) and mode & stat.S_ISVTX):
            raise ModelLoadError(
                f"{path}: {item} is writable by every user of this machine, and loading a "
                "PyTorch model runs the code it holds: `chmod o-w` it (a model repository "
                "is trusted code, docs/pytorch.md)")


def load_exported(path: Path) -> Any:
    check_code_file(path)
    torch = _torch()
    try:
        return torch.export.load(str(path))
    except Exception as exc:  # zip, pickle and version errors alike
        raise ModelLoadError(f"{path}: not a readable torch.export program (.pt2): "
                             f"{type(exc).__name__}: {_last_line(exc)}") from exc


def _shape(value: Any) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) else -1 for d in value.shape)


def describe(model_path: Path) -> tuple[list[TensorSpec], list[TensorSpec]] | None:
    """An exported program's inputs (its forward's argument names) and outputs
    (``OUTPUT__i``) with dtypes and shapes, dynamic dimensions as -1; None for a
    TorchScript file, whose config must list its tensors. 16-bit floating tensors are
    served as FP32 (inputs cast in, outputs cast out), so they are described as FP32: the
    FP32 config of a model stays valid for its fp16 and bf16 versions."""
    if not is_exported(model_path):
        return None
    program = load_exported(model_path)
    from torch.export.graph_signature import InputKind, OutputKind

    values = {node.name: node.meta.get("val") for node in program.graph.nodes}
    inputs = []
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            value = values.get(spec.arg.name)
            if value is None or not hasattr(value, "dtype"):
                raise ModelLoadError(f"{model_path}: input {spec.arg.name!r} is not a tensor; "
                                     "the pytorch backend takes tensor inputs only")
            inputs.append(TensorSpec(spec.arg.name, _datatype(value.dtype, model_path),
                                     _shape(value)))
    output_node = next(n for n in program.graph.nodes if n.op == "output")
    returned = {getattr(a, "name", None): a for a in output_node.args[0]}
    outputs: list[TensorSpec] = []
    for spec in program.graph_signature.output_specs:
        if spec.kind == OutputKind.USER_OUTPUT:
            node = returned.get(spec.arg.name)
            value = node.meta.get("val") if node is not None else None
            if value is None or not hasattr(value, "dtype"):
                raise ModelLoadError(f"{model_path}: output {len(outputs)} is not a tensor")
            outputs.append(TensorSpec(f"OUTPUT__{len(outputs)}",
                                      _datatype(value.dtype, model_path), _shape(value)))
    return inputs, outputs


def _datatype(dtype: Any, path: Path) -> str:
    name = str(dtype).removeprefix("torch.")
    if name in ("float16", "bfloat16"):
        return "FP32"
    found = dtypes.from_torch_name(name)
    if found is None:
        raise ModelLoadError(f"{path}: tensor dtype {name} has no protocol datatype")
    return found


def forward_names(module: Any, exported: Any | None) -> list[str]:
    if exported is not None:
        from torch.export.graph_signature import InputKind

        return [s.arg.name for s in exported.graph_signature.input_specs
                if s.kind == InputKind.USER_INPUT]
    schema = module.forward.schema
    return [a.name for a in schema.arguments[1:]]  # [0] is self


def _indices(names: Sequence[str]) -> list[int] | None:
    """The ``i`` of every ``<anything>__<i>`` name, or None unless all are named so."""
    found = [_INDEXED.match(n) for n in names]
    return [int(m.group(1)) for m in found if m] if names and all(found) else None


def input_positions(names: Sequence[str], forward: Sequence[str], source: str) -> list[int]:
    """The forward argument each config input binds to (Triton's rules, see the module
    docstring)."""
    indexed = _indices(names)
    if indexed is not None:
        positions = indexed
    elif names and all(n in forward for n in names):
        positions = [list(forward).index(n) for n in names]
    else:
        positions = list(range(len(names)))
    if sorted(positions) != list(range(len(forward))):
        raise ConfigError(source, "input", f"the inputs {list(names)} do not bind one to one "
                          f"to the forward's arguments {list(forward)}: name them like "
                          "those, or INPUT__0, INPUT__1, ... by position")
    return positions


def output_keys(names: Sequence[str]) -> list[int]:
    """The index of each config output in the tuple the forward returns (a forward that
    returns a dict is read by name instead)."""
    indexed = _indices(names)
    return indexed if indexed is not None else list(range(len(names)))


class TorchBackend(Backend):
    """One model instance: a TorchScript module or an exported program, on the CPU
    (``KIND_CPU``) or one CUDA device (``KIND_GPU``).

        backend = TorchBackend(InstanceSpec("bert", Path("repo/bert/1/model.pt"), ...))
        backend.run({"INPUT__0": ids, "INPUT__1": mask}, ["OUTPUT__0"])
    """

    def __init__(self, spec: InstanceSpec) -> None:
        self.torch = _torch()
        self.name = spec.name
        self.path = spec.path
        self.settings = TorchSettings.of(spec)
        self.device = self._device(spec)
        source = f"model {spec.name!r}"
        if self.device.type == "cpu" and spec.intra_op_threads:  # process-wide in PyTorch
            threads = str(spec.parameters.get("intra_op_thread_count", spec.intra_op_threads))
            if not threads.isdigit() or int(threads) < 1:
                raise ConfigError(source, "parameters.intra_op_thread_count",
                                  f"{threads!r} is not a positive integer")
            self.torch.set_num_threads(int(threads))
        exported = load_exported(spec.path) if is_exported(spec.path) else None
        if exported is not None and self.device.type != "cpu":
            from torch.export.passes import move_to_device_pass

            # the program's weights and the devices written into its graph alike
            exported = move_to_device_pass(exported, self.device)
        module = exported.module() if exported is not None else self._load_script(spec.path)
        forward = forward_names(module, exported)
        config_inputs = [t.name for t in spec.inputs] or forward
        self.positions = dict(zip(config_inputs,
                                  input_positions(config_inputs, forward, source), strict=True))
        self.config_outputs = {t.name: t for t in spec.outputs}
        self.output_keys = dict(zip(self.config_outputs, output_keys(list(self.config_outputs)),
                                    strict=True))
        low = self.settings.low_dtype()
        cast = low is not None and self.settings.precision_mode == "cast"
        if cast:
            module = module.to(low)
        self.autocast_dtype = low if low is not None and not cast else None
        if self.settings.precision == "tf32":
            with _TF32_LOCK:  # PyTorch's TF32 switch is process-wide
                self.torch.backends.cuda.matmul.allow_tf32 = True
                self.torch.backends.cudnn.allow_tf32 = True
        if hasattr(module, "eval") and exported is None:
            module.eval()
        self.module = module
        # floating inputs go in as the weights are: 16-bit when cast here or saved so
        # (an optimize version), FP32 otherwise
        self.input_dtype = low if cast else _weights_dtype(module, self.torch)
        self.stream = self.torch.cuda.Stream(device=self.device) if self.device.type == "cuda" \
            else None
        self._staging: dict[str, torch.Tensor] = {}
        self._returned: dict[str, torch.Tensor] = {}
        self.compile_seconds: float | None = None
        if self.settings.compile_mode not in ("", "none"):
            if exported is None:
                raise ConfigError(source, "parameters.compile",
                                  "torch.compile takes a torch.export program (model.pt2), "
                                  "not TorchScript: export the model, or leave compile out")
            self._compile(spec)

    def _device(self, spec: InstanceSpec) -> torch.device:
        torch = self.torch
        if spec.kind != "KIND_GPU":
            return torch.device("cpu")
        if not torch.cuda.is_available():
            raise ModelLoadError(f"model {spec.name!r} asks for KIND_GPU but this PyTorch "
                                 f"({torch.__version__}) sees no CUDA device; use KIND_CPU "
                                 "or a CUDA build of torch on a machine with a GPU")
        index = spec.device_id or 0
        if index >= torch.cuda.device_count():
            raise ModelLoadError(f"model {spec.name!r}: instance_group gpus [{index}], but "
                                 f"this machine has {torch.cuda.device_count()} CUDA device(s)")
        return torch.device("cuda", index)

    def _load_script(self, path: Path) -> Any:
        check_code_file(path)
        try:
            with torchscript_quietly():
                return self.torch.jit.load(str(path), map_location=self.device)
        except Exception as exc:  # RuntimeError, ValueError from a damaged zip
            raise ModelLoadError(f"{path}: not a readable TorchScript model (model.pt): "
                                 f"{type(exc).__name__}: {_last_line(exc)}") from exc

    def _compile(self, spec: InstanceSpec) -> None:
        """torch.compile, then a run at every batch size the batcher can form (powers of
        two up to max_batch_size, and that size), so no request pays for compiling."""
        mode = self.settings.compile_mode
        started = time.perf_counter()
        sizes = batch_sizes_to_warm(spec.max_batch_size)
        with torchscript_quietly():  # Inductor touches torch.jit as it loads
            self.module = self.torch.compile(self.module, mode=mode, dynamic=False)
            for size in sizes:
                rows = (size,) if spec.max_batch_size else ()
                example = {t.name: np.zeros((*rows, *(max(d, 1) for d in t.shape)),
                                            dtypes.numpy_dtype(t.datatype))
                           for t in spec.inputs}
                self.run(example, list(self.config_outputs))
        self.compile_seconds = time.perf_counter() - started
        log.info("model %s: torch.compile (%s) and warmup at batch sizes %s took %.1f s",
                 self.name, mode, sizes, self.compile_seconds)

    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        torch = self.torch
        stream = torch.cuda.stream(self.stream) if self.stream is not None else nullcontext()
        autocast = torch.autocast(self.device.type, dtype=self.autocast_dtype) \
            if self.autocast_dtype is not None else nullcontext()
        args: list[Any] = [None] * len(self.positions)
        try:
            with torch.inference_mode(), stream:
                for name, array in inputs.items():
                    tensor = self._upload(name, array)
                    if tensor.is_floating_point() and tensor.dtype != self.input_dtype:
                        tensor = tensor.to(self.input_dtype)
                    args[self.positions[name]] = tensor
                with autocast:
                    returned = self.module(*args)
                out = {name: self._download(name, self._pick(returned, name))
                       for name in output_names}
                if self.stream is not None:
                    self.stream.synchronize()
        except RuntimeError as exc:
            # TorchScript's interpreter re-raises a CUDA OOM as a plain RuntimeError
            if not isinstance(exc, torch.cuda.OutOfMemoryError) and \
                    "CUDA out of memory" not in str(exc):
                raise
            torch.cuda.empty_cache()
            rows = next(iter(inputs.values())).shape[0] if inputs else 0
            raise InferenceFailed(f"model {self.name!r}: CUDA out of memory on "
                                  f"{self.device} for a batch of {rows}; this batch failed "
                                  "and the instance keeps serving (lower max_batch_size or "
                                  f"the preferred batch sizes): {_last_line(exc)}") from None
        return {name: self._to_numpy(name, tensor) for name, tensor in out.items()}

    def _upload(self, name: str, array: np.ndarray) -> torch.Tensor:
        torch = self.torch
        host = torch.from_numpy(np.ascontiguousarray(array))
        if self.device.type == "cpu":
            return host
        pinned = self._pinned(self._staging, name, host)
        pinned.copy_(host)
        return pinned.to(self.device, non_blocking=True)

    def _pinned(self, buffers: dict[str, torch.Tensor], name: str,
                like: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor shaped like ``like``: a view of the buffer kept for
        ``name``, grown (and its dtype changed) only when it must be."""
        buffer = buffers.get(name)
        if buffer is None or buffer.numel() < like.numel() or buffer.dtype != like.dtype:
            buffer = self.torch.empty(max(like.numel(), 1), dtype=like.dtype,
                                      pin_memory=True)
            buffers[name] = buffer
        return buffer[:like.numel()].view(like.shape)

    def _pick(self, returned: Any, name: str) -> torch.Tensor:
        key = self.output_keys.get(name)
        if isinstance(returned, Mapping):
            if name in returned:
                return returned[name]
            raise InferenceFailed(f"model {self.name!r} returned {sorted(returned)}, not "
                                  f"{name!r}")
        tensors = returned if isinstance(returned, (tuple, list)) else (returned,)
        if not isinstance(key, int) or key >= len(tensors):
            raise InferenceFailed(f"model {self.name!r}: output {name!r} is the forward's "
                                  f"result {key}, but it returned {len(tensors)}")
        return tensors[key]

    def _download(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        torch = self.torch
        if tensor.dtype in (torch.bfloat16, torch.float16):
            wanted = self.config_outputs.get(name)
            if wanted is None or wanted.datatype not in ("BF16", "FP16"):
                tensor = tensor.float()  # a reduced-precision run of an FP32 model
        if self.device.type == "cpu":
            return tensor
        host = self._pinned(self._returned, name, tensor)
        host.copy_(tensor, non_blocking=True)
        return host

    def _to_numpy(self, name: str, tensor: torch.Tensor) -> np.ndarray:
        if tensor.dtype == self.torch.bfloat16:  # numpy has no bfloat16: its bit patterns
            array = tensor.contiguous().view(self.torch.int16).numpy().view(np.uint16)
        else:
            array = tensor.contiguous().numpy()
        # a CPU run may hand back the module's own storage; a GPU run a pinned buffer the
        # next batch overwrites
        return array.copy()

    def close(self) -> None:
        self.module = None
        self._staging.clear()
        self._returned.clear()
        if self.device.type == "cuda":
            self.torch.cuda.empty_cache()


@contextmanager
def torchscript_quietly() -> Iterator[None]:
    """TorchScript without PyTorch's deprecation warnings: it is the format Triton's
    PyTorch backend serves, so this project reads and writes it on purpose."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r"`?torch\.jit", category=DeprecationWarning)
        yield


def _weights_dtype(module: Any, torch: Any) -> Any:
    """The dtype of the module's floating weights: a 16-bit one when the file holds 16-bit
    weights, FP32 otherwise."""
    for tensor in (*module.parameters(), *module.buffers()):
        if tensor.dtype in (torch.float16, torch.bfloat16):
            return tensor.dtype
        if tensor.is_floating_point():
            return torch.float32
    return torch.float32


def _last_line(exc: BaseException, limit: int = 200) -> str:
    """The gist of a PyTorch error (its messages carry tracebacks and advice)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return capped(lines[-1] if lines else type(exc).__name__, limit)


def batch_sizes_to_warm(max_batch_size: int) -> list[int]:
    """Powers of two up to ``max_batch_size``, and that size: the batches a compiled
    module is run at before serving (one size when the model does not batch)."""
    if max_batch_size <= 1:
        return [1]
    sizes = [1 << i for i in range(max_batch_size.bit_length()) if 1 << i <= max_batch_size]
    return sorted({*sizes, max_batch_size})


BACKEND = TensorBackendType(name="pytorch", platforms=("pytorch_libtorch", "torch_export"),
                            default_filename="model.pt", describe=describe,
                            create=TorchBackend,
                            platform_filenames={"torch_export": "model.pt2"})
