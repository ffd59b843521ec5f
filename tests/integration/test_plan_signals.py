"""`tradeoff plan` stopped by a signal: its `tradeoff serve` children stop, its scratch
goes, and the same command can run again at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from ..synthetic_model import write_synthetic_model
from .helpers import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid``, read from /proc."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _serving(pid: int) -> set[int]:
    out = set()
    for child in _descendants(pid):
        try:
            command = (Path("/proc") / str(child) / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"serve" in command:
            out.add(child)
    return out


def _plan_command(tmp_path: Path) -> tuple[list[str], Path]:
    """`tradeoff plan` of a synthetic model into ``tmp_path/plan``: long enough to stop."""
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=2.0, per_row_ms=0.05,
                                  max_batch_size=16)
    output = tmp_path / "plan"
    return [sys.executable, "-m", "tradeoff", "plan", str(model), "--sla-p99-ms", "15",
            "--rate", "200", "--precision", "none", "--budget", "2m", "--replay", "5s",
            "-o", str(output)], output


def _stop_at_first_server(command: list[str], sig: signal.Signals
                          ) -> tuple[subprocess.Popen[str], str, set[int]]:
    planner = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    servers: set[int] = set()
    try:
        def started() -> bool:
            servers.update(_serving(planner.pid))
            return bool(servers) or planner.poll() is not None

        wait_for(started, "the plan's first tradeoff serve", 90)
        assert servers, planner.communicate(timeout=10)[0]
        planner.send_signal(sig)
        text, _ = planner.communicate(timeout=90)
    finally:
        planner.kill()
    return planner, text, servers


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_stops_the_plans_servers_and_removes_its_scratch(
        tmp_path: Path, sig: signal.Signals) -> None:
    command, output = _plan_command(tmp_path)
    planner, text, servers = _stop_at_first_server(command, sig)
    assert planner.returncode == 128 + sig, text
    assert f"plan: stopped by {sig.name}" in text and "Traceback" not in text
    wait_for(lambda: not any(_alive(pid) for pid in servers), "the servers to stop", 30)
    assert not (output / ".work").exists()
    # the same command runs again into the same folder (stopped again once it serves)
    planner, text, _ = _stop_at_first_server(command, signal.SIGINT)
    assert planner.returncode == 128 + signal.SIGINT, text
    assert not output.exists() or not any(output.iterdir())


def test_a_killed_plan_leaves_no_server_and_its_scratch_does_not_block_a_rerun(
        tmp_path: Path) -> None:
    command, output = _plan_command(tmp_path)
    planner, _, servers = _stop_at_first_server(command, signal.SIGKILL)
    assert planner.returncode == -signal.SIGKILL
    # SIGKILL runs no clean-up: the servers see their parent gone and stop themselves
    wait_for(lambda: not any(_alive(pid) for pid in servers), "the orphaned servers to stop",
             30)
    assert (output / ".work").is_dir()
    planner, text, _ = _stop_at_first_server(command, signal.SIGINT)
    assert planner.returncode == 128 + signal.SIGINT, text
    assert not output.exists() or not any(output.iterdir())
