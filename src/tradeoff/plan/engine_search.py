"""The plan's search for a generative model: the versions and engine settings that meet a
TTFT and a TPOT SLA at the traffic's rate, predicted, ranked.

    versions, costs = measure_versions(work / "m", variants, max_drop=0.05, seconds=2.0,
                                       say=print)
    searcher = EngineSearcher(traffic, lengths, goal, calibration, (1, settings_of(config)))
    ranked = searcher.search(versions, costs)

The steps mirror the tensor search's (:mod:`tradeoff.plan.search`):

1. **Versions.** ``tradeoff optimize`` writes each precision as a sibling model and
   measures every one in process: the decode step at each batch of sequences, what a
   prompt chunk costs, and the perplexity on tradeoff's sentences. A version whose
   perplexity rises by more than ``max_drop`` (relative) is left out.
2. **Search.** Every kept version x ``max_num_seqs`` x ``max_num_batched_tokens`` x
   prefix caching (on and off where the prompts share a prefix) x, with classes, first
   come first served or the classes' priority is predicted by
   :func:`tradeoff.plan.continuous.simulate_engine`: the engine's own scheduler over the
   traffic's arrivals and the measured step costs, scaled by the calibration
   (:class:`GenerationCalibration`, measured by :mod:`tradeoff.plan.measure`). Ranked by
   meeting both SLAs, cost per 1M output tokens, TTFT p99, the fewest changes, the
   perplexity lost.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.generate.config import GenerativeConfig
from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
from tradeoff.plan.continuous import (
    EngineRun,
    EngineSettings,
    Lengths,
    StepCost,
    simulate_engine,
)
from tradeoff.plan.search import rank_key, supported_range, weigh
from tradeoff.plan.traffic import Traffic
from tradeoff.results import (
    OptimizeResult,
    PlanCandidate,
    PlanVersion,
    Prediction,
    VersionReport,
)
from tradeoff.tune.goal import Goal

__all__ = ["ENGINE_KNOBS", "SCALE_BOUNDS", "SIMULATED_REQUESTS", "EngineSearcher",
           "GenerationCalibration", "capacity_rps", "class_priorities", "engine_label",
           "measure_versions", "on_gpu", "settings_of", "step_cost"]

Progress = Callable[[str], None]
ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "prefix_caching", "scheduling")
SEQS = (1, 2, 4, 8, 16, 32, 64)
BATCHED_TOKENS = (128, 256, 512, 1024, 2048)
SIMULATED_REQUESTS = 600  # per prediction: each is a step-by-step run of the scheduler
MEASURED_SEQUENCES = 32  # the largest decode batch timed; the search goes to twice that


@dataclass(frozen=True)
class GenerationCalibration:
    """Measured on the starting deployment, one request at a time: the prompt in the
    server's tokens, and how much slower (or faster) the served engine's prompt and
    decode steps run than the in-process timings (its median TTFT and TPOT over the
    simulated ones). Every prediction runs on the step costs scaled by these."""

    prompt_tokens: int
    shared_prefix_tokens: int
    prefill_scale: float
    decode_scale: float
    requests: int  # answered in the calibration run
    # under the traffic's load the server's own work (requests, streams) takes a share of
    # the cores from the engine: its steps take load_scale times as long at the rate
    load_scale: float = 1.0
    load_rate_rps: float = 0.0  # the rate load_scale was measured at (0: not measured)
    # the time to first token the simulation leaves out under load (the request's way
    # in, its tokenizing, the first event's way out), measured less simulated
    ttft_extra_p50_ms: float = 0.0
    ttft_extra_p99_ms: float = 0.0
    # the least and the most of the p99's extra in the load run's windows (None: no run)
    ttft_extra_p99_range_ms: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens,
                "shared_prefix_tokens": self.shared_prefix_tokens,
                "prefill_scale": self.prefill_scale, "decode_scale": self.decode_scale,
                "requests": self.requests, "load_scale": self.load_scale,
                "load_rate_rps": self.load_rate_rps,
                "ttft_extra_p50_ms": self.ttft_extra_p50_ms,
                "ttft_extra_p99_ms": self.ttft_extra_p99_ms,
                "ttft_extra_p99_range_ms": None if self.ttft_extra_p99_range_ms is None
                else list(self.ttft_extra_p99_range_ms)}

    def cost(self, measured: StepCost) -> StepCost:
        """The in-process step cost as the served engine pays it under the load."""
        prefill, decode = (self.prefill_scale * self.load_scale,
                           self.decode_scale * self.load_scale)
        return replace(measured, decode_ms=tuple(t * decode for t in measured.decode_ms),
                       prefill_fixed_ms=measured.prefill_fixed_ms * prefill,
                       prefill_ms_per_token=measured.prefill_ms_per_token * prefill)

    def alone_answer_s(self, measured: StepCost, lengths: Lengths,
                       settings: EngineSettings) -> float:
        """Seconds one answer takes with nothing else running (prompt and every token)."""
        run = simulate_engine(np.zeros(1), replace(lengths, shared_prefix=0), settings,
                              self.cost(measured))
        return float(run.e2e_ms[0]) / 1e3

    def at_rate(self, rate_rps: float) -> GenerationCalibration:
        """This calibration with its load scale carried to another rate: the server's
        share of the cores grows with the rate (1 - 1/load_scale at load_rate_rps)."""
        if self.load_rate_rps <= 0 or self.load_scale <= 1:
            return self
        share = (1 - 1 / self.load_scale) * rate_rps / self.load_rate_rps
        return replace(self, load_scale=min(1 / max(1 - share, 1e-9), SCALE_BOUNDS[1]),
                       load_rate_rps=rate_rps)


SCALE_BOUNDS = (0.2, 5.0)  # a calibration further off than this is not trusted


def on_gpu(config: GenerativeConfig) -> bool:
    """Whether the engine runs on CUDA (``device: cuda``, or ``auto`` where torch sees a
    GPU)."""
    if config.device == "auto":
        import torch

        return bool(torch.cuda.is_available())
    return config.device.startswith("cuda")


def step_cost(version: PlanVersion, prefill_ms: dict[int, float], one_pass: bool = True
              ) -> StepCost:
    """A version's decode step per batch (``batch_ms``), and the prompt cost as the
    least-squares line through the measured chunk times (fixed ms + ms per token);
    ``one_pass``: a step with prompt chunks is one forward pass (the CPU engine)."""
    sizes = sorted(version.batch_ms)
    tokens = np.array(sorted(prefill_ms), dtype=np.float64)
    times = np.array([prefill_ms[int(t)] for t in tokens])
    if tokens.size >= 2:
        per_token, fixed = np.polyfit(tokens, times, 1)
    else:
        per_token, fixed = (times[0] / tokens[0] if tokens.size else 0.0), 0.0
    return StepCost(tuple(sizes), tuple(version.batch_ms[b] for b in sizes),
                    max(float(fixed), 0.0), max(float(per_token), 0.0), one_pass)


def _perplexity_rise(report: VersionReport) -> float:
    """How much the version's perplexity rose over the original's (0.05: 5% higher)."""
    for accuracy in report.accuracy:
        metrics = accuracy.metrics
        if "perplexity" in metrics and metrics.get("perplexity_original"):
            return max(0.0, metrics["perplexity"] / metrics["perplexity_original"] - 1.0)
    return 0.0


def measure_versions(work_model: Path, request_variants: tuple[Any, ...], max_drop: float,
                     seconds: float, say: Progress, one_pass: bool = True
                     ) -> tuple[list[PlanVersion], dict[int, StepCost]]:
    """Every precision asked for, made and measured by ``tradeoff optimize``: the plan's
    versions (``batch_ms``: a decode step at each batch) and each one's step cost."""
    optimized: OptimizeResult = optimize_model(work_model, OptimizePlan(
        variants=request_variants, max_drop=max_drop, seconds_per_version=seconds,
        max_sequences=MEASURED_SEQUENCES), say)
    versions = weigh(optimized, max_drop, _perplexity_rise, lambda r: f"perplexity {r:+.2%}")
    costs = {v.version: step_cost(v, report.prefill_ms or {}, one_pass)
             for v, report in zip(versions, optimized.versions, strict=True)}
    return versions, costs


