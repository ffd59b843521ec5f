"""Open Inference Protocol v2 codec: JSON ``data`` and the binary tensor extension.

Requests are built here the way Triton's clients build them (JSON header, then raw tensor
bytes; BYTES as 4-byte little-endian length + bytes) and responses are read back the same
way, so the codec is checked against the wire format, not against itself.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from tradeoff import dtypes
from tradeoff.errors import InvalidInput
from tradeoff.protocol.v2 import (
    RequestedOutput,
    TensorInput,
    TensorOutput,
    V2Request,
    bf16_to_float32,
    decode_bytes_elements,
    decode_request,
    decode_response,
    encode_bytes_elements,
    encode_relayed,
    encode_request,
    encode_response,
    read_relayed,
)

NUMERIC = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
           "FP16", "FP32", "FP64", "BF16"]
ALL = [*NUMERIC, "BYTES"]
assert sorted(ALL) == sorted(dtypes.DATATYPES)


def bf16_bits(values: list[float]) -> np.ndarray:
    """Bit patterns of float32 values that bfloat16 holds exactly."""
    bits = np.array(values, dtype=np.float32).view(np.uint32)
    assert not (bits & 0xFFFF).any(), "value not exact in bfloat16"
    return (bits >> 16).astype(np.uint16)


def sample(datatype: str) -> np.ndarray:
    """A 2x3 tensor of ``datatype`` holding its extreme values."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    if datatype == "BYTES":
        return np.array([[b"", b"a", "h\u00e9llo".encode()], [b"\x00\x01", b"xyz" * 10, b" "]],
                        dtype=object)
    if datatype == "BF16":
        return bf16_bits([1.0, -2.5, 0.0, 3.140625, -65536.0, 2.0**-20]).reshape(2, 3)
    dtype = dtypes.numpy_dtype(datatype)
    if dtype.kind == "f":
        info = np.finfo(dtype)
        values = [0.0, -1.5, float(info.max), float(info.min), float(info.tiny), 0.1]
    else:
        info = np.iinfo(dtype)
        values = [0, 1, int(info.max), int(info.min), int(info.max) - 1, 7]
    return np.array(values, dtype=dtype).reshape(2, 3)


def le_bytes(array: np.ndarray, datatype: str) -> bytes:
    """The binary extension's bytes of a tensor, built without the codec."""
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(e)) + e for e in array.reshape(-1))
    return np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<")).tobytes()


def json_values(array: np.ndarray, datatype: str) -> Any:
    """``data`` as a JSON client writes it (nested lists, like ``array.tolist()``)."""
    if datatype == "BYTES":
        return np.vectorize(lambda b: b.decode(), otypes=[object])(array).tolist()
    if datatype == "BF16":
        return bf16_to_float32(array).tolist()
    return array.tolist()


def binary_request(tensors: dict[str, tuple[str, np.ndarray]], **extra: Any) -> tuple[bytes, int]:
    inputs, blobs = [], []
    for name, (datatype, array) in tensors.items():
        blob = le_bytes(array, datatype)
        inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                       "parameters": {"binary_data_size": len(blob)}})
        blobs.append(blob)
    header = json.dumps({"inputs": inputs, **extra}).encode()
    return header + b"".join(blobs), len(header)


def json_request(tensors: dict[str, tuple[str, np.ndarray]], flat: bool = False,
                 **extra: Any) -> bytes:
    inputs = []
    for name, (datatype, array) in tensors.items():
        data = json_values(array.reshape(-1) if flat else array, datatype)
        inputs.append({"name": name, "datatype": datatype, "shape": list(array.shape),
                       "data": data})
    return json.dumps({"inputs": inputs, **extra}).encode()


def read_response(body: bytes, header_length: int | None) -> tuple[dict, dict[str, np.ndarray]]:
    """Parse a response the way a client does; returns the JSON doc and the tensors."""
    header = body if header_length is None else body[:header_length]
    doc = json.loads(header)
    offset = len(header)
    tensors = {}
    for out in doc["outputs"]:
        datatype, shape = out["datatype"], tuple(out["shape"])
        size = out.get("parameters", {}).get("binary_data_size")
        if size is None:
            if datatype == "BYTES":
                flat = [s.encode() for s in np.array(out["data"], dtype=object).reshape(-1)]
                array = np.array(flat + [None], dtype=object)[:-1]
            elif datatype == "BF16":
                floats = np.array(out["data"], dtype=np.float32)
                array = (floats.view(np.uint32) >> 16).astype(np.uint16)
            else:
                array = np.array(out["data"], dtype=dtypes.numpy_dtype(datatype))
        else:
            raw = body[offset:offset + size]
            assert len(raw) == size
            offset += size
            if datatype == "BYTES":
                items, pos = [], 0
                while pos < len(raw):
                    (n,) = struct.unpack_from("<I", raw, pos)
                    items.append(raw[pos + 4:pos + 4 + n])
                    pos += 4 + n
                array = np.array(items + [None], dtype=object)[:-1]
            else:
                array = np.frombuffer(raw, dtype=dtypes.numpy_dtype(datatype).newbyteorder("<"))
        tensors[out["name"]] = array.reshape(shape)
    assert offset == len(body), "response has bytes that no output claims"
    return doc, tensors


