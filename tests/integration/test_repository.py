"""The repository extension (index, load, unload) and model versions."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.http as triton
from tritonclient.utils import InferenceServerException

from tradeoff.server.process import ServerProcess

from .helpers import infer_json, model_metric, request, wait_for
from .model_repo import BROKEN_MODELS, add_constant_model

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]


def fp32_input(rows: int = 1, value: float = 0.5) -> tuple[triton.InferInput, np.ndarray]:
    data = np.full((rows, 4), value, np.float32)
    tensor = triton.InferInput("INPUT0", [rows, 4], "FP32")
    tensor.set_data_from_numpy(data)
    return tensor, data


def index_rows(client: triton.InferenceServerClient, name: str) -> list[dict]:
    return [row for row in client.get_model_repository_index() if row["name"] == name]


def test_infer_on_each_version(client: triton.InferenceServerClient) -> None:
    tensor, data = fp32_input()
    for version, constant in (("1", 1.0), ("2", 2.0)):
        result = client.infer("versioned", [tensor], model_version=version)
        assert result.get_response()["model_version"] == version
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + constant)
        assert client.is_model_ready("versioned", version)
    latest = client.infer("versioned", [tensor])  # no version: the highest one serves
    assert latest.get_response()["model_version"] == "2"
    np.testing.assert_array_equal(latest.as_numpy("OUTPUT0"), data + 2.0)
    assert client.get_model_metadata("versioned", "1")["versions"] == ["1", "2"]


def test_latest_policy_serves_only_the_newest_versions(client: triton.InferenceServerClient
                                                       ) -> None:
    tensor, data = fp32_input()
    assert client.get_model_metadata("versioned_latest")["versions"] == ["2", "3"]
    for version, constant in (("2", 2.0), ("3", 3.0)):
        result = client.infer("versioned_latest", [tensor], model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + constant)
    assert not client.is_model_ready("versioned_latest", "1")
    with pytest.raises(InferenceServerException) as info:
        client.infer("versioned_latest", [tensor], model_version="1")
    assert info.value.status() == "404"
    assert "version" in info.value.message()


def test_unload_then_load(server: ServerProcess, client: triton.InferenceServerClient) -> None:
    tensor, data = fp32_input()
    np.testing.assert_array_equal(client.infer("reloadable", [tensor]).as_numpy("OUTPUT0"),
                                  data + 10.0)
    client.unload_model("reloadable")
    try:
        assert not client.is_model_ready("reloadable")
        with pytest.raises(InferenceServerException) as info:
            client.infer("reloadable", [tensor])
        assert info.value.status() == "503"
        assert "reloadable" in info.value.message()
        assert "not ready" in info.value.message()
        [row] = index_rows(client, "reloadable")
        assert row["state"] == "UNAVAILABLE"
        assert row["reason"] == "unloaded"
        # metadata of an unloaded model is refused, the server itself still serves
        response = request(server.url, "GET", "/v2/models/reloadable")
        assert response.status == 503
        assert "error" in response.json()
        assert client.is_server_ready()
        assert client.is_model_ready("tiny")
        # unloading twice is fine
        client.unload_model("reloadable")
    finally:
        client.load_model("reloadable")
    assert client.is_model_ready("reloadable")
    assert index_rows(client, "reloadable")[0]["state"] == "READY"
    np.testing.assert_array_equal(client.infer("reloadable", [tensor]).as_numpy("OUTPUT0"),
                                  data + 10.0)


def queue_depth(server: ServerProcess, model: str) -> float:
    return model_metric(server, "tradeoff_inference_queue_depth", model)


@pytest.mark.parametrize("action", ["unload", "reload"])
def test_queued_requests_survive_unload_and_reload(server: ServerProcess,
                                                   client: triton.InferenceServerClient,
                                                   action: str) -> None:
    """``held`` keeps requests queued for 2 s; unloading or reloading answers them."""
    model = "held"
    body = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    wait_for(lambda: queue_depth(server, model) == 0, "an empty queue")
    with ThreadPoolExecutor(1) as pool:
        queued = pool.submit(infer_json, server.url, model, body)
        wait_for(lambda: queue_depth(server, model) == 1, "the request to be queued")
        try:
            if action == "unload":
                client.unload_model(model)
                assert not client.is_model_ready(model)
            else:
                client.load_model(model)
        finally:
            response = queued.result(timeout=60)
            if action == "unload":
                client.load_model(model)
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [2.0] * 4
    assert client.is_model_ready(model)


def test_load_picks_up_a_new_version(repository: Path,
                                     client: triton.InferenceServerClient) -> None:
    """Triton's explicit reload: a version added on disk serves after load_model."""
    tensor, data = fp32_input()
    new_version = repository / "reloadable" / "2"
    new_version.mkdir()
    try:
        onnx.save(add_constant_model(20.0), str(new_version / "model.onnx"))
        client.load_model("reloadable")  # a model that is loaded already: reload
        assert client.get_model_metadata("reloadable")["versions"] == ["2"]
        result = client.infer("reloadable", [tensor])
        assert result.get_response()["model_version"] == "2"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 20.0)
    finally:
        (new_version / "model.onnx").unlink(missing_ok=True)
        new_version.rmdir()
        client.load_model("reloadable")
    result = client.infer("reloadable", [tensor])
    assert result.get_response()["model_version"] == "1"
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data + 10.0)


