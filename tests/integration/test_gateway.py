"""A gateway: a server whose router sends to pools of replicas on other servers (each on
a loopback address of its own). v2 requests over HTTP through the official client, the
policies, a replica killed and started again under load, draining and adding replicas by
reloading router.yaml, and the client's credentials kept back unless configured."""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as triton_http

from tradeoff.server.process import ServerProcess, started

from ..synthetic_model import write_synthetic_model
from .helpers import (
    background_load,
    infer_json,
    metric_samples,
    post_json,
    request,
    wait_for,
)
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model

pytestmark = [pytest.mark.integration]

HOSTS = ("127.0.0.2", "127.0.0.3")
ROW = [1.0, 2.0, 3.0, 4.0]


def replica_repo(root: Path, constant: float) -> Path:
    """A replica serving ``addc``: its input plus ``constant`` (so answers name it)."""
    _write(root, "addc", {1: add_constant_model(constant)},
           CONSTANT_CONFIG.format(name="addc", extra=""))
    return root


def write_router(root: Path, replicas: list[object], **pool: object) -> None:
    (root / "front").mkdir(exist_ok=True)
    doc = {"pools": {"addc_pool": {"protocol": "v2", "model": "addc",
                                   "replicas": replicas,
                                   "health": {"interval_s": 0.2, "eject_s": 0.5},
                                   **pool}},
           "routes": [{"to": "addc_pool"}]}
    (root / "front" / "router.yaml").write_text(json.dumps(doc))


def added(url: str, model: str = "front") -> float:
    """Which replica answered: the constant its model adds."""
    response = infer_json(url, model, [{"name": "INPUT0", "datatype": "FP32",
                                        "shape": [1, 4], "data": ROW}])
    assert response.status == 200, response.body
    return round(json.loads(response.body)["outputs"][0]["data"][0] - ROW[0], 3)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    with started([ServerProcess(replica_repo(tmp_path_factory.mktemp(f"replica{i}"),
                                             i + 1.0), host=host)
                  for i, host in enumerate(HOSTS)]) as servers:
        yield servers


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory,
            replicas: list[ServerProcess]) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("gateway")
    write_router(root, [r.url for r in replicas], policy="round_robin")
    server = ServerProcess(root).start()
    try:
        yield server
    finally:
        code = server.stop()
        log = server.close_log()
        assert code == 0, log[-3000:]


def test_round_robin_spreads_requests_over_the_replicas(gateway: ServerProcess) -> None:
    answers = [added(gateway.url) for _ in range(6)]
    assert sorted(set(answers)) == [1.0, 2.0]
    assert all(a != b for a, b in itertools.pairwise(answers))


def test_an_answer_is_passed_on_in_the_form_the_client_asked_under_the_routers_name(
        gateway: ServerProcess) -> None:
    """A request that came as a v2 body goes on as it came, and the replica's answer
    comes back as it sent it (JSON here, binary for the official client below) but for
    the name; a class from the header is put in the request, which is then encoded
    anew: both answer alike."""
    row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}]
    response = infer_json(gateway.url, "front", row, id="a1")
    passed = json.loads(response.body)
    check_passed_on_timing(response.header("server-timing"))
    classed = request(gateway.url, "POST", "/v2/models/front/infer",
                      json.dumps({"inputs": row, "id": "a2"}).encode(),
                      {"X-Tradeoff-Class": "batch", "Content-Type": "application/json"})
    assert classed.status == 200, classed.body
    for answer, id_ in ((passed, "a1"), (json.loads(classed.body), "a2")):
        assert answer["model_name"] == "front" and answer["id"] == id_
        assert answer["parameters"]["routed_to"].startswith("addc_pool@127.0.0.")
        (output,) = answer["outputs"]
        assert output["name"] == "OUTPUT0" and len(output["data"]) == 4


def check_passed_on_timing(header: str | None) -> None:
    """The gateway's Server-Timing: the replica it chose, then the replica's own
    entries (its queue and its batch), not zeros of the gateway's."""
    assert header is not None and header.startswith('route;desc="addc_pool@127.0.0.')
    entries = dict(part.strip().split(";", 1) for part in header.split(","))
    assert entries["batch"] == 'desc="1"' and entries["queue"].startswith("dur=")
    assert float(entries["compute_infer"].removeprefix("dur=")) > 0


def test_the_router_takes_the_replicas_signature(gateway: ServerProcess) -> None:
    metadata = json.loads(request(gateway.url, "GET", "/v2/models/front").body)
    assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    assert metadata["platform"] == "router"
    bad = infer_json(gateway.url, "front", [{"name": "INPUT0", "datatype": "FP32",
                                             "shape": [1, 3], "data": [1, 2, 3]}])
    assert bad.status == 400


