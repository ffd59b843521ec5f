"""`tradeoff sweep`, `soak`, `compare`, `diagnose` and `report` against real servers on
127.0.0.1: a controllable server whose capacity is known, and `tradeoff serve`."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tradeoff.server.process import ServerProcess

from .control_server import ControlServer

pytestmark = pytest.mark.integration

SHORT = ["--duration", "0.8", "--warmup", "0.2"]


def tradeoff(*args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess:
    run = subprocess.run([sys.executable, "-m", "tradeoff", *args], capture_output=True,
                         text=True, timeout=timeout, check=False)
    if check:
        assert run.returncode == 0, run.stdout + run.stderr
    return run


def run_json(tmp_path: Path, name: str, *args: str, check: bool = True
             ) -> tuple[dict[str, Any], str]:
    """Run a command writing ``name``.json; with ``check`` it must succeed. A soak may
    also end with 3 (its verdict "unstable"): whether six half-second windows are stable
    moves with the neighbours' load, so only the tests of the verdict ask for it."""
    out = tmp_path / f"{name}.json"
    run = tradeoff(*args, "--json", str(out), check=False)
    if check:
        verdicts = (0, 3) if args[0] == "soak" else (0,)
        assert run.returncode in verdicts, run.stdout + run.stderr
    return (json.loads(out.read_text()) if out.exists() else {}), run.stdout + run.stderr


# ------------------------------------------------------------------------- sweep

def test_a_sweep_warms_up_each_level_unless_told_otherwise(tmp_path: Path) -> None:
    """The README's SLA sweep measured the cold start as its first level's p99."""
    with ControlServer() as server:
        url = f"{server.url}/serial?ms=1"
        sweep, out = run_json(tmp_path, "warm", "sweep", url, "--protocol", "http",
                              "--method", "GET", "--concurrency-range", "1:2",
                              "--duration", "0.5", "--summary", str(tmp_path / "warm.md"))
        assert "warmup: 1s at each level" in out
        assert "concurrency 2: 1 of 2 levels at most, 50%, about" in out  # progress lines
        table = (tmp_path / "warm.md").read_text().splitlines()
        assert table[0].startswith("| concurrency | throughput_rps") and len(table) == 4
        assert all(p["load"]["warmup_s"] == 1.0 for p in sweep["points"])
        cold, out = run_json(tmp_path, "cold", "sweep", url, "--protocol", "http",
                             "--method", "GET", "--concurrency-range", "1:2",
                             "--duration", "0.5", "--warmup", "0")
        assert "warmup:" not in out
        assert all(p["load"]["warmup_s"] == 0 for p in cold["points"])


@pytest.mark.timing  # over 120 req/s of 5 ms turns, and the knee by 2, move with the load
def test_concurrency_sweep_of_a_server_without_batching(tmp_path: Path) -> None:
    """One request at a time, 5 ms each: throughput is flat at about 200/s from
    concurrency 1, latency grows with concurrency; the sweep stops 2 points past the knee
    and the diagnosis says no batching."""
    with ControlServer() as server:
        sweep, out = run_json(tmp_path, "sweep", "sweep", f"{server.url}/serial?ms=5",
                              "--protocol", "http", "--method", "GET",
                              "--concurrency-range", "1:64", *SHORT)
    assert sweep["schema"] == "tradeoff.sweep/1"
    assert all(p["schema"] == "tradeoff.bench/1" for p in sweep["points"])
    loads = [r["load"] for r in sweep["rows"]]
    assert loads == [1, 2, 4, 8, 16, 32, 64][:len(loads)]
    assert sweep["knee"] is not None and sweep["knee"]["load"] <= 2
    assert len(loads) == loads.index(sweep["knee"]["load"]) + 3  # patience 2
    assert "stopped growing" in sweep["stop_reason"]
    for row in sweep["rows"]:
        assert 120 < row["throughput_rps"] <= 205
    assert "knee" in out
    diagnosis = tradeoff("diagnose", str(tmp_path / "sweep.json"))
    assert "no batching" in diagnosis.stdout


def test_sweep_stops_when_p99_passes_the_limit(tmp_path: Path) -> None:
    with ControlServer() as server:
        sweep, _ = run_json(tmp_path, "sweep", "sweep", f"{server.url}/fixed?ms=20",
                            "--protocol", "http", "--concurrency-range", "1,2,4",
                            "--max-p99-ms", "5", *SHORT)
    assert len(sweep["points"]) == 1
    assert "> 5 ms" in sweep["stop_reason"]


