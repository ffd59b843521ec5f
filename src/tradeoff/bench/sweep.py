"""Sweeps: one full benchmark per load level, until the endpoint stops giving more.

    result = Sweep(adapter, LoadSpec(concurrency=1, duration_s=5),
                   SweepPlan("concurrency", parse_levels("1:256"))).run()
    result.knee.load if result.knee else None

A concurrency sweep (closed loop) or a rate sweep (open loop) runs the levels in order and
stops early when throughput has stopped growing (``patience`` points past the knee), the
error rate passes ``max_error_percent``, or p99 passes ``max_p99_ms``. With ``sla_p99_ms``
it searches for the highest load whose p99 and error rate meet the SLA: steps up through
the levels until one fails, then bisects between the last pass and the first failure.
Every point is a complete bench result; :meth:`Sweep.run` gives the typed
:class:`~tradeoff.results.SweepResult`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rich.console import Console

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.errors import InvalidValue
from tradeoff.results import (
    BenchResult,
    Knee,
    RowTokens,
    SlaAnswer,
    SweepResult,
    SweepRow,
    environment,
)
from tradeoff.stats.cost import Price, rank
from tradeoff.stats.knee import MIN_GAIN, find_knee
from tradeoff.stats.progress import progress_text

__all__ = [
    "JUDGED_REQUESTS",
    "KNEE_RULE",
    "SATURATION_RULE",
    "SERVED_SHARE",
    "SWEEP_WARMUP_S",
    "Sweep",
    "SweepPlan",
    "first_unserved",
    "knee_of",
    "parse_levels",
    "point_summary",
    "profile_levels",
]

# a sweep's warmup at each level unless --warmup says otherwise: a level's first requests
# meet cold caches, new connections and a batcher that has not settled
SWEEP_WARMUP_S = 1.0

KNEE_RULE = (f"first load from which every further point gains under {MIN_GAIN:.0%} "
             "throughput (output tokens/s for generations) per doubling of the load")
# an open-loop level served under this share of the rate it sent: the endpoint is saturated
SERVED_SHARE = 0.9
JUDGED_REQUESTS = 50
SATURATION_RULE = (f"the last rate served in full: the next was served under "
                   f"{SERVED_SHARE:.0%} of the rate asked (saturation)")


def parse_levels(text: str, integer: bool = False) -> list[float]:
    """``START:END`` (doubling), ``START:END:STEP`` (perf_analyzer's linear range) or
    ``A,B,C``."""
    convert = int if integer else float
    try:
        if ":" in text:
            parts = [convert(p) for p in text.split(":")]
            if len(parts) not in (2, 3):
                raise ValueError
            start, end = parts[0], parts[1]
            if start <= 0 or end < start:
                raise ValueError
            levels: list[float] = []
            level = start
            while level <= end * (1 + 1e-9):
                levels.append(level)
                level = level + parts[2] if len(parts) == 3 else level * 2
                if len(parts) == 3 and parts[2] <= 0:
                    raise ValueError
            return levels
        levels = [convert(p) for p in text.split(",") if p.strip()]
        if not levels or any(v <= 0 for v in levels) or levels != sorted(set(levels)):
            raise ValueError
        return levels
    except ValueError:
        kind = "integers" if integer else "numbers"
        raise InvalidValue(f"{text!r}: use START:END (doubling), START:END:STEP or an "
                           f"increasing list A,B,C of positive {kind}") from None


@dataclass(frozen=True)
class SweepPlan:
    """Which loads to try and when to stop."""

    mode: str  # concurrency | rate
    levels: list[float]
    max_p99_ms: float | None = None
    max_error_percent: float = 1.0
    sla_p99_ms: float | None = None
    min_gain: float = MIN_GAIN
    patience: int = 2
    bisect_steps: int = 4
    # a profile's anchors: the rates one request at a time and flat out gave (see
    # profile_levels); its levels all run, whatever the knee
    profile: dict[str, float] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("concurrency", "rate"):
            raise InvalidValue(f"sweep mode must be concurrency or rate, got {self.mode!r}")
        if not self.levels:
            raise InvalidValue("no load levels to sweep")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def profile_levels(adapter: Adapter, base: LoadSpec, count: int, max_concurrency: int,
                   console: Console | None = None) -> tuple[list[float], dict[str, float]]:
    """guidellm's sweep profile: measure one request at a time (the lowest useful rate)
    and ``max_concurrency`` at once (the saturation rate), then ``count`` constant rates
    spread evenly between them, both ends included. Returns the rates and the anchors."""
    if count < 2:
        raise InvalidValue("--profile needs at least 2 rates")
    anchors = {}
    for name, concurrency in (("synchronous", 1), ("throughput", max_concurrency)):
        if console:
            console.print(f"profile: {name} run (concurrency {concurrency})")
        spec = dataclasses.replace(base, concurrency=concurrency, rate=None, intervals=None,
                                   workers=min(base.workers, concurrency))
        result, _, _ = run_benchmark(adapter, spec, console)
        anchors[f"{name}_rps"] = result.summary.throughput_rps
    low, high = anchors["synchronous_rps"], anchors["throughput_rps"]
    if not low > 0:
        raise InvalidValue("profile: no request succeeded one at a time; check the endpoint")
    high = max(high, low * 1.01)  # saturated at one: still spread a little
    step = (high - low) / (count - 1)
    return [round(low + i * step, 3) for i in range(count)], anchors


def point_summary(result: BenchResult) -> SweepRow:
    """Load, throughput, latency and error rate of one bench result."""
    s = result.summary
    generation = s.generation
    tokens = None
    if generation is not None:
        ttft, tpot = generation.ttft_ms or {}, generation.tpot_ms or {}
        tokens = RowTokens(generation.output_tokens_per_s, ttft.get("p50"), ttft.get("p99"),
                           tpot.get("p50"), tpot.get("p99"), generation.goodput_rps)
    return SweepRow(load=result.load["concurrency"] if result.load["mode"] == "closed"
                    else result.load["rate"],
                    throughput_rps=s.throughput_rps, inferences_per_s=s.inferences_per_s,
                    p50_ms=s.latency("p50"), p99_ms=s.latency("p99"),
                    error_percent=s.error_percent, requests=s.requests, tokens=tokens)


def knee_of(points: list[BenchResult], min_gain: float = MIN_GAIN) -> Knee | None:
    """The knee of a list of bench results (any order), with its figures. Over rates
    (open loop), the last rate before one the endpoint served under SERVED_SHARE of
    (a rate not achieved is saturation, however the throughput still creeps up);
    none when it fell short from the first (:func:`first_unserved` says so)."""
    rows = sorted((point_summary(p) for p in points), key=lambda r: r.load)
    short = first_unserved(points)
    index: int | None
    if short is not None:
        index, rule = [r.load for r in rows].index(short.load) - 1, SATURATION_RULE
        if index < 0:
            return None
    else:
        index = find_knee([r.load for r in rows], [r.work_rate for r in rows], min_gain)
        rule = KNEE_RULE
    if index is None:
        return None
    return Knee(**{f.name: getattr(rows[index], f.name) for f in dataclasses.fields(SweepRow)},
                rule=rule)


def first_unserved(points: list[BenchResult]) -> SweepRow | None:
    """Of an open-loop sweep, the lowest rate at which the endpoint completed under
    SERVED_SHARE of the requests sent in the measurement (judged from JUDGED_REQUESTS
    sent: fewer end too close to the window's edge); None for a concurrency sweep, or
    when every rate was served."""
    if not points or any(p.load.get("mode") != "open" or p.load.get("rate") is None
                         for p in points):
        return None
    for point in sorted(points, key=lambda p: point_summary(p).load):
        s = point.summary
        if s.requests >= JUDGED_REQUESTS and s.achieved_rate_rps and \
                s.throughput_rps < SERVED_SHARE * s.achieved_rate_rps:
            return point_summary(point)
    return None


class Sweep:
    """Runs a SweepPlan against one endpoint."""

    def __init__(self, adapter: Adapter, base: LoadSpec, plan: SweepPlan,
                 console: Console | None = None,
                 on_point: Callable[[BenchResult], None] | None = None,
                 price: Price | None = None, alpha: float = 0.5) -> None:
        self.price = price
        self.alpha = alpha
        self.adapter = adapter
        self.base = base
        self.plan = plan
        self.console = console
        self.on_point = on_point
        self.points: list[BenchResult] = []
        self._started = time.monotonic()

    def _spec(self, load: float) -> LoadSpec:
        if self.plan.mode == "concurrency":
            concurrency = max(round(load), 1)  # a worker holds at least one request
            return dataclasses.replace(self.base, concurrency=concurrency, rate=None,
                                       intervals=None,
                                       workers=min(self.base.workers, concurrency))
        return dataclasses.replace(self.base, rate=float(load), concurrency=None,
                                   intervals=None)

    def _most_levels(self) -> int:
        """Levels this sweep may measure: every level, and an SLA search's bisections."""
        plan = self.plan
        return len(plan.levels) + (plan.bisect_steps if plan.sla_p99_ms is not None else 0)

    def measure(self, load: float) -> BenchResult:
        """One full benchmark at ``load``."""
        if self.console:
            if not self.points:
                self._started = time.monotonic()
            self.console.print(f"{self.plan.mode} {load:g}: " + progress_text(
                len(self.points), self._most_levels(), time.monotonic() - self._started,
                "levels at most"), highlight=False)
        result, _, _ = run_benchmark(self.adapter, self._spec(load), self.console)
        if self.console:
            row = point_summary(result)
            tokens = (f", {row.tokens.output_tokens_per_s:,.1f} tok/s, TTFT p50 "
                      f"{row.tokens.ttft_p50_ms or float('nan'):.0f} ms"
                      if row.tokens else "")
            self.console.print(
                f"  {self.plan.mode} {load:g}: {row.throughput_rps:,.1f} req/s{tokens}, p50 "
                f"{row.p50_ms or float('nan'):.2f} ms, p99 {row.p99_ms or float('nan'):.2f}"
                f" ms, errors {row.error_percent:.1f}%")
        self.points.append(result)
        if self.on_point:
            self.on_point(result)
        return result

    def _fails(self, row: SweepRow, limit_p99: float | None) -> str | None:
        if row.error_percent > self.plan.max_error_percent:
            return (f"error rate {row.error_percent:.1f}% > "
                    f"{self.plan.max_error_percent:g}% at {self.plan.mode} {row.load:g}")
        p99 = row.p99_ms
        if limit_p99 is not None and (p99 is None or p99 > limit_p99):
            shown = "no successful requests" if p99 is None else f"p99 {p99:.2f} ms"
            return f"{shown} > {limit_p99:g} ms at {self.plan.mode} {row.load:g}"
        return None

    def run(self) -> SweepResult:
        """All the points, the knee, why it stopped, and the SLA answer when asked."""
        if self.plan.sla_p99_ms is not None:
            stop_reason, sla = self._search_sla()
        else:
            stop_reason, sla = self._walk(), None
        return self._result(stop_reason, sla)

    def _walk(self) -> str:
        for load in self.plan.levels:
            row = point_summary(self.measure(load))
            why = self._fails(row, self.plan.max_p99_ms)
            if why:
                return why
            if self.plan.profile is not None:
                continue  # a profile measures every rate between its anchors
            rows = [point_summary(p) for p in self.points]
            loads = [r.load for r in rows]
            knee = find_knee(loads, [r.work_rate for r in rows], self.plan.min_gain)
            if knee is not None and len(self.points) - 1 - knee >= self.plan.patience:
                return (f"throughput stopped growing: {self.plan.patience} points past "
                        f"{self.plan.mode} {loads[knee]:g} gained under "
                        f"{self.plan.min_gain:.0%} per doubling")
        return "every rate of the profile measured" if self.plan.profile is not None \
            else "last level reached"

    def _search_sla(self) -> tuple[str, SlaAnswer]:
        limit = self.plan.sla_p99_ms
        best: float | None = None
        failed: float | None = None
        why = ""
        for load in self.plan.levels:
            why = self._fails(point_summary(self.measure(load)), limit) or ""
            if why:
                failed = load
                break
            best = load
        high = failed
        if failed is not None and best is not None:
            low, high = best, failed
            for _ in range(self.plan.bisect_steps):
                middle = (low + high) / 2
                if self.plan.mode == "concurrency":
                    middle = round(middle)
                    if middle in (low, high):
                        break
                failure = self._fails(point_summary(self.measure(middle)), limit)
                if failure:
                    high, why = middle, failure  # the reason is the failed level's own
                else:
                    low = middle
            best = low
        if best is None:
            reason = f"no load met the SLA: {why}"
        elif failed is None:
            reason = "every level met the SLA"
        else:
            reason = (f"highest load meeting the SLA: {best:g} passed, {high:g} failed "
                      f"({why})")
        best_point = next((p for p in self.points if point_summary(p).load == best), None)
        assert limit is not None
        return reason, SlaAnswer(limit, self.plan.max_error_percent, best,
                                 point_summary(best_point) if best_point else None)

    def _result(self, stop_reason: str, sla: SlaAnswer | None) -> SweepResult:
        ordered = sorted(self.points, key=lambda p: point_summary(p).load)
        rows = [point_summary(p) for p in ordered]
        ranking = None
        if self.price is not None:
            limit = self.plan.sla_p99_ms or self.plan.max_p99_ms
            ranking = rank([{"name": f"{self.plan.mode} {r.load:g}", "load": r.load,
                             "throughput_rps": r.throughput_rps, "p99_ms": r.p99_ms,
                             "error_percent": r.error_percent, "price": self.price}
                            for r in rows], self.alpha, limit,
                           self.plan.max_error_percent if limit is not None else None)
            cost = {c["load"]: c["cost_per_million"] for c in ranking}
            rows = [dataclasses.replace(r, priced=True, cost_per_million=cost[r.load])
                    for r in rows]
        return SweepResult(
            endpoint=ordered[0].endpoint if ordered else self.adapter.describe(),
            mode=self.plan.mode,
            plan=self.plan.to_dict(),
            environment=environment(),
            points=ordered,
            rows=rows,
            knee=knee_of(ordered, self.plan.min_gain),
            stop_reason=stop_reason,
            sla=sla,
            price=self.price.to_dict() if self.price else None,
            ranking=ranking,
            score={"alpha": self.alpha, "sla_p99_ms": self.plan.sla_p99_ms or
                   self.plan.max_p99_ms, "max_error_percent": self.plan.max_error_percent},
        )
