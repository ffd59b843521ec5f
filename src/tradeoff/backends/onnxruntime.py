"""ONNX Runtime backend: one ``InferenceSession`` per model instance."""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from tradeoff import dtypes
from tradeoff.backends.base import Backend, TensorSpec
from tradeoff.backends.registry import InstanceSpec, TensorBackendType
from tradeoff.errors import ConfigError, InvalidInput, ModelLoadError

__all__ = [
    "BACKEND",
    "OnnxRuntimeBackend",
    "check_utf8",
    "describe",
    "execution_providers",
    "session_options",
    "utf8_strings",
]

log = logging.getLogger(__name__)

_GRAPH_LEVELS = {
    "disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
}
# Triton's optimization.graph.level: 0 (unset) all, 1 extended, -1 basic
_TRITON_GRAPH_LEVELS = {0: "all", 1: "extended", -1: "basic"}


def describe(model_path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """Inputs and outputs declared by an ONNX file, read without creating a session."""
    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError, ...
        raise ModelLoadError(f"{model_path}: not a readable ONNX model: {exc}") from exc
    initializers = {i.name for i in model.graph.initializer}

    def spec(value: onnx.ValueInfoProto) -> TensorSpec:
        tensor_type = value.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else -1
                      for d in tensor_type.shape.dim)
        return TensorSpec(value.name, dtypes.from_onnx(tensor_type.elem_type), shape)

    inputs = [spec(v) for v in model.graph.input if v.name not in initializers]
    outputs = [spec(v) for v in model.graph.output]
    return inputs, outputs


def session_options(spec: InstanceSpec) -> ort.SessionOptions:
    """Session options from the model's ``parameters`` and ``optimization`` fields."""
    options = ort.SessionOptions()
    params = spec.parameters
    source = f"model {spec.name!r}"
    try:
        options.intra_op_num_threads = int(params.get("intra_op_thread_count",
                                                      spec.intra_op_threads))
        options.inter_op_num_threads = int(params.get("inter_op_thread_count", 0))
    except ValueError as exc:
        raise ConfigError(source, "parameters.intra_op_thread_count",
                          f"not an integer: {exc}") from exc
    level_name = params.get("graph_optimization_level",
                            _TRITON_GRAPH_LEVELS.get(spec.graph_optimization_level, "all"))
    if level_name not in _GRAPH_LEVELS:
        raise ConfigError(source, "parameters.graph_optimization_level",
                          f"{level_name!r}; expected one of {', '.join(_GRAPH_LEVELS)}")
    options.graph_optimization_level = _GRAPH_LEVELS[level_name]
    # Idle intra-op threads must not spin on cores the HTTP event loop needs.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def execution_providers(spec: InstanceSpec) -> list[str | tuple[str, dict]]:
    """Providers for one instance: CUDA (and TensorRT when the config names it) for
    KIND_GPU when ONNX Runtime has them, on the spec's device; the CPU otherwise."""
    available = ort.get_available_providers()
    providers: list[str | tuple[str, dict]] = []
    if spec.kind == "KIND_GPU":
        options = {"device_id": spec.device_id or 0}
        if "tensorrt" in spec.gpu_accelerators and "TensorrtExecutionProvider" in available:
            providers.append(("TensorrtExecutionProvider", options))
        if "CUDAExecutionProvider" in available:
            providers.append(("CUDAExecutionProvider", options))
        else:
            log.warning("model %r asks for KIND_GPU but ONNX Runtime has no CUDA provider "
                        "here; running on CPU", spec.name)
    providers.append("CPUExecutionProvider")
    return providers


class OnnxRuntimeBackend(Backend):
    """One model instance running in its own ``InferenceSession``.

        backend = OnnxRuntimeBackend(InstanceSpec("mlp", Path("repo/mlp/1/model.onnx")))
        backend.run({"INPUT0": x}, ["OUTPUT0"])
    """

    inline = True  # a session run is computation alone

    def __init__(self, spec: InstanceSpec) -> None:
        self.path = model_path = spec.path
        try:
            self.session = ort.InferenceSession(
                str(model_path),
                sess_options=session_options(spec),
                providers=execution_providers(spec),
            )
        except (ort.capi.onnxruntime_pybind11_state.Fail,
                ort.capi.onnxruntime_pybind11_state.InvalidGraph,
                ort.capi.onnxruntime_pybind11_state.InvalidProtobuf,
                ort.capi.onnxruntime_pybind11_state.NoSuchFile,
                RuntimeError) as exc:
            raise ModelLoadError(f"{model_path}: ONNX Runtime cannot load it: {exc}") from exc
        self._bf16 = {i.name for i in self.session.get_inputs() if i.type == "tensor(bfloat16)"}
        self._bf16_out = {o.name for o in self.session.get_outputs()
                          if o.type == "tensor(bfloat16)"}
        self._strings = {i.name for i in self.session.get_inputs() if i.type == "tensor(string)"}

    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        feed: dict[str, object] = {}
        for name, array in inputs.items():
            if name in self._bf16:
                feed[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array), onnx.TensorProto.BFLOAT16)
            elif name in self._strings:
                feed[name] = utf8_strings(name, array)
            else:
                feed[name] = array
        names = list(output_names)
        if self._bf16_out.intersection(names):
            values = self.session.run_with_ort_values(names, feed)
            return {n: self._from_ort_value(n, v) for n, v in zip(names, values, strict=True)}
        results = self.session.run(names, feed)
        return dict(zip(names, results, strict=True))

    def _from_ort_value(self, name: str, value: ort.OrtValue) -> np.ndarray:
        if name in self._bf16_out:
            return _bf16_bits(value)
        return value.numpy()

    def close(self) -> None:
        del self.session


def _not_utf8(name: str, index: int, exc: UnicodeDecodeError) -> InvalidInput:
    return InvalidInput(f"input {name!r}: BYTES element {index} is not UTF-8 text "
                        f"({exc.reason} at byte {exc.start}); ONNX string tensors hold "
                        "UTF-8 only")


def check_utf8(name: str, array: np.ndarray) -> None:
    """Refuse BYTES elements that are not UTF-8 text, which ONNX string tensors hold."""
    for i, element in enumerate(array.reshape(-1)):
        if isinstance(element, bytes):
            try:
                element.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise _not_utf8(name, i, exc) from None


def utf8_strings(name: str, array: np.ndarray) -> np.ndarray:
    """BYTES elements (``bytes``) as the ``str`` elements ONNX string tensors hold.

    Decoded as UTF-8 explicitly: ``astype(str)`` on an object array decodes as ASCII.
    """
    if array.dtype != object:
        return array
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, element in enumerate(flat):
        if not isinstance(element, bytes):
            out[i] = element
            continue
        try:
            out[i] = element.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise _not_utf8(name, i, exc) from None
    return out.reshape(array.shape)


def _bf16_bits(value: ort.OrtValue) -> np.ndarray:
    """Copy a bfloat16 OrtValue out as its 16-bit patterns (numpy has no bfloat16)."""
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if count == 0:
        return np.zeros(shape, np.uint16)
    buffer = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(buffer).copy().reshape(shape)


BACKEND = TensorBackendType(name="onnxruntime", platforms=("onnxruntime_onnx",),
                            default_filename="model.onnx", describe=describe,
                            create=OnnxRuntimeBackend, check_bytes=check_utf8)
