"""Triton's perf_analyzer drives `tradeoff serve` over HTTP and gRPC, and agrees with
`tradeoff bench` at the same load."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.model_repo import CONSTANT_CONFIG, _write, add_constant_model
from tradeoff.server.process import ServerProcess, started

pytestmark = pytest.mark.integration


def run_perf_analyzer(binary: Path, *args: str, stability_percent: int = 20) -> str:
    """perf_analyzer with 1 s windows; up to 30 of them to agree within
    ``stability_percent`` (on this 2-core machine, latency at a low fixed rate can need
    more than 15 to agree within 20%)."""
    run = subprocess.run([str(binary), *args, "--measurement-interval", "1000",
                          "--max-trials", "30", "--stability-percentage",
                          str(stability_percent)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    return run.stdout


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_concurrency_and_rate_ranges_run(perf_analyzer: Path, compat_server: ServerProcess,
                                         protocol: str) -> None:
    url = compat_server.grpc_url if protocol == "grpc" else \
        compat_server.url.removeprefix("http://")
    # whether the ranges run, not what they measure: any three windows count as stable
    # (beside other tests' load, 30 windows did not agree within 20% at concurrency 1)
    out = run_perf_analyzer(perf_analyzer, "-m", "tiny", "-u", url, "-i", protocol,
                            "--concurrency-range", "1:4:3", stability_percent=1000)
    assert re.search(r"Concurrency: 1, throughput: [\d.]+ infer/sec", out)
    assert re.search(r"Concurrency: 4, throughput: [\d.]+ infer/sec", out)
    assert "Execution count" in out  # it read our statistics extension
    out = run_perf_analyzer(perf_analyzer, "-m", "mlp", "-u", url, "-i", protocol,
                            "--request-rate-range", "50:100:50", stability_percent=1000)
    assert re.search(r"Request Rate: 100(\.0+)?, throughput: [\d.]+ infer/sec", out)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.timing  # two throughputs measured one after the other, within 10%
def test_throughput_agrees_with_tradeoff_bench(perf_analyzer: Path,
                                               compat_server: ServerProcess,
                                               tmp_path: Path, protocol: str) -> None:
    url = compat_server.grpc_url if protocol == "grpc" else \
        compat_server.url.removeprefix("http://")
    out = run_perf_analyzer(perf_analyzer, "-m", "mlp", "-u", url, "-i", protocol,
                            "--request-rate-range", "150")
    match = re.search(r"Request Rate: 150(?:\.0+)?, throughput: ([\d.]+) infer/sec", out)
    assert match, out
    theirs = float(match.group(1))
    result = tmp_path / "bench.json"
    target = compat_server.grpc_url if protocol == "grpc" else compat_server.url
    subprocess.run([sys.executable, "-m", "tradeoff", "bench", target, "--model", "mlp",
                    "--protocol", "v2-grpc" if protocol == "grpc" else "v2",
                    "--rate", "150", "--duration", "3", "--json", str(result)],
                   check=True, capture_output=True, timeout=120)
    ours = json.loads(result.read_text())["summary"]["throughput_rps"]
    assert abs(ours - theirs) / theirs <= 0.10, (ours, theirs)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_a_gateway(perf_analyzer: Path, tmp_path: Path,
                                          protocol: str) -> None:
    """A router over a pool of replicas, measured as a model: perf_analyzer finds the
    version that served by its statistics (a router counts each request through its
    queue) and reads the answers passed on as the replica sent them."""
    replica_root = tmp_path / "replica"
    _write(replica_root, "addc", {1: add_constant_model(1.0)},
           CONSTANT_CONFIG.format(name="addc", extra=""))
    with started([ServerProcess(replica_root, host="127.0.0.2")]) as (replica,):
        (tmp_path / "front").mkdir()
        (tmp_path / "front" / "router.yaml").write_text(json.dumps({
            "pools": {"addc_pool": {"protocol": "v2", "model": "addc",
                                    "replicas": [replica.url]}},
            "routes": [{"to": "addc_pool"}]}))
        with started([ServerProcess(tmp_path)]) as (gateway,):
            url = gateway.grpc_url if protocol == "grpc" else \
                gateway.url.removeprefix("http://")
            out = run_perf_analyzer(perf_analyzer, "-m", "front", "-u", url, "-i", protocol,
                                    "--concurrency-range", "2", stability_percent=1000)
    assert re.search(r"Concurrency: 2, throughput: [\d.]+ infer/sec", out), out
    assert "Successful request count" in out
