"""Overload and abandoned requests: refused at once with 503 / UNAVAILABLE, nothing lost,
nothing leaked, and the server is back to its baseline soon after the load stops."""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.soak import MemoryWatch, SoakPlan
from tradeoff.server.process import ServerProcess

from ..synthetic_model import write_synthetic_model
from .helpers import infer_json, metric_samples, model_metric, request, running_server, wait_for
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model, build_shutdown_repository

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

LIMIT = 3
# waits up to 2 s for a batch, but a request may wait only 300 ms (or less, if it asks)
TIMED_CONFIG = CONSTANT_CONFIG.format(name="timed", extra="""\
dynamic_batching {
  max_queue_delay_microseconds: 2000000
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 300000
    allow_timeout_override: true
  }
}
""")


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory, server_mode: str
            ) -> Iterator[ServerProcess]:
    """A server that holds at most LIMIT inference requests at once."""
    repo = build_shutdown_repository(tmp_path_factory.mktemp("limited"))
    _write(repo, "timed", {1: add_constant_model(1.0)}, TIMED_CONFIG)
    yield from running_server(repo, mode=server_mode,
                              extra_args=("--max-inflight", str(LIMIT)))


def row(value: float) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]


def server_gauge(server: ServerProcess, name: str) -> float:
    return metric_samples(server)[(name, frozenset())]


def test_past_the_server_limit_requests_are_refused_at_once(limited: ServerProcess) -> None:
    """``held`` keeps requests queued for 2 s: LIMIT of them fill the server."""
    with ThreadPoolExecutor(LIMIT) as pool:
        waiting = [pool.submit(infer_json, limited.url, "held", row(float(i)))
                   for i in range(LIMIT)]
        wait_for(lambda: server_gauge(limited, "tradeoff_server_in_flight") == LIMIT,
                 f"{LIMIT} requests in flight")
        started = time.monotonic()
        refused = infer_json(limited.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                                  "shape": [1, 64], "data": [0.0] * 64}])
        refused_after = time.monotonic() - started
        client = triton_grpc.InferenceServerClient(limited.grpc_url)
        tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.zeros((1, 4), np.float32))
        with pytest.raises(triton_grpc.InferenceServerException) as grpc_refusal:
            client.infer("held", [tensor])
        client.close()
        answered = [f.result(timeout=60) for f in waiting]
    assert refused.status == 503, refused.body
    assert "--max-inflight" in refused.json()["error"]
    assert refused.header("Retry-After") == "1"
    assert refused_after < 1.0  # refused at once, not after the 2 s the others wait
    assert grpc_refusal.value.status() == "StatusCode.UNAVAILABLE"
    assert all(r.status == 200 for r in answered)
    wait_for(lambda: server_gauge(limited, "tradeoff_server_in_flight") == 0,
             "no requests in flight")
    assert server_gauge(limited, "tradeoff_server_overload_refusals_total") >= 2


