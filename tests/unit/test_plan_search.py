"""`tradeoff plan`'s parts that need no server: the traffic measured from a trace, the
batcher simulation against queueing theory, the cache sized from repetition, and the
search's choice where the right answer is known by hand."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from tradeoff.errors import InvalidValue
from tradeoff.plan.predict import BatchCost, simulate
from tradeoff.plan.search import (
    CacheChoice,
    Calibration,
    Searcher,
    cache_choice,
    version_cost,
)
from tradeoff.plan.traffic import Traffic, fit_zipf
from tradeoff.repository.config import parse_config_text
from tradeoff.results import PlanVersion
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

CONFIG = parse_config_text('name: "synthetic"\nbackend: "synthetic"\nmax_batch_size: 16\n'
                           'input { name: "INPUT0" data_type: TYPE_FP32 dims: [4] }\n'
                           'output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }\n',
                           source="test", default_name="synthetic")
NO_SERVER_COST = Calibration(0.0, 0.0, 0.0, 1.0)


def _version(version: int = 1, fixed_ms: float = 2.0, per_row_ms: float = 0.05,
             precision: str = "fp32", drop: float = 0.0, kept: bool = True) -> PlanVersion:
    sizes = [1, 2, 4, 8, 16]
    return PlanVersion(version, precision, "test", drop, kept, "test",
                       {b: fixed_ms + per_row_ms * b for b in sizes})


def test_poisson_single_server_matches_queueing_theory() -> None:
    # M/D/1 at load 0.5 with 1 ms service: mean time in system 1 + 0.5 / (2 * 0.5) = 1.5
    arrivals = Traffic.law(500).arrivals(40_000)
    run = simulate(arrivals, BatchCost((1, 2), (1.0, 2.0)), 1, 0.0, 1)
    assert run.latency_ms.mean() == pytest.approx(1.5, rel=0.05)
    assert run.mean_batch == 1


def test_the_batcher_waits_at_most_the_delay_and_fills_batches_under_load() -> None:
    cost = BatchCost((1, 8), (1.0, 1.0))
    # constant 1000/s and a 3.5 ms delay: four requests wait for the oldest's deadline
    run = simulate(Traffic.law(1000, "constant").arrivals(4000), cost, 8, 0.0035, 1)
    assert run.mean_batch == pytest.approx(4, abs=0.1)
    assert run.p99_ms == pytest.approx(3.5 + 1.0, abs=0.05)
    # a full batch does not wait for the delay
    run = simulate(Traffic.law(1000, "constant").arrivals(4000), cost, 2, 0.0035, 1)
    assert run.p99_ms == pytest.approx(1 + 1.0, abs=0.05)


def test_cache_hits_skip_the_batcher() -> None:
    arrivals = Traffic.law(900).arrivals(20_000)
    cost = BatchCost((1, 2), (1.0, 2.0))
    hits = np.random.default_rng(1).random(arrivals.size) < 0.5
    run = simulate(arrivals, cost, 1, 0.0, 1, per_request_ms=0.01, hits=hits)
    assert np.all(run.latency_ms[hits] == 0.01)
    # the model sees 450/s instead of 900/s: queueing as at load 0.45
    assert run.latency_ms[~hits].mean() < 2.0


def test_a_trace_is_measured(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.exponential(1 / 200, 4000))
    inputs = rng.zipf(1.6, 4000) % 300
    lines = [json.dumps({"timestamp": 1.7e9 + float(t), "input": {"x": int(i)},
                         "class": "a" if n % 4 else "b"})
             for n, (t, i) in enumerate(zip(times, inputs, strict=True))]
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(lines))
    traffic = Traffic.read(trace)
    assert traffic.rate_rps == pytest.approx(200, rel=0.05)
    assert traffic.burstiness == pytest.approx(1.0, abs=0.1)
    assert traffic.peak_rps > traffic.rate_rps
    assert traffic.repeats and traffic.distinct_inputs == len(set(inputs.tolist()))
    assert traffic.classes == {"a": 0.75, "b": 0.25}
    assert 0 < traffic.hit_ratio(16) < traffic.hit_ratio(64) <= 1


def test_a_records_csv_is_a_trace(tmp_path: Path) -> None:
    rows = ["scheduled_ms,sent_ms,request,outcome"] + \
        [f"{i * 10.0},{i * 10.0},{i % 5},ok" for i in range(200)]
    path = tmp_path / "records.csv"
    path.write_text("\n".join(rows))
    traffic = Traffic.read(path)
    assert traffic.rate_rps == pytest.approx(100)
    assert traffic.burstiness == pytest.approx(0, abs=1e-9)
    assert traffic.distinct_inputs == 5 and traffic.hit_ratio(5) > 0.9


def test_one_input_repeated_and_bench_inputs_are_said_for_what_they_are(tmp_path: Path
                                                                          ) -> None:
    """A trace whose every request sends the same input (bench --distinct-inputs 1
    --records) is measured, not a LinAlgError; a bench CSV's inputs are the bench's own
    set, and the cache prediction says so; a JSON lines trace's are its requests'."""
    rows = ["scheduled_ms,sent_ms,request,outcome"] + \
        [f"{i * 10.0},{i * 10.0},0,ok" for i in range(100)]
    path = tmp_path / "one.csv"
    path.write_text("\n".join(rows))
    traffic = Traffic.read(path)
    assert traffic.distinct_inputs == 1 and traffic.zipf == 0.0
    assert traffic.hit_ratio(1) == pytest.approx(0.99)  # all but the first of 100
    assert traffic.describe()["inputs_from"] == "bench"
    choice = cache_choice(traffic, CONFIG)
    assert choice.capacity == 1 and "the bench's own set" in choice.why
    lines = tmp_path / "t.jsonl"
    lines.write_text("".join(f'{{"timestamp": {i}, "input": {i % 3}}}\n' for i in range(30)))
    own = Traffic.read(lines)
    assert own.inputs_from == "trace" and "bench" not in cache_choice(own, CONFIG).why
    assert fit_zipf(np.array([7])) == 0.0


def test_a_bad_trace_says_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"timestamp": 1}\n{"time": "soon"}\n')
    with pytest.raises(InvalidValue, match=r"t\.jsonl:2: needs a numeric 'timestamp'"):
        Traffic.read(path)
    path.write_text('{"timestamp": 1, "input": 1}\n{"timestamp": 2}\n')
    with pytest.raises(InvalidValue, match="'input' is on some lines only"):
        Traffic.read(path)
    csv = tmp_path / "other.csv"
    csv.write_text("a,b\n1,2\n")
    with pytest.raises(InvalidValue, match="not a `tradeoff bench --records` CSV"):
        Traffic.read(csv)


def test_zipf_is_fitted_from_counts() -> None:
    counts = np.round(1e5 * np.arange(1, 200, dtype=float) ** -1.2)
    assert fit_zipf(counts) == pytest.approx(1.2, abs=0.02)


def test_repetition_turns_the_cache_on_and_its_absence_leaves_it_off() -> None:
    repeated = cache_choice(Traffic.law(100, distinct_inputs=10_000, zipf=1.5), CONFIG)
    assert repeated.capacity and repeated.hit_ratio > 0.5 and repeated.size_bytes >= 1 << 20
    assert repeated.capacity < 10_000  # the smallest that gets 95% of the best
    # a cache that starts empty and sees 500 requests misses each input's first sight
    cold = cache_choice(Traffic.law(100, distinct_inputs=10_000, zipf=1.5), CONFIG, 500)
    assert 0 < cold.hit_ratio < repeated.hit_ratio
    unique = cache_choice(Traffic.law(100), CONFIG)
    assert unique.capacity == 0 and "differs" in unique.why


def _searcher(rate: float, sla: float, cores: int = 1, **goal: float) -> Searcher:
    return Searcher(CONFIG, Traffic.law(rate), Goal(sla_p99_ms=sla, max_drop=0.01,
                                                         cores=cores, **goal),
                    NO_SERVER_COST, (1, Knobs(1, 0, 1, 1, False)))


def test_the_search_batches_when_one_at_a_time_cannot_keep_up() -> None:
    # 2 ms per batch of one: at 450/s one at a time runs at 90% load, far over an 8 ms
    # p99; batches of 4 cost 2.2 ms for 4 requests and keep well under it
    searcher = _searcher(450, 8.0)
    ranked = searcher.search([_version()], CacheChoice(0, 0, 0.0, "off"))
    best = ranked[0]
    assert best.meets_sla and best.knobs["max_batch_size"] > 1
    assert best.knobs["instances"] == 1 and best.cache_bytes == 0
    alone = next(c for c in ranked if c.knobs["max_batch_size"] == 1)
    assert not alone.meets_sla and alone.predicted.utilisation > 0.85


def test_an_impossible_sla_is_reported_with_the_best_p99() -> None:
    ranked = _searcher(450, 1.0).search([_version()], CacheChoice(0, 0, 0.0, "off"))
    assert not any(c.meets_sla for c in ranked)
    best = ranked[0]
    assert best.predicted.p99_ms == min(c.predicted.p99_ms for c in ranked)
    assert best.predicted.p99_ms > 2.0  # a batch alone takes 2 ms


def test_a_version_over_the_accuracy_budget_is_never_a_candidate() -> None:
    fast = _version(2, fixed_ms=0.5, precision="int8", drop=0.05, kept=False)
    ranked = _searcher(450, 8.0).search([_version(), fast], CacheChoice(0, 0, 0.0, "off"))
    assert {c.version for c in ranked} == {1}
    kept = _version(2, fixed_ms=0.5, precision="int8", drop=0.005)
    ranked = _searcher(450, 8.0, price_per_core_hour=1.0).search(
        [_version(), kept], CacheChoice(0, 0, 0.0, "off"))
    assert {c.version for c in ranked} == {1, 2}


@pytest.mark.slow
def test_fewer_cores_win_when_cores_are_priced() -> None:
    ranked = _searcher(300, 20.0, cores=4, price_per_core_hour=0.1).search(
        [_version()], CacheChoice(0, 0, 0.0, "off"))
    assert ranked[0].meets_sla and ranked[0].cores == 1
    assert ranked[0].cost_per_million == pytest.approx(0.1 / (300 * 3600) * 1e6)


def test_the_predicted_p99_of_an_overloaded_deployment_is_infinite() -> None:
    candidate = _searcher(5000, 8.0).predict(_version(), Knobs(1, 0, 1, 1, False),
                                              CacheChoice(0, 0, 0.0, "off"))
    assert math.isinf(candidate.predicted.p99_ms) and not candidate.meets_sla
    assert version_cost(_version()).capacity_rps(1, 1, 0.0) == pytest.approx(1e3 / 2.05)


def test_a_calibration_run_is_read_in_windows_as_the_load_moved() -> None:
    """window_p99s: each third of a 3 s run on its own (the warmup before it and the
    failures left out), so a slow second makes one window's p99, not the whole run's."""
    from tradeoff.bench.records import OK, RecordBuffer
    from tradeoff.plan.measure import window_p99s

    buffer = RecordBuffer()
    start = 10**12
    for i in range(-50, 300):  # 100 a second, the first 0.5 s a warmup
        at = start + i * 10_000_000
        took = 40_000_000 if 100 <= i < 200 else 2_000_000  # the second second: 40 ms
        outcome = OK if i % 50 else OK + 1  # now and then a failure, of 100 s
        buffer.add(at, at, at + (100 * 10**9 if outcome != OK else took), outcome, 200,
                   0, 0, 1, None)
    records = buffer.freeze()
    p99s = window_p99s(records, records.latency_ms, start, 3.0)
    assert p99s == pytest.approx([2.0, 40.0, 2.0])
    assert window_p99s(records, records.latency_ms, start + 3 * 10**9, 3.0) == []