def test_the_official_client_gets_binary_answers_through_the_gateway(
        gateway: ServerProcess) -> None:
    client = triton_http.InferenceServerClient(gateway.url.removeprefix("http://"))
    data = np.arange(8, dtype=np.float32).reshape(2, 4)
    tensor = triton_http.InferInput("INPUT0", [2, 4], "FP32")
    tensor.set_data_from_numpy(data, binary_data=True)
    wanted = triton_http.InferRequestedOutput("OUTPUT0", binary_data=True)
    seen = set()
    for _ in range(4):
        result = client.infer("front", [tensor], outputs=[wanted])
        difference = result.as_numpy("OUTPUT0") - data
        assert np.allclose(difference, difference[0, 0])
        seen.add(float(difference[0, 0]))
        routed = result.get_response()["parameters"]["routed_to"]
        assert routed.startswith("addc_pool@127.0.0.")
    assert seen == {1.0, 2.0}


def test_statistics_show_each_replica(gateway: ServerProcess) -> None:
    for _ in range(4):
        added(gateway.url)
    stats = json.loads(request(gateway.url, "GET", "/v2/models/front/stats").body)
    (pool,) = stats["model_stats"][0]["pools"]
    assert pool["policy"] == "round_robin" and pool["protocol"] == "v2"
    assert {r["replica"].split(":")[0] for r in pool["replicas"]} == set(HOSTS)
    assert all(r["ready"] and r["answered"] >= 2 for r in pool["replicas"])
    samples = metric_samples(gateway)
    for host in HOSTS:
        labels = next(k[1] for k in samples if k[0] == "tradeoff_gateway_replica_requests_total"
                      and dict(k[1])["replica"].startswith(host))
        assert dict(labels)["pool"] == "addc_pool"
        assert samples[("tradeoff_gateway_replica_requests_total", labels)] >= 2
        assert samples[("tradeoff_gateway_replica_ready", labels)] == 1
        assert samples[("tradeoff_gateway_replica_latency_seconds_count", labels)] >= 2


@pytest.mark.timing  # ejected within 1 s, back within 5 s: wall-clock bounds
def test_a_replica_killed_under_load_fails_no_request_and_comes_back(
        tmp_path: Path) -> None:
    servers = [ServerProcess(replica_repo(tmp_path / f"r{i}", i + 1.0), host=host).start()
               for i, host in enumerate(HOSTS)]
    root = tmp_path / "gw"
    root.mkdir()
    write_router(root, [s.url for s in servers], policy="least_outstanding")
    gateway = ServerProcess(root).start()
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}]}
    try:
        with background_load(lambda: post_json(gateway.url, "/v2/models/front/infer",
                                               body).status) as statuses:
            wait_for(lambda: len(statuses) > 50, "load before the kill")
            victim = servers[1]
            assert victim.process is not None
            victim.process.send_signal(signal.SIGKILL)
            victim.process.wait(10)
            killed_at = time.monotonic()

            def ejected() -> bool:
                doc = json.loads(request(gateway.url, "GET", "/v2/models/front/stats").body)
                return not doc["model_stats"][0]["pools"][0]["replicas"][1]["ready"]

            wait_for(ejected, "the killed replica ejected", timeout=5)
            assert time.monotonic() - killed_at < 1.0
            served_before = len(statuses)
            wait_for(lambda: len(statuses) > served_before + 50, "load after the kill")
            victim.close_log()
            again = ServerProcess(victim.repository, host=victim.host)
            again.http_port, again.metrics_port, again.grpc_port = \
                victim.http_port, victim.metrics_port, victim.grpc_port
            servers[1] = again.start()  # the same address and ports
            restarted_at = time.monotonic()
            wait_for(lambda: 2.0 in {added(gateway.url) for _ in range(6)},
                     "the restarted replica readmitted", timeout=10)
            assert time.monotonic() - restarted_at < 5
        assert statuses and set(statuses) == {200}, sorted(set(statuses))
    finally:
        gateway.stop()
        gateway.close_log()
        for server in servers:
            server.stop()
            server.close_log()