def assert_same(actual: np.ndarray, expected: np.ndarray, datatype: str) -> None:
    assert actual.shape == expected.shape
    if datatype == "BYTES":
        assert actual.dtype == object
        assert actual.reshape(-1).tolist() == [bytes(e) for e in expected.reshape(-1)]
        return
    assert actual.dtype == dtypes.numpy_dtype(datatype)
    # bitwise: NaN == NaN, and -0.0 != 0.0
    assert actual.tobytes() == np.ascontiguousarray(expected).astype(actual.dtype).tobytes()


# -------------------------------------------------------------- request decoding


@pytest.mark.parametrize("datatype", ALL)
def test_decode_binary_every_datatype(datatype: str) -> None:
    array = sample(datatype)
    body, header_length = binary_request({"t": (datatype, array)})
    request = decode_request(body, header_length)
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("t", datatype, (2, 3))
    assert_same(tensor.array, array, datatype)


@pytest.mark.parametrize("flat", [False, True], ids=["nested", "flat"])
@pytest.mark.parametrize("datatype", ALL)
def test_decode_json_every_datatype(datatype: str, flat: bool) -> None:
    array = sample(datatype)
    if datatype == "BYTES":
        array = np.array([[b"", b"a", b"b c"], [b"\xc3\xa9", b"[]", b"\\"]], dtype=object)
    request = decode_request(json_request({"t": (datatype, array)}, flat=flat))
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("t", datatype, (2, 3))
    assert_same(tensor.array, array, datatype)


def test_decode_json_bf16_rounds_to_nearest_even() -> None:
    # 1 + 2**-8 lies halfway between two bfloat16 values: round to the even one (1.0)
    body = json_request({"t": ("FP32", np.array([1 + 2.0**-8, 1 + 3 * 2.0**-8],
                                                 dtype=np.float32))})
    body = body.replace(b'"FP32"', b'"BF16"')
    (tensor,) = decode_request(body).inputs
    assert bf16_to_float32(tensor.array).tolist() == [1.0, 1 + 2.0**-6]


def test_decode_mixed_binary_and_json_inputs_in_order() -> None:
    a, c = sample("INT32"), sample("FP64")
    blob_a, blob_c = le_bytes(a, "INT32"), le_bytes(c, "FP64")
    header = json.dumps({"id": "req-1", "inputs": [
        {"name": "a", "datatype": "INT32", "shape": [2, 3],
         "parameters": {"binary_data_size": len(blob_a)}},
        {"name": "b", "datatype": "BYTES", "shape": [2, 3], "data": [["x", "y", "z"]] * 2},
        {"name": "c", "datatype": "FP64", "shape": [2, 3],
         "parameters": {"binary_data_size": len(blob_c)}},
    ]}).encode()
    request = decode_request(header + blob_a + blob_c, len(header))
    assert request.id == "req-1"
    assert [t.name for t in request.inputs] == ["a", "b", "c"]
    assert_same(request.inputs[0].array, a, "INT32")
    assert request.inputs[1].array.tolist() == [[b"x", b"y", b"z"]] * 2
    assert_same(request.inputs[2].array, c, "FP64")


def test_binary_input_is_not_copied() -> None:
    body, header_length = binary_request({"t": ("FP32", np.arange(1024, dtype=np.float32))})
    (tensor,) = decode_request(body, header_length).inputs
    assert not tensor.array.flags.owndata


@pytest.mark.parametrize("shape", [[], [0], [4, 0, 2]])
def test_decode_scalar_and_empty_shapes(shape: list[int]) -> None:
    array = np.zeros(shape, dtype=np.float32) + 2.5
    body, header_length = binary_request({"t": ("FP32", array)})
    assert decode_request(body, header_length).inputs[0].array.shape == tuple(shape)
    (tensor,) = decode_request(json_request({"t": ("FP32", array)}, flat=True)).inputs
    assert tensor.array.shape == tuple(shape) and (tensor.array == 2.5).all()


def test_empty_bytes_tensor_binary() -> None:
    header = json.dumps({"inputs": [{"name": "s", "datatype": "BYTES", "shape": [0],
                                     "parameters": {"binary_data_size": 0}}]}).encode()
    (tensor,) = decode_request(header, len(header)).inputs
    assert tensor.array.shape == (0,) and tensor.array.dtype == object


def test_header_length_equal_to_body_without_binary_inputs() -> None:
    body = json_request({"t": ("INT8", np.array([1, 2], dtype=np.int8))})
    assert decode_request(body, len(body)).inputs[0].array.tolist() == [1, 2]


def test_json_ints_are_accepted_for_float_datatypes() -> None:
    body = json.dumps({"inputs": [{"name": "t", "datatype": "FP32", "shape": [3],
                                   "data": [1, 2.5, -3]}]}).encode()
    assert decode_request(body).inputs[0].array.tolist() == [1.0, 2.5, -3.0]