def _send_and_vanish(server: ServerProcess, model: str) -> None:
    body = json.dumps({"inputs": row(1.0)}).encode()
    with socket.create_connection((server.host, server.http_port)) as sock:
        sock.sendall(b"POST /v2/models/%s/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                     % (model.encode(), len(body), body))
        wait_for(lambda: model_metric(server, "tradeoff_inference_queue_depth", model) == 1,
                 "the request in the queue")


def test_a_request_whose_client_left_is_dropped_before_compute(limited: ServerProcess) -> None:
    def failures(reason: str) -> float:
        labels = frozenset({"model": "held", "version": "1", "reason": reason}.items())
        return metric_samples(limited)[("tradeoff_inference_request_failure_total", labels)]

    canceled_before = failures("CANCELED")
    executions_before = model_metric(limited, "tradeoff_inference_exec_count_total", "held")
    _send_and_vanish(limited, "held")  # closes the socket with the request still queued
    wait_for(lambda: failures("CANCELED") == canceled_before + 1, "the request canceled")
    assert model_metric(limited, "tradeoff_inference_queue_depth", "held") == 0
    assert model_metric(limited, "tradeoff_inference_in_flight", "held") == 0
    wait_for(lambda: server_gauge(limited, "tradeoff_server_in_flight") == 0,
             "no requests in flight")
    time.sleep(2.5)  # past the 2 s batching delay: the dropped request never runs
    assert model_metric(limited, "tradeoff_inference_exec_count_total", "held") == executions_before
    ok = infer_json(limited.url, "held", row(2.0))
    assert ok.status == 200  # and the server serves on


@pytest.mark.timing  # p99 after the overload against the p99 before, 2 ms of slack
@pytest.mark.slow
def test_three_times_capacity_for_twenty_seconds(tmp_path: Path) -> None:
    """Open loop at 3x the measured capacity of ``paced``: every request gets an answer
    (success or an explicit 503), no hangs or resets, bounded memory, and light-load p99
    back near its baseline within seconds of the load stopping. ``paced`` costs 2 ms a
    batch of up to 8 whatever the machine, so 3x its capacity (about 10,000 req/s)
    overloads the server, not the load generator, on a fast core as on a slow one."""
    repo = build_shutdown_repository(tmp_path / "models")
    write_synthetic_model(repo, "paced", fixed_ms=2.0, per_row_ms=0.05, max_batch_size=8)
    cores = sorted(os.sched_getaffinity(0))
    pinned = len(cores) >= 2  # server and load generator on different cores
    with ServerProcess(repo, cpus=str(cores[0]) if pinned else None) as server:
        assert server.process is not None
        if pinned:
            os.sched_setaffinity(0, set(cores[1:]))
        try:
            adapter = V2Adapter(server.url, "paced")
            light = LoadSpec(concurrency=1, duration_s=2.0, warmup_s=0.5)
            baseline, _, _ = run_benchmark(adapter, light)
            capacity, _, _ = run_benchmark(adapter, LoadSpec(concurrency=32, duration_s=2.0,
                                                             warmup_s=0.5))
            rate = 3 * capacity.summary.throughput_rps
            plan = SoakPlan(duration_s=20.0, window_s=1.0, server_pid=server.process.pid)
            started = time.monotonic()
            with MemoryWatch(plan) as memory:
                overload, _, _ = run_benchmark(adapter, LoadSpec(
                    rate=rate, duration_s=20.0, timeout_s=120.0, max_connections=2048))
            stopped = time.monotonic()
            time.sleep(3.0)
            after, _, _ = run_benchmark(adapter, light)
            recovered_in = time.monotonic() - stopped
        finally:
            os.sched_setaffinity(0, set(cores))
        assert server.stop() == 0
    s = overload.summary
    classes = s.errors_by_class
    assert set(classes) <= {"http", "http_503"}, classes  # no timeouts, resets, refusals
    assert s.successes + classes.get("http_503", 0) == s.requests
    assert overload.total_requests_sent >= s.requests
    assert classes.get("http_503", 0) > 0.2 * s.requests  # it really was overloaded
    assert s.successes > 0
    rss = [sample[1] for sample in memory.samples]
    assert len(rss) >= 10
    assert max(rss) < rss[0] + 300 * 2**20, (rss[0], max(rss))
    base_p99 = baseline.summary.latency("p99")
    after_p99 = after.summary.latency("p99")
    assert base_p99 is not None and after_p99 is not None
    assert after.summary.errors == 0
    assert after_p99 < 3 * base_p99 + 2.0, (base_p99, after_p99, recovered_in)
    print(f"\noverload: asked {rate:,.0f} req/s (3x {rate / 3:,.0f}) for 20 s, all sent in "
          f"{stopped - started:.1f} s; {s.successes:,} served, "
          f"{classes.get('http_503', 0):,} refused, "
          f"RSS {rss[0] / 2**20:.0f} -> max {max(rss) / 2**20:.0f} MiB, "
          f"p99 light load {base_p99:.2f} ms before, {after_p99:.2f} ms "
          f"{recovered_in:.1f} s after")


def test_a_grpc_call_past_its_deadline_is_dropped_before_compute(limited: ServerProcess) -> None:
    def canceled() -> float:
        labels = frozenset({"model": "held", "version": "1", "reason": "CANCELED"}.items())
        return metric_samples(limited)[("tradeoff_inference_request_failure_total", labels)]

    before = canceled()
    executions = model_metric(limited, "tradeoff_inference_exec_count_total", "held")
    client = triton_grpc.InferenceServerClient(limited.grpc_url)
    tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
    with pytest.raises(triton_grpc.InferenceServerException) as gave_up:
        client.infer("held", [tensor], client_timeout=0.3)  # held for 2 s in the queue
    client.close()
    assert "Deadline" in str(gave_up.value) or "DEADLINE" in str(gave_up.value.status())
    wait_for(lambda: canceled() == before + 1, "the abandoned call canceled")
    wait_for(lambda: server_gauge(limited, "tradeoff_server_in_flight") == 0,
             "no requests in flight")
    assert model_metric(limited, "tradeoff_inference_queue_depth", "held") == 0
    time.sleep(2.5)
    assert model_metric(limited, "tradeoff_inference_exec_count_total", "held") == executions


def test_requests_past_their_time_limit_get_a_clear_error(limited: ServerProcess) -> None:
    started = time.monotonic()
    by_policy = infer_json(limited.url, "timed", row(1.0))
    waited = time.monotonic() - started
    assert by_policy.status == 503 and "timed out in the queue" in by_policy.json()["error"]
    assert waited < 1.5  # the policy's 300 ms, not the 2 s batching delay
    body = {"inputs": row(1.0), "parameters": {"timeout": 50_000}}
    started = time.monotonic()
    asked = request(limited.url, "POST", "/v2/models/timed/infer", json.dumps(body).encode(),
                    {"Content-Type": "application/json"})
    assert asked.status == 503 and "timed out" in asked.json()["error"]
    assert time.monotonic() - started < waited + 0.5
    wait_for(lambda: model_metric(limited, "tradeoff_inference_in_flight", "timed") == 0,
             "nothing left in flight")
