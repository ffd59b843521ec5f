"""Health, server and model metadata, model config and the repository index."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import tritonclient.http as triton

from tests.synthetic_model import write_synthetic_model
from tradeoff.models import EXAMPLE_MODELS
from tradeoff.server.process import ServerProcess

from .helpers import request
from .model_repo import BROKEN_MODELS, IDENTITY_TYPES, QUEUE_DELAY_US, QUEUE_LIMIT, identity_name

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

SERVED = [*EXAMPLE_MODELS, *(identity_name(t) for t in [*IDENTITY_TYPES, "BF16"]), "add_sub",
          "versioned", "versioned_latest", "autocomplete", "queue_limited", "reloadable", "held"]


def test_server_live_and_ready(client: triton.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


def test_health_routes_answer_with_empty_bodies(server: ServerProcess) -> None:
    for path in ("/v2/health/live", "/v2/health/ready"):
        response = request(server.url, "GET", path)
        assert response.status == 200


def test_server_metadata(client: triton.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata["name"] == "tradeoff"
    assert metadata["version"]
    for extension in ("binary_tensor_data", "model_repository", "statistics",
                      "model_configuration"):
        assert extension in metadata["extensions"]


@pytest.mark.parametrize("model", SERVED)
def test_every_good_model_is_ready(client: triton.InferenceServerClient, model: str) -> None:
    assert client.is_model_ready(model)


def test_model_metadata(client: triton.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("add_sub")
    assert metadata["name"] == "add_sub"
    assert metadata["versions"] == ["1"]
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [
        {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}]
    assert metadata["outputs"] == [
        {"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]},
        {"name": "OUTPUT1", "datatype": "INT32", "shape": [-1, 16]}]


@pytest.mark.parametrize("datatype", [*IDENTITY_TYPES, "BF16"])
def test_identity_metadata_names_the_datatype(client: triton.InferenceServerClient,
                                              datatype: str) -> None:
    metadata = client.get_model_metadata(identity_name(datatype))
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": datatype, "shape": [-1, -1]}]
    assert metadata["outputs"] == [{"name": "OUTPUT0", "datatype": datatype,
                                    "shape": [-1, -1]}]


def test_model_config_from_hand_written_pbtxt(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("identity_bytes")
    assert config["name"] == "identity_bytes"
    assert config["platform"] == "onnxruntime_onnx"
    assert config["max_batch_size"] == 8
    assert config["input"][0]["name"] == "INPUT0"
    assert config["input"][0]["data_type"] == "TYPE_STRING"
    assert config["input"][0]["dims"] == [-1]
    assert config["output"][0]["data_type"] == "TYPE_STRING"
    assert config["dynamic_batching"]["max_queue_delay_microseconds"] == 100
    assert config["instance_group"][0]["count"] == 1
    assert config["instance_group"][0]["kind"] == "KIND_CPU"
    assert config["version_policy"] == {"latest": {"num_versions": 1}}


def test_model_config_of_queue_policy(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("queue_limited")
    batching = config["dynamic_batching"]
    assert batching["max_queue_delay_microseconds"] == QUEUE_DELAY_US
    assert batching["default_queue_policy"]["max_queue_size"] == QUEUE_LIMIT
    assert batching["default_queue_policy"]["timeout_action"] == "REJECT"


def test_model_config_version_policies(client: triton.InferenceServerClient) -> None:
    assert client.get_model_config("versioned")["version_policy"] == {"all": {}}
    assert client.get_model_config("versioned_latest")["version_policy"] == {
        "latest": {"num_versions": 2}}
    assert client.get_model_config("add_sub")["instance_group"][0]["count"] == 2


def test_model_without_config_is_auto_completed(client: triton.InferenceServerClient) -> None:
    config = client.get_model_config("autocomplete")
    assert config["name"] == "autocomplete"
    assert config["platform"] == "onnxruntime_onnx"
    # every tensor has a variable first dimension: Triton's default max_batch_size and
    # the dynamic batcher are turned on
    assert config["max_batch_size"] == 4
    assert "dynamic_batching" in config
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("INPUT0", "TYPE_FP32", [4])]
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["output"]] == [
        ("OUTPUT0", "TYPE_FP32", [4])]
    metadata = client.get_model_metadata("autocomplete")
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]


def test_repository_index_lists_every_model(client: triton.InferenceServerClient) -> None:
    index = client.get_model_repository_index()
    names = {row["name"] for row in index}
    assert set(SERVED) | set(BROKEN_MODELS) <= names
    for row in index:
        if row["name"] in SERVED:
            assert row["state"] == "READY", row
    versions = sorted(row["version"] for row in index if row["name"] == "versioned")
    assert versions == ["1", "2"]
    versions = sorted(row["version"] for row in index if row["name"] == "versioned_latest")
    assert versions == ["2", "3"]


@pytest.mark.parametrize("model", list(BROKEN_MODELS))
def test_broken_config_fails_alone_with_a_reason(server: ServerProcess,
                                                 client: triton.InferenceServerClient,
                                                 model: str) -> None:
    rows = [row for row in client.get_model_repository_index() if row["name"] == model]
    assert len(rows) == 1
    row = rows[0]
    assert row["state"] == "UNAVAILABLE"
    assert f"{model}/config.pbtxt" in row["reason"]
    for fragment in BROKEN_MODELS[model]:
        assert fragment in row["reason"], row["reason"]
    assert not client.is_model_ready(model)
    response = request(server.url, "GET", f"/v2/models/{model}/ready")
    assert response.status != 200
    # the rest of the server is unaffected
    assert client.is_server_ready()
    assert client.is_model_ready("tiny")


def test_ready_only_index(server: ServerProcess) -> None:
    response = request(server.url, "POST", "/v2/repository/index", b'{"ready": true}')
    assert response.status == 200
    rows = response.json()
    assert rows and all(row["state"] == "READY" for row in rows)
    assert not set(BROKEN_MODELS) & {row["name"] for row in rows}


def test_a_server_with_nothing_to_serve_is_live_but_not_ready(tmp_path: Path) -> None:
    """Every model failed to load: ready used to answer 200 (unless --strict-readiness);
    it answers 503 until a model serves, and the log says why."""
    write_synthetic_model(tmp_path, "broken", extra="not a config field: 1")
    process = ServerProcess(tmp_path)
    process.process = subprocess.Popen(process.command(), stdout=process.log,
                                       stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while "no model serves" not in process.log_text():
            assert time.monotonic() < deadline and process.process.poll() is None
            time.sleep(0.1)
        assert request(process.url, "GET", "/v2/health/live").status == 200
        assert request(process.url, "GET", "/v2/health/ready").status == 503
        (tmp_path / "broken" / "config.pbtxt").write_text(
            'name: "broken"\nbackend: "synthetic"\nmax_batch_size: 8\n')
        assert request(process.url, "POST", "/v2/repository/models/broken/load",
                       b"{}").status == 200
        assert request(process.url, "GET", "/v2/health/ready").status == 200
    finally:
        assert process.stop() == 0
        process.close_log()
