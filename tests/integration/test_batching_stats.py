"""Dynamic batching under concurrency, the statistics extension, /metrics, Server-Timing."""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
import pytest
import tritonclient.http as triton

from tradeoff.server.process import ServerProcess

from .helpers import References, infer_json, metric_samples, model_metric, request

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

CONCURRENCY = 64
T = TypeVar("T")

DURATIONS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output",
             "cache_hit", "cache_miss")


def stats_of(client: triton.InferenceServerClient, model: str, version: str = "") -> dict:
    [entry] = client.get_inference_statistics(model, version)["model_stats"]
    return entry


def together(server: ServerProcess, count: int,
             work: Callable[[triton.InferenceServerClient, int], T]) -> list[T]:
    """Run ``work(client, i)`` for ``i < count`` on threads released at once.

    tritonclient's async_infer sleeps 10 ms after sending each request, which spaces them
    out too far to ever share a batch on a fast model; threads, each with its own client
    and an open connection, released together by a barrier, send at once.
    """
    barrier = threading.Barrier(count)

    def run(i: int) -> T:
        with triton.InferenceServerClient(server.url.removeprefix("http://"),
                                          network_timeout=60.0) as own:
            assert own.is_server_live()  # opens the connection before the barrier
            barrier.wait(timeout=60)
            return work(own, i)

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(run, range(count), timeout=120))


def test_concurrent_requests_are_batched_and_match_unbatched_results(
        server: ServerProcess, references: References) -> None:
    inputs = np.random.default_rng(123).standard_normal((CONCURRENCY, 1, 256)).astype(np.float32)
    before = _stats(server, "mlp")

    def send(own: triton.InferenceServerClient, i: int) -> triton.InferResult:
        tensor = triton.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(inputs[i])
        return own.infer("mlp", [tensor], request_id=str(i))

    results = together(server, CONCURRENCY, send)
    for i, (data, result) in enumerate(zip(inputs, results, strict=True)):
        assert result.get_response()["id"] == str(i)
        alone = references.run("mlp", {"INPUT0": data})["OUTPUT0"]  # one row, unbatched
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), alone, rtol=1e-5, atol=1e-5,
                                   err_msg=f"request {i}")

    after = _stats(server, "mlp")
    executions = after["execution_count"] - before["execution_count"]
    inferences = after["inference_count"] - before["inference_count"]
    assert inferences == CONCURRENCY
    assert 1 <= executions < inferences, "64 concurrent requests never shared a batch"
    assert any(b["batch_size"] > 1 for b in after["batch_stats"])


def test_concurrent_requests_of_different_shapes_keep_their_own_data(
        server: ServerProcess) -> None:
    """Only requests with equal non-batch dims share a batch; each gets its own rows back."""
    shapes = [(rows, width) for rows in (1, 2, 3) for width in (1, 2, 5, 7)] * 2
    before = _stats(server, "identity_int64")

    def send(own: triton.InferenceServerClient, i: int) -> tuple[np.ndarray, np.ndarray]:
        rows, width = shapes[i]
        data = (np.arange(rows * width, dtype=np.int64) + 1000 * i).reshape(rows, width)
        tensor = triton.InferInput("INPUT0", [rows, width], "INT64")
        tensor.set_data_from_numpy(data)
        return data, own.infer("identity_int64", [tensor]).as_numpy("OUTPUT0")

    for data, got in together(server, len(shapes), send):
        np.testing.assert_array_equal(got, data)
    after = _stats(server, "identity_int64")
    assert after["inference_count"] - before["inference_count"] == sum(r for r, _ in shapes)


def _stats(server: ServerProcess, model: str) -> dict:
    [entry] = request(server.url, "GET", f"/v2/models/{model}/stats").json()["model_stats"]
    return entry


