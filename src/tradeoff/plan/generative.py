"""``tradeoff plan`` for a generative model: the engine settings and precision that meet a
TTFT and a TPOT SLA at the traffic's rate, predicted, written and replayed.

    make_plan(PlanRequest(Path("models/smollm2-135m"), Traffic.law(2), Goal(
        sla_p99_ms=500, max_drop=0.05, sla_tpot_ms=60), lengths=Lengths(128, 64)))

The steps mirror the tensor plan's (:mod:`tradeoff.plan.planner`), each by the lever's
own code:

1. **Versions.** ``tradeoff optimize`` writes each precision as a sibling model and
   measures every one in process: the decode step at each batch of sequences, what a
   prompt chunk costs, and the perplexity on tradeoff's sentences. A version whose
   perplexity rises by more than ``max_drop`` (relative) is left out.
2. **Calibration.** The starting deployment is served and sent the traffic's prompts one
   at a time: the server's own prompt token count, and its median TTFT and TPOT over what
   the step costs give a request alone, factors that scale the step costs.
3. **Search.** Every kept version x ``max_num_seqs`` x ``max_num_batched_tokens`` x
   prefix caching (on and off where the prompts share a prefix) is predicted by
   :func:`tradeoff.plan.continuous.simulate_engine`: the engine's own scheduler over the
   traffic's arrivals and the measured step costs. Ranked by meeting both SLAs, cost per
   1M output tokens, TTFT p99, the fewest changes, the perplexity lost.
4. **Deployment and proof.** The best is written as ``generate.yaml`` (its settings and
   precision) beside the repository, served, and the traffic replayed against it and the
   starting deployment side by side, TTFT and TPOT measured against predicted.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from tradeoff.analysis.compare import run_compare
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.mix import RequestClass
from tradeoff.bench.prompts import synthetic_prompts
from tradeoff.bench.scrape import Snapshot, scrape
from tradeoff.bench.session import run_benchmark
from tradeoff.errors import TuneError, local_resource
from tradeoff.generate.config import GenerativeConfig
from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
from tradeoff.plan.continuous import (
    EngineRun,
    EngineSettings,
    Lengths,
    StepCost,
    simulate_engine,
)
from tradeoff.plan.deployment import pool_routes, write_router, written_by
from tradeoff.plan.search import class_replays, rank_key, weigh
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.repository import GENERATIVE_FILE
from tradeoff.repository.safe_yaml import read_yaml
from tradeoff.results import (
    OptimizeResult,
    PlanCandidate,
    PlanLever,
    PlanVersion,
    Prediction,
    Replayed,
    Summary,
    VersionReport,
)
from tradeoff.server.process import ServerProcess
from tradeoff.tune.goal import Goal

__all__ = ["ENGINE_KNOBS", "EngineSearcher", "GenerationCalibration", "calibrate",
           "calibrate_load",
           "capacity_rps", "class_priorities", "engine_label",
           "engine_levers", "engine_name", "generation_endpoint", "measure_versions", "on_gpu",
           "prefix_hit_ratio", "replay_generation", "replay_prompts", "settings_of",
           "step_cost", "write_engine_deployment"]

Progress = Callable[[str], None]
ENGINE_KNOBS = ("max_num_seqs", "max_num_batched_tokens", "prefix_caching", "scheduling")
SEQS = (1, 2, 4, 8, 16, 32, 64)
BATCHED_TOKENS = (128, 256, 512, 1024, 2048)
SIMULATED_REQUESTS = 600  # per prediction: each is a step-by-step run of the scheduler
MEASURED_SEQUENCES = 32  # the largest decode batch timed; the search goes to twice that
WARMUP = 12  # requests a written deployment answers before its replay


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

    def to_dict(self) -> dict[str, Any]:
        return {"prompt_tokens": self.prompt_tokens,
                "shared_prefix_tokens": self.shared_prefix_tokens,
                "prefill_scale": self.prefill_scale, "decode_scale": self.decode_scale,
                "requests": self.requests, "load_scale": self.load_scale,
                "load_rate_rps": self.load_rate_rps,
                "ttft_extra_p50_ms": self.ttft_extra_p50_ms,
                "ttft_extra_p99_ms": self.ttft_extra_p99_ms}

    def cost(self, measured: StepCost) -> StepCost:
        """The in-process step cost as the served engine pays it under the load."""
        prefill, decode = (self.prefill_scale * self.load_scale,
                           self.decode_scale * self.load_scale)
        return replace(measured, decode_ms=tuple(t * decode for t in measured.decode_ms),
                       prefill_fixed_ms=measured.prefill_fixed_ms * prefill,
                       prefill_ms_per_token=measured.prefill_ms_per_token * prefill)

    def at_rate(self, rate_rps: float) -> GenerationCalibration:
        """This calibration with its load scale carried to another rate: the server's
        share of the cores grows with the rate (1 - 1/load_scale at load_rate_rps)."""
        if self.load_rate_rps <= 0 or self.load_scale <= 1:
            return self
        share = (1 - 1 / self.load_scale) * rate_rps / self.load_rate_rps
        return replace(self, load_scale=min(1 / max(1 - share, 1e-9), SCALE_BOUNDS[1]),
                       load_rate_rps=rate_rps)


SCALE_BOUNDS = (0.2, 5.0)  # a calibration further off than this is not trusted


def _scale(measured: float | None, simulated: float) -> float:
    if measured is None or not math.isfinite(simulated) or simulated <= 0:
        return 1.0
    return min(max(measured / simulated, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])


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

    def predict(self, version: PlanVersion, cost: StepCost, settings: EngineSettings
                ) -> PlanCandidate:
        cost = self.calibration.cost(cost)
        busy = self.traffic.rate_rps / capacity_rps(cost, settings, self.lengths)
        by_class: dict[str, Prediction] = {}
        if busy >= 1:
            prediction = Prediction(math.inf, math.inf, float(settings.max_num_seqs), 0.0,
                                    busy, math.inf, math.inf)
            meets = False
        else:
            run = simulate_engine(self.arrivals, self.lengths, settings, cost,
                                  self.priorities if self.classes else None)
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
        return Prediction(run.percentile(ttft, 50) + c.ttft_extra_p50_ms,
                          run.percentile(ttft, 99) + c.ttft_extra_p99_ms,
                          run.mean_running, run.prefix_hit_ratio, busy,
                          run.percentile(tpot, 50), run.percentile(tpot, 99))

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
            out += [self.predict(version, costs[version.version], s) for s in grid]
        return sorted(out, key=lambda c: rank_key(c, self.goal.strictest(self.classes),
                                                  self.goal))


PREFIX_SEED = 7  # the shared prefix: the same words in every file of a plan


def replay_prompts(path: Path, lengths: Lengths, count: int = 256, seed: int = 0) -> Path:
    """A prompts file for the bench: ``count`` prompts of ``lengths.prompt`` words, the
    first ``lengths.shared_prefix`` of them the same in every one (and in every file),
    the rest drawn with ``seed``. The calibration, the warm-up and the replay each get
    their own seed: a prompt an engine has already seen would be found whole in its
    prefix cache, which the traffic's prompts would not be."""
    shared = synthetic_prompts(1, (max(lengths.shared_prefix, 1),) * 2, (1, 1),
                               PREFIX_SEED)[0]
    tail = max(lengths.prompt - lengths.shared_prefix, 1)
    items = synthetic_prompts(count, (tail, tail), (lengths.output,) * 2, seed)
    prefix = f"{shared.prompt} " if lengths.shared_prefix else ""
    with local_resource(f"cannot write the replay's prompts {path}"):
        path.write_text("\n".join(json.dumps({"prompt": prefix + (item.prompt or ""),
                                              "max_tokens": lengths.output})
                                  for item in items))
    return path