def test_requested_outputs_and_binary_flags() -> None:
    body = json_request({"t": ("INT32", np.array([1], dtype=np.int32))},
                        outputs=[{"name": "y", "parameters": {"binary_data": True}},
                                 {"name": "z", "parameters": {"binary_data": False}},
                                 {"name": "w"}],
                        parameters={"binary_data_output": True})
    request = decode_request(body)
    assert request.outputs == [RequestedOutput("y", True), RequestedOutput("z", False),
                               RequestedOutput("w", None)]
    assert request.binary_output


def test_no_requested_outputs_means_all_and_json() -> None:
    request = decode_request(json_request({"t": ("INT32", np.array([1], dtype=np.int32))}))
    assert request.outputs is None
    assert request.id is None
    assert not request.binary_output


# ---------------------------------------------------------------- malformed input


def doc(*inputs: dict, **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def tensor(datatype: str = "FP32", shape: Any = (2,), **fields: Any) -> dict:
    return {"name": "t", "datatype": datatype, "shape": list(shape) if isinstance(shape, tuple)
            else shape, **fields}


def with_binary(item: dict, blob: bytes, extra: bytes = b"", header_extra: int = 0
                ) -> tuple[bytes, int]:
    item = {**item, "parameters": {"binary_data_size": len(blob) + header_extra}}
    header = doc(item)
    return header + blob + extra, len(header)


def u32(n: int) -> bytes:
    return struct.pack("<I", n)


def whole(body: bytes) -> tuple[bytes, int]:
    """``body`` with an Inference-Header-Content-Length covering all of it."""
    return body, len(body)


MALFORMED: list[tuple[str, bytes, int | None, str]] = [
    ("bad json", b'{"inputs": [', None, "not valid JSON"),
    ("empty body", b"", None, "not valid JSON"),
    ("not utf-8", b'{"inputs": "\xff"}', None, "not valid JSON"),
    ("array body", b"[1, 2]", None, "must be a JSON object"),
    ("string body", b'"inputs"', None, "must be a JSON object"),
    ("missing inputs", b"{}", None, "'inputs' must be a non-empty list"),
    ("empty inputs", doc(), None, "'inputs' must be a non-empty list"),
    ("inputs not list", b'{"inputs": {"name": "t"}}', None, "'inputs' must be a non-empty list"),
    ("input not object", doc("t"), None, r"inputs\[0\] must be a JSON object"),
    ("missing name", doc({"datatype": "FP32", "shape": [1], "data": [1]}), None,
     r"inputs\[0\]: 'name' must be a non-empty string"),
    ("bad id", doc(tensor(data=[1, 2]), id=7), None, "'id' must be a string"),
    ("bad parameters", doc(tensor(data=[1, 2]), parameters=[1]), None,
     "'parameters' must be a JSON object"),
    ("bad input parameters", doc(tensor(data=[1, 2], parameters="x")), None,
     "input 't': 'parameters' must be a JSON object"),
    ("unknown datatype", doc(tensor("FP8", data=[1, 2])), None,
     "input 't': unknown datatype 'FP8'; expected one of BOOL, "),
    ("lower-case datatype", doc(tensor("fp32", data=[1, 2])), None, "unknown datatype 'fp32'"),
    ("missing datatype", doc({"name": "t", "shape": [1], "data": [1]}), None,
     "unknown datatype None"),
    ("negative shape", doc(tensor(shape=[-1], data=[1])), None,
     r"'shape' must be a list of non-negative integers, got \[-1\]"),
    ("float shape", doc(tensor(shape=[2.0], data=[1, 2])), None,
     "'shape' must be a list of non-negative integers"),
    ("bool shape", doc(tensor(shape=[True], data=[1])), None,
     "'shape' must be a list of non-negative integers"),
    ("shape not list", doc(tensor(shape=2, data=[1, 2])), None,
     "'shape' must be a list of non-negative integers"),
    ("missing shape", doc({"name": "t", "datatype": "FP32", "data": [1]}), None,
     "'shape' must be a list of non-negative integers, got None"),
    ("huge empty shape", doc(tensor(shape=[0, 2**62, 2**62], data=[])), None,
     "is too large"),
    ("huge empty binary shape", *with_binary(tensor(shape=[0, 2**62, 2**62]), b""),
     "is too large"),
    ("no data", doc(tensor()), None, "has neither 'data' nor a binary_data_size"),
    ("too little data", doc(tensor(shape=[3], data=[1, 2])), None,
     r"'data' has 2 elements but shape \[3\] needs 3"),
    ("too much nested data", doc(tensor(shape=[2], data=[[1, 2], [3, 4]])), None,
     r"'data' has 4 elements but shape \[2\] needs 2"),
    ("ragged numeric", doc(tensor("INT32", shape=[3], data=[[1], [2, 3]])), None,
     "'data' cannot be read as INT32"),
    ("ragged float", doc(tensor("FP64", shape=[3], data=[1.0, [2.0, 3.0]])), None,
     "'data' cannot be read as FP64"),
    ("ragged bool", doc(tensor("BOOL", shape=[3], data=[[True], [False, True]])), None,
     "'data' cannot be read as BOOL"),
    ("ragged bf16", doc(tensor("BF16", shape=[3], data=[[1.0], [2.0, 3.0]])), None,
     "'data' cannot be read as BF16"),
    ("ragged bytes", doc(tensor("BYTES", shape=[3], data=[["a"], ["b", "c"]])), None,
     "BYTES data must be strings"),
    ("uint8 too big", doc(tensor("UINT8", shape=[2], data=[1, 256])), None,
     "values out of range for UINT8"),
    ("int8 too small", doc(tensor("INT8", shape=[1], data=[-129])), None,
     "values out of range for INT8"),
    ("uint32 negative", doc(tensor("UINT32", shape=[1], data=[-1])), None,
     "values out of range for UINT32"),
    ("uint64 negative", doc(tensor("UINT64", shape=[1], data=[-1])), None,
     "values out of range for UINT64"),
    ("int64 too big", doc(tensor("INT64", shape=[1], data=[2**63])), None,
     "values out of range for INT64"),
    ("int16 from float", doc(tensor("INT16", shape=[1], data=[1.5])), None,
     "data does not hold INT16 values"),
    ("fp32 overflow", doc(tensor("FP32", shape=[1], data=[1e39])), None,
     "values out of range for FP32"),
    ("fp16 overflow", doc(tensor("FP16", shape=[1], data=[70000.0])), None,
     "values out of range for FP16"),
    ("bf16 overflow", doc(tensor("BF16", shape=[1], data=[1e39])), None,
     "values out of range for BF16"),
    ("null float", doc(tensor("FP32", shape=[1], data=[None])), None,
     "data does not hold FP32 values"),
    ("null bf16", doc(tensor("BF16", shape=[1], data=[None])), None,
     "data does not hold BF16 values"),
    ("string bf16", doc(tensor("BF16", shape=[1], data=["1.5"])), None,
     "data does not hold BF16 values"),
    ("string number", doc(tensor("INT32", shape=[1], data=["1"])), None,
     "data does not hold INT32 values"),
    ("object data", doc(tensor("INT32", shape=[1], data={"a": 1})), None,
     "data does not hold INT32 values"),
    ("bool from ints", doc(tensor("BOOL", shape=[2], data=[0, 1])), None,
     "BOOL data must be true/false"),
    ("bytes from numbers", doc(tensor("BYTES", shape=[1], data=[1])), None,
     "BYTES data must be strings"),
    ("header longer than body", b'{"inputs": []}', 100, "Inference-Header-Content-Length is 100"),
    ("negative header length", b'{"inputs": []}', -1, "Inference-Header-Content-Length is -1"),
    ("binary without header length", doc(tensor(parameters={"binary_data_size": 8})), None,
     "binary_data_size given but the request has no Inference-Header-Content-Length"),
    ("negative binary size", *with_binary(tensor(), b"", header_extra=-1),
     "binary_data_size must be a non-negative integer"),
    ("float binary size", *whole(doc(tensor(parameters={"binary_data_size": 8.0}))),
     "binary_data_size must be a non-negative integer"),
    ("bool binary size", *whole(doc(tensor(parameters={"binary_data_size": True}))),
     "binary_data_size must be a non-negative integer"),
    ("binary size mismatch", *with_binary(tensor("FP32", [2]), b"\0" * 4),
     r"binary_data_size is 4 bytes but shape \[2\] of FP32 needs 8"),
    ("binary size mismatch int64", *with_binary(tensor("INT64", [3]), b"\0" * 16),
     r"binary_data_size is 16 bytes but shape \[3\] of INT64 needs 24"),
    ("binary past end", *with_binary(tensor("FP32", [2]), b"\0" * 4, header_extra=4),
     "binary_data_size 8 runs past the end of the body"),
    ("leftover binary", *with_binary(tensor("FP32", [2]), b"\0" * 8, extra=b"\0\0"),
     "the body has 2 bytes of binary data that no input claims"),
    ("leftover binary json inputs", whole(doc(tensor(data=[1, 2])))[0] + b"xx",
     whole(doc(tensor(data=[1, 2])))[1], "2 bytes of binary data that no input claims"),
    ("bytes length too long", *with_binary(tensor("BYTES", [1]), u32(10) + b"ab"),
     "BYTES element 0 claims 10 bytes but only 2 remain"),
    ("bytes ends in length", *with_binary(tensor("BYTES", [2]), u32(4) + b"abcd" + b"\0\0"),
     "BYTES data ends inside the length of element 1"),
    ("bytes leftover", *with_binary(tensor("BYTES", [1]), u32(1) + b"ab"),
     "1 bytes left over after 1 BYTES elements"),
    ("bytes too few for shape", *with_binary(tensor("BYTES", [3]), u32(1) + b"abcdefg"),
     "3 BYTES elements need at least 12 bytes"),
    ("bytes huge shape", *with_binary(tensor("BYTES", [10**12]), u32(0)),
     r"shape \[1000000000000\] is over the limit of 67108864 elements"),
    ("too many dimensions", doc(tensor(shape=[1] * 40, data=[1])), None,
     "over the limit of 67108864 elements and 32 dimensions"),
    ("outputs not list", doc(tensor(data=[1, 2]), outputs={"name": "y"}), None,
     "'outputs' must be a list"),
    ("output without name", doc(tensor(data=[1, 2]), outputs=[{"parameters": {}}]), None,
     r"outputs\[0\] must be an object with a 'name'"),
    ("output bad parameters", doc(tensor(data=[1, 2]), outputs=[{"name": "y", "parameters": 3}]),
     None, r"outputs\[0\]: 'parameters' must be a JSON object"),
    ("classification", doc(tensor(data=[1, 2]), outputs=[
        {"name": "y", "parameters": {"classification": 3}}]), None,
     "classification extension is not supported"),
]


@pytest.mark.parametrize(("body", "header_length", "message"),
                         [case[1:] for case in MALFORMED], ids=[case[0] for case in MALFORMED])
def test_malformed_request(body: bytes, header_length: int | None, message: str) -> None:
    with pytest.raises(InvalidInput, match=message) as info:
        decode_request(body, header_length)
    assert info.value.status == 400


def test_bytes_length_prefix_is_little_endian() -> None:
    raw = memoryview(b"\x03\x00\x00\x00abc\x00\x00\x00\x00")
    assert decode_bytes_elements(raw, 2, "t").tolist() == [b"abc", b""]
    # read big-endian, 0x03000000 would run past the end
    with pytest.raises(InvalidInput, match="claims 50331648 bytes"):
        decode_bytes_elements(memoryview(b"\x00\x00\x00\x03abc"), 1, "t")


def test_encode_bytes_elements_layout() -> None:
    array = np.array([b"ab", "\u00e9", b""], dtype=object)
    assert encode_bytes_elements(array) == b"\x02\0\0\0ab\x02\0\0\0\xc3\xa9\x00\0\0\0"
    assert decode_bytes_elements(memoryview(encode_bytes_elements(array)), 3, "t").tolist() == [
        b"ab", "\u00e9".encode(), b""]


# -------------------------------------------------------------- response encoding


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
@pytest.mark.parametrize("datatype", ALL)
def test_encode_response_every_datatype(datatype: str, binary: bool) -> None:
    array = sample(datatype)
    body, header_length = encode_response("mlp", "1", "abc",
                                          [TensorOutput("y", array, datatype, binary)])
    assert (header_length is not None) == binary
    document, tensors = read_response(body, header_length)
    assert document["model_name"] == "mlp" and document["model_version"] == "1"
    assert document["id"] == "abc"
    (out,) = document["outputs"]
    assert out["name"] == "y" and out["datatype"] == datatype and out["shape"] == [2, 3]
    if binary:
        assert out["parameters"]["binary_data_size"] == len(le_bytes(array, datatype))
    else:
        assert "parameters" not in out
    assert_same(tensors["y"], array, datatype)


def test_encode_response_bf16_json_is_floats() -> None:
    bits = bf16_bits([1.0, -2.5])
    body, _ = encode_response("m", "1", None, [TensorOutput("y", bits, "BF16")])
    assert json.loads(body)["outputs"][0]["data"] == [1.0, -2.5]


def test_encode_response_binary_blobs_follow_header_in_order() -> None:
    a = np.arange(6, dtype=np.int16).reshape(2, 3)
    b = np.array([b"hi", b""], dtype=object)
    c = np.array([1.5], dtype=np.float32)
    body, header_length = encode_response("m", "2", None, [
        TensorOutput("a", a, "INT16", True), TensorOutput("c", c, "FP32", False),
        TensorOutput("b", b, "BYTES", True)])
    assert header_length is not None
    assert body[header_length:] == le_bytes(a, "INT16") + le_bytes(b, "BYTES")
    document = json.loads(body[:header_length])
    assert "id" not in document
    assert [o["name"] for o in document["outputs"]] == ["a", "c", "b"]
    assert document["outputs"][1]["data"] == [1.5]


def test_encode_response_non_contiguous_array_in_c_order() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T  # 3x2, Fortran order in memory
    for binary in (True, False):
        body, header_length = encode_response("m", "1", None,
                                              [TensorOutput("y", array, "INT32", binary)])
        _, tensors = read_response(body, header_length)
        assert tensors["y"].tolist() == array.tolist()


def test_encode_response_parameters_and_empty_tensor() -> None:
    empty = np.zeros((0, 4), dtype=np.float32)
    body, header_length = encode_response("m", "1", "r", [TensorOutput("y", empty, "FP32", True)],
                                          parameters={"queue_ns": 5})
    document, tensors = read_response(body, header_length)
    assert document["parameters"] == {"queue_ns": 5}
    assert document["outputs"][0]["parameters"]["binary_data_size"] == 0
    assert tensors["y"].shape == (0, 4)


def test_encode_response_str_bytes_elements_are_utf8() -> None:
    array = np.array(["\u00e9t\u00e9"], dtype=object)
    for binary in (True, False):
        body, header_length = encode_response("m", "1", None,
                                              [TensorOutput("y", array, "BYTES", binary)])
        assert read_response(body, header_length)[1]["y"].tolist() == ["\u00e9t\u00e9".encode()]


# ----------------------------------------------------------------- properties


def numeric_arrays(datatype: str, finite: bool) -> st.SearchStrategy[np.ndarray]:
    dtype = dtypes.numpy_dtype(datatype)
    shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
    if datatype == "BF16":
        floats = st.floats(width=32, allow_nan=not finite, allow_infinity=not finite)
        return hnp.arrays(np.float32, shapes, elements=floats).map(
            lambda a: (a.view(np.uint32) >> 16).astype(np.uint16))
    if dtype.kind == "f":
        elements = st.floats(width=dtype.itemsize * 8, allow_nan=not finite,
                             allow_infinity=not finite)
        return hnp.arrays(dtype, shapes, elements=elements)
    return hnp.arrays(dtype, shapes)


@pytest.mark.parametrize("datatype", NUMERIC)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_property_binary_round_trip(datatype: str, data: st.DataObject) -> None:
    array = data.draw(numeric_arrays(datatype, finite=False))
    body, header_length = binary_request({"t": (datatype, array)})
    (decoded,) = decode_request(body, header_length).inputs
    assert_same(decoded.array, array, datatype)
    body, header_length = encode_response("m", "1", None,
                                          [TensorOutput("t", decoded.array, datatype, True)])
    assert_same(read_response(body, header_length)[1]["t"], array, datatype)


@pytest.mark.parametrize("datatype", NUMERIC)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_property_json_round_trip(datatype: str, data: st.DataObject) -> None:
    array = data.draw(numeric_arrays(datatype, finite=True))  # JSON has no NaN or inf
    (decoded,) = decode_request(json_request({"t": (datatype, array)})).inputs
    assert_same(decoded.array, array, datatype)
    body, header_length = encode_response("m", "1", None,
                                          [TensorOutput("t", decoded.array, datatype, False)])
    assert header_length is None
    assert_same(read_response(body, None)[1]["t"], array, datatype)


@settings(max_examples=60, deadline=None)
@given(elements=st.lists(st.binary(max_size=20), max_size=6))
def test_property_bytes_round_trip(elements: list[bytes]) -> None:
    array = np.array(elements + [None], dtype=object)[:-1]
    body, header_length = binary_request({"t": ("BYTES", array)})
    (decoded,) = decode_request(body, header_length).inputs
    assert decoded.array.tolist() == elements
    body, header_length = encode_response("m", "1", None,
                                          [TensorOutput("t", decoded.array, "BYTES", True)])
    assert read_response(body, header_length)[1]["t"].tolist() == elements


json_scalars = st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(
    allow_nan=False, allow_infinity=False) | st.text(max_size=5)
json_values_strategy = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=5), inner, max_size=3), max_leaves=12)
shapes = st.lists(st.integers(-1, 5) | st.sampled_from([0, 2**31, 2**62, 2**64 + 1]),
                  max_size=4) | json_values_strategy
