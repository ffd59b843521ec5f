"""Queue limits and a graceful stop under load.

Requests are held in a batcher's queue by a long ``max_queue_delay_microseconds``, and
the tests wait on the server's own gauges (``/metrics``) rather than on sleeps, so what
they check is the order of events, not how fast this machine computes.
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

import tradeoff
from tradeoff.server.process import ServerProcess, free_ports, source_tree

from .helpers import (
    SERVER_MODES,
    Response,
    infer_json,
    metric_samples,
    model_metric,
    request,
    wait_for,
)
from .model_repo import (
    CONSTANT_CONFIG,
    QUEUE_LIMIT,
    _write,
    add_constant_model,
    build_shutdown_repository,
)

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]


def gauges(server: ServerProcess, model: str) -> tuple[float, float]:
    """``(in_flight, queue_depth)`` of a model, from one scrape of /metrics."""
    samples = metric_samples(server)
    labels = frozenset({"model": model, "version": "1"}.items())
    return (samples[("tradeoff_inference_in_flight", labels)],
            samples[("tradeoff_inference_queue_depth", labels)])


def fp32_row(value: float) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]


def test_full_queue_rejects_with_503(server: ServerProcess) -> None:
    """``queue_limited`` holds requests until 4 rows or 2 s: the third waiting one is refused."""
    model = "queue_limited"

    def send(value: float) -> Response:
        return infer_json(server.url, model, fp32_row(value))

    def depth() -> float:
        return model_metric(server, "tradeoff_inference_queue_depth", model)

    wait_for(lambda: depth() == 0, "an empty queue")
    with ThreadPoolExecutor(QUEUE_LIMIT) as pool:
        waiting = []
        for i in range(QUEUE_LIMIT):
            waiting.append(pool.submit(send, float(i)))
            wait_for(lambda n=i + 1: depth() == n, f"{i + 1} requests in the queue")
        rejected = send(99.0)
        results = [future.result(timeout=60) for future in waiting]
    assert rejected.status == 503, rejected.body
    assert "queue is full" in rejected.json()["error"]
    assert rejected.header("Retry-After") is not None
    for i, response in enumerate(results):
        assert response.status == 200, response.body
        assert response.json()["outputs"][0]["data"] == [i + 1.0] * 4
    # the queued requests left as one batch when the delay passed
    stats = request(server.url, "GET", f"/v2/models/{model}/stats").json()["model_stats"][0]
    assert {b["batch_size"] for b in stats["batch_stats"]} == {QUEUE_LIMIT}


# ------------------------------------------------------------------ SIGTERM under load

HELD_REQUESTS = 8
LOOPERS = 4
MAX_LOOPS = 2000


@pytest.fixture
def stoppable_server(tmp_path_factory: pytest.TempPathFactory, server_mode: str
                     ) -> Iterator[ServerProcess]:
    root = build_shutdown_repository(tmp_path_factory.mktemp("shutdown-models"))
    process = ServerProcess(root, extra_args=SERVER_MODES[server_mode])
    with process:
        yield process


def test_sigterm_answers_every_accepted_request(stoppable_server: ServerProcess) -> None:
    """SIGTERM while ``held`` keeps 8 requests queued and mlp serves a steady stream."""
    server = stoppable_server
    assert server.process is not None
    stopping = threading.Event()
    mlp_body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                       "shape": [1, 256], "data": [0.25] * 256}]}).encode()
    looper_errors: list[str] = []

    def loop_mlp() -> int:
        """Fresh connections to mlp until the server stops taking them."""
        answered = 0
        for _ in range(MAX_LOOPS):
            try:
                response = request(server.url, "POST", "/v2/models/mlp/infer", mlp_body,
                                   {"Content-Type": "application/json"})
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                if not stopping.is_set():
                    looper_errors.append(f"before SIGTERM: {exc!r}")
                return answered  # not accepted: the server had stopped listening
            if stopping.is_set() and response.status == 503:
                # arrived after SIGTERM: refused explicitly, as new work should be
                assert b"shutting down" in response.body
                return answered
            if response.status != 200:
                looper_errors.append(f"{response.status}: {response.body[:200]!r}")
            answered += 1
        return answered

    with ThreadPoolExecutor(LOOPERS + HELD_REQUESTS) as pool:
        loopers = [pool.submit(loop_mlp) for _ in range(LOOPERS)]
        wait_for(lambda: model_metric(server, "tradeoff_inference_request_success_total",
                                      "mlp") >= LOOPERS, "mlp traffic")
        held: list[Future[Response]] = [
            pool.submit(infer_json, server.url, "held", fp32_row(float(i)))
            for i in range(HELD_REQUESTS)]
        # all of them accepted and waiting in the batcher's queue (for up to 2 s)
        wait_for(lambda: gauges(server, "held") == (HELD_REQUESTS, HELD_REQUESTS),
                 "every held request to be queued")
        stopping.set()
        server.process.send_signal(signal.SIGTERM)

        for i, future in enumerate(held):
            response = future.result(timeout=120)
            assert response.status == 200, (response.status, response.body)
            assert response.json()["outputs"][0]["data"] == [i + 1.0] * 4
        answered = [future.result(timeout=120) for future in loopers]

    assert server.process.wait(timeout=60) == 0
    assert server.stop() == 0
    assert not looper_errors, looper_errors
    assert all(n >= 1 for n in answered)
    assert "stopped" in server.log_text()
    with pytest.raises((ConnectionError, OSError)):
        request(server.url, "GET", "/v2/health/live")


def test_a_server_that_cannot_start_says_why_and_leaves_no_log_behind(tmp_path: Path) -> None:
    # something else already listens on the HTTP port: the child exits, start() says so
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        process = ServerProcess(tmp_path)
        process.http_port = taken.getsockname()[1]
        with pytest.raises(RuntimeError, match=r"exited with (.|\n)*cannot listen"):
            process.start(timeout=60)
    assert process.log.closed and not Path(process.log.name).exists()
    assert len(set(free_ports(16))) == 16


def test_a_port_it_picked_that_another_process_took_is_picked_again(tmp_path: Path) -> None:
    _write(tmp_path, "addc", {1: add_constant_model(1.0)},
           CONSTANT_CONFIG.format(name="addc", extra=""))
    process = ServerProcess(tmp_path)
    picked = process.http_port
    with socket.socket() as taken:  # what another test's server might do meanwhile
        taken.bind(("127.0.0.1", picked))
        taken.listen()
        process.start(timeout=60)
        try:
            assert process.http_port != picked
            assert request(process.url, "GET", "/v2/health/live").status == 200
        finally:
            assert process.stop() == 0
            process.close_log()


def test_a_baseline_source_tree_must_hold_the_package(tmp_path: Path) -> None:
    src = Path(tradeoff.__file__).parent.parent
    assert source_tree(str(src)) == src.resolve()
    with pytest.raises(argparse.ArgumentTypeError, match="no tradeoff package there"):
        source_tree(str(tmp_path))