def generation_endpoint(url: str, model: str, role: str, prompts: Path, lengths: Lengths,
                        goal: Goal, classes: dict[str, float] | None = None,
                        class_sequence: tuple[int, ...] = ()) -> EndpointSpec:
    """The bench's view of a deployment: streamed completions of the prompts, the goal's
    SLA as the goodput's; with ``classes`` (their shares), each request drawn to one (or
    given one in turn by ``class_sequence``, a trace's) and carrying it (``class`` in the
    body, which the router reads)."""
    slo = {"ttft_ms": goal.sla_p99_ms}
    if goal.sla_tpot_ms is not None:
        slo["tpot_ms"] = goal.sla_tpot_ms
    mix = tuple(RequestClass(name, share, {"class": name})
                for name, share in (classes or {}).items()) \
        if classes and len(classes) > 1 else ()
    return EndpointSpec(f"{url}/v1", "openai", model, name=role, classes=mix,
                        class_sequence=class_sequence if mix else (),
                        generation=GenerationOptions(
                            prompts=prompts, output_tokens=(lengths.output, lengths.output),
                            ignore_eos=True, slo=slo))


def _percentiles(summary: Summary) -> tuple[float | None, ...]:
    g = summary.generation
    if g is None:
        return None, None, None, None
    ttft, tpot = g.ttft_ms or {}, g.tpot_ms or {}
    return ttft.get("p50"), ttft.get("p99"), tpot.get("p50"), tpot.get("p99")


