"""tritonclient.grpc, sync and asyncio, against `tradeoff serve` over gRPC."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.utils import InferenceServerException

from tests.integration.helpers import References
from tests.integration.model_repo import IDENTITY_TYPES, identity_name
from tradeoff.server.process import ServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]


@pytest.fixture(scope="module")
def client(compat_server: ServerProcess) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(compat_server.grpc_url)


def sample(datatype: str, rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([[b"a", "h\u00e9llo".encode(), b""]], dtype=object)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=(2, 3)).astype(bool)
    dtype = IDENTITY_TYPES[datatype][1]
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal((2, 3)).astype(dtype)
    info = np.iinfo(dtype)
    return np.array([[info.min, 0, info.max], [1, 2, 3]], dtype=dtype)


def test_health_and_metadata(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("mlp") and not client.is_model_ready("nope")
    metadata = client.get_server_metadata()
    assert metadata.name == "tradeoff" and "statistics" in metadata.extensions
    model = client.get_model_metadata("mlp")
    assert model.platform == "onnxruntime_onnx" and list(model.inputs[0].shape) == [-1, 256]


def test_model_config_decodes_with_tritons_own_messages(
        client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("queue_limited").config
    assert config.max_batch_size > 0
    assert config.dynamic_batching.default_queue_policy.max_queue_size == 2
    assert config.input[0].name == "INPUT0"
    as_json = client.get_model_config("mlp", as_json=True)["config"]
    assert as_json["input"][0]["data_type"] == "TYPE_FP32"
    assert as_json["instance_group"][0]["kind"] == "KIND_CPU"


@pytest.mark.parametrize("datatype", sorted(IDENTITY_TYPES))
def test_infer_every_datatype(client: grpcclient.InferenceServerClient,
                              compat_references: References, datatype: str) -> None:
    data = sample(datatype, np.random.default_rng(0))
    tensor = grpcclient.InferInput("INPUT0", list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    result = client.infer(identity_name(datatype), [tensor], request_id="r1",
                          outputs=[grpcclient.InferRequestedOutput("OUTPUT0")])
    assert result.get_response().id == "r1"
    got = result.as_numpy("OUTPUT0")
    if datatype == "BYTES":
        # ONNX Runtime takes text, so the reference runs on the decoded strings
        text = np.array([v.decode() for v in data.ravel()], dtype=object).reshape(data.shape)
        want = compat_references.run(identity_name(datatype), {"INPUT0": text})["OUTPUT0"]
        assert [bytes(v) for v in got.ravel()] == [str(v).encode() for v in want.ravel()]
    else:
        want = compat_references.run(identity_name(datatype), {"INPUT0": data})["OUTPUT0"]
        np.testing.assert_array_equal(got, want)


def test_mlp_equals_onnx_runtime(client: grpcclient.InferenceServerClient,
                                 compat_references: References) -> None:
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    tensor = grpcclient.InferInput("INPUT0", [3, 256], "FP32")
    tensor.set_data_from_numpy(x)
    got = client.infer("mlp", [tensor]).as_numpy("OUTPUT0")
    np.testing.assert_allclose(got, compat_references.run("mlp", {"INPUT0": x})["OUTPUT0"],
                               rtol=1e-5, atol=1e-5)


def test_statistics_and_repository(client: grpcclient.InferenceServerClient) -> None:
    before = client.get_inference_statistics("tiny").model_stats[0]
    x = np.ones((2, 16), np.float32)
    tensor = grpcclient.InferInput("INPUT0", [2, 16], "FP32")
    tensor.set_data_from_numpy(x)
    client.infer("tiny", [tensor])
    after = client.get_inference_statistics("tiny").model_stats[0]
    assert after.inference_count == before.inference_count + 2
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    index = {m.name: m.state for m in client.get_model_repository_index().models}
    assert index["tiny"] == "READY" and index["broken"] == "UNAVAILABLE"
    client.unload_model("reloadable")
    assert not client.is_model_ready("reloadable")
    client.load_model("reloadable")
    assert client.is_model_ready("reloadable")
    client.load_model("reloadable", config=json.dumps({
        "max_batch_size": 2,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]}))
    assert client.get_model_config("reloadable").config.max_batch_size == 2
    client.load_model("reloadable")


def test_errors_map_to_grpc_status_codes(client: grpcclient.InferenceServerClient) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("nope", [tensor])
    assert info.value.status() == "StatusCode.NOT_FOUND"
    wrong = grpcclient.InferInput("INPUT0", [1, 16], "INT32")
    wrong.set_data_from_numpy(np.ones((1, 16), np.int32))
    with pytest.raises(InferenceServerException) as info:
        client.infer("tiny", [wrong])
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "datatype INT32 does not match" in info.value.message()
    with pytest.raises(InferenceServerException) as info:
        client.load_model("broken")
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert client.is_server_live()


def test_asyncio_client(compat_server: ServerProcess) -> None:
    async def scenario() -> None:
        client = grpcaio.InferenceServerClient(compat_server.grpc_url)
        try:
            assert await client.is_server_ready()
            x = np.random.default_rng(2).standard_normal((1, 256)).astype(np.float32)
            tensors = []
            for _ in range(16):
                tensor = grpcaio.InferInput("INPUT0", [1, 256], "FP32")
                tensor.set_data_from_numpy(x)
                tensors.append(tensor)
            results = await asyncio.gather(*(client.infer("mlp", [t]) for t in tensors))
            outputs = [r.as_numpy("OUTPUT0") for r in results]
            for out in outputs[1:]:
                np.testing.assert_array_equal(out, outputs[0])
            stats = await client.get_inference_statistics("mlp")
            assert stats.model_stats[0].execution_count >= 1
        finally:
            await client.close()

    asyncio.run(scenario())


def test_typed_contents_are_decoded(compat_server: ServerProcess) -> None:
    """Clients that send `contents` instead of raw bytes (KServe's typed form)."""
    import grpc

    from tradeoff.protocol import grpc_service_pb2 as pb

    request = pb.ModelInferRequest(model_name="tiny", id="typed")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 16])
    tensor.contents.fp32_contents.extend([float(i) for i in range(16)])
    with grpc.insecure_channel(compat_server.grpc_url) as channel:
        infer = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                    request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        response = infer(request, timeout=30)
        out = np.frombuffer(response.raw_output_contents[0], np.float32)
        np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32) * 2 + 1)
        assert response.id == "typed"
        tensor.contents.fp32_contents.pop()
        with pytest.raises(grpc.RpcError) as info:
            infer(request, timeout=30)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "contents have 15 elements" in info.value.details()


