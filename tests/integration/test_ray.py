"""`tradeoff serve --ray` and `--ray` load workers on a real Ray cluster: a head and one
more node, each a `ray start` of its own on 127.0.0.2 and 127.0.0.3, with a token of its
own (a stale ~/.ray/auth_token, as a past Ray run leaves, is in the way on purpose)."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest

from tradeoff.server.process import LocalRayCluster, ServerProcess

from .helpers import References, background_load, get_text, post_json, request, wait_for

if importlib.util.find_spec("ray") is None:  # found, not imported: Ray runs in children
    pytest.skip("ray[serve] is not installed: pip install 'tradeoff[ray]' (make test does)",
                allow_module_level=True)
tritonclient_http = pytest.importorskip("tritonclient.http")

pytestmark = pytest.mark.integration

REPLICA_LINE = re.compile(r"replica (\S+) on (\S+), pid (\d+), metrics (\S+)")
GONE_LINE = re.compile(r"replica (\S+) is gone")
SUCCESSES = "tradeoff_inference_request_success_total"


METRICS_KEY = "replica-metrics-key"


def stale_home(directory: Path) -> Path:
    """A home directory holding the token a past Ray run left (not this cluster's)."""
    (directory / ".ray").mkdir(parents=True)
    (directory / ".ray" / "auth_token").write_text("token-of-a-past-run\n")
    return directory


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalRayCluster]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(stale_home(tmp_path_factory.mktemp("home"))))
        with LocalRayCluster(nodes=2) as running:
            yield running


@pytest.fixture(scope="module")
def ray_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tradeoff.models import build_repository

    directory = tmp_path_factory.mktemp("ray-models")
    build_repository(directory, ["tiny", "mlp", "tinyllama"])
    return directory


@pytest.fixture(scope="module")
def deployment(cluster: LocalRayCluster, ray_repository: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(ray_repository, extra_args=(
        "--ray", cluster.address, "--replicas", "2", "--replica-cpus", "1",
        "--metrics-key", METRICS_KEY), env=cluster.env)
    server.start(timeout=240)
    try:
        wait_for(lambda: len(live_replicas(server)) == 2, "two replicas listed", 60)
        yield server
    finally:
        code = server.stop(timeout=60)
        log = server.close_log()
        assert code == 0, f"serve --ray exited with {code}:\n{log[-3000:]}"


def live_replicas(server: ServerProcess) -> dict[str, dict[str, Any]]:
    """The replicas the `serve --ray` process has listed and not seen go."""
    live: dict[str, dict[str, Any]] = {}
    for line in server.log_text().splitlines():
        if found := REPLICA_LINE.search(line):
            replica, node, pid, metrics = found.groups()
            live[replica] = {"node": node, "pid": int(pid), "metrics_url": metrics}
        elif found := GONE_LINE.search(line):
            live.pop(found.group(1), None)
    return live


def infer_tiny(url: str, value: float = 0.5) -> int:
    doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                       "data": [value] * 16}]}
    return post_json(url, "/v2/models/tiny/infer", doc).status


def answer_tiny(url: str) -> int:
    """``infer_tiny``'s status; 0 when the request got no HTTP answer at all."""
    try:
        return infer_tiny(url)
    except OSError:
        return 0