def calibrate(server: ServerProcess, model: str, cost: StepCost, start: EngineSettings,
              lengths: Lengths, goal: Goal, prompts: Path
              ) -> tuple[GenerationCalibration, Lengths]:
    """The traffic's prompts one at a time for 4 s (after 1 s of warm-up) on the starting
    deployment: the server's count of the prompt's tokens (the plan's lengths are words
    until then), and its median TTFT and TPOT over what the step costs give a request
    alone (nothing queues, so the ratio is the steps' own)."""
    spec = generation_endpoint(server.url, model, "start", prompts, lengths, goal)
    result, _, _ = run_benchmark(make_adapter(spec), LoadSpec(concurrency=1, duration_s=4.0,
                                                              warmup_s=1.0))
    generation = result.summary.generation
    if generation is None or generation.input_tokens is None or \
            not generation.input_tokens.per_request or not generation.ttft_ms:
        raise TuneError(f"the starting deployment of {model} answered no generation; see "
                        f"the server log {server.log.name}")
    per_word = generation.input_tokens.per_request["mean"] / max(lengths.prompt, 1)
    served = Lengths(max(1, round(lengths.prompt * per_word)), lengths.output,
                     round(lengths.shared_prefix * per_word))
    # alone and without the prefix cache: the calibration's prompts had no cached prefix
    alone = simulate_engine(np.zeros(1), replace(served, shared_prefix=0), start, cost)
    return GenerationCalibration(
        served.prompt, served.shared_prefix,
        _scale(generation.ttft_ms.get("p50"), float(alone.ttft_ms[0])),
        _scale((generation.tpot_ms or {}).get("p50"), float(alone.tpot_ms[0])),
        result.summary.successes), served


def engine_name(model: str) -> str:
    """The engine's model name behind a router that sets each class's priority."""
    return f"{model}_engine"


LOAD_SECONDS = 8.0  # the at-rate calibration's measurement
LOAD_BUSY = 0.7  # ... at the traffic's rate, or the rate that keeps the start this busy


def calibrate_load(server: ServerProcess, model: str, cost: StepCost, start: EngineSettings,
                   calibration: GenerationCalibration, lengths: Lengths, goal: Goal,
                   traffic: Traffic, prompts: Path) -> GenerationCalibration:
    """The starting deployment at the traffic's rate (or the rate that keeps it 70%
    busy) for 8 s, after 1 s: how much longer its steps take under load than alone (its
    TPOT p50 over the simulated one at that rate, refined once), carried to the
    traffic's rate by :meth:`GenerationCalibration.at_rate`; then its TTFT p50 and p99
    less the simulated ones, what every prediction adds. One request at a time the
    server's own work waits for the engine; under load it takes a share of the cores."""
    scaled = calibration.cost(cost)
    rate = min(traffic.rate_rps, LOAD_BUSY * capacity_rps(scaled, start, lengths))
    spec = generation_endpoint(server.url, model, "start", prompts, lengths, goal)
    result, _, _ = run_benchmark(make_adapter(spec), LoadSpec(
        rate=rate, arrival="poisson", duration_s=LOAD_SECONDS, warmup_s=1.0))
    generation = result.summary.generation
    measured = (generation.tpot_ms or {}).get("p50") if generation else None
    ttft = (generation.ttft_ms or {}) if generation else {}
    if measured is None:
        return calibration
    arrivals = Traffic.law(rate).arrivals(SIMULATED_REQUESTS)
    factor = 1.0
    for _ in range(2):  # a longer step lengthens the batches too: refine once
        run = simulate_engine(arrivals, lengths, start, replace(
            calibration, load_scale=factor).cost(cost))
        simulated = run.percentile(run.tpot_ms, 50)
        factor = min(max(factor * _scale(measured, simulated), 1.0), SCALE_BOUNDS[1])
    run = simulate_engine(arrivals, lengths, start, replace(
        calibration, load_scale=factor).cost(cost))
    extra = {q: max(0.0, ttft[f"p{q}"] - run.percentile(run.ttft_ms, q))
             if ttft.get(f"p{q}") is not None else 0.0 for q in (50, 99)}
    return replace(calibration, load_scale=factor, load_rate_rps=rate,
                   ttft_extra_p50_ms=extra[50], ttft_extra_p99_ms=extra[99]).at_rate(
        traffic.rate_rps)