datatypes = st.sampled_from([*ALL, "FP8", "", "fp32"]) | json_values_strategy
parameters = st.fixed_dictionaries({}, optional={
    "binary_data_size": st.integers(-2, 40) | json_values_strategy,
}) | json_values_strategy
tensors_strategy = st.fixed_dictionaries({}, optional={
    "name": st.sampled_from(["x", ""]) | json_values_strategy,
    "datatype": datatypes, "shape": shapes, "data": json_values_strategy,
    "parameters": parameters,
})
requests = st.fixed_dictionaries({}, optional={
    "id": st.text(max_size=3) | json_values_strategy,
    "inputs": st.lists(tensors_strategy | json_values_strategy, max_size=3) | json_values_strategy,
    "outputs": st.lists(st.fixed_dictionaries({"name": st.text(max_size=3)}, optional={
        "parameters": parameters}) | json_values_strategy, max_size=2) | json_values_strategy,
    "parameters": parameters,
})


@settings(max_examples=300, deadline=None)
@given(document=requests, tail=st.binary(max_size=48), use_header=st.booleans(),
       header_shift=st.integers(-3, 3))
def test_property_garbage_requests_raise_only_invalid_input(
        document: dict, tail: bytes, use_header: bool, header_shift: int) -> None:
    header = json.dumps(document).encode()
    header_length = len(header) + header_shift if use_header else None
    try:
        decode_request(header + (tail if use_header else b""), header_length)
    except InvalidInput:
        pass


