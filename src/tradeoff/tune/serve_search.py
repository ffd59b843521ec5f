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

Every candidate loaded carries a marker in its ``parameters`` (``tradeoff_tune``: who
applied it, and ``tradeoff_tune_original``: the config the server had), so the
repository index and the model's config show that the server is on a trial config, and
:func:`restore_original` can put the original back even after the tuner was killed.

    goal = Goal(sla_p99_ms=20, rate=None, budget_s=600)
    result = ServeSearch(target, base_load, goal, Space()).run()
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import math
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.sweep import Sweep, SweepPlan, point_summary
from tradeoff.errors import TradeoffError, TuneError, local_resource
from tradeoff.repository.edit import PBTXT, YAML_FILES, config_text
from tradeoff.results import ServeTune, SweepRow, Trial, environment
from tradeoff.server.models import TUNE_MARKER, TUNE_ORIGINAL
from tradeoff.stats.pareto import front
from tradeoff.stats.progress import progress_text
from tradeoff.tune.goal import Goal

__all__ = [
    "KNOBS",
    "WRITTEN_BY",
    "Knobs",
    "ModelControl",
    "Progress",
    "ServeSearch",
    "Space",
    "check_apply_target",
    "pareto_front",
    "probe_concurrency",
    "restore_original",
    "tune_marker",
    "write_winner",
]

Progress = Callable[[str], None]
KNOBS = ("max_batch_size", "max_queue_delay_us", "instances", "threads", "preferred")


@dataclass(frozen=True)
class Knobs:
    """One serving configuration: the values the search moves."""

    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    threads: int
    preferred: bool  # preferred_batch_size = max_batch_size

    def normal(self) -> Knobs:
        """The same configuration written one way: without batching there is no delay
        and no preferred size."""
        if self.max_batch_size <= 1:
            return dataclasses.replace(self, max_queue_delay_us=0, preferred=False)
        return self

    @property
    def name(self) -> str:
        return (f"batch {self.max_batch_size}, delay {self.max_queue_delay_us} us, "
                f"{self.instances} inst x {self.threads} thr"
                + (", preferred" if self.preferred else ""))

    @property
    def cores(self) -> int:
        return self.instances * self.threads

    def config(self, original: dict[str, Any]) -> dict[str, Any]:
        """``original`` (Triton's JSON config) with these knobs."""
        config = json.loads(json.dumps(original))
        config["max_batch_size"] = self.max_batch_size
        batching = dict(config.get("dynamic_batching") or {})
        batching["max_queue_delay_microseconds"] = self.max_queue_delay_us
        batching["preferred_batch_size"] = [self.max_batch_size] if self.preferred else []
        config["dynamic_batching"] = batching
        groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
        group = {"kind": groups[0].get("kind", "KIND_CPU"), "count": self.instances}
        if groups[0].get("gpus"):  # count is per listed GPU: the instances stay on them
            group["gpus"] = groups[0]["gpus"]
        config["instance_group"] = [group]
        parameters = dict(config.get("parameters") or {})
        parameters["intra_op_thread_count"] = {"string_value": str(self.threads)}
        config["parameters"] = parameters
        for warmup in config.get("model_warmup") or []:
            warmup["batch_size"] = min(warmup.get("batch_size", 1), self.max_batch_size)
        return config

    @classmethod
    def of(cls, config: dict[str, Any]) -> Knobs:
        """The knobs of a Triton JSON config as the server reports it (without
        ``dynamic_batching`` a model runs each request alone: batch 1)."""
        batching = config.get("dynamic_batching")
        groups = config.get("instance_group") or [{}]
        threads = (config.get("parameters") or {}).get("intra_op_thread_count", {})
        max_batch = int(config.get("max_batch_size", 0)) if batching is not None else 1
        batching = batching or {}
        return cls(max(max_batch, 1), int(batching.get("max_queue_delay_microseconds", 0)),
                   sum(int(g.get("count", 1)) for g in groups),
                   int(threads.get("string_value", 1) or 1),
                   bool(batching.get("preferred_batch_size"))
                   and list(batching["preferred_batch_size"]) == [max_batch]).normal()