def test_statistics_extension_counts_requests(client: triton.InferenceServerClient) -> None:
    model = "versioned"
    before = stats_of(client, model, "1")
    rows = [1, 2, 1]
    for n in rows:
        tensor = triton.InferInput("INPUT0", [n, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((n, 4), np.float32))
        client.infer(model, [tensor], model_version="1")
    after = stats_of(client, model, "1")

    assert after["name"] == model
    assert after["version"] == "1"
    assert after["last_inference"] > 0
    assert after["inference_count"] - before["inference_count"] == sum(rows)
    # sequential requests to a model without dynamic batching: one execution each
    assert after["execution_count"] - before["execution_count"] == len(rows)
    stats = after["inference_stats"]
    assert set(DURATIONS) <= set(stats)
    for name in DURATIONS:
        assert set(stats[name]) == {"count", "ns"}
    for name in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        assert stats[name]["count"] - before["inference_stats"][name]["count"] == len(rows)
    assert stats["compute_infer"]["ns"] > before["inference_stats"]["compute_infer"]["ns"]
    sizes = {b["batch_size"]: b for b in after["batch_stats"]}
    assert {1, 2} <= set(sizes)
    for entry in sizes.values():
        assert set(entry) >= {"batch_size", "compute_input", "compute_infer", "compute_output"}
    # version 2 was not touched by this test's requests
    assert stats_of(client, model, "2")["version"] == "2"


def test_statistics_of_every_version_and_every_model(client: triton.InferenceServerClient
                                                     ) -> None:
    entries = client.get_inference_statistics("versioned")["model_stats"]
    assert sorted(e["version"] for e in entries) == ["1", "2"]
    everything = client.get_inference_statistics()["model_stats"]
    served = {(e["name"], e["version"]) for e in everything}
    assert {("tiny", "1"), ("versioned", "1"), ("versioned", "2"),
            ("versioned_latest", "2"), ("versioned_latest", "3")} <= served
    assert not any(name == "broken" for name, _ in served)


def test_failed_requests_are_counted(client: triton.InferenceServerClient,
                                     server: ServerProcess) -> None:
    # a request refused before it reaches the queue is not an inference; the count of
    # successes must not move
    before = stats_of(client, "tiny")
    response = infer_json(server.url, "tiny", [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 15], "data": [0.0] * 15}])
    assert response.status == 400
    after = stats_of(client, "tiny")
    assert after["inference_stats"]["success"]["count"] == \
        before["inference_stats"]["success"]["count"]
    assert after["inference_count"] == before["inference_count"]


def test_server_timing_header(server: ServerProcess) -> None:
    response = infer_json(server.url, "tiny", [
        {"name": "INPUT0", "datatype": "FP32", "shape": [2, 16], "data": [1.0] * 32}])
    assert response.status == 200, response.body
    timing = response.header("Server-Timing")
    assert timing is not None
    metrics = {part.strip().split(";")[0]: part.strip() for part in timing.split(",")}
    for name in ("queue", "compute_input", "compute_infer", "compute_output"):
        assert name in metrics, timing
        duration = float(metrics[name].split("dur=")[1])
        assert duration >= 0
    assert response.json()["outputs"][0]["data"] == [3.0] * 32


def test_metrics_port_has_batch_size_and_model_counters(
        server: ServerProcess, client: triton.InferenceServerClient) -> None:
    requests = 3
    before = metric_samples(server)
    for _ in range(requests):
        tensor = triton.InferInput("INPUT0", [2, 16], "FP32")
        tensor.set_data_from_numpy(np.zeros((2, 16), np.float32))
        client.infer("tiny", [tensor])
    after = metric_samples(server)
    labels = frozenset({"model": "tiny", "version": "1"}.items())

    def delta(name: str) -> float:
        return after[(name, labels)] - before.get((name, labels), 0.0)

    assert delta("tradeoff_inference_request_success_total") == requests
    assert delta("tradeoff_inference_count_total") == 2 * requests
    assert delta("tradeoff_inference_exec_count_total") == requests  # sequential
    # tradeoff_batch_size: one observation per execution, the sum is the rows run
    assert delta("tradeoff_batch_size_count") == requests
    assert delta("tradeoff_batch_size_sum") == 2 * requests
    assert delta("tradeoff_inference_request_duration_seconds_count") == requests
    assert after[("tradeoff_model_ready", labels)] == 1
    assert ("tradeoff_inference_queue_depth", labels) in after
    assert ("tradeoff_inference_in_flight", labels) in after
    # every served model has its own counters
    for model in ("mlp", "add_sub", "identity_bytes"):
        assert model_metric(server, "tradeoff_inference_request_success_total", model) >= 0


def test_metrics_count_the_batches_run_on_the_event_loop(
        server: ServerProcess, client: triton.InferenceServerClient) -> None:
    # tiny's batches take microseconds: once 16 in a row were short, they run on the loop
    name = "tradeoff_inference_exec_on_loop_count_total"
    before = model_metric(server, name, "tiny")
    executions = model_metric(server, "tradeoff_inference_exec_count_total", "tiny")
    for _ in range(40):
        tensor = triton.InferInput("INPUT0", [1, 16], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 16), np.float32))
        assert client.infer("tiny", [tensor]).as_numpy("OUTPUT0") is not None
    on_loop = model_metric(server, name, "tiny") - before
    ran = model_metric(server, "tradeoff_inference_exec_count_total", "tiny") - executions
    assert ran == 40 and 1 <= on_loop <= ran


def test_metrics_port_serves_only_metrics(server: ServerProcess) -> None:
    metrics_root = server.metrics_url.removesuffix("/metrics")
    assert request(metrics_root, "GET", "/v2/health/ready").status == 404
    assert request(server.url, "GET", "/metrics").status == 404
