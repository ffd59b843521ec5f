"""tradeoff top in a real terminal (tmux) against a live server under load."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.server.process import ServerProcess, free_port

from ..synthetic_model import write_synthetic_model
from .helpers import background_load, post_json, running_server, wait_for

CLI = str(Path(sys.executable).with_name("tradeoff"))
BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                    "data": [1, 2, 3, 4]}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("top-models")
    write_synthetic_model(root, "synthetic", fixed_ms=1.0, per_row_ms=0.1, max_batch_size=8,
                          extra="dynamic_batching { }")
    yield from running_server(root)


def pane(session: str) -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", session], capture_output=True,
                          text=True, check=True).stdout


def model_row(screen: str) -> list[float] | None:
    """The numbers of the ``synthetic`` row on the screen, if it shows one."""
    line = next((line for line in screen.splitlines()
                 if line.strip().startswith("synthetic")), None)
    if line is None:
        return None
    return [float(v.replace(",", "")) for v in re.findall(r"\d[\d,]*\.?\d*", line)]


def requests_per_s(screen: str) -> float:
    row = model_row(screen)
    return row[1] if row and len(row) > 1 else 0.0


def test_top_shows_each_model_live_in_a_terminal(server: ServerProcess) -> None:
    if shutil.which("tmux") is None:
        pytest.skip("tmux is not installed (make test installs it: apt-get install tmux)")
    session = f"top-{uuid.uuid4().hex[:8]}"
    # a terminal of its own size, whatever the environment the tests run in says
    subprocess.run(["tmux", "new-session", "-d", "-s", session, "-x", "160", "-y", "30",
                    "env", "-u", "COLUMNS", "-u", "LINES", "TERM=xterm-256color",
                    CLI, "top", server.metrics_url, "--interval", "0.5s", "--iterations",
                    "40"], check=True)
    try:
        with background_load(lambda: post_json(server.url, "/v2/models/synthetic/infer",
                                               BODY).status, threads=4) as statuses:
            # refreshed every 0.5 s: wait for a screen that shows the load
            wait_for(lambda: requests_per_s(pane(session)) > 0, "top to show the load",
                     timeout=60)
            screen = pane(session)
        assert set(statuses) == {200}
        assert "req/s" in screen and "p99 ms" in screen and "batch" in screen
        # the window between the last two scrapes: 0.5 s, or longer when one came late
        window = re.search(r"/metrics: last (\d+\.\d) s", screen)
        assert window is not None and float(window.group(1)) >= 0.5, screen
        row = model_row(screen)
        assert row is not None and row[0] == 1  # version 1
    finally:
        subprocess.run(["tmux", "kill-session", "-t", session], check=False)


def test_an_unreachable_server_is_one_line() -> None:
    run = CliRunner().invoke(main, ["top", "127.0.0.1:9", "--iterations", "1"])
    assert run.exit_code != 0 and "cannot read http://127.0.0.1:9/metrics" in run.output
    assert "Traceback" not in run.output


@pytest.fixture
def prometheus(server: ServerProcess, tmp_path: Path) -> Iterator[str]:
    """A real Prometheus on 127.0.0.1 scraping the server every second."""
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip("prometheus is not installed (make test installs it: apt-get install "
                    "prometheus)")
    target = server.metrics_url.removeprefix("http://").removesuffix("/metrics")
    config = tmp_path / "prometheus.yml"
    config.write_text("global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
                      "scrape_configs:\n  - job_name: tradeoff\n"
                      f"    static_configs: [{{targets: ['{target}']}}]\n")
    port = free_port()
    process = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: ready(url), "Prometheus to start", timeout=60)
        yield url
    finally:
        process.terminate()
        process.wait(30)


def ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


def test_top_reads_a_prometheus_that_scrapes_the_server(server: ServerProcess,
                                                        prometheus: str) -> None:
    def shown() -> str:
        run = CliRunner().invoke(main, ["top", "--prometheus-url", prometheus, "--window",
                                        "10s", "--iterations", "1"])
        assert run.exit_code == 0, run.output
        return run.output

    with background_load(lambda: post_json(server.url, "/v2/models/synthetic/infer",
                                           BODY).status, threads=4) as statuses:
        # scraped every second; rates need two samples in the window
        wait_for(lambda: requests_per_s(shown()) > 0, "Prometheus to see the load",
                 timeout=60)
        screen = shown()
    assert set(statuses) == {200}
    assert f"{prometheus} (Prometheus): rates over 10s" in screen
    row = model_row(screen)
    assert row is not None and row[0] == 1 and row[1] > 0
