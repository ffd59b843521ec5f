"""Knee detection, sweep levels, cost and score, trend tests, soak verdicts, bootstrap
intervals and endpoint profiles: the arithmetic behind sweep, soak and compare."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from tradeoff.analysis.compare import merge_rounds
from tradeoff.analysis.profile import UNKNOWN, build_profile, parse_fact
from tradeoff.bench.soak import verdict
from tradeoff.bench.sweep import knee_of, parse_levels
from tradeoff.results import BenchResult, Window
from tradeoff.stats.bootstrap import bootstrap_ratio
from tradeoff.stats.cost import Price, parse_prices, rank
from tradeoff.stats.knee import find_knee, gain_per_doubling
from tradeoff.stats.trend import mann_kendall

from .result_factory import bench_result, sweep_result

# ------------------------------------------------------------------------- knee

def test_gain_per_doubling_scales_any_step_to_one_doubling() -> None:
    assert gain_per_doubling(1, 100, 2, 150) == pytest.approx(0.5)
    assert gain_per_doubling(1, 100, 4, 150) == pytest.approx(math.sqrt(1.5) - 1)
    assert gain_per_doubling(100, 100, 125, 125) == pytest.approx(1.0)  # proportional


def test_knee_is_where_every_later_point_is_flat() -> None:
    loads = [1, 2, 4, 8, 16, 32]
    assert find_knee(loads, [100, 190, 360, 600, 610, 605]) == 3
    assert find_knee(loads, [100, 200, 400, 800, 1600, 3200]) is None


def test_a_noisy_dip_is_not_the_knee() -> None:
    # 8 -> 16 dips, but 32 is far above 8: the curve is still rising at 8
    assert find_knee([1, 2, 4, 8, 16, 32, 64], [100, 190, 360, 600, 580, 900, 905]) == 5


def test_a_point_that_served_nothing_is_never_the_knee() -> None:
    assert find_knee([1, 2, 4, 8], [0, 0, 300, 305]) == 2
    assert find_knee([1, 2, 4], [0, 0, 0]) is None


def test_a_curve_flat_from_the_start_has_its_knee_at_the_first_point() -> None:
    assert find_knee([1, 2, 4, 8], [200, 201, 199, 200]) == 0


@pytest.mark.parametrize(("text", "integer", "levels"), [
    ("1:16", True, [1, 2, 4, 8, 16]),
    ("1:20", True, [1, 2, 4, 8, 16]),
    ("4:16:4", True, [4, 8, 12, 16]),
    ("1,3,9", True, [1, 3, 9]),
    ("100:400", False, [100.0, 200.0, 400.0]),
    ("50.5,75", False, [50.5, 75.0]),
])
def test_levels(text: str, integer: bool, levels: list[float]) -> None:
    assert parse_levels(text, integer) == levels


@pytest.mark.parametrize("text", ["", "0:8", "8:1", "1:8:0", "a:b", "4,2", "1:2:3:4", "-1,2"])
def test_bad_levels_say_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match="START:END"):
        parse_levels(text, integer=True)


# ------------------------------------------------------------------------- cost

def test_cost_per_million_requests() -> None:
    assert Price(per_hour=3.6).per_million(1000) == pytest.approx(1.0)
    assert Price(per_1k_requests=0.002).per_million(5) == pytest.approx(2.0)
    assert Price(per_hour=1.0).per_million(0) is None
    with pytest.raises(ValueError):
        Price(per_hour=1.0, per_1k_requests=1.0)
    with pytest.raises(ValueError):
        Price()


def candidate(name: str, throughput: float, p99: float, price: float | None,
              errors: float = 0.0) -> dict:
    return {"name": name, "throughput_rps": throughput, "p99_ms": p99,
            "error_percent": errors, "price": Price(per_hour=price) if price else None}


def test_score_weighs_throughput_per_cost_against_latency() -> None:
    cheap_slow = candidate("cheap", 1000, 50, 1.0)    # 1000 req/s per $/h, p99 50
    dear_fast = candidate("dear", 4000, 10, 8.0)      # 500 req/s per $/h, p99 10
    by_value = rank([cheap_slow, dear_fast], alpha=1.0)
    assert [c["name"] for c in by_value] == ["cheap", "dear"]
    assert by_value[0]["score"] == pytest.approx(1.0)
    assert by_value[1]["score"] == pytest.approx(0.5)
    by_speed = rank([cheap_slow, dear_fast], alpha=0.0)
    assert [c["name"] for c in by_speed] == ["dear", "cheap"]
    assert by_speed[1]["score"] == pytest.approx(0.2)
    balanced = rank([cheap_slow, dear_fast], alpha=0.5)
    assert balanced[0]["name"] == "dear"  # 0.5*0.5 + 0.5*1 = 0.75 vs 0.5*1 + 0.5*0.2 = 0.6
    assert balanced[0]["score"] == pytest.approx(0.75)


def test_only_candidates_meeting_the_sla_rank() -> None:
    ranked = rank([candidate("fast", 100, 5, 1.0), candidate("slow", 1000, 30, 1.0),
                   candidate("failing", 2000, 4, 1.0, errors=5.0)],
                  sla_p99_ms=10, max_error_percent=1.0)
    by_name = {c["name"]: c for c in ranked}
    assert by_name["fast"]["rank"] == 1
    assert by_name["slow"]["rank"] is None and "p99" in by_name["slow"]["sla_misses"][0]
    assert by_name["failing"]["rank"] is None
    assert ranked[0]["name"] == "fast"


def test_without_prices_the_score_uses_throughput() -> None:
    ranked = rank([candidate("a", 100, 5, None), candidate("b", 200, 5, None)], alpha=1.0)
    assert ranked[0]["name"] == "b" and ranked[0]["cost_per_million"] is None
    assert ranked[0]["score_basis"] == "throughput (no prices)"


def test_prices_per_endpoint_and_for_all() -> None:
    prices = parse_prices(["a=2.5", "0.9"], ["b=0.01"], ["a", "b", "c"])
    assert prices == {"a": Price(per_hour=2.5), "b": Price(per_hour=0.9),
                      "c": Price(per_hour=0.9)}  # a price per hour wins
    assert parse_prices([], ["0.01"], ["a"]) == {"a": Price(per_1k_requests=0.01)}
    assert parse_prices([], [], ["a"]) == {}
    with pytest.raises(ValueError, match=r"--price-per-hour 'a=x': use NAME=NUMBER or NUMBER"):
        parse_prices(["a=x"], [], ["a"])
    with pytest.raises(ValueError, match="prices name unknown endpoints: z"):
        parse_prices([], ["z=1"], ["a"])


# ------------------------------------------------------------------------ trend

def test_mann_kendall_finds_a_rising_series_and_its_slope() -> None:
    t = np.arange(20, dtype=float)
    trend = mann_kendall(t, 100 + 2 * t)
    assert trend.direction == "up" and trend.p_value < 0.001
    assert trend.slope_per_s == pytest.approx(2.0)


def test_mann_kendall_sorts_by_time() -> None:
    t = np.arange(10.0)
    shuffled = np.random.default_rng(5).permutation(10)
    trend = mann_kendall(t[shuffled], (3 * t)[shuffled])
    assert trend.direction == "up" and trend.slope_per_s == pytest.approx(3.0)


def test_four_points_can_never_be_significant_six_can() -> None:
    assert mann_kendall(np.arange(4.0), np.arange(4.0)).direction == "none"
    assert mann_kendall(np.arange(6.0), np.arange(6.0)).direction == "up"


def test_mann_kendall_sees_no_trend_in_noise() -> None:
    rng = np.random.default_rng(3)
    trend = mann_kendall(np.arange(30.0), rng.normal(100, 5, 30))
    assert trend.direction == "none" and trend.p_value > 0.05


def test_mann_kendall_is_not_thrown_by_one_outlier() -> None:
    values = np.full(12, 10.0) + np.arange(12) * 0.0
    values[5] = 1000.0
    assert mann_kendall(np.arange(12.0), values).direction == "none"


def soak_windows(p99: list[float], errors: list[int] | None = None) -> list[Window]:
    errors = errors or [0] * len(p99)
    return [Window(index=i, duration_s=60.0, completed=1000, errors=e, throughput_rps=100.0,
                   p50_ms=5.0, p99_ms=v) for i, (v, e) in enumerate(zip(p99, errors, strict=True))]


def test_soak_verdict_stable() -> None:
    rng = np.random.default_rng(0)
    memory = [(float(t), 200e6 + rng.normal(0, 1e5)) for t in range(60)]
    result = verdict(soak_windows(list(rng.normal(10, 0.3, 8))), memory)
    assert result.stable, result.reasons


def test_soak_verdict_drift() -> None:
    result = verdict(soak_windows([10, 11, 12, 13, 14, 15, 16, 17]), [])
    assert not result.stable
    assert result.reasons[0]["kind"] == "drift" and "p99" in result.reasons[0]["text"]


def test_a_sub_millisecond_p99_rising_is_not_drift() -> None:
    # +60% of a 1.5 ms p99 is 0.9 ms over the run: the timer and the scheduler's noise
    result = verdict(soak_windows([1.5, 1.6, 1.7, 1.9, 2.0, 2.2, 2.3, 2.4]), [])
    assert result.stable, result.reasons
    assert result.trends["p99"]["direction"] == "up"


def test_soak_verdict_error_burst() -> None:
    result = verdict(soak_windows([10.0] * 6, errors=[0, 0, 0, 80, 0, 0]), [])
    assert [r["kind"] for r in result.reasons] == ["error_burst"]
    assert result.reasons[0]["evidence"]["windows"] == [3]


def test_soak_verdict_memory_growth() -> None:
    memory = [(float(t), 200e6 + t * 1e6) for t in range(60)]  # +59 MB in a minute
    result = verdict(soak_windows([10.0] * 6), memory)
    assert [r["kind"] for r in result.reasons] == ["memory_growth"]
    assert result.trends["memory"]["growth_mib"] == pytest.approx(59e6 / 2**20, rel=0.01)


def test_soak_with_too_few_windows_says_so() -> None:
    result = verdict(soak_windows([10, 30]), [])
    assert result.stable and "too few" in result.notes[0]


# -------------------------------------------------------------------- bootstrap

def test_bootstrap_interval_holds_the_true_ratio() -> None:
    rng = np.random.default_rng(1)
    a = rng.exponential(10.0, 5000)
    b = rng.exponential(20.0, 5000)
    low, high = bootstrap_ratio(a, b, np.mean)
    assert low < 2.0 < high and high - low < 0.3
    p99 = bootstrap_ratio(a, b, lambda x, axis: np.percentile(x, 99, axis=axis))
    assert p99 is not None and p99[0] < 2.0 < p99[1]


def test_bootstrap_needs_samples() -> None:
    assert bootstrap_ratio(np.array([1.0]), np.array([1.0, 2.0]), np.mean) is None


def test_merged_rounds_pool_counts_and_time() -> None:
    rounds = [bench_result(throughput=100.0, requests=500),
              bench_result(throughput=300.0, requests=1500)]
    merged = merge_rounds(rounds, {"latency": np.array([1.0, 2.0, 3.0])})
    s = merged.summary
    assert s.requests == 2000 and s.duration_s == 10.0
    assert s.throughput_rps == pytest.approx(200.0)
    assert s.latency("p50") == 2.0
    assert merged.merged_rounds == 2
    assert [w.round for w in merged.windows] == [0, 1]


# ---------------------------------------------------------------------- profile

def test_profile_reads_config_and_leaves_the_rest_unknown() -> None:
    config = {"platform": "onnxruntime_onnx", "max_batch_size": 8,
              "dynamic_batching": {"max_queue_delay_microseconds": 100,
                                   "preferred_batch_size": [4, 8]},
              "instance_group": [{"kind": "KIND_CPU", "count": 2}]}
    metadata = {"platform": "onnxruntime_onnx",
                "inputs": [{"name": "x", "datatype": "FP16", "shape": [-1, 4]}],
                "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 2]}]}
    found = build_profile(metadata, config, {"name": "triton", "version": "2.50"})
    checklist = found["checklist"]
    assert checklist["format"] == "onnxruntime_onnx"
    assert checklist["precision"] == "in FP16; out FP32"
    assert checklist["server"] == "triton 2.50"
    assert checklist["batching"].startswith("dynamic, max_batch_size 8, max_queue_delay 100")
    assert checklist["instances"] == "2 x cpu"
    bare = build_profile({}, {}, {})
    assert set(bare["checklist"].values()) == {UNKNOWN}


def test_user_facts_win_and_extra_facts_are_kept() -> None:
    found = build_profile({}, {"instance_group": [{"kind": "KIND_GPU", "count": 1}]}, {},
                          {"hardware": "H100 SXM", "region": "eu-west"})
    assert found["checklist"]["hardware"] == "H100 SXM"
    assert found["sources"]["hardware"] == "user"
    assert found["facts"] == {"region": "eu-west"}
    assert parse_fact("a:hardware=H100") == ("a", "hardware", "H100")
    with pytest.raises(ValueError, match="NAME:key=value"):
        parse_fact("hardware=H100")


def test_report_draws_a_sweep_with_a_point_that_served_nothing(tmp_path) -> None:
    from tradeoff.report.html import build_report

    from .result_factory import sweep_result

    failed = bench_result(load=8, throughput=0.0, errors=10_000)
    failed = dataclasses.replace(failed, summary=dataclasses.replace(failed.summary,
                                                                     latency_ms=None))
    sweep = sweep_result([bench_result(load=1, throughput=500.0),
                          bench_result(load=2, throughput=900.0),
                          bench_result(load=4, throughput=910.0), failed])
    page, report = build_report([sweep], tmp_path / "png")
    assert page.count('<figure class="plot"') == 4 and len(report.pngs) == 4
    assert "knee: concurrency 2" in page


def test_a_plan_that_missed_or_mispredicted_is_a_finding() -> None:
    """diagnose on a plan result: its replay's miss and a prediction the replay is far
    from are findings (they used to read 'no findings'); a plan proven as predicted has
    none."""
    from tradeoff.analysis.diagnose import diagnose
    from tradeoff.results import PlanCandidate, PlanResult, Prediction, Replayed

    def predicted(p99: float) -> Prediction:
        return Prediction(p99 / 2, p99, 1.0, 0.0, 0.5)

    def plan(replayed_p99: float, predicted_p99: float, met: bool,
             proof: bool = True) -> PlanResult:
        start = PlanCandidate("start", 1, "fp32", 0.0, {}, 0, 1, predicted(3.0), None,
                              False, 0)
        shown = [Replayed("start", "baseline", 2.0, 9.0, 100.0, 0.0, None, None,
                          predicted(3.0), False, None),
                 Replayed("chosen", "plan", 1.0, replayed_p99, 100.0, 0.0, None, None,
                          predicted(predicted_p99), met, None)]
        return PlanResult("mlp", "models", "out", {"sla_p99_ms": 5.0}, {}, {}, {}, [],
                          start, [start], "chosen", [], shown if proof else [],
                          "the plan ...", "done", 1.0)

    assert diagnose(plan(2.4, 2.9, met=True)) == []
    missed = diagnose(plan(7.0, 2.9, met=False))
    assert [f.rule for f in missed] == ["plan_missed_sla", "plan_prediction_off"]
    assert missed[0].severity == "critical" and "2.4x the predicted" in missed[1].title
    assert [f.rule for f in diagnose(plan(1.0, 1.0, met=True, proof=False))] == [
        "plan_not_replayed"]


def test_a_replay_outside_the_range_its_calibration_supports_says_by_how_much() -> None:
    """With a range, a prediction is off only where every replay round lies outside it,
    and the finding says by how many milliseconds; the calibration's windows give the
    range (the prediction always inside)."""
    from tradeoff.analysis.diagnose import diagnose_plan
    from tradeoff.plan.search import Calibration, supported_range
    from tradeoff.results import PlanCandidate, PlanResult, Prediction, Replayed

    calibration = Calibration(0.1, 0.2, 0.5, 100.0, wire_p99_range_ms=(0.3, 1.2))
    assert calibration.p99_range(2.0) == [2.3, 3.2]
    assert supported_range(2.0, 0.5, None) is None
    assert supported_range(2.0, 2.0, (0.3, 1.2)) == [2.3, 4.0]  # the prediction inside

    def finding(rounds: list[float], tpot: float | None = None) -> list[str]:
        predicted = Prediction(1.0, 2.5, 1.0, 0.0, 0.5, p99_range_ms=[2.3, 3.2])
        start = PlanCandidate("start", 1, "fp32", 0.0, {}, 0, 1, predicted, None, True, 0)
        proof = [Replayed("start", "baseline", 1.0, 3.0, 100.0, 0.0, None, None, predicted,
                          True, None, p99_rounds_ms=[2.9, 3.1]),
                 Replayed("chosen", "plan", 1.0, max(rounds), 100.0, 0.0, None, None,
                          predicted, True, None, p99_rounds_ms=list(rounds),
                          tpot_p99_ms=tpot)]
        result = PlanResult("m", "models", "out", {"sla_p99_ms": 50.0}, {}, {}, {}, [],
                            start, [start], "chosen", [], proof, "...", "done", 1.0)
        return [f.title for f in diagnose_plan(result) if f.rule == "plan_prediction_off"]

    assert finding([2.0, 4.0]) == []  # a round inside: not off
    assert finding([6.9, 7.3]) == ["the replayed p99 (rounds 6.90-7.30 ms) is 3.70 ms above "
                                   "the range its calibration supports (2.30-3.20 ms)"]
    assert finding([1.1, 1.3]) == ["the replayed p99 (rounds 1.10-1.30 ms) is 1.00 ms below "
                                   "the range its calibration supports (2.30-3.20 ms)"]
    assert finding([6.9, 7.3], tpot=40.0)[0].startswith(  # a generation's first token
        "the replayed TTFT p99 (rounds 6.90-7.30 ms) is 3.70 ms above")


def test_a_rate_sweep_whose_rates_are_not_served_is_saturated() -> None:
    """Over rates, a level served under 90% of what it sent is saturation, though its
    throughput still creeps up (the profile case: 65-72% served, p50 at 1 s): the knee is
    the last rate served in full, and from the first one the terminal says so."""
    from rich.console import Console

    from tradeoff.bench.sweep import SATURATION_RULE, first_unserved
    from tradeoff.report.terminal import print_sweep

    def level(rate: float, served: float) -> BenchResult:
        return bench_result(load=rate, mode="open", throughput=served, achieved=rate,
                            requests=int(rate * 5))

    creeping = [level(100, 100), level(200, 199), level(400, 280), level(800, 560)]
    knee = knee_of(creeping)
    assert knee is not None and knee.load == 200 and knee.rule == SATURATION_RULE
    assert first_unserved(creeping) is not None
    served = [level(100, 100), level(200, 200), level(400, 398)]
    assert first_unserved(served) is None and knee_of(served) is None  # still growing
    few = [level(5, 3), level(10, 10)]  # 25 requests: too few to judge
    assert first_unserved(few) is None
    console = Console(record=True, width=120)
    print_sweep(sweep_result([level(400, 280), level(800, 560)], mode="rate"), console)
    assert "saturated from the first level" in console.export_text()
    closed = [bench_result(load=c, throughput=t) for c, t in ((1, 10), (2, 20), (4, 40))]
    assert first_unserved(closed) is None


def test_a_sweep_says_which_points_the_load_generator_held_back() -> None:
    from rich.console import Console

    from tradeoff.report.terminal import print_sweep

    points = [bench_result(load=c, throughput=t, client_bound=c == 64)
              for c, t in ((16, 100), (32, 190), (64, 200))]
    console = Console(record=True, width=140)
    print_sweep(sweep_result(points), console)
    text = console.export_text()
    assert "client-bound" in text and "client_bound at concurrency 64" in text
    assert "client CPU 99% > 90%" in text
    quiet = Console(record=True, width=140)
    print_sweep(sweep_result([bench_result(load=1), bench_result(load=2)]), quiet)
    assert "client" not in quiet.export_text()


def test_tables_wrap_their_cells_in_a_narrow_terminal_or_a_file() -> None:
    """On a narrow terminal, or output to a file, a cell goes on over lines; it never
    ends in an ellipsis (the plan's table showed `8…` and `(…`)."""
    import io

    from rich.console import Console

    from tradeoff.report.terminal import print_sweep

    points = [bench_result(load=c, throughput=t * 1000.0, p50=1234.5678, p99=98765.4321)
              for c, t in ((16, 1), (32, 2), (64, 3))]
    out = io.StringIO()
    print_sweep(sweep_result(points), Console(file=out, width=40))
    text = out.getvalue()
    assert "…" not in text and "987" in text and "65." in text  # folded, every digit kept


def test_the_plan_command_says_when_its_replay_is_far_from_its_prediction(
        monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """The machine's load moving between calibration and replay (here: a plan result as
    make_plan returns one) is said in one line, with both figures, and a missed SLA
    exits 3."""
    from click.testing import CliRunner

    from tradeoff.cli import main
    from tradeoff.plan import planner
    from tradeoff.results import PlanCandidate, PlanResult, Prediction, Replayed

    predicted = Prediction(1.0, 2.9, 1.0, 0.0, 0.5)
    start = PlanCandidate("start", 1, "fp32", 0.0, {}, 0, 1, predicted, None, False, 0)
    proof = [Replayed("start", "baseline", 2.0, 9.0, 100.0, 0.0, None, None, predicted,
                      False, None),
             Replayed("start", "plan", 1.0, 7.0, 100.0, 0.0, None, None, predicted, False,
                      None)]
    from tradeoff.plan.search import Calibration
    from tradeoff.plan.traffic import Traffic
    from tradeoff.tune.goal import Goal

    result = PlanResult("m", str(tmp_path), None,
                        Goal(sla_p99_ms=5.0, max_drop=0.01).plan_dict(),
                        Traffic.law(10).describe(), {},
                        Calibration(0.1, 0.2, 0.4, 10.0).to_dict(), [], start, [start],
                        None, [], proof, "the plan misses", "done", 1.0)
    monkeypatch.setattr(planner, "make_plan", lambda request, say: result)
    model = tmp_path / "m"
    (model / "1").mkdir(parents=True)
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                    "-o", str(tmp_path / "out")])
    text = " ".join(run.output.split())
    assert run.exit_code == 3, run.output
    assert "the replayed p99 is 2.4x the predicted one (7.00 against 2.90 ms)" in text
    assert "no deployment met the SLA on replay" in text