def write_engine_deployment(target: Path, source: Path, candidate: PlanCandidate,
                            priorities: dict[str, int] | None = None) -> Path:
    """A repository at ``target`` with the model (its files copied from ``source``, the
    original model directory) and a ``generate.yaml`` of the candidate's settings and
    precision. Scheduled by priority (``priorities``: each class's), the engine is
    ``MODEL_engine`` behind a router named MODEL whose routes give each class its
    priority (a request of no known class gets the last's), so clients keep the name.
    With a pool per class, each class's engine is ``MODEL_CLASS`` behind that router."""
    routes: list[dict[str, Any]] = []
    with local_resource(f"cannot write the deployment into {target}"):
        if candidate.pools:  # an engine per class
            routes = pool_routes(source.name, candidate, lambda name, pool: _write_engine(
                target / name, source, pool, candidate.name))
        elif candidate.knobs["scheduling"] == "priority" and priorities:
            name = engine_name(source.name)
            _write_engine(target / name, source, candidate, candidate.name)
            order = sorted(priorities, key=priorities.__getitem__)
            routes = [{"when": {"class": c}, "to": name, "priority": priorities[c]}
                      for c in order]
            routes.append({"to": name, "priority": priorities[order[-1]]})
        else:
            _write_engine(target / source.name, source, candidate, candidate.name)
        if routes:
            write_router(target, source.name, candidate.name, routes)
    return target


def _write_engine(model_dir: Path, source: Path, candidate: PlanCandidate, plan: str) -> None:
    """The model's files and a ``generate.yaml`` of the candidate's settings, precision
    and threads (an engine among several: its share of the cores)."""
    doc = read_yaml(source / GENERATIVE_FILE) or {}
    doc.update({k: candidate.knobs[k] for k in ENGINE_KNOBS}, precision=candidate.precision)
    if candidate.knobs.get("threads"):
        doc["threads"] = candidate.knobs["threads"]
    shutil.copytree(source, model_dir, ignore=shutil.ignore_patterns(GENERATIVE_FILE))
    (model_dir / GENERATIVE_FILE).write_text(written_by(plan)
                                             + yaml.safe_dump(doc, sort_keys=False))


def replay_generation(baseline: ServerProcess, target: Path, model: str,
                      candidate: PlanCandidate, start: PlanCandidate, goal: Goal,
                      lengths: Lengths, prompts: Path, warmup_prompts: Path, load: LoadSpec,
                      cpus: str | None, classes: dict[str, float] | None = None,
                      class_sequence: tuple[int, ...] = ()) -> list[Replayed]:
    """The starting deployment and the candidate's side by side, the prompts replayed at
    the traffic's arrivals: TTFT (p50, p99) and TPOT against both SLAs, and the prefix
    cache's hits read from each server's ``/metrics``; with two or more ``classes``,
    each request carries its class (drawn by the shares, or a trace's in its order:
    ``class_sequence``) and each class is measured against its own SLAs."""
    with ServerProcess(target, cpus=cpus) as plan_server:
        endpoints = [generation_endpoint(url, model, role, prompts, lengths, goal, classes,
                                         class_sequence)
                     for url, role in ((baseline.url, "baseline"), (plan_server.url, "plan"))]
        # the start was warmed by the calibration: the plan's first answers (lazy set-up,
        # the prefill pacer learning its costs) are not its steady state either
        warm = generation_endpoint(plan_server.url, model, "warm-up", warmup_prompts, lengths,
                                   goal, classes)  # with classes: every engine's
        run_benchmark(make_adapter(warm), LoadSpec(concurrency=2, requests=WARMUP,
                                                   warmup_s=0.0))
        servers = (baseline, plan_server)
        before = [scrape(server.metrics_url) for server in servers]
        # one round each: a second would send the same prompts again, found whole in the
        # prefix cache
        compared = run_compare(endpoints, load, rounds=1)
        engines = ([model], _engines(target))
        hits = [prefix_hit_ratio(b, scrape(server.metrics_url), names)
                for b, server, names in zip(before, servers, engines, strict=True)]
    out = []
    for entry, predicted, role, hit in zip(compared.endpoints, (start, candidate),
                                           ("baseline", "plan"), hits, strict=True):
        summary = entry.result.summary
        ttft50, ttft99, _, tpot99 = _percentiles(summary)
        generation = summary.generation
        tokens_per_s = generation.output_tokens_per_s if generation else 0.0
        per_class = class_replays(entry.result.classes or [], predicted, goal)
        meets = all(c.meets_sla for c in per_class) if per_class else \
            ttft99 is not None and ttft99 <= goal.sla_p99_ms and \
            summary.error_percent <= 1.0 and (goal.sla_tpot_ms is None or (
                tpot99 is not None and tpot99 <= goal.sla_tpot_ms))
        out.append(Replayed(
            predicted.name, role, ttft50, ttft99, summary.throughput_rps,
            summary.error_percent, hit, None, predicted.predicted, meets,
            goal.cost_per_million(predicted.cores, tokens_per_s), per_class,
            tpot_p99_ms=tpot99, output_tokens_per_s=tokens_per_s,
            goodput_rps=generation.goodput_rps if generation else None))
    return out


