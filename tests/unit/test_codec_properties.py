"""Property tests of the v2 codecs: whatever arrives, the answer is a correct round trip
or a clean InvalidInput, never another exception."""

from __future__ import annotations

import json
import struct

import numpy as np
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tradeoff import dtypes
from tradeoff.errors import InvalidInput
from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol.v2 import (
    RequestLimits,
    decode_bytes_elements,
    decode_request,
    encode_bytes_elements,
)
from tradeoff.server.grpc_server import decode_infer_request

SETTINGS = settings(max_examples=300, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow])
NUMERIC = [d for d in dtypes.DATATYPES if d not in ("BYTES", "BF16")]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=20)


def decodes_or_refuses(body: bytes, header_length: int | None,
                       limits: RequestLimits = RequestLimits()) -> None:
    try:
        decode_request(body, header_length, limits)
    except InvalidInput:
        pass


@SETTINGS
@given(st.binary(max_size=256), st.one_of(st.none(), st.integers(-5, 300)))
def test_random_bytes(body: bytes, header_length: int | None) -> None:
    decodes_or_refuses(body, header_length)


@SETTINGS
@given(json_values)
def test_random_json_documents(doc: object) -> None:
    decodes_or_refuses(json.dumps(doc).encode(), None)  # NaN, huge ints and all


tensor_docs = st.fixed_dictionaries({
    "name": st.one_of(st.text(max_size=5), st.integers(), st.none()),
    "datatype": st.one_of(st.sampled_from(list(dtypes.DATATYPES)), st.text(max_size=5)),
    "shape": st.one_of(st.lists(st.integers(-2, 2**40), max_size=5), json_values),
    "data": json_values,
})


@SETTINGS
@given(st.lists(tensor_docs, min_size=1, max_size=3), json_values)
def test_random_tensors(inputs: list[dict], parameters: object) -> None:
    decodes_or_refuses(json.dumps({"inputs": inputs, "parameters": parameters}).encode(), None)


@SETTINGS
@given(st.sampled_from(list(dtypes.DATATYPES)), st.lists(st.integers(0, 4), max_size=4),
       st.binary(max_size=128), st.integers(-4, 200))
def test_random_binary_tensors(datatype: str, shape: list[int], blob: bytes,
                               declared: int) -> None:
    header = json.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                     "parameters": {"binary_data_size": declared}}]}).encode()
    decodes_or_refuses(header + blob, len(header))


@SETTINGS
@given(st.sampled_from(NUMERIC), st.lists(st.integers(1, 4), min_size=1, max_size=3),
       st.data())
def test_numeric_round_trip(datatype: str, shape: list[int], data: st.DataObject) -> None:
    dtype = dtypes.numpy_dtype(datatype)
    count = int(np.prod(shape))
    raw = data.draw(st.binary(min_size=count * dtype.itemsize, max_size=count * dtype.itemsize))
    header = orjson.dumps({"inputs": [{"name": "x", "datatype": datatype, "shape": shape,
                                       "parameters": {"binary_data_size": len(raw)}}]})
    request = decode_request(header + raw, len(header))
    array = request.inputs[0].array
    assert array.shape == tuple(shape) and array.tobytes() == raw


@SETTINGS
@given(st.lists(st.binary(max_size=20), max_size=6))
def test_bytes_round_trip(elements: list[bytes]) -> None:
    blob = encode_bytes_elements(np.array(elements, dtype=object))
    assert list(decode_bytes_elements(memoryview(blob), len(elements), "x")) == elements


@SETTINGS
@given(st.binary(max_size=64), st.integers(0, 8))
def test_bytes_with_bad_lengths(blob: bytes, count: int) -> None:
    try:
        out = decode_bytes_elements(memoryview(blob), count, "x")
    except InvalidInput:
        return
    assert encode_bytes_elements(out) == blob  # accepted only if it is exactly well formed


def test_a_bytes_element_over_the_limit_is_refused_before_it_is_copied() -> None:
    blob = struct.pack("<I", 1000) + b"a" * 1000
    with pytest.raises(InvalidInput, match="--max-bytes-element"):
        decode_bytes_elements(memoryview(blob), 1, "x", max_element=100)


def test_limits_on_inputs_depth_and_elements() -> None:
    limits = RequestLimits(max_inputs=2, max_elements=10, max_json_depth=3,
                           max_bytes_element=4)
    tensor = {"name": "x", "datatype": "FP32", "shape": [1], "data": [1.0]}
    with pytest.raises(InvalidInput, match="--max-inputs"):
        decode_request(orjson.dumps({"inputs": [tensor] * 3}), None, limits)
    deep = dict(tensor, shape=[1, 1, 1, 1], data=[[[[1.0]]]])
    with pytest.raises(InvalidInput, match="--max-json-depth"):
        decode_request(orjson.dumps({"inputs": [deep]}), None, limits)
    big = dict(tensor, shape=[11], data=[0.0] * 11)
    with pytest.raises(InvalidInput, match="--max-tensor-elements"):
        decode_request(orjson.dumps({"inputs": [big]}), None, limits)
    text = {"name": "s", "datatype": "BYTES", "shape": [1], "data": ["hello"]}
    with pytest.raises(InvalidInput, match="--max-bytes-element"):
        decode_request(orjson.dumps({"inputs": [text]}), None, limits)
    # far deeper than any limit (and than the JSON parser's): a clean 400, no recursion error
    deepest = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1], "data": '
               + b"[" * 5000 + b"]" * 5000 + b"}]}")
    with pytest.raises(InvalidInput):
        decode_request(deepest, None)


@SETTINGS
@given(st.lists(st.tuples(st.text(max_size=4), st.sampled_from(list(dtypes.DATATYPES)),
                          st.lists(st.integers(0, 3), max_size=3), st.binary(max_size=40)),
                max_size=3))
def test_random_grpc_requests(tensors: list[tuple[str, str, list[int], bytes]]) -> None:
    request = pb.ModelInferRequest(model_name="m")
    for name, datatype, shape, blob in tensors:
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(blob)
    try:
        decode_infer_request(request)
    except InvalidInput:
        pass