def capacity_rps(cost: StepCost, settings: EngineSettings, lengths: Lengths) -> float:
    """Requests per second the engine serves at full batches: every step decodes
    ``max_num_seqs`` sequences, and each request's prompt costs its prefill once."""
    seqs = settings.max_num_seqs
    per_request_ms = (lengths.output * cost.decode(seqs) / seqs + cost.prefill_fixed_ms
                      + cost.prefill_ms_per_token * lengths.prompt)
    return 1e3 / per_request_ms


def engine_label(version: PlanVersion, settings: EngineSettings) -> str:
    """``v2 int8 s16 t512 pc prio``: version and precision, max_num_seqs,
    max_num_batched_tokens, prefix caching on, scheduling by the classes' priority."""
    return (f"v{version.version} {version.precision} s{settings.max_num_seqs} "
            f"t{settings.max_num_batched_tokens}" + (" pc" if settings.prefix_caching else "")
            + (" prio" if settings.scheduling == "priority" else ""))


def settings_of(config: GenerativeConfig) -> EngineSettings:
    """The engine settings a ``generate.yaml`` configures."""
    return EngineSettings(config.max_num_seqs, config.max_num_batched_tokens,
                          config.num_blocks, config.block_size, config.prefix_caching,
                          config.max_num_queued_requests, config.prefill_stretch,
                          config.scheduling)


