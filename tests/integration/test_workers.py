"""``serve --workers N``: front-end processes on one port that answer as one server. The
kernel shares new connections between them; they share one executor process per device
and one engine process per generative model;
a repository change on one reaches all; the statistics extension and ``/metrics`` add up
over them; a front end or an executor process killed under load costs only the requests
it held (each client counted), both are started again, and SIGTERM
stops every process and leaves no shared memory."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tradeoff.server.process import ServerProcess

from .helpers import (
    get_text,
    metric_samples,
    model_metric,
    request,
    running_server,
    wait_for,
)
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model, build_test_repository
from .test_engine_process import alive, engine_children
from .test_executor_process import kill_with_requests_waiting

pytestmark = pytest.mark.integration

WORKERS = 2
CONNECTIONS = 32  # new connections, hashed over the front ends by their addresses
ROW = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                              "data": [0.5] * 256}]})


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tradeoff.models.generative import write_synthetic_llm

    root = build_test_repository(tmp_path_factory.mktemp("models"))
    write_synthetic_llm(root, "llm", model={"step_ms": 1.0})
    _write(root, "cached", {1: add_constant_model(1.0)}, CONSTANT_CONFIG.format(
        name="cached", extra="response_cache { enable: true }\n"))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from running_server(repository, extra_args=("--workers", str(WORKERS), "--cache",
                                                      "local,size=1MB"))


def front_ends(server: ServerProcess) -> list[int]:
    """The front ends running now, as the supervisor's log names them."""
    return _named(server, r"tradeoff\.server: front end \d+: pid (\d+)")


def executors(server: ServerProcess) -> list[int]:
    return _named(server, r"tradeoff\.server: executor process cpu: pid (\d+)")


def _named(server: ServerProcess, pattern: str) -> list[int]:
    assert server.process is not None
    children = set(engine_children(server.process.pid))
    return [pid for pid in map(int, re.findall(pattern, server.log_text()))
            if pid in children and alive(pid)]


def times_ready(server: ServerProcess) -> int:
    """How many times the log said every front end serves (once more after a restart)."""
    return server.log_text().count(f"ready: {WORKERS} front ends")


def answered_by(server: ServerProcess, count: int = CONNECTIONS) -> dict[int, int]:
    """Send one request on each of ``count`` new connections (each answered 200): how
    many each front end holds, pid -> connections."""
    connections = open_connections(server, count)
    try:
        return holders(server, connections)
    finally:
        for connection in connections:
            connection.close()


def holders(server: ServerProcess, connections: list[http.client.HTTPConnection]
            ) -> dict[int, int]:
    """Which front end accepted each of ``connections`` (by the sockets in /proc):
    pid -> how many; waits until every one is accepted."""
    ports = {c.sock.getsockname()[1] for c in connections if c.sock is not None}
    assert len(ports) == len(connections)
    accepted: dict[int, str] = {}

    def all_accepted() -> bool:
        accepted.clear()
        accepted.update(_server_sides(server.http_port, ports))
        return len(accepted) == len(ports) and "0" not in accepted.values()

    wait_for(all_accepted, "every connection accepted")
    inodes = set(accepted.values())
    return {pid: len(_socket_inodes(pid) & inodes) for pid in front_ends(server)}


def open_connections(server: ServerProcess, count: int) -> list[http.client.HTTPConnection]:
    """``count`` new connections, each with one request answered 200, kept open."""
    connections = []
    for _ in range(count):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
        connection.request("POST", "/v2/models/mlp/infer", ROW)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        answer.read()
        connections.append(connection)
    return connections


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


def _server_sides(port: int, clients: set[int]) -> dict[int, str]:
    """The server's sockets of the connections to ``port`` from the client ports
    ``clients``: client port -> socket inode ("0" until accepted)."""
    found = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = (int(a.split(":")[1], 16) for a in fields[1:3])
        if local == port and remote in clients:
            found[remote] = fields[9]
    return found


def success_count(server: ServerProcess, model: str) -> int:
    answer = request(server.url, "GET", f"/v2/models/{model}/stats")
    return int(answer.json()["model_stats"][0]["inference_stats"]["success"]["count"])


def test_the_front_ends_share_the_connections_and_one_executor(server: ServerProcess) -> None:
    """Two front ends, one executor process for the CPU; new connections reach both, and
    each answers HTTP and gRPC."""
    assert server.process is not None
    assert len(front_ends(server)) == WORKERS and len(executors(server)) == 1
    assert len(engine_children(server.process.pid)) == WORKERS + 2  # and one engine
    held = answered_by(server)
    assert sum(held.values()) == CONNECTIONS
    assert all(count > 0 for count in held.values()), held
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    for _ in range(8):  # each a new channel: both front ends bound the gRPC port
        tensor = triton_grpc.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
        assert client.infer("mlp", [tensor]).as_numpy("OUTPUT0").shape == (1, 10)
        client = triton_grpc.InferenceServerClient(server.grpc_url)


