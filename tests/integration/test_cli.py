"""`tradeoff demo` end to end, and `tradeoff serve` refusing a port that is taken."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def test_demo_serves_and_reports_batching(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "demo", "--duration", "0.5",
                          "--concurrency", "1", "--concurrency", "16", "--output", str(out)],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "server exited with 0 after SIGTERM" in run.stdout
    assert str(out / "results.json") in run.stdout.replace("\n", "")
    rows = json.loads((out / "results.json").read_text())["rows"]
    assert {(r["model"], r["concurrency"]) for r in rows} == {
        ("mlp", 1), ("mlp", 16), ("mlp_nobatch", 1), ("mlp_nobatch", 16)}
    assert all(r["errors"] == 0 and r["throughput_rps"] > 0 for r in rows)
    nobatch = [r for r in rows if r["model"] == "mlp_nobatch"]
    assert all(r["executions_per_request"] == 1.0 for r in nobatch)


def test_serve_on_a_taken_port_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "empty").mkdir()
        run = subprocess.run([sys.executable, "-m", "tradeoff", "serve", "--model-repository",
                              str(tmp_path / "empty"), "--http-port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert f"cannot listen on 127.0.0.1:{port}" in run.stderr
    assert "Traceback" not in run.stderr
