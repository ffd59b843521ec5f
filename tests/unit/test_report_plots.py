"""What the report's plots draw where a reader was misled: a fast model and an LLM on
one linear axis, a CDF legend naming a model twice, a plan's axis of one core drawn from
0.96 to 1.04."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("matplotlib")

from tradeoff.report import plots
from tradeoff.report.html import _told_apart
from tradeoff.results import (
    Generation,
    OutputLength,
    OutputTokens,
    PlanCandidate,
    PlanResult,
    Prediction,
)

from .result_factory import bench_result


def _timed(p50_ms: float, rate: float, generation: bool = False):
    summary = bench_result(p50=p50_ms, p99=2 * p50_ms, throughput=rate).summary
    timeline = {"bin_s": 1.0, "throughput_rps": [rate] * 3, "p50_ms": [p50_ms] * 3,
                "p99_ms": [2 * p50_ms] * 3}
    made = Generation(None, None, None, 40.0, None, OutputTokens(64, None, 64, 0),
                      OutputLength(1, 1, 0, 0, True, True), None, None) if generation \
        else None
    return dataclasses.replace(summary, timeline=timeline, generation=made)


def test_runs_far_apart_share_log_axes_and_an_answers_latency_says_whole_answer() -> None:
    figure = plots.over_the_run([("mlp", _timed(0.65, 1500.0)),
                                 ("llm", _timed(5000.0, 1.2, generation=True))])
    top, bottom = figure.axes
    assert top.get_yscale() == "log" and bottom.get_yscale() == "log"
    legend = [t.get_text() for t in bottom.get_legend().get_texts()]
    assert "llm p50 (whole answer)" in legend and "mlp p50" in legend
    close = plots.over_the_run([("a", _timed(1.0, 100.0)), ("b", _timed(2.0, 150.0))])
    assert [a.get_yscale() for a in close.axes] == ["linear", "linear"]


def test_a_name_two_results_share_is_told_apart_by_their_loads() -> None:
    named = _told_apart([("mlp", bench_result(load=1)), ("mlp", bench_result(load=8)),
                         ("mlp_nobatch", bench_result(load=8))])
    assert [name for name, _ in named] == ["mlp at concurrency 1", "mlp at concurrency 8",
                                           "mlp_nobatch"]
    same = _told_apart([("m", bench_result(load=4)), ("m", bench_result(load=4))])
    assert [name for name, _ in same] == ["m at concurrency 4 (1 of 2)",
                                          "m at concurrency 4 (2 of 2)"]


def test_a_plan_of_one_core_draws_whole_cores() -> None:
    start = PlanCandidate("start", 1, "fp32", 0.0, {}, 0, 1, Prediction(2.0, 3.0, 1.0, 0.0,
                                                                       0.5), None, True, 0)
    chosen = dataclasses.replace(start, name="b4", predicted=Prediction(1.5, 2.5, 3.0, 0.0,
                                                                         0.5))
    result = PlanResult("mlp", "models", "out", {"sla_p99_ms": 5.0}, {"rate_rps": 100.0},
                        {}, {}, [], start, [start, chosen], "b4", [], [], "v", "done", 1.0)
    axes = plots.plan_front(result).axes[0]
    assert axes.get_xlim() == (0.5, 1.5)
    assert [t for t in axes.get_xticks() if 0.5 <= t <= 1.5] == [1.0]
