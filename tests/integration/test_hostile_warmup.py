"""Warmups asked for over the network: bounded in runs and bytes, held to a deadline,
and cancelled by unload and by shutdown (a load that warms up for ever used to keep the
model's unload, and the process after SIGTERM, waiting with it)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.synthetic_model import write_synthetic_model
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, post_json, request, running_server

pytestmark = pytest.mark.integration

ROW = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0, 2.0, 3.0, 4.0]}]


def slow_warmup(count: int, dims: list[int] | None = None) -> dict[str, Any]:
    """A config for the synthetic model (50 ms a batch) warming up ``count`` times."""
    return {"backend": "synthetic", "max_batch_size": 8,
            "model_warmup": [{"name": "slow", "batch_size": 1, "count": count,
                              "inputs": {"INPUT0": {"data_type": "TYPE_FP32",
                                                    "dims": dims or [4],
                                                    "zero_data": True}}}]}


@pytest.fixture()
def repo(tmp_path: Path) -> Path:
    write_synthetic_model(tmp_path, "slow", fixed_ms=50.0, max_batch_size=8)
    write_synthetic_model(tmp_path, "other", fixed_ms=0.1, max_batch_size=8)
    return tmp_path


@pytest.fixture()
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo)


def load(server: ServerProcess, model: str, config: dict[str, Any]) -> tuple[int, str]:
    response = post_json(server.url, f"/v2/repository/models/{model}/load",
                         {"parameters": {"config": json.dumps(config)}})
    return response.status, response.json().get("error", "") if response.body else ""


def load_in_background(server: ServerProcess, model: str, config: dict[str, Any]
                       ) -> tuple[threading.Thread, list[tuple[int, str]]]:
    answers: list[tuple[int, str]] = []
    thread = threading.Thread(target=lambda: answers.append(load(server, model, config)))
    thread.start()
    time.sleep(1.0)  # well into its warmup
    return thread, answers


def index(server: ServerProcess) -> dict[str, dict]:
    response = post_json(server.url, "/v2/repository/index", {})
    return {m["name"]: m for m in response.json()}


def test_warmup_runs_and_sizes_from_the_network_are_bounded(server: ServerProcess) -> None:
    started = time.monotonic()
    status, error = load(server, "slow", slow_warmup(4_000_000_000))
    assert status == 400 and "model_warmup.count" in error and "at most 1000" in error
    status, error = load(server, "slow", slow_warmup(1, dims=[100_000_000]))
    assert status == 400 and "64 MiB" in error, error
    assert time.monotonic() - started < 10
    assert infer_json(server.url, "slow", ROW).status == 200  # the version loaded before
    assert infer_json(server.url, "other", ROW).status == 200


def test_unload_cancels_a_load_that_is_warming_up(server: ServerProcess) -> None:
    thread, answers = load_in_background(server, "slow", slow_warmup(1000))  # 50 s
    started = time.monotonic()
    response = post_json(server.url, "/v2/repository/models/slow/unload", {})
    assert response.status == 200
    thread.join(15)
    assert time.monotonic() - started < 10
    assert answers and answers[0][0] == 400 and "load cancelled" in answers[0][1], answers
    assert index(server)["slow"]["state"] == "UNAVAILABLE"
    assert infer_json(server.url, "other", ROW).status == 200
    # the model loads again afterwards, with the operator's own config
    assert post_json(server.url, "/v2/repository/models/slow/load", {}).status == 200
    assert infer_json(server.url, "slow", ROW).status == 200


def test_sigterm_during_a_long_warmup_exits_promptly(repo: Path) -> None:
    process = ServerProcess(repo).start()
    try:
        thread, answers = load_in_background(process, "slow", slow_warmup(1000))
        started = time.monotonic()
        code = process.stop(timeout=20)
        assert code == 0 and time.monotonic() - started < 15
        thread.join(5)
        assert answers and answers[0][0] in (400, 503), answers  # answered, not dropped
    finally:
        if process.process is not None and process.process.poll() is None:
            process.process.kill()
        process.close_log()


def test_a_warmup_past_its_deadline_fails_the_load(repo: Path) -> None:
    server_gen = running_server(repo, extra_args=("--warmup-timeout", "1s"))
    server = next(server_gen)
    try:
        started = time.monotonic()
        status, error = load(server, "slow", slow_warmup(1000))
        assert status == 400 and "warmup deadline" in error and "--warmup-timeout" in error
        assert time.monotonic() - started < 10
        assert infer_json(server.url, "slow", ROW).status == 200  # still the old version
        assert request(server.url, "GET", "/v2/health/ready").status == 200
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)