@dataclass(frozen=True)
class Space:
    """The values each knob may take."""

    max_batch_size: tuple[int, ...] = (1, 4, 16, 64)
    max_queue_delay_us: tuple[int, ...] = (0, 500, 2000, 10000)
    instances: tuple[int, ...] = (1, 2)
    threads: tuple[int, ...] = (1, 2)
    preferred: tuple[bool, ...] = (False, True)

    def __post_init__(self) -> None:
        for knob in KNOBS:
            values = getattr(self, knob)
            if not values:
                raise TuneError(f"no values to try for {knob}")
            if knob != "preferred" and min(values) < (0 if knob == "max_queue_delay_us"
                                                      else 1):
                raise TuneError(f"{knob}: {list(values)} holds a value below the least "
                                "allowed")

    def grid(self) -> list[Knobs]:
        """Every distinct combination, in order."""
        seen: dict[Knobs, None] = {}
        for values in itertools.product(*(getattr(self, k) for k in KNOBS)):
            seen.setdefault(Knobs(**dict(zip(KNOBS, values, strict=True))).normal())
        return list(seen)


class ModelControl:
    """The server's config and repository-load calls for one model."""

    def __init__(self, url: str, model: str, timeout_s: float = 300.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.headers = headers or {}

    @classmethod
    def of(cls, target: EndpointSpec) -> ModelControl:
        """The control of the model an endpoint names (a bare host:port is plain HTTP)."""
        url = target.url if target.url.startswith("http") else f"http://{target.url}"
        return cls(url, target.model or "", headers=dict(target.headers or {}))

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
                return response.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, {"error": text[:300]}
        except (urllib.error.URLError, OSError) as exc:
            raise TuneError(f"{method} {self.url}{path}: {exc}") from None

    def config(self) -> dict[str, Any]:
        status, body = self._call("GET", f"/v2/models/{self.model}/config")
        if status != 200:
            raise TuneError(f"cannot read the config of {self.model!r}: HTTP {status} "
                            f"{body.get('error', body)}")
        return dict(body)

    def load(self, config: dict[str, Any] | None) -> str | None:
        """Load the model with ``config`` (None: its file); the server's refusal, or None."""
        body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
        status, answer = self._call("POST", f"/v2/repository/models/{self.model}/load", body)
        if status == 200:
            return None
        return f"HTTP {status}: {answer.get('error', answer)}"


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
        self.marker = {
            TUNE_MARKER: {"string_value": (
                f"tradeoff tune serve, pid {os.getpid()} on {socket.gethostname()}, since "
                f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")},
            TUNE_ORIGINAL: {"string_value": json.dumps(original, separators=(",", ":"))}}
        try:
            stop = self._grid(original) if self.goal.strategy == "grid" else \
                self._coordinate(baseline, original)
            stop += self._confirm(baseline, original)
        finally:
            self._restore(original)  # the server goes back to what it had
        return self._result(baseline, stop)

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
            grid_size=len(self.space.grid()), written=None)


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


WRITTEN_BY = "# written by tradeoff tune serve"


def tune_marker(config: dict[str, Any]) -> str | None:
    """Who applied ``config`` (Triton's JSON, as the server reports it) when a tune serve
    did; None for a config of the model's own."""
    entry = (config.get("parameters") or {}).get(TUNE_MARKER)
    return None if entry is None else str(entry.get("string_value", "")) or "tune serve"


def restore_original(control: ModelControl) -> str:
    """Load back the config a tune serve found (kept in its marker) when the server is
    still on one of its trial configs; says what it did."""
    current = control.config()
    applied = tune_marker(current)
    if applied is None:
        raise TuneError(f"{control.model!r} is on its own config, not one applied by tune "
                        "serve: nothing to restore")
    text = (current.get("parameters") or {}).get(TUNE_ORIGINAL, {}).get("string_value")
    try:
        original = json.loads(text or "")
    except ValueError:
        original = None
    if not isinstance(original, dict):
        raise TuneError(f"{control.model!r}: the tune serve marker holds no original config; "
                        f"load the model's file instead: POST {control.url}/v2/repository/"
                        f"models/{control.model}/load")
    refused = control.load(original)
    if refused is not None:
        raise TuneError(f"could not restore the original config of {control.model!r}: "
                        f"{refused}")
    return (f"{control.model}: the config applied by {applied} replaced by the original "
            f"(max_batch_size {original.get('max_batch_size', 0)})")


def check_apply_target(model_dir: Path, model: str) -> None:
    """TuneError unless ``model_dir`` is ``model``'s directory in a repository (named after
    it, holding its config or versions) or a new, empty directory."""
    where = f"--apply-to {model_dir}"
    if model_dir.exists() and not model_dir.is_dir():
        raise TuneError(f"{where}: not a directory")
    if not model_dir.exists() or not any(model_dir.iterdir()):
        return
    if model_dir.name != model:
        raise TuneError(f"{where}: not the directory of model {model!r} (a model's directory "
                        f"is named after it); give REPOSITORY/{model} or a new, empty "
                        "directory")
    configs = [model_dir / n for n in (PBTXT, *YAML_FILES) if (model_dir / n).is_file()]
    versions = [d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if not configs and not versions:
        raise TuneError(f"{where}: holds neither a config nor a version directory: not the "
                        f"directory of model {model!r}")
    from tradeoff.repository.config import load_config_file

    for path in configs:  # the loader refuses a name that is not the directory's
        try:
            load_config_file(path, default_name=model)
        except TradeoffError as exc:
            raise TuneError(f"{where}: {path.name} is not a config of model {model!r}: "
                            f"{exc}") from None


def _free_name(path: Path) -> Path:
    """``path`` + ``.orig``, or ``.orig.2``, ``.orig.3``... the first that does not exist."""
    candidate, n = path.with_name(path.name + ".orig"), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.orig.{n}")
    return candidate


def _ours(path: Path) -> bool:
    try:
        with path.open() as handle:
            return handle.readline().startswith(WRITTEN_BY)
    except (OSError, UnicodeDecodeError):
        return False


def write_winner(result: ServeTune, original: dict[str, Any], directory: Path,
                 model_dir: Path | None = None) -> ServeTune:
    """Write the winner's ``config.pbtxt`` (and the config the server had, as
    ``original.pbtxt``) into ``directory``, which holds no other files of those names;
    with ``model_dir`` (REPOSITORY/MODEL, see :func:`check_apply_target`) also as the
    model's config, each config file there kept under a new name (``.orig``, then
    ``.orig.2``...): nothing is deleted or overwritten. Returns ``result`` saying where
    the winner went."""
    trial = result.trial(result.winner)
    if trial is None:
        return result
    winner = Knobs(**trial.knobs).config(original)
    header = f"{WRITTEN_BY}: {trial.name} for model {result.model!r}\n"
    outputs = {directory / "config.pbtxt": header + config_text(winner),
               directory / "original.pbtxt": f"{WRITTEN_BY}: the config {result.model!r} "
                                            "had on the server\n" + config_text(original)}
    for path in outputs:
        if path.exists() and not _ours(path):
            raise TuneError(f"--output {directory}: {path.name} there was not written by "
                            "tune serve; give another directory")
    if model_dir is not None:
        check_apply_target(model_dir, result.model)
    with local_resource(f"cannot write the winner's config into {directory}"):
        directory.mkdir(parents=True, exist_ok=True)
        for path, text in outputs.items():
            path.write_text(text)
    written = directory / "config.pbtxt"
    if model_dir is not None:
        with local_resource(f"--apply-to {model_dir}: cannot write the winner's config"):
            model_dir.mkdir(parents=True, exist_ok=True)
            for name in (PBTXT, *YAML_FILES):
                current = model_dir / name
                if current.is_file():
                    current.rename(_free_name(current))
            written = model_dir / PBTXT
            written.write_text(outputs[directory / "config.pbtxt"])
    return dataclasses.replace(result, written=str(written))
