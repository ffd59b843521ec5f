"""Inference through ``tritonclient.http``: every datatype, binary and JSON tensors.

Each result is compared with ONNX Runtime run in this process on the same model file.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tradeoff.server.process import ServerProcess

from .helpers import References, infer_json
from .model_repo import IDENTITY_TYPES, identity_name

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

ENCODINGS = [pytest.param(True, id="binary"), pytest.param(False, id="json")]


def sample(datatype: str, rows: int = 2, cols: int = 5, *, binary: bool = True) -> np.ndarray:
    """Values that exercise the type: extremes for integers, fractions and signs for floats."""
    rng = np.random.default_rng(zlib.crc32(datatype.encode()))  # str hash() is salted
    dtype = IDENTITY_TYPES[datatype][1]
    if datatype == "BOOL":
        values = rng.integers(0, 2, (rows, cols)).astype(bool)
        values[0, :2] = [True, False]
        return values
    if datatype == "BYTES":
        words = [b"", b"a", "h\u00e9llo w\u00f6rld".encode(), "\u65e5\u672c".encode(),
                 b"tab\tnew\nline", b'quote"back\\slash', b"0" * 300]
        flat = [words[i % len(words)] for i in range(rows * cols)]
        return np.array(flat, dtype=object).reshape(rows, cols)
    if np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, (rows, cols), dtype=dtype, endpoint=True)
        values[0, :3] = [info.min, info.max, 0]
        return values
    values = (rng.standard_normal((rows, cols)) * 100).astype(dtype)
    finfo = np.finfo(dtype)
    values[0, :4] = [finfo.max, finfo.min, finfo.tiny, -0.0]
    if binary:
        values[1, :3] = [np.inf, -np.inf, np.nan]  # JSON has no way to say these
    return values


def as_bytes(array: np.ndarray) -> np.ndarray:
    """JSON BYTES come back as str; compare as UTF-8 bytes."""
    return np.vectorize(lambda e: e.encode() if isinstance(e, str) else e,
                        otypes=[object])(array)


def reference_input(datatype: str, array: np.ndarray) -> np.ndarray:
    if datatype == "BYTES":  # ONNX Runtime string tensors take str
        return np.vectorize(lambda e: e.decode(), otypes=[object])(array)
    return array


@pytest.mark.parametrize("binary", ENCODINGS)
@pytest.mark.parametrize("datatype", list(IDENTITY_TYPES))
def test_identity_every_datatype(client: triton.InferenceServerClient, references: References,
                                 datatype: str, binary: bool) -> None:
    model = identity_name(datatype)
    data = sample(datatype, binary=binary)
    tensor = triton.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    output = triton.InferRequestedOutput("OUTPUT0", binary_data=binary)
    result = client.infer(model, [tensor], outputs=[output],
                          request_id=f"{datatype}-{binary}")

    response = result.get_response()
    assert response["model_name"] == model
    assert response["model_version"] == "1"
    assert response["id"] == f"{datatype}-{binary}"
    [meta] = response["outputs"]
    assert meta["name"] == "OUTPUT0"
    assert meta["datatype"] == datatype
    assert meta["shape"] == list(data.shape)
    assert ("binary_data_size" in meta.get("parameters", {})) == binary

    got = result.as_numpy("OUTPUT0")
    expected = references.run(model, {"INPUT0": reference_input(datatype, data)})["OUTPUT0"]
    assert got.shape == data.shape
    if datatype == "BYTES":
        np.testing.assert_array_equal(as_bytes(got), data)
        np.testing.assert_array_equal(as_bytes(got), as_bytes(expected))
    else:
        assert got.dtype == np.dtype(IDENTITY_TYPES[datatype][1])
        np.testing.assert_array_equal(got, expected)  # NaN equals NaN here
        np.testing.assert_array_equal(got, data)
        if np.dtype(got.dtype).kind == "f":  # -0.0 keeps its sign
            assert np.signbit(got[0, 3])


@pytest.mark.parametrize("binary", ENCODINGS)
def test_identity_tensor_with_no_elements(client: triton.InferenceServerClient,
                                          binary: bool) -> None:
    data = np.zeros((1, 0), dtype=np.int32)
    tensor = triton.InferInput("INPUT0", [1, 0], "INT32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer("identity_int32", [tensor], outputs=[
        triton.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    assert result.get_response()["outputs"][0]["shape"] == [1, 0]
    assert result.as_numpy("OUTPUT0").size == 0


def test_uint64_json_above_int64(client: triton.InferenceServerClient) -> None:
    """numpy alone reads ``[0, 2**64 - 1]`` as float64; the server must not."""
    data = np.array([[0, 2**63, 2**64 - 1]], dtype=np.uint64)
    tensor = triton.InferInput("INPUT0", list(data.shape), "UINT64")
    tensor.set_data_from_numpy(data, binary_data=False)
    result = client.infer("identity_uint64", [tensor], outputs=[
        triton.InferRequestedOutput("OUTPUT0", binary_data=False)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_bf16_binary(client: triton.InferenceServerClient) -> None:
    ml_dtypes = pytest.importorskip("ml_dtypes")  # tritonclient sends BF16 from these only
    data = np.array([[1.5, -2.0, 3.140625, 0.0, -0.0, 65280.0]], dtype=ml_dtypes.bfloat16)
    tensor = triton.InferInput("INPUT0", list(data.shape), "BF16")
    tensor.set_data_from_numpy(data, binary_data=True)
    result = client.infer("identity_bf16", [tensor])
    assert result.get_response()["outputs"][0]["datatype"] == "BF16"
    got = result.as_numpy("OUTPUT0")
    np.testing.assert_array_equal(got.astype(np.float32), data.astype(np.float32))


def test_bf16_json_is_read_as_floats(server: ServerProcess) -> None:
    # tritonclient refuses BF16 as JSON; the protocol carries it as numbers
    response = infer_json(server.url, "identity_bf16", [
        {"name": "INPUT0", "datatype": "BF16", "shape": [1, 3], "data": [1.5, -2.0, 0.25]}])
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [1.5, -2.0, 0.25]


@pytest.mark.parametrize("algorithm", ["gzip", "deflate"])
def test_compressed_request_and_response(client: triton.InferenceServerClient,
                                         algorithm: str) -> None:
    tensors, a, b = add_sub_inputs(True, rows=4)
    result = client.infer("add_sub", tensors, request_compression_algorithm=algorithm,
                          response_compression_algorithm=algorithm)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_large_binary_tensor(client: triton.InferenceServerClient) -> None:
    data = np.random.default_rng(3).standard_normal((8, 256 * 1024)).astype(np.float32)
    tensor = triton.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)  # 8 MiB, in many TCP segments
    result = client.infer("identity_fp32", [tensor])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)


def test_bytes_that_are_not_utf8_are_refused(client: triton.InferenceServerClient) -> None:
    data = np.array([[b"ok", b"\xff\xfe not utf-8"]], dtype=object)
    tensor = triton.InferInput("INPUT0", list(data.shape), "BYTES")
    tensor.set_data_from_numpy(data, binary_data=True)
    with pytest.raises(InferenceServerException) as info:
        client.infer("identity_bytes", [tensor])
    assert info.value.status() == "400"
    assert "UTF-8" in info.value.message()
    assert "INPUT0" in info.value.message()


def add_sub_inputs(binary: bool, rows: int = 1) -> tuple[list[triton.InferInput],
                                                         np.ndarray, np.ndarray]:
    a = np.arange(16 * rows, dtype=np.int32).reshape(rows, 16)
    b = np.full((rows, 16), 3, dtype=np.int32)
    tensors = [triton.InferInput("INPUT0", [rows, 16], "INT32"),
               triton.InferInput("INPUT1", [rows, 16], "INT32")]
    tensors[0].set_data_from_numpy(a, binary_data=binary)
    tensors[1].set_data_from_numpy(b, binary_data=binary)
    return tensors, a, b


@pytest.mark.parametrize("binary", ENCODINGS)
def test_all_outputs_by_default(client: triton.InferenceServerClient, references: References,
                                binary: bool) -> None:
    tensors, a, b = add_sub_inputs(binary, rows=3)
    result = client.infer("add_sub", tensors)
    expected = references.run("add_sub", {"INPUT0": a, "INPUT1": b})
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected["OUTPUT0"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), expected["OUTPUT1"])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)


@pytest.mark.parametrize("binary", ENCODINGS)
def test_requested_outputs_only(client: triton.InferenceServerClient, binary: bool) -> None:
    tensors, a, b = add_sub_inputs(binary)
    result = client.infer("add_sub", tensors, request_id="only-diff",
                          outputs=[triton.InferRequestedOutput("OUTPUT1", binary_data=binary)])
    response = result.get_response()
    assert response["id"] == "only-diff"
    assert [o["name"] for o in response["outputs"]] == ["OUTPUT1"]
    assert result.as_numpy("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_mixed_output_encodings(client: triton.InferenceServerClient) -> None:
    tensors, a, b = add_sub_inputs(True)
    result = client.infer("add_sub", tensors, outputs=[
        triton.InferRequestedOutput("OUTPUT0", binary_data=False),
        triton.InferRequestedOutput("OUTPUT1", binary_data=True)])
    outputs = {o["name"]: o for o in result.get_response()["outputs"]}
    assert "data" in outputs["OUTPUT0"]
    assert "binary_data_size" in outputs["OUTPUT1"]["parameters"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_request_id_absent_when_not_given(client: triton.InferenceServerClient) -> None:
    tensors, _, _ = add_sub_inputs(True)
    assert "id" not in client.infer("add_sub", tensors).get_response()


@pytest.mark.parametrize("binary", ENCODINGS)
@pytest.mark.parametrize("model", ["tiny", "mlp", "mlp_nobatch", "autocomplete"])
def test_float_models_match_onnxruntime(client: triton.InferenceServerClient,
                                        references: References, model: str,
                                        binary: bool) -> None:
    width = {"tiny": 16, "autocomplete": 4}.get(model, 256)
    data = np.random.default_rng(7).standard_normal((3, width)).astype(np.float32)
    tensor = triton.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data, binary_data=binary)
    result = client.infer(model, [tensor], outputs=[
        triton.InferRequestedOutput("OUTPUT0", binary_data=binary)])
    expected = references.run(model, {"INPUT0": data})["OUTPUT0"]
    np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-5, atol=1e-5)


def test_unknown_model_through_the_client(client: triton.InferenceServerClient) -> None:
    tensor = triton.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("no_such_model", [tensor])
    assert info.value.status() == "404"
    assert "no_such_model" in info.value.message()
