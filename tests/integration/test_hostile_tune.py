"""`tradeoff tune serve` against an operator's mistakes and signals: the server never stays
on a trial config unnoticed, and --apply-to touches only the tuned model's own files."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.server.process import ServerProcess

from ..synthetic_model import write_synthetic_model
from .helpers import request, running_server, wait_for

pytestmark = pytest.mark.integration

# one candidate (max_batch_size 4 where the model has 8), measured for a few seconds: the
# window in which the tuner is stopped
ONE_CANDIDATE = ("--sla-p99-ms", "50", "--rate", "50", "--duration", "4s", "--warmup",
                 "0.2s", "--max-batch-sizes", "4", "--delays-us", "0", "--instances", "1",
                 "--threads", "1", "--preferred", "off", "--strategy", "grid",
                 "--confirm", "0")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-tune")
    write_synthetic_model(root, "synthetic", fixed_ms=1.0, per_row_ms=0.1, max_batch_size=8,
                          extra="dynamic_batching { }")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from running_server(repository, extra_args=("--max-instances", "1", "--no-grpc"))


def config(server: ServerProcess) -> dict[str, Any]:
    return dict(request(server.url, "GET", "/v2/models/synthetic/config").json())


def index_reason(server: ServerProcess) -> str:
    rows = request(server.url, "POST", "/v2/repository/index", b"{}").json()
    return str(next(r for r in rows if r["name"] == "synthetic").get("reason", ""))


def start_tuner(server: ServerProcess, tmp_path: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tradeoff", "tune", "serve", server.url, "--model", "synthetic",
         *ONE_CANDIDATE, "--output", str(tmp_path / "out")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env=dict(os.environ, PYTHONUNBUFFERED="1"))


def on_trial(server: ServerProcess, before: dict[str, Any]) -> bool:
    return config(server)["max_batch_size"] != before["max_batch_size"]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_and_sighup_put_the_original_config_back(
        server: ServerProcess, tmp_path: Path, sig: signal.Signals) -> None:
    before = config(server)
    tuner = start_tuner(server, tmp_path)
    try:
        wait_for(lambda: on_trial(server, before), "the tuner on its candidate", 30)
        tuner.send_signal(sig)
        output, _ = tuner.communicate(timeout=60)
    finally:
        tuner.kill()
    assert tuner.returncode == 128 + sig, output
    assert f"stopped by {sig.name}; synthetic has its original config back" in output
    assert "Traceback" not in output
    assert config(server) == before and index_reason(server) == ""


def test_a_killed_tuner_leaves_a_marked_config_that_restore_undoes(
        server: ServerProcess, tmp_path: Path) -> None:
    before = config(server)
    tuner = start_tuner(server, tmp_path)
    try:
        wait_for(lambda: on_trial(server, before), "the tuner on its candidate", 30)
        tuner.kill()  # SIGKILL: no handler runs
        tuner.communicate(timeout=30)
    finally:
        tuner.kill()
    reason = index_reason(server)
    assert reason.startswith("on a trial config applied by tradeoff tune serve, pid "
                             f"{tuner.pid} on "), reason
    assert config(server)["parameters"]["tradeoff_tune"]["string_value"] in reason
    # a new search refuses to take the trial config for the model's own
    again = CliRunner().invoke(main, ["tune", "serve", server.url, "--model", "synthetic",
                                      *ONE_CANDIDATE, "--output", str(tmp_path / "again")])
    assert again.exit_code == 1 and "Traceback" not in again.output
    assert "put the original back first: tradeoff tune serve --restore" in again.output
    restored = CliRunner().invoke(main, ["tune", "serve", server.url, "--model", "synthetic",
                                         "--restore"])
    assert restored.exit_code == 0, restored.output
    assert "replaced by the original (max_batch_size 8)" in restored.output
    assert config(server) == before and index_reason(server) == ""
    nothing = CliRunner().invoke(main, ["tune", "serve", server.url, "--model", "synthetic",
                                        "--restore"])
    assert nothing.exit_code == 1 and "nothing to restore" in nothing.output


def tune_apply(server: ServerProcess, tmp_path: Path, *args: str) -> Any:
    return CliRunner().invoke(main, [
        "tune", "serve", server.url, "--model", "synthetic", *ONE_CANDIDATE,
        "--duration", "0.5s", *args])


def snapshot(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.iterdir()) if p.is_file()}


@pytest.mark.parametrize(("name", "config_name", "says"), [
    ("other", "other", "not the directory of model 'synthetic'"),
    ("synthetic", "other", "does not match the model directory 'synthetic'"),
])
def test_apply_to_refuses_a_directory_that_is_not_the_models(
        server: ServerProcess, tmp_path: Path, name: str, config_name: str,
        says: str) -> None:
    target = tmp_path / name
    target.mkdir()
    (target / "config.pbtxt").write_text(f'name: "{config_name}"\nbackend: "synthetic"\n')
    (target / "notes.txt").write_text("not tradeoff's")
    before = snapshot(target)
    run = tune_apply(server, tmp_path, "--apply-to", str(target),
                     "--output", str(tmp_path / "out"))
    assert run.exit_code == 1 and says in run.output and "Traceback" not in run.output
    assert snapshot(target) == before  # nothing written, renamed or deleted


def test_output_refuses_a_directory_holding_files_it_did_not_write(
        server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.pbtxt").write_text('name: "someone_elses"\n')
    run = tune_apply(server, tmp_path, "--output", str(out))
    assert run.exit_code == 1 and "config.pbtxt there was not written by tune serve" \
        in run.output
    assert snapshot(out) == {"config.pbtxt": 'name: "someone_elses"\n'}


def test_applying_twice_keeps_every_earlier_config(server: ServerProcess, repository: Path,
                                                   tmp_path: Path) -> None:
    model_dir = write_synthetic_model(tmp_path / "repo", "synthetic", max_batch_size=8,
                                      extra="dynamic_batching { }")
    original = (model_dir / "config.pbtxt").read_text()
    first = tune_apply(server, tmp_path, "--apply-to", str(model_dir), "--output",
                       str(tmp_path / "out"))
    assert first.exit_code == 0, first.output
    first_written = (model_dir / "config.pbtxt").read_text()
    assert first_written.startswith("# written by tradeoff tune serve")
    second = tune_apply(server, tmp_path, "--apply-to", str(model_dir), "--output",
                        str(tmp_path / "out"))
    assert second.exit_code == 0, second.output
    files = snapshot(model_dir)
    assert files["config.pbtxt.orig"] == original
    assert files["config.pbtxt.orig.2"] == first_written  # the first run's file is kept
    assert set(files) == {"config.pbtxt", "config.pbtxt.orig", "config.pbtxt.orig.2"}