def metric_total(text: str, name: str, model: str) -> float:
    pattern = re.compile(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', re.M)
    return sum(float(v) for v in pattern.findall(text))


def test_tritonclient_and_perf_analyzer_through_the_proxy(
        deployment: ServerProcess, ray_repository: Path) -> None:
    client = tritonclient_http.InferenceServerClient(f"127.0.0.1:{deployment.http_port}")
    assert client.is_server_ready() and client.is_model_ready("tiny")
    data = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    expected = References(ray_repository).run("tiny", {"INPUT0": data})["OUTPUT0"]
    for binary in (True, False):  # binary tensors, then JSON
        tensor = tritonclient_http.InferInput("INPUT0", [3, 16], "FP32")
        tensor.set_data_from_numpy(data, binary_data=binary)
        result = client.infer("tiny", [tensor])
        np.testing.assert_allclose(result.as_numpy("OUTPUT0"), expected, rtol=1e-5)
    assert client.get_model_metadata("mlp")["name"] == "mlp"
    perf_analyzer = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "perf_analyzer"
    if perf_analyzer.exists():
        run = subprocess.run([str(perf_analyzer), "-m", "tiny", "-u",
                              f"127.0.0.1:{deployment.http_port}", "--concurrency-range", "2",
                              "--measurement-interval", "2000", "--max-trials", "10",
                              "--stability-percentage", "999"],
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stdout + run.stderr
        assert "Throughput:" in run.stdout


def test_openai_through_the_proxy(deployment: ServerProcess) -> None:
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=f"{deployment.url}/v1", api_key="none", max_retries=0)
    chat = client.chat.completions.create(
        model="tinyllama", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
        temperature=0)
    assert chat.choices[0].message.content is not None
    assert chat.usage is not None and chat.usage.completion_tokens >= 1
    chunks = list(client.completions.create(model="tinyllama", prompt="one two", max_tokens=4,
                                            stream=True, temperature=0))
    assert chunks and chunks[-1].choices[0].finish_reason in ("length", "stop")


def test_statistics_sum_over_replicas_and_each_replica_serves_metrics(
        deployment: ServerProcess) -> None:
    def count() -> int:
        doc = json.loads(request(deployment.url, "GET", "/v2/models/tiny/stats").body)
        return sum(entry["inference_count"] for entry in doc["model_stats"])

    def scrape(url: str) -> str:
        parts = urlsplit(url)
        answer = request(f"{parts.scheme}://{parts.netloc}", "GET", parts.path,
                         headers={"Authorization": f"Bearer {METRICS_KEY}"})
        assert answer.status == 200, answer.body
        return answer.body.decode()

    def per_replica() -> list[float]:
        return [metric_total(scrape(r["metrics_url"]), SUCCESSES, "tiny")
                for r in live_replicas(deployment).values()]

    for replica in live_replicas(deployment).values():  # on --host, behind --metrics-key
        assert replica["metrics_url"].startswith("http://127.0.0.1:")
        with pytest.raises(AssertionError, match="missing or invalid metrics key"):
            get_text(replica["metrics_url"])

    before, scraped_before = count(), sum(per_replica())
    statuses = Counter(infer_tiny(deployment.url) for _ in range(40))
    assert statuses == {200: 40}
    assert count() - before == 40  # exact: the proxy's requests reached some replica each
    scraped = per_replica()
    assert sum(scraped) - scraped_before == 40
    assert len(scraped) == 2 and all(n > 0 for n in scraped)  # both replicas served


def test_load_and_unload_reach_every_replica(deployment: ServerProcess) -> None:
    def every_answer(path: str, times: int = 12) -> set[int]:
        return {request(deployment.url, "GET", path).status for _ in range(times)}

    assert post_json(deployment.url, "/v2/repository/models/mlp/unload", {}).status == 200
    assert every_answer("/v2/models/mlp/ready") == {503}
    config = {"name": "mlp", "backend": "onnxruntime", "max_batch_size": 8,
              "dynamic_batching": {"max_queue_delay_microseconds": 100}}
    loaded = post_json(deployment.url, "/v2/repository/models/mlp/load",
                       {"parameters": {"config": json.dumps(config)}})
    assert loaded.status == 200, loaded.body
    assert every_answer("/v2/models/mlp/ready") == {200}
    sizes = {json.loads(request(deployment.url, "GET", "/v2/models/mlp/config").body)
             ["max_batch_size"] for _ in range(12)}
    assert sizes == {8}
    refused = post_json(deployment.url, "/v2/repository/models/nope/load", {})
    assert refused.status == 404 and b"nope" in refused.body


@pytest.mark.slow
def test_a_killed_replica_is_replaced_with_the_same_models(deployment: ServerProcess) -> None:
    assert post_json(deployment.url, "/v2/repository/models/mlp/unload", {}).status == 200
    before = live_replicas(deployment)
    victim = next(iter(before.values()))
    with background_load(lambda: answer_tiny(deployment.url)) as statuses:
        time.sleep(1.5)
        os.kill(victim["pid"], signal.SIGKILL)
        time.sleep(3.0)
    answers = Counter(statuses)
    # every request was answered: 200, or the proxy's 500 for those in flight on the
    # replica that died (Ray Serve does not retry a request a replica has begun)
    assert set(answers) <= {200, 500}, answers  # 0 would be a request with no answer
    assert answers[200] > 0
    wait_for(lambda: len(live_replicas(deployment)) == 2
             and victim["pid"] not in {r["pid"] for r in live_replicas(deployment).values()},
             "a replacement replica", 90)
    # the replacement replayed the unload: no replica serves mlp, all serve tiny
    assert {request(deployment.url, "GET", "/v2/models/mlp/ready").status
            for _ in range(12)} == {503}
    assert Counter(infer_tiny(deployment.url) for _ in range(12)) == {200: 12}


def run_cli(tmp_path: Path, *args: str, name: str, env: dict[str, str]
            ) -> dict[str, Any]:
    out = tmp_path / f"{name}.json"
    done = subprocess.run([sys.executable, "-m", "tradeoff", *args, "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False,
                          env=dict(os.environ, **env))
    # 3: a soak's verdict "unstable", which a short soak beside other tests may reach
    verdicts = (0, 3) if args[0] == "soak" else (0,)
    assert done.returncode in verdicts, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def plain_server(ray_repository: Path) -> Iterator[ServerProcess]:
    with ServerProcess(ray_repository, extra_args=("--no-grpc",)) as server:
        yield server


def served(server: ServerProcess, model: str = "tiny") -> int:
    doc = json.loads(request(server.url, "GET", f"/v2/models/{model}/stats").body)
    return sum(entry["inference_count"] for entry in doc["model_stats"])


def test_bench_workers_on_both_nodes_merge_exactly(cluster: LocalRayCluster,
                                                   plain_server: ServerProcess,
                                                   tmp_path: Path) -> None:
    before = served(plain_server)
    closed = run_cli(tmp_path, "bench", plain_server.url, "--model", "tiny", "--concurrency",
                     "4", "--requests", "201", "--ray", cluster.address, "--workers", "2",
                     name="closed", env=cluster.env)
    assert closed["summary"]["requests"] == 201
    assert served(plain_server) - before == closed["total_requests_sent"]
    hosts = closed["client"]["hosts"]
    assert {h["node"] for h in hosts} == {"127.0.0.2", "127.0.0.3"}
    assert sorted(h["requests"] for h in hosts) == [100, 101]
    assert closed["client"]["workers"] == 2 and closed["client"]["start_skew_ms"] >= 0
    before = served(plain_server)
    records = tmp_path / "open.csv"
    opened = run_cli(tmp_path, "bench", plain_server.url, "--model", "tiny", "--rate", "200",
                     "--duration", "2", "--ray", cluster.address, "--workers", "2",
                     "--records", str(records), name="open", env=cluster.env)
    assert served(plain_server) - before == opened["total_requests_sent"]
    with records.open() as f:
        rows = list(csv.DictReader(f))
    # the asked rate is in the merged schedule whatever the load (a stall sends late, it
    # never drops): 200/s for 2 s, 100/s from each worker
    assert len(rows) == 400
    assert all(float(r["sent_ms"]) >= float(r["scheduled_ms"]) for r in rows)  # none early
    assert opened["summary"]["latency_ms"]["min"] >= 0


@pytest.mark.slow
def test_sweep_soak_and_compare_take_ray_workers(cluster: LocalRayCluster,
                                                 plain_server: ServerProcess,
                                                 tmp_path: Path) -> None:
    ray = ("--ray", cluster.address, "--workers", "2")
    sweep = run_cli(tmp_path, "sweep", plain_server.url, "--model", "tiny",
                    "--concurrency-range", "2:4", "--duration", "1s", *ray, name="sweep",
                    env=cluster.env)
    assert [p["load"]["concurrency"] for p in sweep["points"]] == [2, 4]
    soak = run_cli(tmp_path, "soak", plain_server.url, "--model", "tiny", "--max-rate", "200",
                   "--fraction", "0.5", "--duration", "2s", "--window", "0.3s", *ray,
                   name="soak", env=cluster.env)
    compare = run_cli(tmp_path, "compare", "--endpoint", f"a={plain_server.url},model=tiny",
                      "--endpoint", f"b={plain_server.url},model=mlp", "--concurrency", "2",
                      "--duration", "1s", "--rounds", "1", *ray, name="compare",
                      env=cluster.env)
    results = [*sweep["points"], soak["result"], *(e["result"] for e in compare["endpoints"])]
    for result in results:
        assert {h["node"] for h in result["client"]["hosts"]} == {"127.0.0.2", "127.0.0.3"}


def listeners(pids: set[int], drivers: set[int] = frozenset()) -> list[tuple[str, str, str]]:
    """(address, port, process) of every TCP socket ``pids`` listen on; a Ray driver
    among ``drivers`` is named ``driver``."""
    found = []
    for line in subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True,
                               check=True).stdout.splitlines():
        owners = {int(p) for p in re.findall(r"pid=(\d+)", line)} & pids
        if owners:
            address, _, port = line.split()[3].rpartition(":")
            owner = min(owners)
            found.append((address.strip("[]"), port,
                          "driver" if owner in drivers else process_name(owner)))
    return found


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:300]
    except OSError:
        return "?"


