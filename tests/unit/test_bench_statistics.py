"""Bench arithmetic without sockets: schedules, stability, windows, result summary."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from tradeoff.bench.adapters import parse_server_timing
from tradeoff.bench.load import LoadSpec, arrival_offsets_ns, read_intervals
from tradeoff.bench.mix import InputMix
from tradeoff.bench.records import HTTP_ERROR, OK, TIMEOUT, RecordBuffer, Records
from tradeoff.bench.result import build_result
from tradeoff.bench.runner import RunOutcome, WindowReport, is_stable, window_report
from tradeoff.errors import InvalidValue
from tradeoff.stats.distribution import distribution


def test_constant_and_poisson_schedules() -> None:
    constant = list(itertools.islice(arrival_offsets_ns(LoadSpec(rate=100, duration_s=1)), 5))
    assert constant == [0, 10_000_000, 20_000_000, 30_000_000, 40_000_000]
    poisson = np.array(list(itertools.islice(
        arrival_offsets_ns(LoadSpec(rate=1000, arrival="poisson", duration_s=1)), 20_000)))
    gaps = np.diff(poisson) / 1e6
    assert gaps.mean() == pytest.approx(1.0, rel=0.03)  # ms
    assert gaps.std() == pytest.approx(1.0, rel=0.05)  # exponential: std == mean
    again = list(itertools.islice(
        arrival_offsets_ns(LoadSpec(rate=1000, arrival="poisson", duration_s=1)), 100))
    assert again == poisson[:100].tolist()  # the seed fixes the schedule


def test_trace_files_gaps_and_offsets(tmp_path: Path) -> None:
    gaps = tmp_path / "gaps.txt"
    gaps.write_text("0\n1000\n2000\n")
    assert read_intervals(gaps) == pytest.approx((0.0, 0.001, 0.003))
    offsets = tmp_path / "offsets.txt"
    offsets.write_text("# offsets\n0\n1000\n2000\n")
    assert read_intervals(offsets) == pytest.approx((0.0, 0.001, 0.002))
    offsets.write_text("# offsets\n0\n2000\n1000\n")
    with pytest.raises(ValueError, match="must not decrease"):
        read_intervals(offsets)
    for bad in ("nan", "inf", "-5", "1e300", "soon"):
        gaps.write_text(f"0\n1000\n{bad}\n")
        with pytest.raises(InvalidValue, match=rf"gaps\.txt:3: '{bad}' is not a number of "
                                               "microseconds from 0 to 31 days"):
            read_intervals(gaps)
    spec = LoadSpec(intervals=(0.0, 0.001), duration_s=1)
    assert list(itertools.islice(arrival_offsets_ns(spec), 4)) == [0, 1_000_000, 2_000_000,
                                                                    3_000_000]
    assert list(arrival_offsets_ns(LoadSpec(intervals=(0.0, 0.001)))) == [0, 1_000_000]


@pytest.mark.parametrize("kwargs", [{}, {"concurrency": 1, "rate": 5},
                                    {"rate": 0}, {"concurrency": 1, "arrival": "bursty"},
                                    {"concurrency": 1, "duration_s": 1, "requests": 5}])
def test_load_spec_refuses_contradictions(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LoadSpec(**kwargs)


def _window(throughput: float, p99: float) -> WindowReport:
    return WindowReport(0, 0, 1, 10, 0, throughput, 1.0, p99)


def test_stability_needs_three_agreeing_windows() -> None:
    assert not is_stable([_window(100, 10), _window(100, 10)], 10)
    assert is_stable([_window(50, 99), _window(100, 10), _window(104, 10.5),
                      _window(97, 9.8)], 10)
    assert not is_stable([_window(100, 10), _window(100, 10), _window(100, 14)], 10)
    assert not is_stable([_window(100, 10), _window(130, 10), _window(100, 10)], 10)


def test_window_counts_requests_that_ended_inside() -> None:
    end = np.array([5, 10, 15, 25], np.int64) * 10**8
    ok = np.array([True, True, False, True])
    latency = np.array([1.0, 2.0, 3.0, 4.0])
    report = window_report(0, 10**9, 2 * 10**9, end, ok, latency)
    assert (report.completed, report.errors) == (2, 1)
    assert report.throughput_rps == 1.0 and report.p50_ms == 2.0


def test_server_timing_header() -> None:
    value = (b'queue;dur=0.412, compute_input;dur=0.021, compute_infer;dur=1.873, '
             b'compute_output;dur=0.009, batch;desc="24"')
    assert parse_server_timing(value) == (0.412, 0.021, 1.873, 0.009)
    assert parse_server_timing(b"db;dur=5") is None


def test_distribution_is_exact() -> None:
    d = distribution(np.arange(1, 1001, dtype=float))
    assert d is not None
    assert (d["min"], d["max"], d["p50"]) == (1.0, 1000.0, 500.5)
    assert d["p999"] == pytest.approx(999.001)
    assert distribution(np.array([np.nan])) is None


class _Adapter:
    rows_per_request = 2
    url = "http://x"
    mix = InputMix()
    input_count = 8

    def describe(self) -> dict:
        return {"protocol": "v2", "url": self.url}


def _outcome(server_before: dict | None = None, server_after: dict | None = None,
             with_timing: bool = True) -> RunOutcome:
    buffer = RecordBuffer()
    ms = 1_000_000
    # warmup request, then 4 measured: 3 ok (10, 20, 30 ms) and 1 timeout
    buffer.add(0, 0, 5 * ms, OK, 200, 10, 20, 2, None)
    for i, (latency, outcome) in enumerate([(10, OK), (20, OK), (30, OK), (50, TIMEOUT)]):
        start = (100 + i) * ms
        timing = (1.0, 0.5, 2.0, 0.5) if with_timing and outcome == OK else None
        buffer.add(start, start, start + latency * ms, outcome, 200 if outcome == OK else 0,
                   10, 20 if outcome == OK else 0, 2, timing)
    buffer.add(104 * ms, 104 * ms, 110 * ms, HTTP_ERROR, 503, 10, 5, 2, None)
    empty = RecordBuffer().freeze()
    return RunOutcome(buffer.freeze(), empty, 0, 100 * ms, 1100 * ms, [], None, "done", 12.0,
                      server_before, server_after)


def test_summary_from_records() -> None:
    result = build_result(_Adapter(), LoadSpec(concurrency=2, duration_s=1),  # type: ignore[arg-type]
                          _outcome())
    s = result.summary
    assert (s.requests, s.successes, s.errors) == (5, 3, 2)
    assert s.errors_by_class == {"http": 1, "timeout": 1, "http_503": 1}
    assert s.throughput_rps == pytest.approx(3.0)
    assert s.inferences_per_s == pytest.approx(6.0)
    assert s.latency("p50") == 20.0 and s.latency("max") == 30.0
    assert s.server_ms is not None and s.server_ms["source"] == "server-timing"
    assert s.server_ms["server_total"]["mean"] == pytest.approx(4.0)
    assert s.server_ms["overhead"]["min"] == pytest.approx(6.0)
    assert result.warmup.requests == 1
    assert result.total_requests_sent == 6
    assert s.bytes_sent == 50


def test_breakdown_from_the_statistics_extension_when_no_server_timing() -> None:
    def stats(count: int, scale: int) -> dict:
        parts = {p: {"count": count, "ns": scale * ns} for p, ns in
                 [("success", 9_000_000), ("queue", 2_000_000), ("compute_input", 1_000_000),
                  ("compute_infer", 4_000_000), ("compute_output", 1_000_000)]}
        return {"inference_stats": parts, "execution_count": count}

    outcome = _outcome(stats(10, 1), stats(13, 4), with_timing=False)
    breakdown = build_result(_Adapter(), LoadSpec(concurrency=2, duration_s=1),  # type: ignore[arg-type]
                             outcome).summary.server_ms
    assert breakdown["source"] == "statistics extension"
    assert breakdown["queue"]["mean"] == pytest.approx(2.0)  # 6 ms over 3 requests
    assert breakdown["compute_infer"]["mean"] == pytest.approx(4.0)
    assert breakdown["server_total"]["mean"] == pytest.approx(8.0)
    assert breakdown["overhead"]["mean"] == pytest.approx(12.0)  # 20 ms mean - 8


def test_records_merge_exactly_across_workers() -> None:
    a, b = RecordBuffer(), RecordBuffer()
    a.add(0, 0, 10, OK, 200, 1, 1, 1, None)
    b.add(5, 5, 8, OK, 200, 1, 1, 1, None)
    merged = Records.merge([a.freeze(), b.freeze()], [0, 100])
    assert merged.scheduled_ns.tolist() == [0, 105]
    assert merged.latency_ms.tolist() == [10 / 1e6, 3 / 1e6]


def test_split_spec_shares_the_load() -> None:
    from tradeoff.bench.workers import split_spec

    closed = split_spec(LoadSpec(concurrency=5, requests=11), 2)
    assert [s.concurrency for s in closed] == [3, 2]
    assert [s.requests for s in closed] == [6, 5]
    opened = split_spec(LoadSpec(rate=100, duration_s=1), 4)
    assert [s.rate for s in opened] == [25, 25, 25, 25]
    merged = sorted(offset for s in opened
                    for offset in itertools.islice(arrival_offsets_ns(s), 25))
    assert merged == list(itertools.islice(arrival_offsets_ns(LoadSpec(rate=100,
                                                                       duration_s=1)), 100))
    trace = split_spec(LoadSpec(intervals=(0.0, 0.1, 0.2)), 2)
    assert [s.intervals for s in trace] == [(0.0, 0.2), (0.1,)]
    with pytest.raises(ValueError, match="more than --concurrency"):
        split_spec(LoadSpec(concurrency=1, duration_s=1), 2)
    # each share runs in one worker, wherever the whole load was placed
    shares = split_spec(LoadSpec(concurrency=4, duration_s=1, workers=2,
                                 ray_address="127.0.0.2:6379"), 2)
    assert {(s.workers, s.ray_address) for s in shares} == {(1, None)}
    with pytest.raises(ValueError, match="--workers must be >= 1"):
        LoadSpec(concurrency=1, workers=0)


def test_instability_says_why() -> None:
    from tradeoff.bench.runner import instability

    why = instability([_window(100, 10), _window(100, 10), _window(100, 14)], 10)
    assert why is not None and why.startswith("p99 of the last 3 windows differs")
    assert "(limit 10%)" in why
    assert instability([_window(100, 10)] * 3, 10) is None