well_formed_tensors = st.fixed_dictionaries({
    "name": st.just("t"),
    "datatype": st.sampled_from(ALL),
    "shape": st.lists(st.integers(0, 4) | st.sampled_from([2**31, 2**62]), max_size=3),
}, optional={"data": json_values_strategy,
             "parameters": st.fixed_dictionaries({"binary_data_size": st.integers(0, 40)})})


@settings(max_examples=300, deadline=None)
@given(item=well_formed_tensors, tail=st.binary(max_size=40))
def test_property_garbage_tensor_data_raises_only_invalid_input(item: dict, tail: bytes) -> None:
    header = json.dumps({"inputs": [item]}).encode()
    try:
        (decoded,) = decode_request(header + tail, len(header)).inputs
    except InvalidInput:
        return
    assert decoded.array.shape == tuple(item["shape"])
    assert decoded.array.dtype == dtypes.numpy_dtype(item["datatype"])


@settings(max_examples=200, deadline=None)
@given(body=st.binary(max_size=200), header_length=st.none() | st.integers(-5, 210))
def test_property_garbage_bytes_raise_only_invalid_input(body: bytes,
                                                         header_length: int | None) -> None:
    try:
        decode_request(body, header_length)
    except InvalidInput:
        pass


def test_orjson_and_json_agree_on_request_documents() -> None:
    # The helpers above write requests with the standard library; the codec reads with
    # orjson. Check they agree on what a request is, so the tests test the codec.
    body = json_request({"t": ("FP64", sample("FP64"))})
    assert orjson.loads(body) == json.loads(body)


