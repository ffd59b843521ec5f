"""Open Inference Protocol v2 request and response bodies, JSON and binary tensors.

Tensor data goes straight into numpy: binary tensors with ``np.frombuffer`` (no copy),
JSON ``data`` with one ``np.asarray`` call. Only BYTES elements, whose lengths vary,
are walked one by one.

    request = decode_request(body, header_length=None)
    body, json_length = encode_response("mlp", "1", request.id, outputs)

A gateway sends a request on, and reads the answer back, with the other two:

    body, json_length = encode_request(request)          # binary tensors, binary outputs
    answer = decode_response(body, json_length)          # V2Response
"""

from __future__ import annotations

import functools
import struct
import sys
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson

from tradeoff import dtypes
from tradeoff.errors import InvalidInput
from tradeoff.protocol.limits import DEFAULT_LIMITS, RequestLimits

__all__ = [
    "CACHED_HEADER_BYTES",
    "RelayedAnswer",
    "RequestedOutput",
    "TensorInput",
    "TensorOutput",
    "V2Request",
    "V2Response",
    "bf16_to_float32",
    "decode_binary_tensor",
    "decode_bytes_elements",
    "decode_request",
    "decode_response",
    "encode_bytes_elements",
    "encode_relayed",
    "encode_request",
    "encode_response",
    "parse_json_object",
    "read_relayed",
    "tensor_bytes",
]

_LITTLE_ENDIAN = sys.byteorder == "little"
_U32 = struct.Struct("<I")




@dataclass(slots=True)
class TensorInput:
    name: str
    datatype: str
    shape: tuple[int, ...]
    array: np.ndarray


@dataclass(slots=True)
class RequestedOutput:
    name: str
    binary: bool | None = None  # None: use the request's binary_data_output


@dataclass(slots=True)
class V2Request:
    id: str | None
    inputs: list[TensorInput]
    outputs: list[RequestedOutput] | None
    parameters: dict[str, Any] = field(default_factory=dict)
    # the kept JSON header it was decoded from: every request with this header has the
    # same names, datatypes, shapes, outputs and parameters (None: not kept)
    header: Any = None
    # who asked: the API key's digest, set by the transport after its check (b"": keys off)
    tenant: bytes = b""
    # the body it was decoded from and its JSON header's length (the binary extension's,
    # None: all JSON), when it may be passed on as it is (a gateway's v2 pools)
    wire: tuple[bytes, int | None] | None = None

    @property
    def binary_output(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))

    def binary_for(self, output: str) -> bool:
        """Whether ``output`` goes back as binary data: as its own entry says, else as
        ``binary_data_output`` does."""
        for requested in self.outputs or ():
            if requested.name == output and requested.binary is not None:
                return requested.binary
        return self.binary_output


@dataclass(slots=True)
class RelayedAnswer:
    """An infer answer passed on as it came, but for its JSON header: ``header`` (the
    JSON object, read) and ``tail`` (the binary outputs after it, if any)."""

    header: dict[str, Any]
    tail: memoryview
    binary: bool  # sent with the binary extension (an Inference-Header-Content-Length)


@dataclass(slots=True)
class TensorOutput:
    name: str
    array: np.ndarray
    datatype: str
    binary: bool = False