def test_sweep_stops_when_errors_rise(tmp_path: Path) -> None:
    with ControlServer() as server:
        sweep, _ = run_json(tmp_path, "sweep", "sweep", f"{server.url}/status?code=503",
                            "--protocol", "http", "--concurrency-range", "1:8", *SHORT)
    assert len(sweep["points"]) == 1
    assert "error rate 100.0%" in sweep["stop_reason"]


@pytest.mark.timing  # rate 100 meeting p99 <= 30 ms moves with the load
def test_sla_search_steps_up_then_bisects(tmp_path: Path) -> None:
    """Capacity 200 req/s: rates up to 100 meet p99 <= 30 ms, 400 cannot."""
    with ControlServer() as server:
        sweep, out = run_json(tmp_path, "sla", "sweep", f"{server.url}/serial?ms=5",
                              "--protocol", "http", "--method", "GET",
                              "--rate-range", "50:400", "--arrival", "constant",
                              "--sla-p99-ms", "30", "--bisect-steps", "2", *SHORT)
    sla = sweep["sla"]
    tried = [r["load"] for r in sweep["rows"]]
    assert 100 <= sla["best_load"] < 400
    assert sla["best"]["p99_ms"] <= 30
    assert len(tried) >= 5  # 50, 100, 200 or 400 failing, then 2 bisection points
    assert any(load not in (50, 100, 200, 400) for load in tried)
    failing = [r for r in sweep["rows"] if r["load"] > sla["best_load"]]
    assert failing and all(r["p99_ms"] > 30 or r["error_percent"] > 1 for r in failing)
    assert "SLA p99 <= 30 ms" in out


def test_sweep_refuses_bad_ranges_in_one_line(tmp_path: Path) -> None:
    run = tradeoff("sweep", "http://127.0.0.1:9", "--protocol", "http",
                   "--concurrency-range", "8:1", check=False)
    assert run.returncode != 0 and "START:END" in run.stderr and "Traceback" not in run.stderr
    run = tradeoff("sweep", "http://127.0.0.1:9", "--protocol", "http", check=False)
    assert "--concurrency-range, --rate-range or --profile" in run.stderr


# -------------------------------------------------------------------------- soak

def test_soak_of_a_steady_server_watches_its_memory(tmp_path: Path,
                                                    server: ServerProcess) -> None:
    assert server.process is not None
    soak, out = run_json(tmp_path, "soak", "soak", server.url, "--model", "mlp",
                         "--max-rate", "150", "--fraction", "0.5", "--duration", "3s",
                         "--window", "0.5s", "--server-pid", str(server.process.pid))
    assert soak["schema"] == "tradeoff.soak/1"
    assert soak["rate_rps"] == pytest.approx(75)
    assert soak["max_rate"]["source"] == "given"
    assert len(soak["result"]["windows"]) == 6
    assert soak["memory"]["source"].startswith(f"/proc/{server.process.pid}")
    assert len(soak["memory"]["samples"]) >= 3
    assert all(s[1] > 10 * 2**20 for s in soak["memory"]["samples"])
    assert set(soak["verdict"]["trends"]) >= {"p99", "throughput", "memory"}
    assert soak["result"]["summary"]["errors"] == 0
    assert "windows" not in out or "Soak at" in out


def test_server_memory_from_its_pid_and_from_prometheus(server: ServerProcess) -> None:
    from tradeoff.bench.soak import read_rss

    assert server.process is not None
    by_pid = read_rss(server.process.pid, None)
    by_metrics = read_rss(None, server.metrics_url)
    assert by_pid is not None and by_metrics is not None
    assert by_pid > 10 * 2**20
    assert abs(by_pid - by_metrics) / by_pid < 0.5  # the same process, read two ways
    assert read_rss(None, "http://127.0.0.1:9/metrics") is None


def test_soak_reads_memory_from_a_prometheus_url(tmp_path: Path, server: ServerProcess) -> None:
    soak, _ = run_json(tmp_path, "soak", "soak", server.url, "--model", "mlp",
                       "--max-rate", "50", "--duration", "3", "--window", "0.5",
                       "--prometheus-url", server.metrics_url)
    assert "process_resident_memory_bytes" in soak["memory"]["source"]
    assert soak["memory"]["samples"]


def test_soak_needs_six_windows(tmp_path: Path) -> None:
    run = tradeoff("soak", "http://127.0.0.1:9", "--protocol", "http", "--max-rate", "10",
                   "--duration", "2", "--window", "0.5", check=False)
    assert run.returncode != 0 and "fewer than 6 windows" in run.stderr


def test_soak_refuses_memory_it_cannot_read(tmp_path: Path, server: ServerProcess) -> None:
    run = tradeoff("soak", server.url, "--model", "mlp", "--max-rate", "50", "--duration",
                   "3", "--window", "0.5", "--prometheus-url", "http://127.0.0.1:9/metrics",
                   check=False)
    assert run.returncode != 0 and "cannot read the server's memory" in run.stderr


