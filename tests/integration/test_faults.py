"""Faults: a batch that raises, an instance that dies, a model that fails to load, and a
new version swapped in under load. The faults are injected by the fault-injection
backend (``--allow-fault-injection``), which wraps the real ONNX Runtime backend."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.results import BenchResult
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, model_metric, post_json, request, running_server, wait_for
from .model_repo import (
    CONSTANT_CONFIG,
    VERSIONED_CONFIG,
    _write,
    add_constant_model,
    build_shutdown_repository,
)

pytestmark = pytest.mark.integration

FAULTY_CONFIG = CONSTANT_CONFIG.format(name="faulty", extra="""\
dynamic_batching { max_queue_delay_microseconds: 1000000 }
parameters { key: "fault_fail_on_value" value: { string_value: "13" } }
parameters { key: "fault_die_on_value" value: { string_value: "666" } }
""")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = build_shutdown_repository(tmp_path_factory.mktemp("faults"))
    _write(root, "faulty", {1: add_constant_model(1.0)}, FAULTY_CONFIG)
    _write(root, "swappable", {1: add_constant_model(1.0)},
           VERSIONED_CONFIG.format(name="swappable", policy="{ latest: { num_versions: 1 } }"))
    _write(root, "late", {1: add_constant_model(5.0)}, None)
    (root / "late" / "1" / "model.onnx").write_bytes(b"not an onnx file")
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo, extra_args=("--allow-fault-injection",))


def row(value: float) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]


def status(server: ServerProcess, path: str) -> int:
    return request(server.url, "GET", path).status


def test_a_failing_batch_fails_each_of_its_requests_and_the_next_is_served(
        server: ServerProcess) -> None:
    def depth() -> float:
        return model_metric(server, "tradeoff_inference_queue_depth", "faulty")

    with ThreadPoolExecutor(3) as pool:
        futures = []
        for i, value in enumerate((1.0, 13.0, 2.0)):  # one batch: the 1 s delay holds it
            futures.append(pool.submit(infer_json, server.url, "faulty", row(value)))
            wait_for(lambda n=i + 1: depth() == n, f"{i + 1} requests queued")
        answers = [f.result(timeout=60) for f in futures]
    for answer in answers:
        assert answer.status == 500, answer.body
        assert "injected fault: batch holds value 13" in answer.json()["error"]
    after = infer_json(server.url, "faulty", row(5.0))
    assert after.status == 200 and after.json()["outputs"][0]["data"] == [6.0] * 4
    assert status(server, "/v2/models/faulty/ready") == 200
    assert status(server, "/v2/health/ready") == 200


def test_a_dead_instance_makes_its_model_unready_until_it_is_loaded_again(
        server: ServerProcess) -> None:
    died = infer_json(server.url, "faulty", row(666.0))
    assert died.status == 500 and "instance died" in died.json()["error"]
    wait_for(lambda: status(server, "/v2/models/faulty/ready") == 503, "faulty not ready")
    refused = infer_json(server.url, "faulty", row(1.0))
    assert refused.status == 503 and "instances died" in refused.json()["error"]
    index = post_json(server.url, "/v2/repository/index", {}).json()
    entry = next(e for e in index if e["name"] == "faulty")
    assert "instance died on value 666" in entry["reason"]
    assert status(server, "/v2/health/ready") == 200  # the server and other models serve on
    mlp = infer_json(server.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                          "shape": [1, 256], "data": [0.5] * 256}])
    assert mlp.status == 200
    assert post_json(server.url, "/v2/repository/models/faulty/load", {}).status == 200
    assert status(server, "/v2/models/faulty/ready") == 200
    back = infer_json(server.url, "faulty", row(2.0))
    assert back.status == 200 and back.json()["outputs"][0]["data"] == [3.0] * 4


def test_a_model_that_fails_to_load_can_be_loaded_once_fixed(server: ServerProcess,
                                                             repo: Path) -> None:
    assert status(server, "/v2/models/late/ready") == 503
    failed = post_json(server.url, "/v2/repository/models/late/load", {})
    assert failed.status == 400 and "late" in failed.json()["error"]
    assert status(server, "/v2/health/ready") == 200
    import onnx

    onnx.save(add_constant_model(5.0), str(repo / "late" / "1" / "model.onnx"))
    assert post_json(server.url, "/v2/repository/models/late/load", {}).status == 200
    answer = infer_json(server.url, "late", row(1.0))
    assert answer.status == 200 and answer.json()["outputs"][0]["data"] == [6.0] * 4


def test_swapping_in_a_new_version_under_load_fails_no_request(server: ServerProcess,
                                                               repo: Path) -> None:
    results: list[BenchResult] = []
    thread = threading.Thread(target=lambda: results.append(run_benchmark(
        V2Adapter(server.url, "swappable"), LoadSpec(concurrency=8, duration_s=4.0))[0]))
    thread.start()
    wait_for(lambda: model_metric(server, "tradeoff_inference_request_success_total",
                                  "swappable") > 50, "load on version 1")
    _write(repo, "swappable", {2: add_constant_model(2.0)},
           VERSIONED_CONFIG.format(name="swappable", policy="{ latest: { num_versions: 1 } }"))
    assert post_json(server.url, "/v2/repository/models/swappable/load", {}).status == 200
    thread.join(60)
    summary = results[0].summary
    assert summary.errors == 0, summary.errors_by_class
    assert summary.successes > 100
    assert model_metric(server, "tradeoff_inference_request_success_total", "swappable",
                        version="2") > 0
    answer = infer_json(server.url, "swappable", row(1.0))
    assert answer.json()["model_version"] == "2"
    assert answer.json()["outputs"][0]["data"] == [3.0] * 4


def test_fault_injection_needs_the_server_flag(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _write(root, "faulty", {1: add_constant_model(1.0)}, FAULTY_CONFIG)
    _write(root, "plain", {1: add_constant_model(1.0)},
           CONSTANT_CONFIG.format(name="plain", extra=""))  # ready needs one model serving
    with ServerProcess(root) as plain:
        assert status(plain, "/v2/models/faulty/ready") == 503
        index = post_json(plain.url, "/v2/repository/index", {}).json()
        assert "--allow-fault-injection" in index[0]["reason"]
