"""``tradeoff tune serve``: the serving configuration that meets a p99 SLA at the lowest
cost, searched on a running ``tradeoff serve``.

Each candidate is a set of knobs (``max_batch_size``, ``max_queue_delay_microseconds``,
``preferred_batch_size``, ``instance_group.count``, intra-op threads) applied live through
the repository extension's load with a ``config`` parameter (no restart), then measured
with the bench engine:

* ``rate``: one open-loop run at the asked rate; the candidate meets the SLA when p99 and
  the error rate stay within it;
* max throughput (no rate): a closed-loop probe (enough requests in flight to fill two
  batches on every instance) finds the candidate's capacity, then the
  sweep's SLA search (steps up through rates, then bisects) finds the highest rate whose
  p99 meets the SLA; that rate's throughput is the candidate's.

Search: ``coordinate`` descent (the default) starts from the server's config and, one knob
at a time, tries that knob's values with the others held at the best so far, keeps the
best, and goes round again until a round improves nothing; ``grid`` tries every
combination. Both stop at the time budget. Then the ``confirm`` best configurations and the server's
own are measured once more each and judged on the medians: with one short measurement
each, the search favours whichever caught a fast moment of the machine (the winner's
curse). "Best" is the highest throughput under the SLA
(max throughput), or the lowest cost per million requests and then the lowest p99 (at a
rate). A candidate the server refuses is recorded with its reason and skipped.

Every candidate loaded carries a marker in its ``parameters``
(:mod:`tradeoff.tune.marker`), so the server shows it is on a trial config and the
original can be put back even after the tuner was killed; the server's own config is
loaded back when the search ends. The candidates are :class:`~tradeoff.tune.knobs.Knobs`,
loaded through :class:`~tradeoff.bench.v2.ModelControl`; the winner is written by
:mod:`tradeoff.tune.winner`.

    goal = Goal(sla_p99_ms=20, rate=None, budget_s=600)
    result = ServeSearch(target, base_load, goal, Space()).run()
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.sweep import Sweep, SweepPlan, point_summary
from tradeoff.bench.v2 import ModelControl
from tradeoff.errors import TuneError
from tradeoff.results import Recommendation, ServeTune, SweepRow, Trial, environment
from tradeoff.stats.pareto import front
from tradeoff.stats.progress import progress_text
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import KNOBS, Knobs, Space
from tradeoff.tune.marker import trial_marker, tune_marker

__all__ = ["DEFAULT_HEADROOM", "MAX_HEADROOM", "MIN_HEADROOM", "Progress", "ServeSearch",
           "pareto_front", "probe_concurrency"]

# the share a recommended rate keeps below the winner's lowest measured one: the spread
# between its measurements, within these bounds; after one measurement, the default
MIN_HEADROOM = 0.05
MAX_HEADROOM = 0.5
DEFAULT_HEADROOM = 0.15

Progress = Callable[[str], None]


class ServeSearch:
    """Runs the search on one model of a live server."""

    def __init__(self, target: EndpointSpec, base: LoadSpec, goal: Goal, space: Space,
                 progress: Progress | None = None, control: ModelControl | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if goal.price is not None and goal.price_per_core_hour is not None:
            raise TuneError("give one of --price-per-hour and --price-per-core-hour")
        if target.protocol != "v2":
            raise TuneError("tune serve drives a v2 HTTP endpoint (--protocol v2): it changes "
                            "the model's config through the HTTP repository extension")
        if not target.model:
            raise TuneError("give --model: the model whose config to tune")
        self.target = target
        self.base = base
        self.goal = goal
        self.space = space
        self.say = progress or (lambda _: None)
        self.checkpoint: Callable[[], None] = lambda: None  # raises to stop the search
        self.control = control or ModelControl.of(target)
        self.clock = clock
        self.trials: dict[Knobs, Trial] = {}
        self.rows: dict[Knobs, list[SweepRow]] = {}
        self.started = 0.0
        self.recommended: Recommendation | None = None
        self.original: dict[str, Any] = {}
        self.marker: dict[str, Any] = {}

    # ---------------------------------------------------------------- measuring

    def _left(self) -> float:
        return self.goal.budget_s - (self.clock() - self.started)

    def _typical_s(self) -> float:
        measured = [t.seconds for t in self.trials.values() if t.status == "measured"]
        return sum(measured) / len(measured) if measured else 0.0

    def try_knobs(self, knobs: Knobs, original: dict[str, Any]) -> Trial | None:
        """Measure one candidate (the recorded trial when it was tried); None when the
        budget cannot hold another measurement."""
        if knobs in self.trials:
            return self.trials[knobs]
        if self.trials and self._left() < self._typical_s():
            return None
        start = self.clock()
        elapsed = start - self.started
        self.say(f"trial {len(self.trials) + 1}: {knobs.name} (budget "
                 f"{progress_text(elapsed, self.goal.budget_s, elapsed)})")
        refused = self._apply(knobs, original)
        if refused is not None:
            trial = Trial(knobs.name, dataclasses.asdict(knobs), "refused", refused,
                          seconds=self.clock() - start)
        else:
            try:
                self.rows[knobs] = [self._measure(knobs)]
                trial = self._trial(knobs, self.rows[knobs], self.clock() - start)
            except TuneError as exc:
                trial = Trial(knobs.name, dataclasses.asdict(knobs), "failed", str(exc),
                              seconds=self.clock() - start)
        self.trials[knobs] = trial
        return trial

    def _measure(self, knobs: Knobs) -> SweepRow:
        self.checkpoint()
        adapter = make_adapter(self.target)
        if self.goal.rate is not None:
            spec = dataclasses.replace(self.base, rate=self.goal.rate, concurrency=None,
                                       intervals=None)
            result, _, _ = run_benchmark(adapter, spec)
            return point_summary(result)
        probe = dataclasses.replace(self.base, concurrency=probe_concurrency(knobs),
                                    rate=None, intervals=None)
        capacity = point_summary(run_benchmark(adapter, probe)[0]).throughput_rps
        if capacity <= 0:
            raise TuneError("the closed-loop probe served nothing")
        levels = [round(capacity * f, 1) for f in (0.4, 0.6, 0.8, 1.0)]
        sweep = Sweep(adapter, self.base, SweepPlan(
            "rate", levels, sla_p99_ms=self.goal.sla_p99_ms,
            max_error_percent=self.goal.max_error_percent, bisect_steps=2))
        answer = sweep.run().sla
        if answer is None or answer.best is None:
            return point_summary(sweep.points[0])  # the lowest rate: it missed the SLA
        return answer.best

    def _trial(self, knobs: Knobs, rows: list[SweepRow], seconds: float) -> Trial:
        """The trial of ``rows``, each one measurement: its figures are their medians."""
        def median(values: list[float | None]) -> float | None:
            known = [v for v in values if v is not None]
            return float(np.median(known)) if known else None

        row = SweepRow(load=rows[0].load,
                       throughput_rps=median([r.throughput_rps for r in rows]) or 0.0,
                       inferences_per_s=median([r.inferences_per_s for r in rows]) or 0.0,
                       p50_ms=median([r.p50_ms for r in rows]),
                       p99_ms=median([r.p99_ms for r in rows]),
                       error_percent=median([r.error_percent for r in rows]) or 0.0,
                       requests=sum(r.requests for r in rows))
        meets = (row.p99_ms is not None and row.p99_ms <= self.goal.sla_p99_ms
                 and row.error_percent <= self.goal.max_error_percent)
        why = None if meets else (
            f"p99 {row.p99_ms or math.nan:.2f} ms, errors {row.error_percent:.1f}% miss the "
            f"SLA (p99 <= {self.goal.sla_p99_ms:g} ms, errors <= "
            f"{self.goal.max_error_percent:g}%)")
        return Trial(knobs.name, dataclasses.asdict(knobs), "measured", why,
                     row.throughput_rps, row.p50_ms, row.p99_ms, row.error_percent,
                     self.goal.cost_per_million(knobs.cores, row.throughput_rps), meets,
                     seconds=seconds,
                     measurements=[{"throughput_rps": r.throughput_rps, "p50_ms": r.p50_ms,
                                    "p99_ms": r.p99_ms, "error_percent": r.error_percent}
                                   for r in rows])

    # ---------------------------------------------------------------- choosing

    def key(self, trial: Trial) -> tuple[float, ...]:
        """Sort key: smaller is better; a trial that misses the SLA sorts last."""
        if not trial.meets_sla:
            return (1, math.inf, math.inf)
        if self.goal.rate is None:
            return (0, -(trial.throughput_rps or 0), trial.p99_ms or math.inf)
        cost = trial.cost_per_million if trial.cost_per_million is not None else 0.0
        return (0, cost, trial.p99_ms or math.inf)

    def _best(self, knobs: list[Knobs]) -> Knobs:
        return min(knobs, key=lambda k: self.key(self.trials[k]))

    # ---------------------------------------------------------------- searching

    def run(self) -> ServeTune:
        self.started = self.clock()
        original = self.original = self.control.config()
        if int(original.get("max_batch_size", 0)) <= 0:
            raise TuneError(f"{self.target.model!r} does not batch (max_batch_size 0): its "
                            "inputs have no batch dimension, so there is no batch size or "
                            "queue delay to tune")
        applied = tune_marker(original)
        if applied is not None:
            raise TuneError(f"{self.target.model!r} is on a config applied by {applied}, not "
                            "its own; put the original back first: tradeoff tune serve "
                            f"--restore {self.control.url} --model {self.target.model}")
        baseline = Knobs.of(original)
        self.marker = trial_marker(original)
        try:
            stop = self._grid(original) if self.goal.strategy == "grid" else \
                self._coordinate(baseline, original)
            stop += self._confirm(baseline, original)
            if self.goal.rate is None:
                self.recommended = self._recommend(original)
        finally:
            self._restore(original)  # the server goes back to what it had
        return self._result(baseline, stop)

    def _recommend(self, original: dict[str, Any]) -> Recommendation | None:
        """The winner's rate to run at: the lowest of its measured SLA rates less a
        headroom for the spread between them (DEFAULT_HEADROOM after one measurement,
        at least MIN_HEADROOM), replayed there; lowered by the headroom once more if
        that replay misses the SLA."""
        measured = [k for k, t in self.trials.items() if t.status == "measured"]
        winner = self._best(measured) if measured else None
        trial = self.trials.get(winner) if winner is not None else None
        if winner is None or trial is None or not trial.meets_sla:
            return None
        rates = [m["throughput_rps"] for m in trial.measurements if m.get("throughput_rps")]
        if not rates:
            return None
        spread = (max(rates) - min(rates)) / float(np.median(rates)) if len(rates) > 1 \
            else None
        headroom = DEFAULT_HEADROOM if spread is None else \
            min(max(spread, MIN_HEADROOM), MAX_HEADROOM)
        rate = replayed_at = min(rates) * (1 - headroom)
        replay: SweepRow | None = None
        for _ in range(2):
            if self._left() < self._typical_s() or self._apply(winner, original) is not None:
                break
            self.say(f"replaying the winner at the rate recommended: {rate:,.1f} req/s")
            spec = dataclasses.replace(self.base, rate=rate, concurrency=None,
                                       intervals=None)
            replay = point_summary(run_benchmark(make_adapter(self.target), spec)[0])
            replayed_at = rate
            if self._holds(replay):
                break
            rate *= 1 - headroom
        return Recommendation(  # the rate replayed last, with what its replay found
            replayed_at, headroom, spread, len(rates),
            replay.p99_ms if replay else None, replay.error_percent if replay else None,
            self._holds(replay) if replay else None)

    def _holds(self, row: SweepRow) -> bool:
        return row.p99_ms is not None and row.p99_ms <= self.goal.sla_p99_ms and \
            row.error_percent <= self.goal.max_error_percent

    def _apply(self, knobs: Knobs, original: dict[str, Any]) -> str | None:
        """Load ``knobs`` on the server, marked as a tune serve trial; the refusal or None."""
        self.checkpoint()
        config = knobs.config(original)
        config["parameters"] = {**config.get("parameters", {}), **self.marker}
        return self.control.load(config)

    def _restore(self, original: dict[str, Any]) -> None:
        try:
            refused = self.control.load(original)
        except TuneError as exc:
            refused = str(exc)
        if refused is not None:
            raise TuneError(
                f"could not restore the original config of {self.target.model!r}: {refused}; "
                f"when the server answers: tradeoff tune serve --restore {self.control.url} "
                f"--model {self.target.model}")

    def _confirm(self, baseline: Knobs, original: dict[str, Any]) -> str:
        """Measure the best ``confirm`` configurations and the server's own once more
        each, in turn, and judge them on the medians: one short measurement per
        configuration favours whichever caught a fast moment of the machine."""
        if self.goal.confirm <= 0:
            return ""
        measured = [k for k, t in self.trials.items() if t.status == "measured"]
        best = sorted((k for k in measured if self.trials[k].meets_sla),
                      key=lambda k: self.key(self.trials[k]))[: self.goal.confirm]
        chosen = best + [baseline] if baseline in measured and baseline not in best else best
        if len(chosen) < 2:
            return ""
        done = 0
        for knobs in chosen:
            if self._left() < self._typical_s():
                break
            self.say(f"measuring again: {knobs.name}")
            start = self.clock()
            if self._apply(knobs, original) is not None:
                continue  # loaded before; a refusal now leaves its first figure
            try:
                self.rows[knobs].append(self._measure(knobs))
            except TuneError:
                continue
            spent = self.trials[knobs].seconds + self.clock() - start
            self.trials[knobs] = self._trial(knobs, self.rows[knobs], spent)
            done += 1
        if done == 0:
            return "; the budget left no time to measure the best again"
        if done < len(chosen):
            return (f"; {done} of the {len(chosen)} chosen measured again before the budget "
                    "ran out")
        also = " and the server's config" if baseline in chosen and baseline not in best else ""
        return f"; the {len(best)} best{also} measured again"

    def _coordinate(self, baseline: Knobs, original: dict[str, Any]) -> str:
        if self.try_knobs(baseline, original) is None:
            return f"budget of {self.goal.budget_s:g} s spent"
        best = baseline
        rounds = 0
        while True:
            rounds += 1
            start_of_round = best
            for knob in KNOBS:
                for value in getattr(self.space, knob):
                    candidate = dataclasses.replace(best, **{knob: value}).normal()
                    if self.try_knobs(candidate, original) is None:
                        return f"budget of {self.goal.budget_s:g} s spent"
                best = self._best([best, *[k for k in self.trials
                                           if self.trials[k].status == "measured"]])
            if best == start_of_round:
                return (f"coordinate descent converged after {rounds} round(s): no single "
                        "knob improved on the best")

    def _grid(self, original: dict[str, Any]) -> str:
        for knobs in self.space.grid():
            if self.try_knobs(knobs, original) is None:
                return f"budget of {self.goal.budget_s:g} s spent"
        return "every configuration of the grid tried"

    def _result(self, baseline: Knobs, stop: str) -> ServeTune:
        measured = [k for k, t in self.trials.items() if t.status == "measured"]
        winner = self._best(measured) if measured else None
        if winner is not None and not self.trials[winner].meets_sla:
            winner = None
        front = pareto_front([self.trials[k] for k in measured])
        trials = [dataclasses.replace(t, pareto=t.name in front) for t in self.trials.values()]
        return ServeTune(
            endpoint=make_adapter(self.target).describe(), model=self.target.model or "",
            goal=self.goal.serve_dict(), environment=environment(), trials=trials,
            baseline=baseline.name, winner=winner.name if winner else None,
            stop_reason=stop, elapsed_s=self.clock() - self.started,
            grid_size=len(self.space.grid()), written=None,
            recommended=self.recommended)


def probe_concurrency(knobs: Knobs) -> int:
    """Concurrency of the capacity probe: enough requests in flight to fill two batches on
    every instance (at least 8, at most 256), so a large batch is not judged at a load
    that could never fill it."""
    return min(256, max(8, 2 * knobs.max_batch_size * knobs.instances))


def pareto_front(trials: list[Trial]) -> set[str]:
    """Names of the trials no other beats on throughput, p99 and cost at once (more
    throughput, less p99, less cost; an unpriced cost counts as equal)."""
    return {t.name for t in front(trials, lambda t: (-(t.throughput_rps or 0),
                                                     t.p99_ms or math.inf,
                                                     t.cost_per_million or 0))}
