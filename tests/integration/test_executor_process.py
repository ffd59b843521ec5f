"""Tensor models in an executor process (``serve --executors process``): the same
answers, statistics and metrics as in the server's process, tensors in shared memory
that only the server's user can open, is bounded (a request that does not fit gets 503)
and never outlives the server; a killed executor fails its requests in flight at once,
readiness goes false, and its models load again in a new process."""

from __future__ import annotations

import http.client
import json
import os
import signal
import stat
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton

from tradeoff.server.process import ServerProcess

from .helpers import (
    References,
    infer_json,
    metric_samples,
    model_metric,
    request,
    running_server,
    wait_for,
)
from .model_repo import (
    IDENTITY_TYPES,
    QUEUE_DELAY_US,
    QUEUE_LIMIT,
    build_test_repository,
    identity_name,
)
from .test_engine_process import alive, engine_children
from .test_infer import reference_input, sample

pytestmark = pytest.mark.integration

PROCESS = ("--executors", "process")


def segments(pid: int) -> dict[str, int]:
    """The shared memory segments of the server ``pid``: name -> mode."""
    prefix = f"tradeoff-{os.getuid()}-{pid}-"
    return {p.name: stat.S_IMODE(p.stat().st_mode) for p in Path("/dev/shm").iterdir()
            if p.name.startswith(prefix)}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from running_server(repository, extra_args=PROCESS)


def test_every_datatype_and_model_answers_as_onnxruntime(server: ServerProcess,
                                                          repository: Path) -> None:
    """Every datatype through the shared arenas (BYTES inline), several inputs and
    outputs, two versions of one model in one executor, HTTP and gRPC."""
    references = References(repository)
    client = triton.InferenceServerClient(server.url.removeprefix("http://"))
    for datatype in IDENTITY_TYPES:
        model = identity_name(datatype)
        data = sample(datatype)
        tensor = triton.InferInput("INPUT0", list(data.shape), datatype)
        tensor.set_data_from_numpy(data)
        got = client.infer(model, [tensor]).as_numpy("OUTPUT0")
        expected = references.run(model, {"INPUT0": reference_input(datatype, data)})
        if datatype == "BYTES":
            np.testing.assert_array_equal(got, data)
        else:
            np.testing.assert_array_equal(got, expected["OUTPUT0"])
    empty = triton.InferInput("INPUT0", [2, 0], "FP32")
    empty.set_data_from_numpy(np.zeros((2, 0), np.float32))
    assert client.infer("identity_fp32", [empty]).as_numpy("OUTPUT0").shape == (2, 0)
    a, b = (np.arange(16, dtype=np.int32).reshape(1, 16) * k for k in (3, 1))
    pair = [triton.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in range(2)]
    pair[0].set_data_from_numpy(a)
    pair[1].set_data_from_numpy(b)
    result = client.infer("add_sub", pair)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    for version in ("1", "2"):
        answer = infer_json(server.url, "versioned", row, version=version)
        assert answer.json()["outputs"][0]["data"] == [1.0 + int(version)] * 4, answer.body
    grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    data = np.random.default_rng(0).random((8, 256), dtype=np.float32)
    tensor_g = triton_grpc.InferInput("INPUT0", [8, 256], "FP32")
    tensor_g.set_data_from_numpy(data)
    np.testing.assert_allclose(grpc.infer("mlp", [tensor_g]).as_numpy("OUTPUT0"),
                               references.run("mlp", {"INPUT0": data})["OUTPUT0"],
                               rtol=1e-5, atol=1e-6)
    grpc.close()
    client.close()