# ------------------------------------------------------------ strictness, as Triton


def _tiny(**extra: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2],
                                       "data": [1.0, 2.0]}]}
    doc.update(extra)
    return doc


def test_empty_outputs_list_means_every_output() -> None:
    assert decode_request(orjson.dumps(_tiny(outputs=[]))).outputs is None


@pytest.mark.parametrize(("doc", "message"), [
    (_tiny(outputs=[{"name": "y"}, {"name": "y"}]), "requested twice"),
    (_tiny(outputs=[{"name": "y", "parameters": {"binary_data": "false"}}]),
     "binary_data must be true or false"),
    (_tiny(parameters={"binary_data_output": 1}), "binary_data_output"),
    ({"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [True, False]}]},
     "does not hold FP32"),
    ({"inputs": [{"name": "x", "datatype": "INT32", "shape": [1], "data": [True]}]},
     "does not hold INT32"),
])
def test_loose_types_are_refused(doc: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_request(orjson.dumps(doc))


def test_data_and_binary_size_together_are_refused() -> None:
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1],
                                       "data": [1.0],
                                       "parameters": {"binary_data_size": 4}}]})
    with pytest.raises(InvalidInput, match="both 'data' and binary_data_size"):
        decode_request(header + np.float32(1).tobytes(), len(header))