def test_requests_from_every_front_end_batch_together(server: ServerProcess) -> None:
    """``held`` runs a batch at 16 rows or after 2 s: 16 one-row requests that reach both
    front ends run as one batch in the executor they share."""
    def executions() -> int:
        return int(request(server.url, "GET", "/v2/models/held/stats").json()[
            "model_stats"][0]["execution_count"])

    before = executions()
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "data": [1.0] * 4}]})
    connections = []
    try:
        for _ in range(16):
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                                    timeout=10)
            connection.request("POST", "/v2/models/held/infer", body)
            connections.append(connection)
        held = holders(server, connections)
        assert all(held.values()) and sum(held.values()) == 16, held  # both hold some
        answers = [connection.getresponse() for connection in connections]
        assert [a.status for a in answers] == [200] * 16
    finally:
        for connection in connections:
            connection.close()
    assert executions() == before + 1


def test_statistics_and_metrics_add_up_over_the_front_ends(server: ServerProcess) -> None:
    before = success_count(server, "mlp")
    held = answered_by(server)
    assert all(count > 0 for count in held.values()), held
    assert success_count(server, "mlp") == before + CONNECTIONS
    text = get_text(server.metrics_url)
    families = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(families) == len(set(families))  # each family once
    assert model_metric(server, "tradeoff_inference_request_success_total", "mlp") == \
        before + CONNECTIONS
    samples = metric_samples(server)
    # each front end's two arenas of 64 MiB (the default): the requests' one counted
    sizes = samples[("tradeoff_executor_shared_memory_size_bytes",
                     frozenset({"device": "cpu"}.items()))]
    assert sizes == WORKERS * (64 << 20)


def test_a_repository_change_on_one_front_end_reaches_every_other(
        server: ServerProcess) -> None:
    def ready_everywhere() -> set[int]:
        statuses = set()
        for _ in range(CONNECTIONS):
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port)
            connection.request("GET", "/v2/models/add_sub/ready")
            statuses.add(connection.getresponse().status)
            connection.close()
        return statuses

    assert ready_everywhere() == {200}
    assert request(server.url, "POST", "/v2/repository/models/add_sub/unload").status == 200
    assert ready_everywhere() == {503}
    assert request(server.url, "POST", "/v2/repository/models/add_sub/load").status == 200
    assert ready_everywhere() == {200}
    # loaded again while loaded (a reload): every front end serves the new build
    assert request(server.url, "POST", "/v2/repository/models/mlp/load").status == 200
    assert sum(answered_by(server).values()) == CONNECTIONS
    # a generative model loaded again: every front end feeds the one new engine
    [engine] = engines(server)
    assert request(server.url, "POST", "/v2/repository/models/llm/load").status == 200
    assert sum(complete_on_new_connections(server).values()) == CONNECTIONS
    wait_for(lambda: len(engines(server)) == 1 and engines(server) != [engine],
             "the old engine process gone")


class SteadyClient(threading.Thread):
    """A client of a steady load: one request after another on a kept connection, a new
    connection after one breaks. What it got: each answer's status and how long it took,
    and how many requests were lost with their connection."""

    def __init__(self, server: ServerProcess) -> None:
        super().__init__(daemon=True)
        self.port = server.http_port
        self.answers: list[tuple[int, float, float]] = []  # status, sent at, seconds
        self.lost = 0
        self.connection: http.client.HTTPConnection | None = None
        self.started = threading.Event()  # its first answer came
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            if self.connection is None:
                self.connection = http.client.HTTPConnection("127.0.0.1", self.port,
                                                             timeout=10)
            sent = time.monotonic()
            try:
                self.connection.request("POST", "/v2/models/mlp/infer", ROW)
                answer = self.connection.getresponse()
                answer.read()
            except (OSError, http.client.HTTPException):
                self.lost += 1
                self.connection.close()
                self.connection = None
                continue
            self.answers.append((answer.status, sent, time.monotonic() - sent))
            self.started.set()
        if self.connection is not None:
            self.connection.close()


@contextmanager
def steady_load(server: ServerProcess, count: int = 16) -> Iterator[list[SteadyClient]]:
    clients = [SteadyClient(server) for _ in range(count)]
    for client in clients:
        client.start()
    try:
        for client in clients:
            assert client.started.wait(30)
        yield clients
    finally:
        for client in clients:
            client.done.set()
        for client in clients:
            client.join(30)


