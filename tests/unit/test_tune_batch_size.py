"""The doubling search on a synthetic model whose throughput and memory curves are known.

Its batches are timed on a modelled clock: each takes exactly its set cost, so the
searches below come out the same however busy the machine is."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from tradeoff.backends.clock import ModelledClock
from tradeoff.cli import main
from tradeoff.results import BatchSizeTune, load_result
from tradeoff.tune.batch_size import (
    BatchSizePlan,
    back_off_from,
    estimated_max_batch,
    tune_batch_size,
)

from ..synthetic_model import write_synthetic_model

# 2 ms a batch plus 0.05 ms a row up to 32 rows, 0.2 ms a row past them: samples per
# second rise to 32 / 3.6 ms = 8,889 at batch 32, then fall (64 rows: 6,400/s), so the
# knee is 32 and the back-off 25. Each row holds 1 MB while the batch runs.
KNEE, RECOMMENDED = 32, 25


def test_the_search_finds_the_knee_backs_off_and_sizes_memory(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path, fixed_ms=2.0, per_row_ms=0.05, slow_above_rows=32,
                                  per_row_ms_above=0.2, memory_per_row_bytes=1_000_000,
                                  max_batch_size=8)
    result = tune_batch_size(model, BatchSizePlan(max_memory_bytes=100_000_000,
                                                  seconds_per_batch=0.03),
                             clock=ModelledClock())
    assert result.knee == KNEE and result.recommended == RECOMMENDED
    assert [p.batch_size for p in result.doubling] == [1, 2, 4, 8, 16, 32, 64, 128]
    assert result.point(32).samples_per_s == pytest.approx(32 / 3.6e-3)  # the modelled cost
    assert result.point(RECOMMENDED) is not None and result.point(RECOMMENDED).role == "back-off"
    assert not result.point(128).fits and "over --max-memory" in result.stop_reason
    memory = result.memory
    assert memory.per_sample_bytes == pytest.approx(1_000_000, rel=0.1)
    assert memory.largest_fit == 64
    # the formula on the measured slope (within 10% of 1 MB: 90 to 111 rows fit 100 MB)
    assert memory.estimated_max_batch == math.floor(100_000_000 / memory.per_sample_bytes)
    assert "20% below batch 32" in result.why


def test_a_curve_that_never_drops_stops_at_max_batch_and_probes_memory(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path, fixed_ms=5.0, per_row_ms=0.01,
                                  memory_per_row_bytes=200_000)
    result = tune_batch_size(model, BatchSizePlan(max_batch=16, seconds_per_batch=0.03,
                                                  max_memory_bytes=1_000_000_000),
                             clock=ModelledClock())
    assert result.knee is None and result.recommended == back_off_from(16, 0.2) == 12
    assert result.stop_reason == "--max-batch 16 reached"
    assert result.memory.largest_fit == 16  # nothing past --max-batch is tried


def test_max_latency_stops_the_doubling(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path, fixed_ms=1.0, per_row_ms=1.0)
    result = tune_batch_size(model, BatchSizePlan(max_latency_ms=13, seconds_per_batch=0.03),
                             clock=ModelledClock())
    assert result.stop_reason.startswith("batch 16 took")
    assert result.recommended == back_off_from(8, 0.2) == 6


def test_the_formula() -> None:
    assert estimated_max_batch(4_000, 1_000, 100.0) == 30
    assert estimated_max_batch(None, 1_000, 100.0) is None
    assert estimated_max_batch(4_000, 1_000, None) is None


def test_the_command_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=2.0, per_row_ms=0.05,
                                  slow_above_rows=32, per_row_ms_above=0.2)
    out = tmp_path / "tune.json"
    run = CliRunner().invoke(main, ["tune", "batch-size", str(model), "--seconds", "0.05",
                                    "--max-memory", "1GB", "--json", str(out)])
    assert run.exit_code == 0, run.output
    assert "formula" in run.output
    assert "what this optimises: the model's own throughput" in run.output
    document = load_result(out)
    assert isinstance(document, BatchSizeTune)
    # timed on the real clock: which batch wins moves with the machine's load, so the
    # exact knee is the modelled-clock tests' to check; here the table and file agree
    assert f"recommended batch size: {document.recommended}" in run.output
    assert json.loads(out.read_text())["schema"] == "tradeoff.tune/1"
    assert document.to_dict() == json.loads(out.read_text())


@pytest.mark.parametrize(("args", "says"), [
    (["{missing}"], "not a model directory"),
    (["{repo}"], "is a model repository, not a model: give REPOSITORY/MODEL"),
    (["{nobatch}"], "does not batch"),
    (["{model}", "--max-memory", "lots"], "--max-memory='lots'"),
])
def test_user_mistakes_are_one_line(tmp_path: Path, args: list[str], says: str) -> None:
    model = write_synthetic_model(tmp_path, "model")
    nobatch = write_synthetic_model(tmp_path, "nobatch", max_batch_size=0)
    values = {"missing": str(tmp_path / "nope"), "nobatch": str(nobatch), "model": str(model),
              "repo": str(tmp_path)}
    run = CliRunner().invoke(main, ["tune", "batch-size", *[a.format(**values) for a in args]])
    assert run.exit_code != 0 and says in run.output and "Traceback" not in run.output
