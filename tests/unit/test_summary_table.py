"""Sweep and compare summaries as CSV and Markdown: one row per level or endpoint."""

from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from tradeoff.report.summary import render_summary, write_summary
from tradeoff.results import CompareResult, SweepResult, load_result

from .result_factory import bench_result, sweep_result

DATA = Path(__file__).resolve().parents[1] / "data" / "results"


def test_a_sweep_is_one_csv_row_per_level() -> None:
    sweep = sweep_result([bench_result(load=c, throughput=100.0 * c, p50=1.0 + c,
                                       p99=2.0 + c, errors=c - 1) for c in (1, 2, 4)])
    rows = list(csv.reader(io.StringIO(render_summary(sweep, markdown=False))))
    assert rows[0] == ["concurrency", "throughput_rps", "p50_ms", "p99_ms", "error_percent",
                       "requests"]
    assert [float(r[0]) for r in rows[1:]] == [1, 2, 4]
    assert [float(r[1]) for r in rows[1:]] == [100, 200, 400]
    assert [float(r[3]) for r in rows[1:]] == [3, 4, 6]
    assert float(rows[2][4]) == pytest.approx(100 * 1 / 10_000)


def test_fixtures_render_as_markdown_and_files(tmp_path: Path) -> None:
    for name in ("sweep.json", "compare.json"):
        result = load_result(DATA / name)
        assert isinstance(result, SweepResult | CompareResult)
        table = render_summary(result, markdown=True).splitlines()
        count = len(result.rows) if isinstance(result, SweepResult) else len(result.endpoints)
        assert len(table) == 2 + count and table[1].startswith("|---|---:")
        assert all(line.count("|") == table[0].count("|") for line in table)
        write_summary(result, tmp_path / "out.csv")
        assert len((tmp_path / "out.csv").read_text().splitlines()) == 1 + count
    with pytest.raises(ValueError, match=r"name a \.csv or a \.md file"):
        write_summary(result, tmp_path / "out.txt")