def test_draining_and_adding_replicas_by_reloading_the_router(
        tmp_path: Path, replicas: list[ServerProcess]) -> None:
    root = tmp_path / "gw"
    root.mkdir()
    write_router(root, [replicas[0].url], policy="round_robin")
    gateway = ServerProcess(root).start()
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}]}
    try:
        assert {added(gateway.url) for _ in range(4)} == {1.0}
        with background_load(lambda: post_json(gateway.url, "/v2/models/front/infer",
                                               body).status) as statuses:
            write_router(root, [replicas[0].url, replicas[1].url], policy="round_robin")
            assert post_json(gateway.url, "/v2/repository/models/front/load", {}).status == 200
            assert {added(gateway.url) for _ in range(20)} == {1.0, 2.0}
            write_router(root, [{"url": replicas[0].url, "drain": True}, replicas[1].url],
                         policy="round_robin")
            assert post_json(gateway.url, "/v2/repository/models/front/load", {}).status == 200
            assert {added(gateway.url) for _ in range(20)} == {2.0}
        assert statuses and set(statuses) == {200}
        stats = json.loads(request(gateway.url, "GET", "/v2/models/front/stats").body)
        (pool,) = stats["model_stats"][0]["pools"]
        first = next(r for r in pool["replicas"] if r["url"] == replicas[0].url)
        # its count went on over both reloads: the 4 requests before the first at least
        assert first["answered"] >= 4 + 10
    finally:
        gateway.stop()
        gateway.close_log()


def test_client_credentials_stay_at_the_gateway_unless_the_pool_forwards_them(
        tmp_path: Path) -> None:
    """The replica wants a key the gateway holds (api_key_env). A client's own
    Authorization is not passed on, unless forward_headers names it: then the replica
    sees the client's (wrong) key and refuses."""
    replica = ServerProcess(replica_repo(tmp_path / "r", 1.0), host=HOSTS[0],
                            extra_args=("--api-key", "replica-key")).start()
    try:
        for forward, expected in (([], 200), (["authorization"], 502)):
            root = tmp_path / f"gw{len(forward)}"
            root.mkdir()
            write_router(root, [replica.url], forward_headers=forward,
                         api_key_env="REPLICA_KEY")
            gateway = ServerProcess(root, env={"REPLICA_KEY": "replica-key"}).start()
            try:
                response = post_json(
                    gateway.url, "/v2/models/front/infer",
                    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                                 "data": ROW}]},
                    headers={"Authorization": "Bearer a-client-key"})
                assert response.status == expected, response.body
                if expected == 502:
                    assert b"forward_headers" in response.body
            finally:
                gateway.stop()
                gateway.close_log()
    finally:
        replica.stop()
        replica.close_log()


def test_top_shows_each_replica(gateway: ServerProcess) -> None:
    with background_load(lambda: infer_json(gateway.url, "front", [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}]).status,
            threads=2) as statuses:
        shown = subprocess.run(
            [sys.executable, "-m", "tradeoff", "top", gateway.metrics_url, "--interval",
             "0.5", "--iterations", "2"], capture_output=True, text=True, timeout=60,
            env={**os.environ, "COLUMNS": "200"}, check=True).stdout
    assert set(statuses) == {200}
    assert "gateway replicas" in shown
    for host in HOSTS:
        line = next(row for row in shown.splitlines() if host in row)
        assert "addc_pool" in line and " up " in f"{line} "


def test_a_pool_of_grpc_replicas(tmp_path: Path, replicas: list[ServerProcess]) -> None:
    """The replicas spoken to over v2 gRPC; the gateway answered over HTTP and over gRPC
    (the official client), the replicas' signature read over gRPC."""
    import tritonclient.grpc as triton_grpc

    write_router(tmp_path, [f"grpc://{r.grpc_url}" for r in replicas], protocol="v2-grpc",
                 policy="round_robin")
    gateway = ServerProcess(tmp_path).start()
    try:
        assert {added(gateway.url) for _ in range(4)} == {1.0, 2.0}
        check_passed_on_timing(infer_json(gateway.url, "front", [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}
        ]).header("server-timing"))  # from the replica's trailing metadata
        client = triton_grpc.InferenceServerClient(gateway.grpc_url)
        data = np.arange(8, dtype=np.float32).reshape(2, 4)
        tensor = triton_grpc.InferInput("INPUT0", [2, 4], "FP32")
        tensor.set_data_from_numpy(data)
        seen = set()
        for _ in range(4):
            result = client.infer("front", [tensor])
            seen.add(float((result.as_numpy("OUTPUT0") - data)[0, 0]))
        assert seen == {1.0, 2.0}
        metadata = json.loads(request(gateway.url, "GET", "/v2/models/front").body)
        assert metadata["inputs"] == [{"name": "INPUT0", "datatype": "FP32",
                                       "shape": [-1, 4]}]
        bad = infer_json(gateway.url, "front", [{"name": "INPUT0", "datatype": "FP32",
                                                 "shape": [1, 3], "data": [1, 2, 3]}])
        assert bad.status == 400
        stats = json.loads(request(gateway.url, "GET", "/v2/models/front/stats").body)
        (pool,) = stats["model_stats"][0]["pools"]
        assert pool["protocol"] == "v2-grpc"
        assert all(r["answered"] >= 4 for r in pool["replicas"])
    finally:
        gateway.stop()
        gateway.close_log()