def _shape(value: Any, where: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise InvalidInput(f"{where}: 'shape' must be a list of non-negative integers, "
                           f"got {value!r}")
    return tuple(value)


def _element_count(shape: tuple[int, ...]) -> int:
    count = 1
    for d in shape:
        count *= d
    return count


def _reshape(array: np.ndarray, shape: tuple[int, ...], where: str) -> np.ndarray:
    try:
        return array.reshape(shape)
    except ValueError as exc:  # e.g. [0, 2**62, 2**62]: no elements, but too big for numpy
        raise InvalidInput(f"{where}: shape {list(shape)} is too large: {exc}") from None


def decode_bytes_elements(raw: memoryview, count: int, where: str,
                          max_element: int = DEFAULT_LIMITS.max_bytes_element) -> np.ndarray:
    """BYTES binary layout: each element is a little-endian u32 length, then the bytes."""
    size = len(raw)
    if 4 * count > size:  # check before allocating: a huge shape must not allocate
        raise InvalidInput(f"{where}: {count} BYTES elements need at least {4 * count} bytes"
                           f" of lengths, got {size}")
    uniform = _uniform_bytes_elements(raw, count, where, max_element)
    if uniform is not None:
        return uniform
    out = np.empty(count, dtype=object)
    offset = 0
    for i in range(count):
        if offset + 4 > size:
            raise InvalidInput(f"{where}: BYTES data ends inside the length of element {i}")
        (length,) = _U32.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise InvalidInput(f"{where}: BYTES element {i} claims {length} bytes but only "
                               f"{size - offset} remain")
        if length > max_element:
            raise InvalidInput(f"{where}: BYTES element {i} has {length} bytes, over the "
                               f"limit of {max_element} (--max-bytes-element)")
        out[i] = bytes(raw[offset:offset + length])
        offset += length
    if offset != size:
        raise InvalidInput(f"{where}: {size - offset} bytes left over after {count} BYTES "
                           "elements")
    return out


def _uniform_bytes_elements(raw: memoryview, count: int, where: str,
                            max_element: int) -> np.ndarray | None:
    """The elements of a BYTES buffer whose elements all have the first one's length,
    split without a Python loop; None when the lengths differ."""
    size = len(raw)
    if count == 0 or size % count:
        return None
    stride = size // count
    length = stride - 4
    if length < 0 or _U32.unpack_from(raw, 0)[0] != length:
        return None
    rows = np.frombuffer(raw, dtype=np.uint8).reshape(count, stride)
    if not (rows[:, :4].copy().view("<u4") == length).all():
        return None
    if length > max_element:
        raise InvalidInput(f"{where}: BYTES element 0 has {length} bytes, over the "
                           f"limit of {max_element} (--max-bytes-element)")
    out = np.empty(count, dtype=object)
    if length == 0:
        out.fill(b"")
    else:  # void items convert to bytes objects in C
        out[:] = np.ascontiguousarray(rows[:, 4:]).view(f"V{length}").reshape(-1).tolist()
    return out


def encode_bytes_elements(array: np.ndarray) -> bytes:
    """The BYTES binary layout of an array of bytes/str elements."""
    parts = []
    for element in array.reshape(-1):
        data = element.encode() if isinstance(element, str) else bytes(element)
        parts.append(_U32.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def decode_binary_tensor(raw: memoryview, datatype: str, shape: tuple[int, ...],
                         where: str, limits: RequestLimits = DEFAULT_LIMITS) -> np.ndarray:
    count = _element_count(shape)
    if datatype == "BYTES":
        return _reshape(decode_bytes_elements(raw, count, where, limits.max_bytes_element),
                        shape, where)
    dtype = dtypes.numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidInput(f"{where}: binary_data_size is {len(raw)} bytes but shape "
                           f"{list(shape)} of {datatype} needs {expected}")
    array = np.frombuffer(raw, dtype=dtype if _LITTLE_ENDIAN else dtype.newbyteorder("<"))
    return _reshape(array, shape, where)


def _bf16_from_floats(values: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, rounding to nearest even."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + np.uint32(0x7FFF)
    return ((bits + rounding) >> 16).astype(np.uint16)


def bf16_to_float32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _exact_ints(data: Any, raw: np.ndarray, where: str, datatype: str) -> np.ndarray:
    """numpy reads ``[1, 2**64 - 1]`` as float64 (int64 and uint64 promote to it), which
    loses the value; when every element is an integer, read them again exactly."""
    exact = np.asarray(data, dtype=object)
    if exact.shape != raw.shape or not all(type(e) is int for e in exact.flat):
        return raw  # real floats: the caller rejects them for an integer datatype
    try:
        return exact.astype(np.uint64 if exact.min() >= 0 else np.int64)
    except OverflowError:
        raise InvalidInput(f"{where}: values out of range for {datatype}") from None


def _json_depth(data: Any, limit: int, where: str) -> None:
    """Refuse data nested deeper than ``limit`` (walks the first element of each level)."""
    depth = 0
    while isinstance(data, list):
        depth += 1
        if depth > limit:
            raise InvalidInput(f"{where}: 'data' is nested more than {limit} lists deep "
                               "(--max-json-depth)")
        data = data[0] if data else None


def _decode_json_data(data: Any, datatype: str, shape: tuple[int, ...],
                      where: str, limits: RequestLimits = DEFAULT_LIMITS) -> np.ndarray:
    count = _element_count(shape)
    _json_depth(data, limits.max_json_depth, where)
    try:
        if datatype == "BYTES":
            flat = np.asarray(data, dtype=object).reshape(-1)
            if flat.size and not all(isinstance(e, str) for e in flat):
                raise InvalidInput(f"{where}: BYTES data must be strings")
            longest = max((len(e) for e in flat), default=0)
            if longest > limits.max_bytes_element:
                raise InvalidInput(f"{where}: a BYTES element has {longest} characters, over "
                                   f"the limit of {limits.max_bytes_element} "
                                   "(--max-bytes-element)")
            array = flat
        elif datatype == "BF16":
            raw = np.asarray(data)  # not dtype=float32: that would read null as NaN, "1" as 1
            if raw.size and raw.dtype.kind not in "iuf":
                raise InvalidInput(f"{where}: data does not hold BF16 values "
                                   f"(found {raw.dtype.name})")
            with np.errstate(over="raise"):
                array = _bf16_from_floats(raw.astype(np.float32).reshape(-1))
        elif datatype == "BOOL":
            array = np.asarray(data)
            if array.size and array.dtype != np.bool_:
                raise InvalidInput(f"{where}: BOOL data must be true/false, got {array.dtype}")
            array = array.astype(np.bool_).reshape(-1)
        else:
            dtype = dtypes.numpy_dtype(datatype)
            raw = np.asarray(data)
            if raw.size and raw.dtype.kind == "f" and dtype.kind in "iu":
                raw = _exact_ints(data, raw, where, datatype)
            if raw.size and (raw.dtype.kind not in "iuf"
                             or (dtype.kind in "iu" and raw.dtype.kind == "f")):
                raise InvalidInput(f"{where}: data does not hold {datatype} values "
                                   f"(found {raw.dtype.name})")
            with np.errstate(over="raise"):  # 1e300 as FP32 is an error, not inf
                array = raw.astype(dtype).reshape(-1)
            if dtype.kind in "iu" and raw.size and not np.array_equal(raw.reshape(-1), array):
                raise InvalidInput(f"{where}: values out of range for {datatype}")
    except InvalidInput:
        raise
    except FloatingPointError:
        raise InvalidInput(f"{where}: values out of range for {datatype}") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as exc:
        raise InvalidInput(f"{where}: 'data' cannot be read as {datatype} with shape "
                           f"{list(shape)}: {exc}") from None
    if array.size != count:
        raise InvalidInput(f"{where}: 'data' has {array.size} elements but shape "
                           f"{list(shape)} needs {count}")
    if datatype == "BYTES":
        array = np.array([s.encode() for s in array], dtype=object) if count else array
    return _reshape(array, shape, where)


def parse_json_object(data: bytes | memoryview | str, what: str, hint: str = "") -> dict:
    """``data`` as a JSON object, or InvalidInput saying what was wrong with ``what``."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(doc, dict):
        raise InvalidInput(f"{what} must be a JSON object" + (f" {hint}" if hint else ""))
    return doc


def decode_request(body: bytes, header_length: int | None = None,
                   limits: RequestLimits = DEFAULT_LIMITS) -> V2Request:
    """Parse an infer request; ``header_length`` is ``Inference-Header-Content-Length``."""
    view = memoryview(body)
    if header_length is not None:
        if header_length < 0 or header_length > len(body):
            raise InvalidInput(f"Inference-Header-Content-Length is {header_length} but the "
                               f"body has {len(body)} bytes")
        binary = view[header_length:]
        if header_length <= CACHED_HEADER_BYTES:
            key = bytes(body[:header_length])
            if b'"data"' not in key:  # JSON tensors are values: not kept
                # clients send the same JSON header again and again; the tensors change
                return _cached_header(key, len(binary), limits).decode(binary, limits, True)
        header = view[:header_length]
    else:
        header, binary = view, view[len(view):]
    return _parse_header(header, len(binary), header_length is not None,
                         limits).decode(binary, limits)


# JSON headers of binary requests up to this size are parsed once and kept (LRU)
CACHED_HEADER_BYTES = 4096


@dataclass(frozen=True, slots=True)
class _InputSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]
    offset: int  # binary data: where it starts in the binary part, and its size
    size: int | None  # None: JSON data
    data: Any = None
    where: str = ""  # how an error names it
    dtype: np.dtype | None = None  # binary data of a fixed-size datatype, its size checked
    count: int = 0  # its elements (with dtype)


@dataclass(frozen=True, slots=True, eq=False)  # compared and hashed by identity
class _Header:
    """An infer request's JSON, checked: everything but the tensors' values."""

    id: str | None
    inputs: tuple[_InputSpec, ...]
    outputs: tuple[RequestedOutput, ...] | None
    parameters: dict[str, Any]

    def decode(self, binary: memoryview, limits: RequestLimits, kept: bool = False
               ) -> V2Request:
        """The request with these tensors (a new request each time: nothing shared)."""
        inputs = []
        for spec in self.inputs:
            if spec.dtype is not None:  # the shape fits the bytes: checked with the header
                array = _reshape(np.frombuffer(binary, spec.dtype, spec.count, spec.offset),
                                 spec.shape, spec.where)
            elif spec.size is None:
                array = _decode_json_data(spec.data, spec.datatype, spec.shape, spec.where,
                                          limits)
            else:
                array = decode_binary_tensor(binary[spec.offset:spec.offset + spec.size],
                                             spec.datatype, spec.shape, spec.where, limits)
            inputs.append(TensorInput(spec.name, spec.datatype, spec.shape, array))
        outputs = None if self.outputs is None else \
            [RequestedOutput(o.name, o.binary) for o in self.outputs]
        return V2Request(self.id, inputs, outputs, dict(self.parameters),
                         self if kept else None)


# The infer request's JSON fields as this module reads them, with their JSON schemas:
# server/openapi.py describes the request from these, and tests/unit/test_request_fields.py
# checks that every key the decoder (and the data plane's checks) read is one of them.
REQUEST_PARAMETERS: dict[str, Any] = {
    "binary_data_output": {"type": "boolean", "description": "outputs as binary data"},
    "priority": {"type": "integer", "minimum": 0,
                 "description": "queue priority (the model's priority_levels)"},
    "timeout": {"type": "integer", "minimum": 0, "description": "queue timeout, µs"},
    "cache": {"type": "boolean", "description": "false: skip the response cache"},
    "class": {"type": "string", "description": "a router's request class"},
}
INPUT_FIELDS: dict[str, Any] = {
    "name": {"type": "string"},
    "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}},
    "datatype": {"type": "string", "enum": list(dtypes.DATATYPES)},
    "parameters": {"type": "object", "properties": {
        "binary_data_size": {"type": "integer", "minimum": 0}}},
    "data": {"type": "array", "items": {}},
}
OUTPUT_FIELDS: dict[str, Any] = {
    "name": {"type": "string"},
    "parameters": {"type": "object", "properties": {"binary_data": {"type": "boolean"}}},
}
REQUEST_FIELDS: dict[str, Any] = {
    "id": {"type": "string"},
    "parameters": {"type": "object", "properties": REQUEST_PARAMETERS},
    "inputs": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["name", "shape", "datatype"],
        "properties": INPUT_FIELDS}},
    "outputs": {"type": "array", "items": {
        "type": "object", "required": ["name"], "properties": OUTPUT_FIELDS}},
}
REFUSED_PARAMETERS = ("classification",)  # read only to refuse them: not in the schema

def _parse_header(header: bytes | memoryview, binary_size: int, has_binary_header: bool,
                  limits: RequestLimits) -> _Header:
    doc = parse_json_object(header, "request body", "with 'inputs'")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    parameters = doc.get("parameters") or {}
    if not isinstance(parameters, dict):
        raise InvalidInput("'parameters' must be a JSON object")
    raw_inputs = doc.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise InvalidInput("'inputs' must be a non-empty list of tensors")
    if len(raw_inputs) > limits.max_inputs:
        raise InvalidInput(f"{len(raw_inputs)} inputs is over the limit of "
                           f"{limits.max_inputs} (--max-inputs)")

    inputs: list[_InputSpec] = []
    offset = 0
    for index, item in enumerate(raw_inputs):
        if not isinstance(item, dict):
            raise InvalidInput(f"inputs[{index}] must be a JSON object")
        name = item.get("name")
        if not isinstance(name, str) or not name:
            raise InvalidInput(f"inputs[{index}]: 'name' must be a non-empty string")
        where = f"input {name!r}"
        datatype = item.get("datatype")
        if datatype not in dtypes.DATATYPES:
            raise InvalidInput(f"{where}: unknown datatype {datatype!r}; expected one of "
                               f"{', '.join(dtypes.DATATYPES)}")
        shape = _shape(item.get("shape"), where)
        if len(shape) > limits.max_json_depth or _element_count(shape) > limits.max_elements:
            raise InvalidInput(f"{where}: shape {list(shape)} is over the limit of "
                               f"{limits.max_elements} elements and {limits.max_json_depth} "
                               "dimensions (--max-tensor-elements, --max-json-depth)")
        params = item.get("parameters") or {}
        if not isinstance(params, dict):
            raise InvalidInput(f"{where}: 'parameters' must be a JSON object")
        size = params.get("binary_data_size")
        if size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidInput(f"{where}: binary_data_size must be a non-negative integer")
            if not has_binary_header:
                raise InvalidInput(f"{where}: binary_data_size given but the request has no "
                                   "Inference-Header-Content-Length header")
            if "data" in item:
                raise InvalidInput(f"{where}: has both 'data' and binary_data_size; give one")
            if offset + size > binary_size:
                raise InvalidInput(f"{where}: binary_data_size {size} runs past the end of the"
                                   f" body ({binary_size - offset} bytes left)")
            dtype = None
            if datatype != "BYTES":  # its size depends on the elements: checked on decoding
                dtype = dtypes.numpy_dtype(datatype)
                expected = _element_count(shape) * dtype.itemsize
                if size != expected:
                    raise InvalidInput(f"{where}: binary_data_size is {size} bytes but shape "
                                       f"{list(shape)} of {datatype} needs {expected}")
                dtype = dtype if _LITTLE_ENDIAN else dtype.newbyteorder("<")
            inputs.append(_InputSpec(name, datatype, shape, offset, size, None, where, dtype,
                                     _element_count(shape)))
            offset += size
        elif "data" in item:
            inputs.append(_InputSpec(name, datatype, shape, 0, None, item["data"], where))
        else:
            raise InvalidInput(f"{where}: has neither 'data' nor a binary_data_size parameter")
    if offset != binary_size:
        raise InvalidInput(f"the body has {binary_size - offset} bytes of binary data that no "
                           "input claims (check binary_data_size)")

    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise InvalidInput("parameter 'binary_data_output' must be true or false")
    outputs = None
    raw_outputs = doc.get("outputs")
    if raw_outputs:  # absent or empty: every output, as in Triton
        if not isinstance(raw_outputs, list):
            raise InvalidInput("'outputs' must be a list")
        outputs = []
        seen: set[str] = set()
        for index, item in enumerate(raw_outputs):
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                raise InvalidInput(f"outputs[{index}] must be an object with a 'name'")
            params = item.get("parameters") or {}
            if not isinstance(params, dict):
                raise InvalidInput(f"outputs[{index}]: 'parameters' must be a JSON object")
            if "classification" in params:
                raise InvalidInput(f"output {item['name']!r}: the classification extension "
                                   "is not supported")
            binary_flag = params.get("binary_data")
            if binary_flag is not None and not isinstance(binary_flag, bool):
                raise InvalidInput(f"output {item['name']!r}: binary_data must be true or false")
            if item["name"] in seen:
                raise InvalidInput(f"output {item['name']!r} is requested twice")
            seen.add(item["name"])
            outputs.append(RequestedOutput(item["name"], binary_flag))
    return _Header(request_id, tuple(inputs), None if outputs is None else tuple(outputs),
                   parameters)


@functools.lru_cache(maxsize=512)
def _cached_header(header: bytes, binary_size: int, limits: RequestLimits) -> _Header:
    return _parse_header(header, binary_size, True, limits)


def _json_data(array: np.ndarray, datatype: str) -> Any:
    flat = np.ascontiguousarray(array).reshape(-1)
    if datatype == "BYTES":
        return [e.decode("utf-8", "replace") if isinstance(e, bytes) else str(e) for e in flat]
    if datatype == "BF16":
        return bf16_to_float32(flat)
    return flat


def tensor_bytes(array: np.ndarray, datatype: str) -> bytes | memoryview:
    """A tensor's bytes in the binary extension's layout (gRPC's raw contents too)."""
    if datatype == "BYTES":
        return encode_bytes_elements(array)
    array = np.ascontiguousarray(array)
    if not _LITTLE_ENDIAN:
        array = array.astype(array.dtype.newbyteorder("<"))
    # a flat uint8 view, not memoryview.cast: cast refuses empty arrays
    return array.reshape(-1).view(np.uint8).data


def encode_response(model_name: str, model_version: str, request_id: str | None,
                    outputs: list[TensorOutput],
                    parameters: dict[str, Any] | None = None) -> tuple[bytes, int | None]:
    """Response body, and the JSON header length when any output is binary."""
    entries = []
    blobs: list[bytes | memoryview] = []
    for out in outputs:
        entry: dict[str, Any] = {"name": out.name, "datatype": out.datatype,
                                 "shape": list(out.array.shape)}
        if out.binary:
            blob = tensor_bytes(out.array, out.datatype)
            entry["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            entry["data"] = _json_data(out.array, out.datatype)
        entries.append(entry)
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id is not None:
        doc["id"] = request_id
    if parameters:
        doc["parameters"] = parameters
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=orjson.OPT_SERIALIZE_NUMPY)
    if not blobs:
        return header, None
    return b"".join([header, *blobs]), len(header)


def read_relayed(body: bytes, header_length: int | None) -> RelayedAnswer:
    """An infer answer to pass on (``header_length``: its Inference-Header-Content-Length):
    its JSON header read and its binary outputs checked to fill the rest exactly;
    InvalidInput saying what is wrong. The tensors are not decoded."""
    view, end, doc, outputs = _answer_json(body, header_length)
    if not all(isinstance(o, dict) for o in outputs):
        raise InvalidInput("the answer has no 'outputs' list")
    sizes = [_output_parameters(o, f"outputs[{i}]").get("binary_data_size", 0)
             for i, o in enumerate(outputs)]
    if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in sizes) \
            or sum(sizes) != len(body) - end:
        raise InvalidInput(f"the answer's binary_data_size values {sizes} do not add up "
                           f"to its {len(body) - end} bytes of binary data")
    return RelayedAnswer(doc, view[end:], header_length is not None)


def _answer_json(body: bytes, header_length: int | None
                 ) -> tuple[memoryview, int, dict[str, Any], list[Any]]:
    """An infer answer's JSON read: the body's view, where its JSON ends, the JSON object
    and its ``outputs`` list; InvalidInput saying what is wrong."""
    if header_length is not None and not 0 <= header_length <= len(body):
        raise InvalidInput(f"Inference-Header-Content-Length is {header_length} but the "
                           f"answer has {len(body)} bytes")
    end = len(body) if header_length is None else header_length
    view = memoryview(body)
    doc = parse_json_object(view[:end], "the answer")
    outputs = doc.get("outputs")
    if not isinstance(outputs, list):
        raise InvalidInput("the answer has no 'outputs' list")
    return view, end, doc, outputs


def _output_parameters(entry: dict[str, Any], where: str) -> dict[str, Any]:
    """An answer's output entry's parameters ({} when it has none)."""
    parameters = entry.get("parameters")
    if not parameters:
        return {}
    if not isinstance(parameters, dict):
        raise InvalidInput(f"{where}: 'parameters' must be a JSON object")
    return parameters


def encode_relayed(answer: RelayedAnswer, model_name: str,
                   parameters: dict[str, Any] | None = None) -> tuple[bytes, int | None]:
    """A relayed answer's body as this server's (its ``model_name``, and ``parameters``
    added to its own), and its JSON header's length when it is binary."""
    doc = answer.header
    doc["model_name"] = model_name
    if parameters:
        own = doc.get("parameters")
        doc["parameters"] = {**own, **parameters} if isinstance(own, dict) else parameters
    header = orjson.dumps(doc)
    if not answer.binary:
        return header, None
    return b"".join((header, answer.tail)), len(header)


def encode_request(request: V2Request, parameters: dict[str, Any] | None = None
                   ) -> tuple[bytes, int]:
    """An infer request's body with every input binary, and its JSON header's length (the
    Inference-Header-Content-Length). Every output asked for comes back binary.
    ``parameters``: the request's parameters to send (default: its own)."""
    entries = []
    blobs: list[bytes | memoryview] = []
    for tensor in request.inputs:
        blob = tensor_bytes(tensor.array, tensor.datatype)
        entries.append({"name": tensor.name, "datatype": tensor.datatype,
                        "shape": list(tensor.shape),
                        "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    sent = dict(request.parameters if parameters is None else parameters)
    sent.pop("binary_data_output", None)
    doc: dict[str, Any] = {"inputs": entries}
    if request.id is not None:
        doc["id"] = request.id
    if request.outputs is None:
        sent["binary_data_output"] = True
    else:
        doc["outputs"] = [{"name": o.name, "parameters": {"binary_data": True}}
                          for o in request.outputs]
    if sent:
        doc["parameters"] = sent
    header = orjson.dumps(doc)
    return b"".join([header, *blobs]), len(header)


@dataclass(slots=True)
class V2Response:
    """An infer answer read back: the version that answered, its outputs, and its
    parameters."""

    model_version: str
    outputs: list[TensorOutput]
    parameters: dict[str, Any]


def decode_response(body: bytes, header_length: int | None = None,
                    limits: RequestLimits = DEFAULT_LIMITS) -> V2Response:
    """Read an infer response (``header_length``: its Inference-Header-Content-Length);
    InvalidInput saying what is wrong with it."""
    view, end, doc, raw_outputs = _answer_json(body, header_length)
    outputs = []
    offset = end
    for index, raw in enumerate(raw_outputs):
        where = f"outputs[{index}]"
        if not isinstance(raw, dict) or not isinstance(raw.get("name"), str) or \
                not isinstance(raw.get("datatype"), str):
            raise InvalidInput(f"{where}: needs a name and a datatype")
        datatype = raw["datatype"]
        if datatype not in dtypes.DATATYPES:
            raise InvalidInput(f"{where}: unknown datatype {datatype!r}")
        shape = _shape(raw.get("shape"), where)
        if _element_count(shape) > limits.max_elements:
            raise InvalidInput(f"{where}: shape {list(shape)} is over the limit of "
                               f"{limits.max_elements} elements")
        size = _output_parameters(raw, where).get("binary_data_size")
        if size is not None:
            if isinstance(size, bool) or not isinstance(size, int) or \
                    not 0 <= size <= len(body) - offset:
                raise InvalidInput(f"{where}: binary_data_size {size!r} does not fit the "
                                   "answer")
            array = decode_binary_tensor(view[offset:offset + size], datatype, shape,
                                         where, limits)
            offset += size
        elif "data" in raw:
            array = _decode_json_data(raw["data"], datatype, shape, where, limits)
        else:
            raise InvalidInput(f"{where}: has neither 'data' nor binary_data_size")
        outputs.append(TensorOutput(raw["name"], array, datatype))
    parameters = doc.get("parameters")
    return V2Response(str(doc.get("model_version", "")), outputs,
                      parameters if isinstance(parameters, dict) else {})