def test_a_repeated_binary_header_is_parsed_once_and_shares_nothing_mutable() -> None:
    one = np.arange(4, dtype=np.float32)
    body, length = binary_request({"t": ("FP32", one)}, parameters={"priority": 1},
                                  outputs=[{"name": "y"}])
    other = body[:length] + (one + 10).tobytes()
    first, second = decode_request(body, length), decode_request(other, length)
    assert first.header is not None and first.header is second.header
    np.testing.assert_array_equal(second.inputs[0].array, one + 10)
    np.testing.assert_array_equal(first.inputs[0].array, one)
    first.parameters["class"] = "batch"  # as X-Tradeoff-Class does
    assert second.parameters == {"priority": 1}
    assert first.outputs is not second.outputs
    assert decode_request(body, length).parameters == {"priority": 1}


def test_headers_with_json_tensors_or_no_binary_extension_are_not_kept() -> None:
    array = np.arange(3, dtype=np.int32)
    body, length = binary_request({"t": ("INT32", array)})
    header = json.loads(body[:length])
    header["inputs"].append({"name": "u", "datatype": "INT32", "shape": [1], "data": [7]})
    head = json.dumps(header).encode()
    mixed = decode_request(head + body[length:], len(head))
    assert mixed.header is None and mixed.inputs[1].array.tolist() == [7]
    assert decode_request(json_request({"t": ("INT32", array)})).header is None


def test_a_kept_header_is_checked_against_each_body_size() -> None:
    body, length = binary_request({"t": ("FP32", np.zeros(4, np.float32))})
    decode_request(body, length)
    with pytest.raises(InvalidInput, match="binary data that no input claims"):
        decode_request(body + b"\0\0\0\0", length)
    with pytest.raises(InvalidInput, match="runs past the end"):
        decode_request(body[:-4], length)


def test_the_onnx_codes_written_out_are_onnxs_own() -> None:
    from onnx import TensorProto

    from tradeoff.dtypes import from_onnx, to_onnx

    for datatype, name in (("BOOL", "BOOL"), ("UINT8", "UINT8"), ("UINT16", "UINT16"),
                           ("UINT32", "UINT32"), ("UINT64", "UINT64"), ("INT8", "INT8"),
                           ("INT16", "INT16"), ("INT32", "INT32"), ("INT64", "INT64"),
                           ("FP16", "FLOAT16"), ("FP32", "FLOAT"), ("FP64", "DOUBLE"),
                           ("BF16", "BFLOAT16"), ("BYTES", "STRING")):
        code = getattr(TensorProto, name)
        assert to_onnx(datatype) == code and from_onnx(code) == datatype