def test_compare_measures_the_gateway_against_a_replica(
        gateway: ServerProcess, replicas: list[ServerProcess], tmp_path: Path) -> None:
    out = tmp_path / "compare.json"
    subprocess.run(
        [sys.executable, "-m", "tradeoff", "compare",
         "--endpoint", f"replica={replicas[0].url},model=addc",
         "--endpoint", f"gateway={gateway.url},model=front",
         "--concurrency", "2", "--duration", "0.5s", "--rounds", "1", "--warmup", "0s",
         "--json", str(out)], capture_output=True, text=True, timeout=120, check=True)
    doc = json.loads(out.read_text())
    assert doc["baseline"] == "replica"
    entries = {e["name"]: e for e in doc["endpoints"]}
    assert set(entries) == {"replica", "gateway"}
    for entry in entries.values():
        assert entry["result"]["summary"]["throughput_rps"] > 0
        assert entry["result"]["summary"]["errors"] == 0


def test_a_gateway_of_two_front_ends(tmp_path: Path, replicas: list[ServerProcess]) -> None:
    """`serve --workers 2`: each front end keeps its own pool (checks, counts); the
    statistics and /metrics add them up."""
    write_router(tmp_path, [r.url for r in replicas], policy="round_robin")
    gateway = ServerProcess(tmp_path, extra_args=("--workers", "2")).start()
    try:
        sent = 40
        assert {added(gateway.url) for _ in range(sent)} == {1.0, 2.0}
        stats = json.loads(request(gateway.url, "GET", "/v2/models/front/stats").body)
        (pool,) = stats["model_stats"][0]["pools"]
        assert sum(r["answered"] for r in pool["replicas"]) == sent
        assert all(r["ready"] for r in pool["replicas"])
        samples = metric_samples(gateway)
        total = sum(v for (name, _), v in samples.items()
                    if name == "tradeoff_gateway_replica_requests_total")
        assert total == sent
    finally:
        gateway.stop()
        gateway.close_log()


def slow_replica(root: Path, host: str, cost_ms: float) -> ServerProcess:
    """A replica of ``work``, a synthetic model taking ``cost_ms`` a request, one at a
    time: a few clients make it a queue."""
    write_synthetic_model(root, "work", fixed_ms=cost_ms, per_row_ms=0.0, max_batch_size=0)
    return ServerProcess(root, host=host)


def test_least_outstanding_counts_the_queue_each_replica_reports(tmp_path: Path) -> None:
    """Clients that do not pass through the gateway fill one replica's queue; the gateway
    reads it from the replica's /metrics and sends nothing there, its own first request
    included (with no answer times yet, both replicas cost alike but for that queue)."""
    work = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}]
    with started([slow_replica(tmp_path / f"r{i}", host, 20.0)
                  for i, host in enumerate(HOSTS)]) as (busy, idle):
        write_router(tmp_path, [{"url": r.url, "metrics": r.metrics_url}
                                for r in (busy, idle)], model="work",
                     policy="least_outstanding", queue={"server": "tradeoff",
                                                        "interval_s": 0.1})
        with background_load(lambda: infer_json(busy.url, "work", work).status,
                             threads=6) as statuses, \
                started([ServerProcess(tmp_path)]) as (gateway,):

            def reported() -> dict[str, float | None]:
                stats = json.loads(request(gateway.url, "GET",
                                           "/v2/models/front/stats").body)
                (pool,) = stats["model_stats"][0]["pools"]
                return {r["replica"]: r["reported_queue"] for r in pool["replicas"]}

            wait_for(lambda: (reported().get(busy.url.removeprefix("http://")) or 0) >= 3,
                     "the busy replica's queue, as the gateway read it", timeout=20)
            assert reported()[idle.url.removeprefix("http://")] == 0
            for _ in range(8):
                response = infer_json(gateway.url, "front", work)
                assert response.status == 200, response.body
                routed = json.loads(response.body)["parameters"]["routed_to"]
                assert routed == f"addc_pool@{idle.url.removeprefix('http://')}"
            samples = metric_samples(gateway)
            queued = {dict(labels)["replica"]: value for (name, labels), value
                      in samples.items()
                      if name == "tradeoff_gateway_replica_reported_queue"}
            assert set(queued) == {busy.url.removeprefix("http://"),
                                   idle.url.removeprefix("http://")}
            shown = subprocess.run(
                [sys.executable, "-m", "tradeoff", "top", gateway.metrics_url, "--interval",
                 "0.3", "--iterations", "2"], capture_output=True, text=True, timeout=60,
                env={**os.environ, "COLUMNS": "200"}, check=True).stdout
            header = next(line for line in shown.splitlines() if "queued" in line).split()
            row = next(line for line in shown.splitlines()
                       if busy.url.removeprefix("http://") in line).split()
            assert float(row[header.index("queued")]) >= 1
        assert set(statuses) == {200}