def _engines(repository: Path) -> list[str]:
    """The generative models a written deployment serves."""
    return sorted(d.name for d in repository.iterdir() if (d / GENERATIVE_FILE).is_file())


def prefix_hit_ratio(before: Snapshot, after: Snapshot, models: list[str]) -> float | None:
    """The share of prompt tokens the engines found in their prefix caches between two
    readings of the server's ``/metrics`` (None when they looked nothing up)."""
    queries, hits = (sum((after.value(name, {"model": m}) or 0.0)
                         - (before.value(name, {"model": m}) or 0.0) for m in models)
                     for name in ("tradeoff_generation_prefix_cache_queries_total",
                                  "tradeoff_generation_prefix_cache_hits_total"))
    return hits / queries if queries > 0 else None


def engine_levers(versions: list[PlanVersion], start: PlanCandidate,
                  chosen: PlanCandidate | None, lengths: Lengths,
                  priorities: dict[str, int] | None = None, pools_why: str = "",
                  pools_weighed: bool = False) -> list[PlanLever]:
    """Precision, the engine's batch (sequences and token budget), prefix caching and,
    with classes (``priorities``: each one's in the engine), scheduling by class and an
    engine per class (``pools_why``: what their search found; ``pools_weighed``: whether
    any was ranked): taken or left, and why. With an engine per class the first three
    read the strictest class's engine."""
    if chosen is None:
        return [PlanLever("plan", False, "no deployment was replayed")]
    left = [v for v in versions if not v.kept]
    old, new = start.knobs, chosen.knobs
    p = chosen.predicted
    classes = [_scheduling_lever(start, chosen, priorities),
               PlanLever("classes", bool(chosen.pools), pools_why + (
                   "" if not pools_weighed else "; the engine per class ranked best"
                   if chosen.pools else "; one engine ranked better"))] if priorities else []
    return [
        PlanLever("precision", chosen.version != start.version,
                  f"version {chosen.version} ({chosen.precision}, perplexity "
                  f"{chosen.drop:+.2%}) ranked best" + "".join(
                      f"; v{v.version} {v.precision} left out: {v.why}" for v in left)),
        PlanLever("engine batch", (old["max_num_seqs"], old["max_num_batched_tokens"]) !=
                  (new["max_num_seqs"], new["max_num_batched_tokens"]),
                  f"max_num_seqs {old['max_num_seqs']} -> {new['max_num_seqs']}, "
                  f"max_num_batched_tokens {old['max_num_batched_tokens']} -> "
                  f"{new['max_num_batched_tokens']}: predicted {p.mean_batch:.1f} sequences "
                  f"a step, engine {p.utilisation:.0%} busy"),
        PlanLever("prefix caching", new["prefix_caching"] != old["prefix_caching"],
                  ("no shared prefix in the prompts: nothing to reuse" if
                   lengths.shared_prefix == 0 else
                   f"{lengths.shared_prefix} shared prompt tokens: predicted "
                   f"{p.hit_ratio:.0%} of prompt tokens from the cache")
                  + (f" (turned {'on' if new['prefix_caching'] else 'off'})"
                     if old["prefix_caching"] != new["prefix_caching"] else
                     f" (left {'on' if new['prefix_caching'] else 'off'})")),
    ] + classes


def _scheduling_lever(start: PlanCandidate, chosen: PlanCandidate,
                      priorities: dict[str, int]) -> PlanLever:
    """First come first served, or each class's priority in one engine (behind a router
    that sets it)."""
    by = chosen.knobs["scheduling"] == "priority"
    order = " before ".join(sorted(priorities, key=priorities.__getitem__))
    each = ", ".join(f"{c} TTFT p99 {p.p99_ms:.0f} ms" for c, p in
                     chosen.class_predicted.items())
    return PlanLever(
        "scheduling", chosen.knobs["scheduling"] != start.knobs["scheduling"],
        ("an engine per class: each serves one class" if chosen.pools else
         f"priority by class ({order}), set by a router in front of the engine"
         if by else "first come, first served: it ranked better than priority by class "
         f"({order})") + (f"; predicted {each}" if each else ""))