def on_loopback(address: str) -> bool:
    import ipaddress

    if address in ("*", "0.0.0.0", "::"):
        return False
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return (mapped or ip).is_loopback


def descendants(root: int) -> set[int]:
    children: dict[int, set[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), set()).add(int(stat.parent.name))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, set()) - found)
    return found


# What Ray 2.60 binds to every interface whatever the node's address (only a node on
# 127.0.0.1 gets loopback-only servers): the gRPC servers of the GCS, each raylet and
# each worker (Serve's controller, proxy and replicas, the coordinator, load workers),
# each dashboard agent's gRPC server, and the dashboard head's metrics port (44227).
# All but the last take Ray's token (docs/scale-out.md).
def ray_binds_everywhere(process: str) -> bool:
    return (process == "driver" or process.split(" ")[0].endswith(("gcs_server", "raylet"))
            or process.startswith("ray::") or "dashboard/dashboard.py" in process)


def test_the_cluster_and_its_drivers_listen_on_loopback_where_ray_lets_them(
        cluster: LocalRayCluster, deployment: ServerProcess) -> None:
    assert deployment.process is not None
    found = listeners(cluster.pids() | descendants(deployment.process.pid),
                      drivers={deployment.process.pid})
    assert len(found) >= 10, found
    elsewhere = [f for f in found if not on_loopback(f[0])]
    assert all(address in ("*", "0.0.0.0", "::") for address, _, _ in elsewhere), found
    assert [f for f in elsewhere if not ray_binds_everywhere(f[2])] == [], found
    # the proxy on --host, each replica's /metrics on --host
    assert any(f[1] == str(deployment.http_port) and f[0] == "127.0.0.1" for f in found)


@pytest.mark.slow
def test_a_local_ray_listens_on_loopback_only(ray_repository: Path, tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HOME", str(home))
        with ServerProcess(ray_repository, extra_args=(
                "--ray", "--metrics-key", METRICS_KEY),
                env={"RAY_USAGE_STATS_ENABLED": "0"}) as server:
            wait_for(lambda: len(live_replicas(server)) == 1, "one replica listed", 60)
            assert server.process is not None
            found = listeners(descendants(server.process.pid))
            replica = next(iter(live_replicas(server).values()))
    assert len(found) >= 10, found
    # Serve's replica keeps one inter-deployment gRPC server on [::] (hard-coded in Ray)
    elsewhere = [f for f in found if not on_loopback(f[0])]
    assert all(f[2].startswith("ray::ServeReplica") for f in elsewhere), found
    assert len(elsewhere) <= 1, found
    assert replica["node"] == "127.0.0.1"
    assert replica["metrics_url"].startswith("http://127.0.0.1:")
    assert not (home / ".ray").exists()  # its own token: nothing read or left in ~/.ray
