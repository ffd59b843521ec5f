"""``tradeoff soak``: sustained open-loop load, watched for drift, error bursts and memory
growth.

    result = run_soak(adapter, SoakPlan(duration_s=1800, fraction=0.75), LoadSpec(rate=1))
    result.verdict.stable

The rate is ``fraction`` of the endpoint's maximum: given, or measured first with a short
concurrency sweep (the best throughput it reached). The load runs in windows (one minute
by default) as one ``tradeoff bench`` run. The verdict is *unstable* when, with at least
``MIN_WINDOWS`` windows, p99 rises or throughput falls significantly (Mann-Kendall,
p < 0.05) by more than ``DRIFT_PERCENT`` over the run; when a window's error rate bursts
above ``ERROR_BURST_PERCENT`` (and 3x the median window); or when the server's resident
memory grows significantly by more than ``MEMORY_GROWTH_PERCENT`` and ``MEMORY_GROWTH_MIB``.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import time
import urllib.request
from dataclasses import dataclass
from typing import Any

import numpy as np
from rich.console import Console

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.sweep import Sweep, SweepPlan, parse_levels, point_summary
from tradeoff.errors import BenchSetupError, InvalidValue
from tradeoff.results import Memory, SoakResult, Verdict, Window, environment
from tradeoff.stats.trend import mann_kendall

__all__ = [
    "DRIFT_PERCENT",
    "ERROR_BURST_PERCENT",
    "MAX_TREND_SAMPLES",
    "MEMORY_GROWTH_MIB",
    "MEMORY_GROWTH_PERCENT",
    "MIN_WINDOWS",
    "WARMUP_S",
    "MemoryWatch",
    "SoakPlan",
    "measure_max_rate",
    "read_rss",
    "run_soak",
    "verdict",
]

WARMUP_S = 5.0  # before the first window, at most one window long
MIN_WINDOWS = 6
MAX_TREND_SAMPLES = 2000  # memory samples thinned to this for the trend test
DRIFT_PERCENT = 10.0
DRIFT_FLOOR_MS = 1.0  # a p99 that moves less than this over the run is timer noise
ERROR_BURST_PERCENT = 1.0
MEMORY_GROWTH_PERCENT = 10.0
MEMORY_GROWTH_MIB = 16.0
_RSS_METRIC = re.compile(rb"^process_resident_memory_bytes(?:\{[^}]*\})?\s+(\S+)", re.M)


@dataclass(frozen=True)
class SoakPlan:
    """How hard, how long, and where to read the server's memory."""

    duration_s: float
    fraction: float = 0.75
    max_rate: float | None = None
    window_s: float = 60.0
    arrival: str = "poisson"
    probe_s: float = 3.0
    server_pid: int | None = None
    prometheus_url: str | None = None
    memory_interval_s: float = 1.0  # at most; four samples per window at least

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 2:
            raise InvalidValue(f"--fraction must be in (0, 2], got {self.fraction}")
        if self.window_s * MIN_WINDOWS > self.duration_s:
            raise InvalidValue(f"--duration {self.duration_s:g}s holds fewer than {MIN_WINDOWS} "
                               f"windows of {self.window_s:g}s; lengthen it or shorten --window")


def read_rss(pid: int | None, prometheus_url: str | None) -> float | None:
    """Resident memory in bytes of a local process, or from a Prometheus endpoint."""
    if pid is not None:
        try:
            with open(f"/proc/{pid}/status") as handle:
                for line in handle:
                    if line.startswith("VmRSS:"):
                        return float(line.split()[1]) * 1024
        except OSError:
            return None
        return None
    if prometheus_url:
        try:
            with urllib.request.urlopen(prometheus_url, timeout=5) as response:
                found = _RSS_METRIC.search(response.read())
        except OSError:
            return None
        return float(found.group(1)) if found else None
    return None


class MemoryWatch:
    """Samples the server's RSS on a thread while the load runs."""

    def __init__(self, plan: SoakPlan) -> None:
        self.plan = plan
        self.samples: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def source(self) -> str | None:
        if self.plan.server_pid is not None:
            return f"/proc/{self.plan.server_pid}/status VmRSS"
        if self.plan.prometheus_url:
            return f"{self.plan.prometheus_url} process_resident_memory_bytes"
        return None

    def __enter__(self) -> MemoryWatch:
        if self.source:
            if read_rss(self.plan.server_pid, self.plan.prometheus_url) is None:
                raise BenchSetupError(f"cannot read the server's memory from {self.source}")
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def _run(self) -> None:
        start = time.monotonic()
        while not self._stop.is_set():
            rss = read_rss(self.plan.server_pid, self.plan.prometheus_url)
            if rss is not None:
                self.samples.append((time.monotonic() - start, rss))
            self._stop.wait(min(self.plan.memory_interval_s, self.plan.window_s / 4))