@pytest.mark.parametrize("model", list(BROKEN_MODELS))
def test_loading_a_broken_config_fails_with_file_and_field(
        client: triton.InferenceServerClient, model: str) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.load_model(model)
    assert info.value.status() == "400"
    assert f"{model}/config.pbtxt" in info.value.message()
    for fragment in BROKEN_MODELS[model]:
        assert fragment in info.value.message()
    assert not client.is_model_ready(model)
    [row] = index_rows(client, model)
    assert row["state"] == "UNAVAILABLE"
    assert BROKEN_MODELS[model][0] in row["reason"]
    assert client.is_server_ready()


def test_loading_an_unknown_model_is_404(client: triton.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as info:
        client.load_model("no_such_model")
    assert info.value.status() == "404"
    with pytest.raises(InferenceServerException) as info:
        client.unload_model("no_such_model")
    assert info.value.status() == "404"


def test_model_names_cannot_leave_the_repository(server: ServerProcess) -> None:
    for name in ("..", "%2e%2e", "..%2Ftiny"):
        response = request(server.url, "POST", f"/v2/repository/models/{name}/load", b"{}")
        assert response.status in (400, 404), (name, response.status)


def test_json_infer_on_a_version_path(server: ServerProcess) -> None:
    response = infer_json(server.url, "versioned", [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}],
        version="1", id="v1")
    assert response.status == 200, response.body
    doc = response.json()
    assert doc["model_name"] == "versioned"
    assert doc["model_version"] == "1"
    assert doc["id"] == "v1"
    assert doc["outputs"][0]["data"] == [2.0, 3.0, 4.0, 5.0]


def test_load_with_a_config_override(client: triton.InferenceServerClient) -> None:
    """Triton's ``load`` with a ``config`` parameter replaces config.pbtxt for that load."""
    override = {"max_batch_size": 2,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "instance_group": [{"count": 2, "kind": "KIND_CPU"}]}
    try:
        client.load_model("reloadable", config=json.dumps(override))
        config = client.get_model_config("reloadable")
        assert config["max_batch_size"] == 2
        assert config["instance_group"][0]["count"] == 2
        assert "dynamic_batching" not in config
        tensor, data = fp32_input()
        np.testing.assert_array_equal(
            client.infer("reloadable", [tensor]).as_numpy("OUTPUT0"), data + 10.0)
        with pytest.raises(InferenceServerException) as info:
            client.load_model("reloadable", config=json.dumps({"max_batch_size": -3}))
        assert info.value.status() == "400"
        assert "max_batch_size: must be >= 0" in info.value.message()
        assert client.is_model_ready("reloadable")  # the failed reload left it serving
    finally:
        client.load_model("reloadable")
    assert client.get_model_config("reloadable")["max_batch_size"] == 4