@pytest.mark.timing  # a drift of 4 ms a window hides in a loaded machine's noise
def test_soak_finds_a_server_that_slows_down(tmp_path: Path) -> None:
    """Each request waits 40 us longer than the one before: p99 drifts up."""
    with ControlServer() as server:
        soak, out = run_json(tmp_path, "soak", "soak", f"{server.url}/growing?us=40",
                             "--protocol", "http", "--method", "GET", "--max-rate", "200",
                             "--fraction", "1", "--arrival", "constant", "--duration", "4",
                             "--window", "0.5", check=False)
    assert soak["verdict"]["stable"] is False
    kinds = [r["kind"] for r in soak["verdict"]["reasons"]]
    assert "drift" in kinds, soak["verdict"]
    assert "p99 drifted up" in out


def test_soak_measures_the_maximum_rate_first(tmp_path: Path) -> None:
    with ControlServer() as server:
        soak, _ = run_json(tmp_path, "soak", "soak", f"{server.url}/serial?ms=5",
                           "--protocol", "http", "--fraction", "0.5", "--duration", "3",
                           "--window", "0.5", "--probe-duration", "0.5")
    assert soak["max_rate"]["source"] == "measured"
    assert 120 < soak["max_rate"]["rps"] <= 205
    assert soak["rate_rps"] == pytest.approx(soak["max_rate"]["rps"] * 0.5)


# ----------------------------------------------------------------------- compare

def test_compare_batched_and_unbatched_models_side_by_side(tmp_path: Path,
                                                           server: ServerProcess) -> None:
    doc, out = run_json(tmp_path, "compare", "compare",
                        "--endpoint", f"batched={server.url},model=mlp",
                        "--endpoint", f"single={server.url},model=mlp_nobatch",
                        "--concurrency", "8", "--rounds", "2", *SHORT,
                        "--price-per-hour", "batched=1.0", "--price-per-hour", "single=0.5",
                        "--fact", "batched:hardware=2 vCPU", "--fact", "single:region=local")
    assert doc["schema"] == "tradeoff.compare/1" and doc["baseline"] == "batched"
    names = [e["name"] for e in doc["endpoints"]]
    assert names == ["batched", "single"]
    for entry in doc["endpoints"]:
        assert len(entry["rounds"]) == 2
        assert entry["result"]["merged_rounds"] == 2
    base, other = doc["ratios"]
    assert base["throughput"]["ratio"] == 1.0
    for metric in ("throughput", "p50", "p99"):
        low, high = other[metric]["ci95"]
        assert low <= high
    checks = {c["check"]: c for c in doc["fairness"]["checks"]}
    assert checks["same inputs"]["ok"] is True
    assert checks["interleaved"]["ok"] is True
    assert doc["fairness"]["ok"] is True
    batched, single = (e["profile"]["checklist"] for e in doc["endpoints"])
    assert batched["batching"].startswith("dynamic")
    assert not single["batching"].startswith("dynamic")
    assert batched["hardware"] == "2 vCPU" and single["hardware"] != "2 vCPU"
    assert batched["server"].startswith("tradeoff")
    assert doc["endpoints"][1]["profile"]["facts"] == {"region": "local"}
    ranking = {c["name"]: c for c in doc["ranking"]}
    throughput = doc["endpoints"][0]["result"]["summary"]["throughput_rps"]
    assert ranking["batched"]["cost_per_million"] == pytest.approx(
        1.0 / (throughput * 3600) * 1e6)
    assert "Endpoint profiles" in out and "fairness" in out


@pytest.mark.slow
def test_compare_reads_result_files(tmp_path: Path, server: ServerProcess) -> None:
    for model in ("mlp", "mlp_nobatch"):
        tradeoff("bench", server.url, "--model", model, "--concurrency", "4", "--duration",
                 "1.6", "--warmup", "0.2", "--window", "0.2",
                 "--json", str(tmp_path / f"{model}.json"))
    doc, _ = run_json(tmp_path, "compare", "compare", str(tmp_path / "mlp.json"),
                      str(tmp_path / "mlp_nobatch.json"), "--price-per-1k-requests", "0.01",
                      "--summary", str(tmp_path / "compare.csv"))
    assert [e["name"] for e in doc["endpoints"]] == ["mlp", "mlp_nobatch"]
    table = (tmp_path / "compare.csv").read_text().splitlines()
    assert table[0].startswith("endpoint,throughput_rps,throughput_ratio")
    assert [line.split(",")[0] for line in table[1:]] == ["mlp", "mlp_nobatch"]
    checks = {c["check"]: c["ok"] for c in doc["fairness"]["checks"]}
    assert checks["interleaved"] is False and checks["same inputs"] is None
    assert doc["ratios"][1]["throughput"]["ci95"] is not None  # from 8 windows each
    assert doc["ratios"][1]["p99"]["ci95"] is None  # no raw samples in a file
    assert all(c["cost_per_million"] == pytest.approx(10.0) for c in doc["ranking"])
    assert doc["endpoints"][0]["profile"]["checklist"]["batching"].startswith("dynamic")


