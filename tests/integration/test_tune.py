"""tradeoff tune serve on a live server, and the adaptive batcher on a live server."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.results import ServeTune, load_result
from tradeoff.server.process import ServerProcess
from tradeoff.tune.serve_search import MAX_HEADROOM, MIN_HEADROOM

from ..synthetic_model import write_synthetic_model
from .helpers import (
    background_load,
    model_metric,
    post_json,
    request,
    running_server,
    wait_for,
)

ADAPTIVE = 'dynamic_batching { }\nparameters { key: "target_p99_ms" value: ' \
           '{ string_value: "25" } }'


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tune-models")
    write_synthetic_model(root, "synthetic", fixed_ms=1.0, per_row_ms=0.1, max_batch_size=8,
                          extra="dynamic_batching { }")
    write_synthetic_model(root, "adaptive", fixed_ms=1.0, per_row_ms=0.1, max_batch_size=32,
                          extra=ADAPTIVE)
    write_synthetic_model(root, "nobatch", max_batch_size=0)
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    yield from running_server(repository, extra_args=("--max-instances", "1"))


def config(server: ServerProcess, model: str = "synthetic") -> dict:
    return request(server.url, "GET", f"/v2/models/{model}/config").json()


def tune(server: ServerProcess, tmp_path: Path, *args: str) -> ServeTune:
    out = tmp_path / "tune.json"
    # an SLA every candidate meets even on a busy machine (at load 5, one in three missed
    # 50 ms): these tests are of the search's bookkeeping, not of the machine's speed
    run = CliRunner().invoke(main, [
        "tune", "serve", server.url, "--model", "synthetic", "--sla-p99-ms", "1000",
        "--rate", "100", "--duration", "0.6s", "--warmup", "0.2s", "--delays-us", "0",
        "--threads", "1", "--output", str(tmp_path / "out"), "--json", str(out), *args])
    assert run.exit_code == 0, run.output
    document = load_result(out)
    assert isinstance(document, ServeTune)
    return document


def test_a_refused_candidate_is_skipped_with_the_reason_and_the_winner_is_written(
        server: ServerProcess, tmp_path: Path) -> None:
    before = config(server)
    result = tune(server, tmp_path, "--max-batch-sizes", "1,8", "--instances", "1,2",
                  "--strategy", "grid")
    refused = [t for t in result.trials if t.status == "refused"]
    assert refused and all(t.knobs["instances"] == 2 for t in refused)
    assert all("--max-instances" in (t.reason or "") and "HTTP 400" in (t.reason or "")
               for t in refused)
    measured = [t for t in result.trials if t.status == "measured"]
    assert len(measured) == 3 and result.winner in {t.name for t in measured}
    assert result.stop_reason.startswith("every configuration of the grid tried; the 3 best")
    assert sum(len(t.measurements) == 2 for t in measured) == 3  # measured again
    assert any(t.pareto for t in measured)
    # the server has its own config back
    assert config(server) == before
    written = Path(result.written or "")
    assert written.name == "config.pbtxt" and (written.parent / "original.pbtxt").is_file()


def test_the_written_config_loads_and_the_original_is_kept(server: ServerProcess,
                                                           repository: Path,
                                                           tmp_path: Path) -> None:
    model_dir = repository / "synthetic"
    original_text = (model_dir / "config.pbtxt").read_text()
    try:
        result = tune(server, tmp_path, "--max-batch-sizes", "4", "--instances", "1",
                      "--apply-to", str(model_dir))
        assert result.written == str(model_dir / "config.pbtxt")
        assert (model_dir / "config.pbtxt.orig").read_text() == original_text
        assert post_json(server.url, "/v2/repository/models/synthetic/load", {}).status == 200
        loaded = config(server)
        winner = result.trial(result.winner)
        assert winner is not None and loaded["max_batch_size"] == winner.knobs["max_batch_size"]
        answer = post_json(server.url, "/v2/models/synthetic/infer", {"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]})
        assert answer.status == 200 and answer.json()["outputs"][0]["data"] == [1, 2, 3, 4]
    finally:
        (model_dir / "config.pbtxt").write_text(original_text)
        (model_dir / "config.pbtxt.orig").unlink(missing_ok=True)
        post_json(server.url, "/v2/repository/models/synthetic/load", {})


def test_the_budget_stops_the_search(server: ServerProcess, tmp_path: Path) -> None:
    result = tune(server, tmp_path, "--max-batch-sizes", "1,2,4,8", "--instances", "1",
                  "--strategy", "grid", "--budget", "1s", "--preferred", "off")
    assert result.stop_reason == "budget of 1 s spent"  # and nothing left to measure again
    assert 1 <= len(result.trials) < result.grid_size == 4


@pytest.mark.timing  # the cap follows batch times measured on the real clock: beside the
# parallel tests they ran slow and the rule gave 23, not the model's 32
def test_the_adaptive_batcher_reports_its_delay_and_cap(server: ServerProcess) -> None:
    def gauge(name: str) -> float:
        return model_metric(server, name, "adaptive")

    assert gauge("tradeoff_batcher_batch_cap") == 32
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                        "data": np.arange(4).tolist()}]}
    with background_load(lambda: post_json(server.url, "/v2/models/adaptive/infer",
                                           body).status, threads=8) as statuses:
        wait_for(lambda: len(statuses) >= 300, "300 answers")
    assert set(statuses) == {200}
    cap = gauge("tradeoff_batcher_batch_cap")
    delay = gauge("tradeoff_batcher_queue_delay_us")
    # 2 * (1 ms + 0.1 ms * cap) <= 0.8 * 25 ms: the cap the rule gives is 32 (the model's)
    assert cap == 32 and 0 <= delay <= 25_000
    stats = request(server.url, "GET", "/v2/models/adaptive/stats").json()["model_stats"][0]
    assert stats["inference_count"] >= 300 > stats["execution_count"]  # it batched


@pytest.mark.parametrize(("change", "says"), [
    ({"instance_group": [{"kind": "KIND_CPU", "count": 1000}]},
     "asks for 1000 instances; this server allows at most 1"),
    ({"parameters": {"intra_op_thread_count": {"string_value": "100000"}}},
     "asks for 100000 threads per instance"),
])
def test_a_load_asking_for_too_many_instances_or_threads_is_refused(
        server: ServerProcess, change: dict, says: str) -> None:
    before = config(server)
    answer = post_json(server.url, "/v2/repository/models/synthetic/load",
                       {"parameters": {"config": json.dumps({**before, **change})}})
    assert answer.status == 400 and says in answer.json()["error"]
    assert config(server) == before  # the version serving stays
    assert post_json(server.url, "/v2/models/synthetic/infer", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
         "data": [1, 2, 3, 4]}]}).status == 200


@pytest.mark.parametrize(("args", "says"), [
    (["--model", "nobatch", "--rate", "10"], "does not batch (max_batch_size 0)"),
    (["--model", "synthetic", "--rate", "10", "--protocol", "v2-grpc"], "--protocol v2"),
    (["--model", "synthetic"], "give one of --rate R or --max-throughput"),
    (["--model", "synthetic", "--rate", "10", "--instances", "0"], "whole numbers >= 1"),
])
def test_tune_serve_mistakes_are_one_line(server: ServerProcess, args: list[str],
                                          says: str) -> None:
    run = CliRunner().invoke(main, ["tune", "serve", server.url, "--sla-p99-ms", "20", *args])
    assert run.exit_code != 0 and says in run.output and "Traceback" not in run.output


@pytest.mark.slow
def test_the_recommended_rate_keeps_headroom_and_is_replayed(server: ServerProcess,
                                                             tmp_path: Path) -> None:
    """--max-throughput: the rate recommended is the winner's lowest measured rate less
    the spread between its measurements, and the winner is replayed there before the
    server gets its own config back."""
    before = config(server)
    out = tmp_path / "tune.json"
    run = CliRunner().invoke(main, [
        "tune", "serve", server.url, "--model", "synthetic", "--sla-p99-ms", "1000",
        "--max-throughput", "--duration", "0.4s", "--warmup", "0.1s", "--delays-us", "0",
        "--threads", "1", "--instances", "1", "--max-batch-sizes", "4,8",
        "--preferred", "off", "--budget", "3m", "--output", str(tmp_path / "out"),
        "--json", str(out)])
    assert run.exit_code == 0, run.output
    result = load_result(out)
    assert isinstance(result, ServeTune)
    winner = result.trial(result.winner)
    r = result.recommended
    assert winner is not None and r is not None, run.output
    rates = [m["throughput_rps"] for m in winner.measurements]
    assert r.measurements == len(rates) >= 2 and r.spread is not None
    assert MIN_HEADROOM <= r.headroom <= MAX_HEADROOM
    assert r.rate_rps == pytest.approx(min(rates) * (1 - r.headroom), rel=1e-6) or \
        r.rate_rps < min(rates) * (1 - r.headroom)  # lowered once after a missed replay
    assert r.holds is True and r.replay_p99_ms is not None and r.replay_p99_ms <= 1000
    assert "recommended rate" in " ".join(run.output.split())
    assert config(server) == before