def test_statistics_metrics_and_a_full_queue_are_the_executors(server: ServerProcess) -> None:
    """Batches run in the executor process are counted by the server's statistics and
    /metrics; its queue depth shows there while requests wait, and a full queue is 503."""
    model = "queue_limited"

    def depth() -> float:
        return model_metric(server, "tradeoff_inference_queue_depth", model)

    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [5.0] * 4}]
    labels = frozenset({"model": model, "version": "1"}.items())

    def counts() -> tuple[int, ...]:
        entry = request(server.url, "GET", f"/v2/models/{model}/stats").json()[
            "model_stats"][0]
        stats = entry["inference_stats"]
        samples = metric_samples(server)
        return (entry["inference_count"], entry["execution_count"], stats["success"]["count"],
                stats["fail"]["count"],
                sum(b["compute_infer"]["count"] for b in entry["batch_stats"]
                    if b["batch_size"] == QUEUE_LIMIT),
                int(samples[("tradeoff_inference_count_total", labels)]),
                int(samples[("tradeoff_inference_request_failure_total",
                             labels | {("reason", "REJECTED")})]))

    for _ in range(3):  # a busy host may take the batch delay to fill the queue: again
        before = counts()
        with ThreadPoolExecutor(QUEUE_LIMIT) as pool:
            waiting = []
            first = time.monotonic()
            for i in range(QUEUE_LIMIT):
                waiting.append(pool.submit(infer_json, server.url, model, row))
                wait_for(lambda n=i + 1: depth() == n, f"{i + 1} requests in the queue")
            in_time = time.monotonic() - first < 0.8 * QUEUE_DELAY_US / 1e6
            refused = infer_json(server.url, model, row)
            answers = [future.result(timeout=60) for future in waiting]
        if in_time:
            break
        wait_for(lambda: depth() == 0, "the late request answered")
    assert refused.status == 503 and "queue is full" in refused.json()["error"], refused.body
    assert [a.status for a in answers] == [200] * QUEUE_LIMIT
    # inferences, executions, successes, failures, batches of QUEUE_LIMIT, and /metrics'
    assert [a - b for a, b in zip(counts(), before, strict=True)] == [
        QUEUE_LIMIT, 1, QUEUE_LIMIT, 1, 1, QUEUE_LIMIT, 1]
    assert depth() == 0
    held = metric_samples(server)[("tradeoff_executor_shared_memory_used_bytes",
                    frozenset({"device": "cpu"}.items()))]
    assert held == 0  # every request's blocks are free again


def test_cancelled_requests_free_their_shared_memory(server: ServerProcess) -> None:
    """Clients that leave while their requests wait in the executor's queue: the
    requests are dropped there (CANCELED), and their blocks are free again."""
    model = "held"  # waits 2 s in the queue for a batch of 4
    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    before = request(server.url, "GET", f"/v2/models/{model}/stats").json()[
        "model_stats"][0]["inference_stats"]["fail"]["count"]

    def leave() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=0.3)
        try:
            connection.request("POST", f"/v2/models/{model}/infer",
                               json.dumps({"inputs": row}).encode(),
                               {"Content-Type": "application/json"})
            connection.getresponse()
        except OSError:
            pass  # the client gave up
        finally:
            connection.close()

    threads = [threading.Thread(target=leave) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(10)
    memory = ("tradeoff_executor_shared_memory_used_bytes", frozenset({"device": "cpu"}.items()))
    wait_for(lambda: metric_samples(server)[memory] == 0, "the cancelled requests' blocks "
             "freed", timeout=10)
    wait_for(lambda: request(server.url, "GET", f"/v2/models/{model}/stats").json()[
        "model_stats"][0]["inference_stats"]["fail"]["count"] == before + 3,
        "three cancelled requests counted", timeout=10)
    assert infer_json(server.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                           "shape": [1, 256], "data": [0.5] * 256}]).status == 200


def test_shared_memory_is_the_users_alone_and_goes_with_the_server(repository: Path) -> None:
    """0600 segments named for the server; a request that does not fit the arena is
    refused with 503 and the next one is served; SIGTERM unlinks them all."""
    server = ServerProcess(repository, extra_args=(*PROCESS, "--executor-memory-mb", "1"))
    server.start()
    try:
        assert server.process is not None
        pid = server.process.pid
        found = segments(pid)
        assert len(found) == 2 and set(found.values()) == {0o600}, found
        big = np.zeros((8, 40_000), np.float32)  # 1.28 MB: more than the 1 MiB arena
        too_big = infer_json(server.url, "identity_fp32", [{"name": "INPUT0",
                                                           "datatype": "FP32",
                                                  "shape": list(big.shape),
                                                  "data": big.ravel().tolist()}])
        assert too_big.status == 503, too_big.body
        assert "shared memory for requests is full" in too_big.json()["error"]
        small = infer_json(server.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                                "shape": [2, 256], "data": [0.0] * 512}])
        assert small.status == 200, small.body
    finally:
        code = server.stop()
        server.close_log()
    assert code == 0
    assert segments(pid) == {}


def test_a_killed_executor_fails_its_requests_at_once_and_its_models_load_again(
        repository: Path) -> None:
    """SIGKILL the executor process with requests waiting in it: each is answered 503
    within a second, the models are not ready, then a new executor process loads them
    and they answer again."""
    server = ServerProcess(repository, extra_args=PROCESS)
    server.start()
    try:
        assert server.process is not None
        [executor] = engine_children(server.process.pid)
        statuses = kill_with_requests_waiting(server, executor, 3)
        assert [s for s, _ in statuses] == [503] * 3
        assert all(after < 1.0 for _, after in statuses), statuses
        ready = request(server.url, "GET", "/v2/models/mlp/ready")
        wait_for(lambda: request(server.url, "GET", "/v2/models/mlp/ready").status == 200,
                 "mlp ready again", timeout=60)
        [again] = engine_children(server.process.pid)
        assert again != executor and not alive(executor)
        answer = infer_json(server.url, "mlp", [{"name": "INPUT0", "datatype": "FP32",
                                                 "shape": [1, 256], "data": [0.5] * 256}])
        assert answer.status == 200, answer.body
        log = Path(server.log.name).read_text()
        assert "executor process cpu" in log and "ended with exit code -9" in log
        assert ready.status in (200, 400, 503)  # it may have come back already
    finally:
        code = server.stop()
        server.close_log()
    assert code == 0