def test_a_front_end_killed_under_load_costs_only_its_own_clients(
        server: ServerProcess) -> None:
    """SIGKILL one front end while 16 clients send: the clients whose connection it held
    lose the one request in flight and go on through the other front end; the other
    clients lose nothing. A new front end is started and takes new connections."""
    victim, _ = front_ends(server)
    ready = times_ready(server)
    with steady_load(server) as clients:
        theirs = [c for c in clients
                  if c.connection is not None and holders(server, [c.connection])[victim]]
        assert 0 < len(theirs) < len(clients)
        time.sleep(0.5)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: not alive(victim), "the front end gone")
        time.sleep(1.5)
    for client in clients:
        statuses = {status for status, _, _ in client.answers}
        assert statuses == {200}, statuses
        assert any(sent > killed + 0.5 for _, sent, _ in client.answers)  # served on
        if client in theirs:
            assert 1 <= client.lost <= 2  # the request in flight, at most one retry more
        else:
            assert client.lost == 0
    wait_for(lambda: len(front_ends(server)) == WORKERS, "a new front end", timeout=60)
    wait_for(lambda: times_ready(server) > ready, "the new front end ready", timeout=60)
    assert "ended with exit code -9: starting it again" in server.log_text()
    held = answered_by(server)
    assert all(count > 0 for count in held.values()), held


def test_a_killed_front_ends_counts_stay_in_the_servers_metrics(
        server: ServerProcess) -> None:
    """The counters of the last /metrics a front end answered stay in the server's after
    it is killed and started again: with nothing sent meanwhile, the total is the same,
    not the survivor's alone."""
    answered_by(server)  # both front ends answered some

    def successes() -> set[float]:  # each scrape on a new connection: both front ends
        return {model_metric(server, "tradeoff_inference_request_success_total", "mlp")
                for _ in range(16)}

    [before] = successes()
    victim, ready = front_ends(server)[0], times_ready(server)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not alive(victim), "the front end gone")
    wait_for(lambda: len(front_ends(server)) == WORKERS, "a new front end", timeout=60)
    # ready: it has loaded the repository and replayed the changes made since its start
    wait_for(lambda: times_ready(server) > ready, "the new front end ready", timeout=60)
    assert successes() == {before}


def test_a_killed_executor_is_started_again_for_every_front_end(
        server: ServerProcess) -> None:
    """SIGKILL the executor process with requests waiting in it from both front ends:
    each is answered 503 within a second; every front end dials the one new process the
    supervisor starts, and loads its models there again."""
    [executor] = executors(server)
    statuses = kill_with_requests_waiting(server, executor, 8)
    assert [s for s, _ in statuses] == [503] * 8
    assert all(after < 1.0 for _, after in statuses), statuses
    wait_for(lambda: executors(server) not in ([], [executor]), "a new executor process",
             timeout=60)
    wait_for(lambda: set(_ready_codes(server)) == {200}, "mlp ready everywhere", timeout=60)
    assert len(executors(server)) == 1
    held = answered_by(server)
    assert sum(held.values()) == CONNECTIONS


def test_an_executor_killed_under_load_answers_every_request(server: ServerProcess) -> None:
    """SIGKILL the executor process while 16 clients send through both front ends: no
    connection breaks and no request goes unanswered; each gets 200, or 503 (at once)
    until its models are loaded again, then 200 again."""
    [executor] = executors(server)
    with steady_load(server) as clients:
        time.sleep(0.5)
        os.kill(executor, signal.SIGKILL)
        killed = time.monotonic()
        wait_for(lambda: executors(server) not in ([], [executor]), "a new executor process",
                 timeout=60)
        wait_for(lambda: set(_ready_codes(server)) == {200}, "mlp ready everywhere",
                 timeout=60)
        time.sleep(0.5)
    answers = [a for client in clients for a in client.answers]
    assert all(client.lost == 0 for client in clients)
    assert {status for status, _, _ in answers} == {200, 503}
    assert max(took for status, _, took in answers if status == 503) < 1.0
    assert all(client.answers[-1][0] == 200 for client in clients)  # served again
    assert all(status == 200 for status, sent, _ in answers if sent < killed - 0.1)


def _ready_codes(server: ServerProcess) -> list[int]:
    codes = []
    for _ in range(8):
        connection = http.client.HTTPConnection("127.0.0.1", server.http_port)
        connection.request("GET", "/v2/models/mlp/ready")
        codes.append(connection.getresponse().status)
        connection.close()
    return codes


def engines(server: ServerProcess) -> list[int]:
    return _named(server, r"tradeoff\.server: engine process llm: pid (\d+)")


