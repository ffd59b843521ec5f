"""Tensor data types: Open Inference Protocol names, Triton config names, numpy and ONNX.

The protocol name (``FP32``) is the canonical one inside tradeoff. BYTES tensors are numpy
object arrays of ``bytes``. BF16 travels as its raw 16-bit pattern in a ``uint16`` array,
because numpy has no bfloat16 of its own.
"""

from __future__ import annotations

import numpy as np

from tradeoff.errors import InvalidValue

__all__ = [
    "DATATYPES",
    "datatype_of",
    "element_size",
    "from_config_type",
    "from_onnx",
    "from_ort",
    "from_torch_name",
    "numpy_dtype",
    "to_config_type",
    "to_onnx",
]

# protocol name -> numpy dtype (BF16 is carried as its bit pattern)
_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(np.uint16),
    "BYTES": np.dtype(object),
}

# ONNX's TensorProto.DataType codes (fixed by the ONNX standard; written out so that the
# server and the clients do not import onnx, 50 ms a process)
_ONNX: dict[int, str] = {
    9: "BOOL", 2: "UINT8", 4: "UINT16", 12: "UINT32", 13: "UINT64", 3: "INT8", 5: "INT16",
    6: "INT32", 7: "INT64", 10: "FP16", 1: "FP32", 11: "FP64", 16: "BF16", 8: "BYTES",
}
_ONNX_BY_NAME = {name: code for code, name in _ONNX.items()}

# ONNX Runtime's type strings, as InferenceSession.get_inputs() reports them
_ORT = {f"tensor({s})": n for s, n in [
    ("bool", "BOOL"), ("uint8", "UINT8"), ("uint16", "UINT16"), ("uint32", "UINT32"),
    ("uint64", "UINT64"), ("int8", "INT8"), ("int16", "INT16"), ("int32", "INT32"),
    ("int64", "INT64"), ("float16", "FP16"), ("float", "FP32"), ("double", "FP64"),
    ("bfloat16", "BF16"), ("string", "BYTES"),
]}

# torch dtype names (str(torch.float32) without "torch.") -> protocol name
_TORCH = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32",
          "uint64": "UINT64", "int8": "INT8", "int16": "INT16", "int32": "INT32",
          "int64": "INT64", "float16": "FP16", "float32": "FP32", "float64": "FP64",
          "bfloat16": "BF16"}

_NUMPY_TO_NAME = {dt: name for name, dt in _NUMPY.items() if name != "BF16"}

DATATYPES = tuple(_NUMPY)


def numpy_dtype(datatype: str) -> np.dtype:
    """numpy dtype that holds tensors of protocol ``datatype`` (``"FP32"`` -> float32)."""
    try:
        return _NUMPY[datatype]
    except KeyError:
        raise InvalidValue(
            f"unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}"
        ) from None


def element_size(datatype: str) -> int:
    """Bytes per element in the binary encoding; 0 for BYTES (variable length)."""
    return 0 if datatype == "BYTES" else numpy_dtype(datatype).itemsize


def datatype_of(array: np.ndarray) -> str:
    """Protocol name of a numpy array's dtype; str/bytes/object arrays are BYTES."""
    if array.dtype.kind in "OSU":
        return "BYTES"
    try:
        return _NUMPY_TO_NAME[array.dtype]
    except KeyError:
        raise InvalidValue(f"numpy dtype {array.dtype} has no protocol datatype") from None


def from_config_type(config_type: str) -> str:
    """Triton config name -> protocol name (``TYPE_STRING`` -> ``BYTES``)."""
    name = config_type.removeprefix("TYPE_")
    return "BYTES" if name == "STRING" else name


def to_config_type(datatype: str) -> str:
    """Protocol name -> Triton config name (``BYTES`` -> ``TYPE_STRING``)."""
    return "TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}"


def from_onnx(elem_type: int) -> str:
    """ONNX TensorProto element type -> protocol name."""
    try:
        return _ONNX[elem_type]
    except KeyError:
        raise InvalidValue(f"ONNX element type {elem_type} is not supported") from None


def to_onnx(datatype: str) -> int:
    """Protocol name -> ONNX TensorProto element type."""
    return _ONNX_BY_NAME[datatype]


def from_ort(type_string: str) -> str:
    """ONNX Runtime type string (``tensor(float)``) -> protocol name."""
    try:
        return _ORT[type_string]
    except KeyError:
        raise InvalidValue(f"ONNX Runtime type {type_string} is not supported") from None


def from_torch_name(name: str) -> str | None:
    """The protocol name of a torch dtype named without its ``torch.`` prefix; None when
    the protocol has none (complex, float8)."""
    return _TORCH.get(name)