def kill_with_requests_waiting(server: ServerProcess, executor: int, count: int
                               ) -> list[tuple[int, float]]:
    """``count`` requests waiting in the executor's queue of ``held`` (2 s of delay),
    then SIGKILL ``executor``: each answer's status and how long after the kill it came."""
    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    answered: list[tuple[int, float]] = []

    def wait_in_held() -> None:
        answer = infer_json(server.url, "held", row)
        answered.append((answer.status, time.monotonic()))

    threads = [threading.Thread(target=wait_in_held) for _ in range(count)]
    for thread in threads:
        thread.start()
    # the queue as each front end last heard it from the executor: at least one waits
    wait_for(lambda: model_metric(server, "tradeoff_inference_queue_depth", "held") >= 1,
             "requests waiting in the executor")
    time.sleep(0.5)  # the others reach it too
    os.kill(executor, signal.SIGKILL)
    killed = time.monotonic()
    for thread in threads:
        thread.join(10)
    return [(status, at - killed) for status, at in answered]


@pytest.mark.serial  # any server started beside it may remove the segments first
def test_the_segments_of_a_killed_server_are_removed_at_the_next_start(
        repository: Path) -> None:
    """A server killed with everything it started (its executor, the resource tracker)
    leaves its segments behind; the next server started with executor processes removes
    them."""
    server = ServerProcess(repository, extra_args=PROCESS)
    server.start()
    assert server.process is not None
    pid = server.process.pid
    left = segments(pid)
    assert len(left) == 2
    family = [pid, *children_of(pid)]
    for member in family:
        os.kill(member, signal.SIGKILL)
    server.process.wait(10)
    server.close_log()
    wait_for(lambda: not any(alive(p) for p in family), "the killed processes gone")
    assert segments(pid) == left  # nobody unlinked them
    again = ServerProcess(repository, extra_args=PROCESS)
    again.start()
    try:
        assert segments(pid) == {}
        assert "of a server no longer running" in Path(again.log.name).read_text()
    finally:
        assert again.stop() == 0
        again.close_log()


def children_of(pid: int) -> list[int]:
    """Every process ``pid`` started (spawned children, the resource tracker)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError):
                continue
            if parent == pid:
                found.append(int(entry))
    return found


def test_sigterm_answers_what_waits_in_the_executor(repository: Path) -> None:
    """Requests waiting in the executor's queue when SIGTERM comes are answered; the
    server and its executor process exit, their shared memory unlinked."""
    server = ServerProcess(repository, extra_args=PROCESS)
    server.start()
    assert server.process is not None
    [executor] = engine_children(server.process.pid)
    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    with ThreadPoolExecutor(3) as pool:
        waiting = [pool.submit(infer_json, server.url, "held", row) for _ in range(3)]
        wait_for(lambda: model_metric(server, "tradeoff_inference_queue_depth", "held") == 3,
                 "three requests waiting in the executor")
        server.process.send_signal(signal.SIGTERM)
        answers = [future.result(timeout=30) for future in waiting]
    assert [a.status for a in answers] == [200] * 3, [a.body for a in answers]
    assert all(a.json()["outputs"][0]["data"] == [2.0] * 4 for a in answers)
    assert server.process.wait(30) == 0
    server.close_log()
    wait_for(lambda: not alive(executor), "the executor process gone")
    assert segments(server.process.pid) == {}


def test_many_clients_at_once_lose_nothing(server: ServerProcess) -> None:
    """256 clients for 2 s: pipe messages of thousands of requests at a time cross whole,
    every request is answered, and the executor process is the one that started."""
    from tradeoff.bench.adapters import V2Adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.session import run_benchmark

    assert server.process is not None
    before = engine_children(server.process.pid)
    result, _, _ = run_benchmark(V2Adapter(server.url, "mlp", batch_size=1, seed=1),
                                 LoadSpec(concurrency=256, duration_s=2.0, warmup_s=0.2))
    assert result.summary.errors == 0 and result.summary.successes > 256
    assert engine_children(server.process.pid) == before
    assert "ended with exit code" not in Path(server.log.name).read_text()