def test_stream_infer(compat_server: ServerProcess) -> None:
    """ModelStreamInfer: every request answered on the stream, errors included."""
    import queue

    results: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(compat_server.grpc_url)
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    try:
        for i in range(4):
            tensor = grpcclient.InferInput("INPUT0", [1, 16], "FP32")
            tensor.set_data_from_numpy(np.full((1, 16), i, np.float32))
            client.async_stream_infer("tiny", [tensor], request_id=str(i))
        bad = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
        bad.set_data_from_numpy(np.zeros((1, 3), np.float32))
        client.async_stream_infer("tiny", [bad], request_id="bad")
        answers = [results.get(timeout=30) for _ in range(5)]
    finally:
        client.stop_stream()
        client.close()
    good = {r.get_response().id: r.as_numpy("OUTPUT0") for r, e in answers if e is None}
    assert sorted(good) == ["0", "1", "2", "3"]
    for key, out in good.items():
        np.testing.assert_array_equal(out, np.full((1, 16), 2 * int(key) + 1, np.float32))
    errors = [e for _, e in answers if e is not None]
    assert len(errors) == 1 and "does not match the model" in str(errors[0])


def test_full_queue_is_resource_exhausted(compat_server: ServerProcess) -> None:
    """`queue_limited` holds requests for 2 s with max_queue_size 2: the third is refused."""
    import threading

    from tests.integration.helpers import model_metric, wait_for
    from tests.integration.model_repo import QUEUE_LIMIT

    def send(value: float) -> Exception | np.ndarray:
        client = grpcclient.InferenceServerClient(compat_server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), value, np.float32))
        try:
            return client.infer("queue_limited", [tensor]).as_numpy("OUTPUT0")
        except InferenceServerException as exc:
            return exc
        finally:
            client.close()

    answers: dict[int, Exception | np.ndarray] = {}
    threads = [threading.Thread(target=lambda i=i: answers.__setitem__(i, send(float(i))))
               for i in range(QUEUE_LIMIT)]
    def depth() -> float:
        return model_metric(compat_server, "tradeoff_inference_queue_depth", "queue_limited")

    wait_for(lambda: depth() == 0, "an empty queue")
    for thread in threads:
        thread.start()
    wait_for(lambda: depth() == QUEUE_LIMIT, "the queue to fill")
    refused = send(99.0)
    for thread in threads:
        thread.join(30)
    assert isinstance(refused, InferenceServerException)
    assert refused.status() == "StatusCode.UNAVAILABLE"
    assert "queue is full" in refused.message()
    assert all(isinstance(a, np.ndarray) for a in answers.values()), answers