def complete_on_new_connections(server: ServerProcess, count: int = CONNECTIONS
                                ) -> dict[int, int]:
    """``count`` greedy generations of 8 tokens, each started on a new connection (kept
    until all are answered): which front end holds each, pid -> connections."""
    body = json.dumps({"model": "llm", "prompt": "hello there", "max_tokens": 8,
                       "temperature": 0, "ignore_eos": True})
    connections = []
    try:
        for _ in range(count):
            connection = http.client.HTTPConnection("127.0.0.1", server.http_port,
                                                    timeout=30)
            connection.request("POST", "/v1/completions", body,
                               {"content-type": "application/json"})
            connections.append(connection)
        held = holders(server, connections)
        answers = [json.loads(c.getresponse().read()) for c in connections]
    finally:
        for connection in connections:
            connection.close()
    assert all(a["usage"]["completion_tokens"] == 8 for a in answers), answers[0]
    assert len({a["choices"][0]["text"] for a in answers}) == 1  # greedy: one answer
    return held


def test_a_generative_model_runs_in_one_engine_every_front_end_feeds(
        server: ServerProcess) -> None:
    """The front ends share one engine process: generations from both run in it, and its
    counts are shown once (not once per front end) in /metrics and the statistics."""
    # a front end started again loads the repository as it was at the start, then
    # replays the changes: the engine of an earlier load may still be on its way out
    wait_for(lambda: len(engines(server)) == 1, "one engine process")

    def finished() -> float:
        return metric_samples(server)[("tradeoff_generation_requests_finished_total",
                                       frozenset({"model": "llm"}.items()))]

    before, stats_before = finished(), success_count(server, "llm")
    held = complete_on_new_connections(server)
    assert all(held.values()) and sum(held.values()) == CONNECTIONS, held
    assert finished() == before + CONNECTIONS
    assert success_count(server, "llm") == stats_before + CONNECTIONS
    streamed = request(server.url, "POST", "/v1/completions", json.dumps(
        {"model": "llm", "prompt": "hi", "max_tokens": 4, "stream": True}),
        {"content-type": "application/json"})
    assert streamed.status == 200 and streamed.body.rstrip().endswith(b"data: [DONE]")


def test_a_killed_engine_is_started_again_once_for_every_front_end(
        server: ServerProcess) -> None:
    [engine] = engines(server)
    os.kill(engine, signal.SIGKILL)
    wait_for(lambda: engines(server) not in ([], [engine]), "a new engine process",
             timeout=60)
    wait_for(lambda: {request(server.url, "GET", "/v2/models/llm/ready").status
                      for _ in range(8)} == {200}, "llm ready everywhere", timeout=60)
    assert len(engines(server)) == 1
    held = complete_on_new_connections(server)
    assert sum(held.values()) == CONNECTIONS


def test_sigterm_stops_every_process_and_leaves_no_shared_memory(repository: Path) -> None:
    server = ServerProcess(repository, extra_args=("--workers", str(WORKERS))).start()
    assert server.process is not None
    children = engine_children(server.process.pid)
    assert len(children) == WORKERS + 2  # and an executor process, an engine process
    server.process.send_signal(signal.SIGTERM)
    assert server.process.wait(60) == 0, server.log_text()[-3000:]
    server.close_log()
    wait_for(lambda: not any(alive(pid) for pid in children), "every child gone")
    mine = f"tradeoff-{os.getuid()}-"
    leftover = [p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(mine) and
                int(p.name[len(mine):].split("-")[0]) in children]
    assert leftover == []


def test_each_front_end_keeps_a_local_cache_of_its_own(server: ServerProcess) -> None:
    """--cache local: a repeated request hits in the front end that answered it, and is
    a miss in another; the server says so at start and points to Redis."""
    assert "each of the 2 front ends keeps a cache of its own" in server.log_text()
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                   "data": [7.0] * 4}]})

    def verdict(connection: http.client.HTTPConnection) -> str:
        connection.request("POST", "/v2/models/cached/infer", body)
        answer = connection.getresponse()
        assert answer.status == 200, answer.read()
        answer.read()
        return (answer.getheader("server-timing") or "").split(";desc=")[1].split(";")[0]

    connections = open_connections(server, CONNECTIONS)
    try:
        by_front_end: dict[int, http.client.HTTPConnection] = {}
        for connection in connections:
            [(pid, _)] = [(p, n) for p, n in holders(server, [connection]).items() if n]
            by_front_end.setdefault(pid, connection)
        first, second = by_front_end.values()
        assert [verdict(first), verdict(first)] == ["miss", "hit"]
        assert [verdict(second), verdict(second)] == ["miss", "hit"]
    finally:
        for connection in connections:
            connection.close()