def test_compare_needs_two_endpoints(tmp_path: Path) -> None:
    run = tradeoff("compare", "--endpoint", "a=http://127.0.0.1:9,model=m", check=False)
    assert run.returncode != 0 and "at least two" in run.stderr
    run = tradeoff("compare", "--endpoint", "a", "--endpoint", "b", check=False)
    assert "NAME=URL" in run.stderr and "Traceback" not in run.stderr


def test_compare_checks_every_endpoint_before_its_first_round(server: ServerProcess
                                                              ) -> None:
    """A missing version used to be found after the first endpoint's round had run."""
    run = tradeoff("compare", "--endpoint", f"fp32={server.url},model=mlp,version=1",
                   "--endpoint", f"int8={server.url},model=mlp,version=7", "--duration", "5s",
                   check=False)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "endpoint int8" in run.stderr and "version" in run.stderr, run.stderr
    assert "round 1" not in run.stdout


# ------------------------------------------------------------------------ report

def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.slow
def test_report_renders_every_plot_in_chromium(tmp_path: Path, server: ServerProcess) -> None:
    browser = chromium()
    if browser is None:
        pytest.skip("chromium missing: make test installs it (scripts/apt_get.sh)")
    assert server.process is not None
    sweeps = []
    for model in ("mlp", "mlp_nobatch"):
        path = tmp_path / f"sweep-{model}.json"
        tradeoff("sweep", server.url, "--model", model, "--concurrency-range", "1:4", *SHORT,
                 "--json", str(path))
        sweeps.append(str(path))
    run_json(tmp_path, "compare", "compare", "--endpoint", f"a={server.url},model=mlp",
             "--endpoint", f"b={server.url},model=mlp_nobatch", "--rounds", "1", *SHORT)
    run_json(tmp_path, "soak", "soak", server.url, "--model", "mlp", "--max-rate", "100",
             "--duration", "3", "--window", "0.5", "--server-pid", str(server.process.pid))
    run_json(tmp_path, "bench", "bench", server.url, "--model", "mlp", "--rate", "200",
             "--duration", "3")
    report = tmp_path / "report.html"
    pngs = tmp_path / "png"
    run = tradeoff("report", *sweeps, str(tmp_path / "compare.json"),
                   str(tmp_path / "soak.json"), str(tmp_path / "bench.json"), "-o", str(report),
                   "--png", str(pngs))
    assert f"report: {report}" in run.stdout
    page = report.read_text()
    assert "http://" not in page.split("<main>")[0] and "<script src" not in page
    expected = page.count('<figure class="plot"')
    # throughput, latency, frontier, comparison, over the run, CDF, soak
    assert expected == 7
    assert len(list(pngs.glob("*.png"))) == expected

    flags = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
             "--hide-scrollbars", "--window-size=1200,6000"]
    dom = subprocess.run([browser, *flags, "--virtual-time-budget=3000", "--dump-dom",
                          report.as_uri()], capture_output=True, text=True, timeout=120,
                         check=False)
    assert dom.returncode == 0, dom.stderr[-2000:]
    rendered = [part.split('"')[0] for part in dom.stdout.split('data-rendered="')[1:]]
    assert len(rendered) == expected, dom.stdout[:500]
    widths = []
    for size in rendered:
        box, drawn = size.split(":")
        width, height = (int(v) for v in box.split("x"))
        assert width > 200 and height > 100 and int(drawn) > 20, rendered
        widths.append(width)
    assert max(widths) - min(widths) <= 4, rendered  # one size: the same text size in each
    for name in ("Knee", "Findings", "Fairness", "Endpoint profiles", "Environment",
                 "Verdict"):
        assert name in dom.stdout

    shot = tmp_path / "shot.png"
    subprocess.run([browser, *flags, f"--screenshot={shot}", report.as_uri()],
                   capture_output=True, timeout=120, check=True)
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)[..., :3]
    assert pixels.std() > 0.05  # not blank
    not_background = np.abs(pixels - pixels[0, 0]).sum(axis=2) > 0.1
    assert not_background.mean() > 0.03  # drawn: plots and tables cover the page