def class_priorities(goal: Goal, classes: dict[str, float]) -> dict[str, int]:
    """Each class's priority in one engine (0 is served first): the tightest TTFT SLA
    first, then the tightest TPOT SLA, then the smaller share."""
    def key(name: str) -> tuple[float, float, float]:
        return (goal.sla_for(name), goal.tpot_for(name) or math.inf, classes[name])

    return {name: rank for rank, name in enumerate(sorted(classes, key=key))}


class EngineSearcher:
    """Predicts engine settings of one generative model under one traffic and goal."""

    def __init__(self, traffic: Traffic, lengths: Lengths, goal: Goal,
                 calibration: GenerationCalibration, start: tuple[int, EngineSettings],
                 seed: int = 0) -> None:
        self.traffic = traffic
        self.lengths = lengths
        self.goal = goal
        self.calibration = calibration
        self.start = start
        self.arrivals = traffic.arrivals(SIMULATED_REQUESTS, seed)
        # with two or more classes: each request's class, and the engine's order of them
        self.classes = list(traffic.classes) if len(traffic.classes) > 1 else []
        self.labels = traffic.classes_of(self.arrivals.size, seed)
        self.priority = class_priorities(goal, traffic.classes) if self.classes else {}
        self.priorities = np.array([self.priority.get(str(c), 0) for c in self.labels])

    def grid(self, cost: StepCost) -> list[EngineSettings]:
        """max_num_seqs up to twice the largest batch measured (64 at most) and the
        config's; token budgets from 128 to 2048 and the config's; prefix caching as
        configured, and the other way where the prompts share a block or more; with
        classes, first come first served and the classes' priority."""
        start = self.start[1]
        seqs = sorted({s for s in SEQS if s <= 2 * max(cost.sizes)} | {start.max_num_seqs})
        tokens = sorted({t for t in BATCHED_TOKENS if t >= start.block_size}
                        | {start.max_num_batched_tokens})
        prefix = [start.prefix_caching]
        if self.lengths.shared_prefix >= start.block_size:
            prefix.append(not start.prefix_caching)
        scheduling = ["fcfs", "priority"] if self.classes else [start.scheduling]
        return [replace(start, max_num_seqs=s, max_num_batched_tokens=t, prefix_caching=p,
                        scheduling=q)
                for s in seqs for t in tokens for p in prefix for q in scheduling]

    def predict(self, version: PlanVersion, cost: StepCost, settings: EngineSettings,
                runs: dict[EngineSettings, EngineRun] | None = None) -> PlanCandidate:
        """The settings' candidate, from a simulated run of the traffic. ``runs``: the
        runs of this version so far, by settings; the run of a smaller ``max_num_seqs``
        (all else the same) whose cap never held a request back is this one's too."""
        cost = self.calibration.cost(cost)
        busy = self.traffic.rate_rps / capacity_rps(cost, settings, self.lengths)
        by_class: dict[str, Prediction] = {}
        if busy >= 1:
            prediction = Prediction(math.inf, math.inf, float(settings.max_num_seqs), 0.0,
                                    busy, math.inf, math.inf)
            meets = False
        else:
            run = self._same_run(settings, runs or {}) or simulate_engine(
                self.arrivals, self.lengths, settings, cost,
                self.priorities if self.classes else None)
            if runs is not None:
                runs[settings] = run
            prediction = self._predicted(run, np.ones(self.arrivals.size, bool), busy)
            by_class = {c: self._predicted(run, self.labels == c, busy) for c in self.classes}
            meets = run.rejected == 0 and all(
                self._meets(p, c) for c, p in (by_class.items() or [("", prediction)]))
        token_rate = self.traffic.rate_rps * self.lengths.output
        return PlanCandidate(
            engine_label(version, settings), version.version, version.precision,
            version.drop, {k: getattr(settings, k) for k in ENGINE_KNOBS}, 0,
            self.goal.cores, prediction, self.goal.cost_per_million(self.goal.cores, token_rate),
            meets, self.changes(version, settings), class_predicted=by_class)

    def _predicted(self, run: EngineRun, mine: np.ndarray, busy: float) -> Prediction:
        """TTFT (with what the calibration found the simulation leaves out) and TPOT of
        the requests ``mine`` selects."""
        ttft, tpot = run.ttft_ms[mine], run.tpot_ms[mine]
        c = self.calibration
        simulated = run.percentile(ttft, 99)
        return Prediction(run.percentile(ttft, 50) + c.ttft_extra_p50_ms,
                          simulated + c.ttft_extra_p99_ms,
                          run.mean_running, run.prefix_hit_ratio, busy,
                          run.percentile(tpot, 50), run.percentile(tpot, 99),
                          supported_range(simulated, c.ttft_extra_p99_ms,
                                          c.ttft_extra_p99_range_ms))

    @staticmethod
    def _same_run(settings: EngineSettings, runs: dict[EngineSettings, EngineRun]
                  ) -> EngineRun | None:
        """A run already simulated that these settings would repeat step for step: one
        of a smaller ``max_num_seqs``, the rest equal, that never filled its cap while a
        request waited (the cap is the scheduler's only use of ``max_num_seqs``)."""
        for done, run in runs.items():
            if not run.seqs_bound and done.max_num_seqs < settings.max_num_seqs and \
                    replace(done, max_num_seqs=settings.max_num_seqs) == settings:
                return run
        return None

    def _meets(self, predicted: Prediction, request_class: str) -> bool:
        """Both SLAs of a class (``""``: the goal's own) met by its prediction."""
        tpot = self.goal.tpot_for(request_class)
        return predicted.p99_ms <= self.goal.sla_for(request_class) and \
            (tpot is None or (predicted.tpot_p99_ms or 0.0) <= tpot)

    def changes(self, version: PlanVersion, settings: EngineSettings) -> int:
        start_version, start = self.start
        return int(version.version != start_version) + sum(
            getattr(settings, k) != getattr(start, k) for k in ENGINE_KNOBS)

    def search(self, versions: list[PlanVersion], costs: dict[int, StepCost],
               say: Progress = lambda _: None) -> list[PlanCandidate]:
        out = []
        for version in versions:
            if not version.kept:
                continue
            grid = self.grid(costs[version.version])
            say(f"predicting version {version.version} ({version.precision}): "
                f"{len(grid)} engine settings")
            runs: dict[EngineSettings, EngineRun] = {}
            out += [self.predict(version, costs[version.version], s, runs)
                    for s in sorted(grid, key=lambda s: s.max_num_seqs)]
        return sorted(out, key=lambda c: rank_key(c, self.goal.strictest(self.classes),
                                                  self.goal))
