"""`tradeoff demo` end to end, `tradeoff serve` refusing a port that is taken, and the
shared flags (durations with units, one set of defaults) through the real entry point."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tradeoff.bench.load import LOAD_DEFAULTS
from tradeoff.bench.sweep import SWEEP_WARMUP_S

from .control_server import ControlServer

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_demo_sweeps_both_models_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    report = tmp_path / "demo-report.html"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "demo", "--duration", "0.6",
                          "--max-concurrency", "8", "--output", str(out), "--report",
                          str(report)], capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    text = " ".join(run.stdout.split())
    assert "server exited with 0 after SIGTERM" in text
    assert f"report: {report}" in text
    for heading in ("latency baseline", "side by side", "diagnosis", "cost under a p99 SLA"):
        assert heading in text
    # the sections are numbered in the order they print, each number once
    numbers = [int(n) for n in re.findall(
        r"\b(\d+)\. (?:serving|latency baseline at|sweeping|side by side|diagnosis|cost "
        r"under|generative models|continuous batching|quantization)", text)]
    assert numbers == list(range(1, len(numbers) + 1)), numbers
    # its load generator shares the machine by design: a client-bound point is a warning
    assert not any("critical" in line and "client" in line.lower()
                   for line in run.stdout.splitlines())
    for model in ("mlp", "mlp_nobatch"):
        sweep = json.loads((out / f"sweep-{model}.json").read_text())
        assert sweep["schema"] == "tradeoff.sweep/1"
        assert sweep["rows"][0]["load"] == 1 and sweep["rows"][-1]["load"] <= 8
        assert all(r["error_percent"] == 0 for r in sweep["rows"])
    nobatch = json.loads((out / "sweep-mlp_nobatch.json").read_text())
    counts = [p["summary"]["server_counts"] for p in nobatch["points"]]
    assert all(c["executions"] == c["requests"] for c in counts)  # never batched
    compare = json.loads((out / "compare.json").read_text())
    assert [e["name"] for e in compare["endpoints"]] == ["mlp", "mlp_nobatch"]
    page = report.read_text()
    assert page.count('<figure class="plot"') >= 4 and "Findings" in page
    from tradeoff.models import available_generative_models

    if available_generative_models():  # torch installed: the LLM part ran too
        assert "generative models" in text and "continuous batching" in text
        answers = json.loads((out / "generative-answers.json").read_text())["answers"]
        assert set(answers) == set(available_generative_models())
        assert all(a["error"] is None and a["output_tokens"] > 0 for a in answers.values())
        if "smollm2-135m" in answers:
            assert "Paris" in answers["smollm2-135m"]["text"]
        together = json.loads((out / "generative-8-at-once.json").read_text())["summary"]
        assert together["errors"] == 0 and together["output_length"]["exact"] == 8
        assert "Generations (ms)" in page
    from tradeoff.models.packaged import available_packaged_models

    if "minilm" in available_packaged_models():  # the quantization step ran too
        assert "quantization: minilm FP32 vs INT8" in text
        optimized = json.loads((out / "optimize-minilm.json").read_text())
        assert optimized["schema"] == "tradeoff.optimize/1"
        assert [v["precision"] for v in optimized["versions"]] == ["fp32", "int8"]
        assert optimized["versions"][1]["accuracy"][0]["kind"] == "embedding"
        assert "Optimized versions of minilm" in page


def test_serve_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "empty").mkdir()
        run = subprocess.run([sys.executable, "-m", "tradeoff", "serve", "--model-repository",
                              str(tmp_path / "empty"), "--http-port", str(port)],
                             capture_output=True, text=True, timeout=60, check=False)
    assert run.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr
    assert "Traceback" not in run.stderr


def _tradeoff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tradeoff", *args], capture_output=True,
                          text=True, timeout=120, check=False)


def test_durations_with_units_and_shared_defaults_reach_the_result(tmp_path: Path) -> None:
    with ControlServer() as server:
        url = f"{server.url}/fixed?ms=1"
        bench = _tradeoff("bench", url, "--protocol", "http", "--method", "GET",
                          "--concurrency", "2", "--duration", "800ms", "--warmup", "0.2s",
                          "--timeout", "5s", "--json", str(tmp_path / "bench.json"))
        assert bench.returncode == 0, bench.stdout + bench.stderr
        sweep = _tradeoff("sweep", url, "--protocol", "http", "--method", "GET",
                          "--concurrency-range", "1:2", "--duration", "500ms",
                          "--json", str(tmp_path / "sweep.json"))
        assert sweep.returncode == 0, sweep.stdout + sweep.stderr
    load = json.loads((tmp_path / "bench.json").read_text())["load"]
    assert (load["duration_s"], load["warmup_s"], load["timeout_s"]) == (0.8, 0.2, 5.0)
    points = json.loads((tmp_path / "sweep.json").read_text())["points"]
    assert [p["load"]["concurrency"] for p in points] == [1, 2]
    for point in points:  # the flags not given take the same defaults as in bench
        assert point["load"]["duration_s"] == 0.5
        assert point["load"]["warmup_s"] == SWEEP_WARMUP_S  # but a sweep level's warmup
        assert point["load"]["timeout_s"] == LOAD_DEFAULTS.timeout_s
        assert point["load"]["seed"] == LOAD_DEFAULTS.seed


def test_a_bad_duration_is_one_line_from_every_command() -> None:
    for args in (["bench", "http://127.0.0.1:9", "--duration", "5x"],
                 ["sweep", "http://127.0.0.1:9", "--concurrency-range", "1:2", "--warmup",
                  "-1"],
                 ["soak", "http://127.0.0.1:9", "--window", "nan"],
                 ["compare", "--endpoint", "a=http://127.0.0.1:9", "--timeout", ""]):
        run = _tradeoff(*args)
        assert run.returncode == 2, run.stderr
        assert "Traceback" not in run.stderr
        last = run.stderr.strip().splitlines()[-1]
        assert last.startswith("Error: Invalid value for '--"), last
        assert "write 90 (seconds)" in last or "must be" in last, last