def test_a_request_sent_on_reads_back_the_same_with_every_output_binary() -> None:
    """What a gateway sends a replica: every input binary, the outputs asked binary, the
    parameters kept but the client's own binary_data_output."""
    request = V2Request("r1", [
        TensorInput("a", "FP32", (2, 3), np.arange(6, dtype=np.float32).reshape(2, 3)),
        TensorInput("s", "BYTES", (2,), np.array([b"x", b"\x00yz"], dtype=object)),
        TensorInput("h", "BF16", (1,), np.array([0x3F80], dtype=np.uint16))],
        [RequestedOutput("o", binary=False)], {"class": "c", "binary_data_output": False})
    body, length = encode_request(request)
    header = json.loads(body[:length])
    assert header["outputs"] == [{"name": "o", "parameters": {"binary_data": True}}]
    assert header["parameters"] == {"class": "c"}
    back = decode_request(body, length)
    assert back.id == "r1" and [t.shape for t in back.inputs] == [(2, 3), (2,), (1,)]
    assert np.array_equal(back.inputs[0].array, request.inputs[0].array)
    assert list(back.inputs[1].array) == [b"x", b"\x00yz"]
    assert back.inputs[2].array.tolist() == [0x3F80]
    whole = V2Request(None, request.inputs[:1], None, {})
    body, length = encode_request(whole)
    assert json.loads(body[:length])["parameters"] == {"binary_data_output": True}


def test_an_answer_read_back_binary_or_json() -> None:
    outputs = [TensorOutput("b", np.arange(4, dtype=np.int64).reshape(2, 2), "INT64", True),
               TensorOutput("j", np.array([0.5, 1.5], dtype=np.float32), "FP32", False),
               TensorOutput("s", np.array([b"hi"], dtype=object), "BYTES", True)]
    body, length = encode_response("m", "3", "r", outputs, {"routed_to": "x"})
    answer = decode_response(body, length)
    assert answer.model_version == "3" and answer.parameters == {"routed_to": "x"}
    assert [o.name for o in answer.outputs] == ["b", "j", "s"]
    assert answer.outputs[0].array.tolist() == [[0, 1], [2, 3]]
    assert answer.outputs[1].array.tolist() == [0.5, 1.5]
    assert answer.outputs[2].array.tolist() == [b"hi"]


@pytest.mark.parametrize(("body", "length", "message"), [
    (b"not json", None, "the answer is not valid JSON"),
    (b'{"model_name": "m"}', None, "no 'outputs' list"),
    (b'{"outputs": [{"name": "o", "datatype": "FP99", "shape": [1]}]}', None,
     "unknown datatype"),
    (b'{"outputs": [{"name": "o", "datatype": "FP32", "shape": [2], '
     b'"parameters": {"binary_data_size": 8}}]}1234', 101, "does not fit the answer"),
    (b'{"outputs": [{"name": "o", "datatype": "FP32", "shape": [1]}]}', None,
     "neither 'data' nor binary_data_size"),
    (b"{}", 10, "Inference-Header-Content-Length is 10"),
    (b'{"outputs": [{"name": "o", "datatype": "FP32", "shape": [1], "parameters": "x"}]}',
     None, r"outputs\[0\]: 'parameters' must be a JSON object"),
])
def test_an_unreadable_answer_says_what_is_wrong(body: bytes, length: int | None,
                                                 message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        decode_response(body, length)


def test_an_answer_relayed_keeps_its_tensors_and_takes_this_servers_name() -> None:
    """A gateway passes a replica's answer on: the tensors' bytes as they came, the JSON
    header read and written again with the router's name and where it was routed."""
    outputs = [TensorOutput("b", np.arange(4, dtype=np.int64).reshape(2, 2), "INT64", True),
               TensorOutput("j", np.array([0.5, 1.5], dtype=np.float32), "FP32", False)]
    body, length = encode_response("mlp", "3", "r", outputs, {"replica_own": 1})
    relayed = read_relayed(body, length)
    assert bytes(relayed.tail) == body[length:]
    payload, new_length = encode_relayed(relayed, "front", {"routed_to": "pool@h:1"})
    answer = decode_response(payload, new_length)
    header = json.loads(payload[:new_length])
    assert header["model_name"] == "front" and header["id"] == "r"
    assert answer.model_version == "3"
    assert answer.parameters == {"replica_own": 1, "routed_to": "pool@h:1"}
    assert answer.outputs[0].array.tolist() == [[0, 1], [2, 3]]
    assert answer.outputs[1].array.tolist() == [0.5, 1.5]
    json_only, none = encode_response("mlp", "1", None, outputs[1:])
    payload, length = encode_relayed(read_relayed(json_only, none), "front")
    assert length is None and json.loads(payload)["model_name"] == "front"
    assert json.loads(payload)["outputs"][0]["data"] == [0.5, 1.5]


@pytest.mark.parametrize(("body", "length", "message"), [
    (b"[1]", None, "the answer must be a JSON object"),
    (b'{"outputs": {}}', None, "no 'outputs' list"),
    (b'{"outputs": [{"name": "o", "parameters": {"binary_data_size": 8}}]}1234', 67,
     r"binary_data_size values \[8\] do not add up to its 4 bytes"),
    (b'{"outputs": [{"name": "o", "parameters": {"binary_data_size": -1}}]}', 68,
     "do not add up"),
    (b'{"outputs": []}extra', 15, r"values \[\] do not add up to its 5 bytes"),
    (b"{}", 10, "Inference-Header-Content-Length is 10"),
    (b'{"outputs": [{"name": "o", "parameters": [1]}]}', None,
     r"outputs\[0\]: 'parameters' must be a JSON object"),
])
def test_a_relayed_answer_that_does_not_add_up_is_refused(body: bytes, length: int | None,
                                                          message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        read_relayed(body, length)