def verdict(windows: list[Window], memory: list[tuple[float, float]]) -> Verdict:
    """Trends, bursts and memory growth of a soak run, and whether it was stable."""
    reasons: list[dict[str, Any]] = []
    notes: list[str] = []
    trends: dict[str, Any] = {}
    if len(windows) >= MIN_WINDOWS:
        ends = np.cumsum([w.duration_s for w in windows])
        span = float(ends[-1] - ends[0])
        for metric, field, bad, floor in (("p99", "p99_ms", "up", DRIFT_FLOOR_MS),
                                          ("throughput", "throughput_rps", "down", 0.0)):
            trend = mann_kendall(ends, np.array([getattr(w, field) for w in windows], float))
            trends[metric] = trend.to_dict()
            if trend.direction == bad and abs(trend.change_percent) > DRIFT_PERCENT and \
                    abs(trend.slope_per_s * span) > floor:
                reasons.append({
                    "kind": "drift", "severity": "critical",
                    "text": f"{metric} drifted {trend.direction} {trend.change_percent:+.0f}% "
                            f"over the run (Mann-Kendall p={trend.p_value:.3f})",
                    "evidence": trend.to_dict(),
                    "action": "look for leaks, growing queues or caches, thermal or "
                              "noisy-neighbour throttling; rerun longer to confirm"})
    else:
        notes.append(f"{len(windows)} windows: too few for a trend test (need {MIN_WINDOWS})")
    rates = np.array([w.errors / w.completed * 100 if w.completed else 0.0 for w in windows])
    if rates.size:
        limit = max(ERROR_BURST_PERCENT, 3 * float(np.median(rates)))
        bursts = [int(w.index) for w, r in zip(windows, rates, strict=True) if r > limit]
        if bursts:
            reasons.append({
                "kind": "error_burst", "severity": "critical",
                "text": f"error bursts in {len(bursts)} of {len(windows)} windows "
                        f"(over {limit:.1f}% errors)",
                "evidence": {"windows": bursts, "error_percent": [float(rates[i])
                                                                  for i in bursts]},
                "action": "line the windows up with server logs: restarts, timeouts, "
                          "queue overflows (503) or garbage collection"})
    if len(memory) >= MIN_WINDOWS:
        thinned = memory[::max(1, len(memory) // MAX_TREND_SAMPLES)]
        t = np.array([m[0] for m in thinned])
        rss = np.array([m[1] for m in thinned])
        trend = mann_kendall(t, rss)
        growth_mib = trend.slope_per_s * float(t.max() - t.min()) / 2**20
        trends["memory"] = {**trend.to_dict(), "growth_mib": growth_mib}
        if trend.direction == "up" and trend.change_percent > MEMORY_GROWTH_PERCENT and \
                growth_mib > MEMORY_GROWTH_MIB:
            reasons.append({
                "kind": "memory_growth", "severity": "critical",
                "text": f"server memory grew {growth_mib:.0f} MiB "
                        f"({trend.change_percent:+.0f}%) over the run "
                        f"(Mann-Kendall p={trend.p_value:.3f})",
                "evidence": trends["memory"],
                "action": "a leak or an unbounded cache/queue: profile the server's heap; "
                          "bound caches and queues"})
    return Verdict(not reasons, reasons, notes, trends)


def measure_max_rate(adapter: Adapter, base: LoadSpec, probe_s: float,
                     console: Console | None) -> tuple[float, dict[str, Any]]:
    """The best throughput a short closed-loop concurrency sweep reaches."""
    spec = dataclasses.replace(base, duration_s=probe_s, warmup_s=min(1.0, probe_s / 3),
                               window_s=None, requests=None)
    sweep = Sweep(adapter, spec, SweepPlan("concurrency", parse_levels("1:256"), patience=1),
                  console).run()
    best = max(sweep.rows, key=lambda r: r.throughput_rps)
    return best.throughput_rps, {"source": "measured", "best_concurrency": best.load,
                                 "sweep": [r.to_dict() for r in sweep.rows]}


def run_soak(adapter: Adapter, plan: SoakPlan, base: LoadSpec,
             console: Console | None = None) -> SoakResult:
    """Run the soak: the windows of one long run and their verdict."""
    if plan.max_rate is not None:
        max_rate, origin = plan.max_rate, {"source": "given"}
    else:
        max_rate, origin = measure_max_rate(adapter, base, plan.probe_s, console)
    if max_rate <= 0:
        raise BenchSetupError("the endpoint served nothing while its maximum rate was measured")
    rate = plan.fraction * max_rate
    spec = dataclasses.replace(base, rate=rate, concurrency=None, intervals=None,
                               arrival=plan.arrival, duration_s=plan.duration_s,
                               requests=None, window_s=plan.window_s,
                               warmup_s=min(WARMUP_S, plan.window_s))
    if console:
        console.print(f"[bold]soak at {rate:,.1f} req/s[/] ({plan.fraction:.0%} of "
                      f"{max_rate:,.1f}) for {plan.duration_s:g}s in {plan.window_s:g}s windows")
    with MemoryWatch(plan) as watch:
        result, _, _ = run_benchmark(adapter, spec, console)
    step = max(1, len(watch.samples) // 2000)
    return SoakResult(
        endpoint=result.endpoint,
        plan=dataclasses.asdict(plan),
        environment=environment(),
        max_rate={"rps": max_rate, **origin},
        rate_rps=rate,
        result=result,
        summary=point_summary(result),
        memory=Memory(watch.source, watch.samples[::step]),
        verdict=verdict(result.windows, watch.samples),
    )
