"""``tradeoff plan``: from a model, its traffic and an SLA to a deployment, replayed.

    result = make_plan(PlanRequest(Path("models/mlp"), traffic, Goal(sla_p99_ms=5,
                                                                         max_drop=0.01)))
    result.chosen, result.verdict

The steps, each done by the lever's own code:

1. **Versions.** ``tradeoff optimize`` makes the precision variants in a working copy of
   the model and measures every version in process: its accuracy against the original
   and its throughput at each batch size (the batch cost the predictions run on). A
   version that loses more than ``max_drop`` is left out.
2. **Calibration.** The starting deployment is served (``tradeoff serve``, pinned) and
   measured: one request at a time for the server's own CPU per request, then the
   traffic's rate for the latency the simulation leaves out (client, wire), neither of
   which the batch cost holds (:mod:`tradeoff.plan.measure`).
3. **Search.** Every kept version x serving knobs (``tune serve``'s) x response cache
   (sized from the traffic's repetition by Che's approximation) is predicted by
   simulating the batcher over the traffic's arrivals (:mod:`tradeoff.plan.search`).
4. **Deployment.** The best is written as a repository beside the original, never over
   it: the chosen version, its ``config.pbtxt``, and the ``tradeoff serve`` flags
   (:mod:`tradeoff.plan.deployment`).
5. **Proof.** The written deployment and the starting one are served side by side and
   the traffic replayed against both (``tradeoff compare``'s interleaved rounds): the
   SLA met or not, measured next to predicted. A deployment that misses the SLA on
   replay is said to, and the next candidate is written and replayed while the budget
   lasts. The levers taken or left, and why, are the document's
   (:mod:`tradeoff.plan.levers`).

A generative model's plan takes the same steps with its own search
(:mod:`tradeoff.plan.engine_search`): precision and the engine's settings for a TTFT and
a TPOT SLA, predicted by the engine's own scheduler.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tradeoff.backends.registry import GENERATIVE
from tradeoff.errors import InvalidValue, TuneError, local_resource
from tradeoff.generate.config import GenerativeConfig
from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
from tradeoff.optimize.variants import Variant
from tradeoff.plan.continuous import MAX_LENGTH, Lengths
from tradeoff.plan.deployment import write_deployment, write_engine_deployment, write_serve_script
from tradeoff.plan.engine_search import (
    EngineSearcher,
    GenerationCalibration,
    measure_versions,
    on_gpu,
    settings_of,
)
from tradeoff.plan.levers import engine_levers, levers
from tradeoff.plan.measure import (
    calibrate_generation,
    calibrate_generation_load,
    calibrate_tensor,
    replay_generation,
    replay_load,
    replay_prompts,
    replay_tensor,
)
from tradeoff.plan.pools import search_engine_pools, search_pools
from tradeoff.plan.search import NO_CACHE, Searcher, cache_choice, rank_key, weigh
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.repository import ModelRepository
from tradeoff.results import PlanCandidate, PlanResult, Replayed, environment
from tradeoff.server.process import ServerProcess
from tradeoff.stats.pareto import front
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

__all__ = ["PlanRequest", "default_output", "make_plan", "no_gain", "noise_ms", "pareto", "verdict"]

Progress = Callable[[str], None]
ATTEMPTS = 3  # candidates replayed at most, while each misses the SLA
KEPT_CANDIDATES = 20  # the best ranked kept in the document, beside the Pareto front
MAX_REPLAY_PROMPTS = 1 << 16  # a generative replay's prompts file (round-robin past it)
WORK = ".work"  # the scratch inside the output folder, removed when the plan ends
OWNER = "owner"  # in WORK: the pid of the plan that made it


@dataclass(frozen=True)
class PlanRequest:
    """The model, its traffic, the goal, and the precision variants to weigh."""

    model_dir: Path
    traffic: Traffic
    goal: Goal
    variants: tuple[Variant, ...] = (Variant("int8-dynamic", per_channel=True),)
    output: Path | None = None  # default: REPOSITORY-plan/MODEL beside the repository
    seconds_per_version: float = 2.0
    server_cpus: str | None = None  # the cores the servers are pinned to
    lengths: Lengths | None = None  # a generative model's prompts and answers

    def __post_init__(self) -> None:
        """InvalidValue for a request no plan can be made of: more than one price, prompt
        lengths out of bounds, a class's SLA for a class the traffic does not have."""
        goal, lengths = self.goal, self.lengths
        prices = (goal.price, goal.price_per_core_hour, goal.price_per_gpu_hour)
        if sum(p is not None for p in prices) > 1:
            raise InvalidValue("give one of --price-per-hour, --price-per-core-hour and "
                               "--price-per-gpu-hour")
        if lengths is not None and lengths.shared_prefix >= lengths.prompt:
            raise InvalidValue(f"--shared-prefix-words must be fewer than the prompt's "
                               f"{lengths.prompt} words")
        if lengths is not None and max(lengths.prompt, lengths.output) > MAX_LENGTH:
            raise InvalidValue(f"the trace's mean prompt_tokens or output_tokens is over "
                               f"{MAX_LENGTH:,}: give --prompt-words and --output-tokens")
        if goal.class_tpot_ms and goal.sla_tpot_ms is None:
            raise InvalidValue("--class-sla-tpot is for generative models: give "
                               "--sla-ttft-ms and --sla-tpot-ms")
        for flag, named in (("--class-sla", goal.class_sla_ms),
                            ("--class-sla-tpot", goal.class_tpot_ms)):
            unknown = sorted(set(named) - set(self.traffic.classes))
            if unknown:
                known = ", ".join(self.traffic.classes) or "none: give --class-share, or a " \
                    "trace with a 'class' field"
                raise InvalidValue(f"{flag} {unknown[0]}: the traffic has no such class "
                                   f"(its classes: {known})")


def default_output(model_dir: Path) -> Path:
    repository = model_dir.resolve().parent
    return repository.parent / f"{repository.name}-plan-{model_dir.name}"


def _check_output(output: Path, model_dir: Path) -> None:
    resolved = output.resolve()
    repository = model_dir.resolve().parent
    if resolved == repository or repository in resolved.parents:
        raise InvalidValue(f"--output {output} is inside the model's repository "
                           f"{repository}: the plan is written beside it, never in it")
    if resolved.exists() and [p.name for p in resolved.iterdir()] == [WORK]:
        _remove_abandoned_work(resolved / WORK)
    if resolved.exists() and any(resolved.iterdir()):
        raise InvalidValue(f"--output {output} exists and is not empty: give a new folder")


def _remove_abandoned_work(work: Path) -> None:
    """The scratch of a plan that was killed (SIGKILL: no clean-up ran) is removed; a
    running plan's is kept (its ``owner`` file names the pid that made it)."""
    try:
        owner = int((work / OWNER).read_text())
        os.kill(owner, 0)
    except (OSError, ValueError):  # no owner named, or it is gone
        shutil.rmtree(work, ignore_errors=True)


def make_plan(request: PlanRequest, say: Progress = lambda _: None) -> PlanResult:
    """Search, write and replay the deployment (see the module docstring)."""
    started = time.monotonic()
    model_dir = Path(request.model_dir)
    repository = ModelRepository(model_dir.parent)
    name = model_dir.name
    if not model_dir.is_dir() or name not in repository.names():
        raise InvalidValue(f"{model_dir}: not a model directory (give REPOSITORY/MODEL)")
    kind = repository.kind(name)
    if kind not in ("tensor", GENERATIVE):
        raise TuneError(f"{name} is a {kind}: plan takes a tensor or generative model (a "
                        "router's plan is made for each model behind it)")
    if kind == GENERATIVE and request.goal.sla_tpot_ms is None:
        raise InvalidValue(f"{name} is a generative model: give --sla-ttft-ms and "
                           "--sla-tpot-ms (its SLA is per token, not per request)")
    if kind == "tensor" and request.goal.sla_tpot_ms is not None:
        raise InvalidValue(f"{name} is a tensor model: give --sla-p99-ms (TTFT and TPOT "
                           "are for generative models)")
    output = request.output or default_output(model_dir)
    _check_output(output, model_dir)
    created = not output.exists()
    work = output / WORK
    try:
        with local_resource(f"cannot write into {output}"):
            output.mkdir(parents=True, exist_ok=True)
            work.mkdir()
            (work / OWNER).write_text(str(os.getpid()))
            shutil.copytree(model_dir, work / "candidates" / name)
            shutil.copytree(model_dir, work / "baseline" / name)
        goal = request.goal
        if kind == GENERATIVE:
            settings = GenerativeConfig.of_model(model_dir)
            if goal.price_per_gpu_hour is not None:
                goal = goal.on_gpus(_engine_gpus(settings, name))
            return _plan_generative(request, goal, settings, output, started, say)
        config = repository.read(name).config
        if goal.price_per_gpu_hour is not None:
            goal = goal.on_gpus(_gpus(config))
        return _plan(request, goal, config, output, started, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created and output.is_dir() and not any(output.iterdir()):
            output.rmdir()  # nothing was written: leave no empty folder behind


def _gpus(config: ModelConfig) -> int:
    """The GPUs the model's instances are placed on (a KIND_GPU group without a list:
    GPU 0); InvalidValue for a model on the CPU."""
    gpus = {d or 0 for g in config.instance_groups if g.kind == "KIND_GPU"
            for d in g.devices()}
    if not gpus:
        raise InvalidValue(f"{config.name} runs on the CPU (no KIND_GPU instance_group): a "
                           "GPU-hour price does not apply; give --price-per-hour or "
                           "--price-per-core-hour")
    return len(gpus)


def _engine_gpus(config: GenerativeConfig, name: str) -> int:
    """One GPU for an engine on CUDA; InvalidValue for one on the CPU."""
    if not on_gpu(config):
        raise InvalidValue(f"{name} runs on the CPU (generate.yaml device: {config.device}"
                           "): a GPU-hour price does not apply; give --price-per-hour or "
                           "--price-per-core-hour")
    return 1


def _plan_generative(request: PlanRequest, goal: Goal, config: GenerativeConfig,
                     output: Path, started: float, say: Progress) -> PlanResult:
    """A generative model's plan (:mod:`tradeoff.plan.engine_search`): its precision and
    engine settings for a TTFT and a TPOT SLA (``goal``: the request's, priced for the
    model's GPUs)."""
    work, model_dir = output / WORK, Path(request.model_dir)
    name, traffic = model_dir.name, request.traffic
    lengths = request.lengths or Lengths(128, 64)
    say("measuring every version (tradeoff optimize)")
    versions, costs = measure_versions(work / "candidates" / name, request.variants,
                                       goal.max_drop, request.seconds_per_version, say,
                                       one_pass=not on_gpu(config))
    original = versions[0]
    start = settings_of(config)
    # prompts no engine has seen for each use (see replay_prompts)
    loaded = min(max(64, math.ceil(traffic.rate_rps * 10) + 16), MAX_REPLAY_PROMPTS)
    calibration_prompts, warmup_prompts, load_prompts = (
        replay_prompts(work / f"{use}.jsonl", lengths, count, seed)
        for use, count, seed in (("calibration", 256, 1), ("warm-up", 64, 2),
                                 ("load", loaded, 3)))
    with ServerProcess(work / "baseline", cpus=request.server_cpus) as baseline_server:
        say("calibrating on the starting deployment")
        alone, served = calibrate_generation(baseline_server, name, costs[original.version],
                                             start, lengths, goal, calibration_prompts)
        goal = _replay_long_enough(goal, alone.alone_answer_s(
            costs[original.version], served, start), say)
        load = replay_load(traffic, goal.replay_s)
        replayed = min(max(256, math.ceil(traffic.rate_rps * (goal.replay_s + load.warmup_s))
                           + 16), MAX_REPLAY_PROMPTS)
        prompts = (replay_prompts(work / "replay.jsonl", lengths, replayed, 0),
                   replay_prompts(work / "replay-2.jsonl", lengths, replayed, 4))
        say("calibrating the starting deployment under the traffic's load")
        calibration = calibrate_generation_load(baseline_server, name,
                                                costs[original.version], start, alone,
                                                served, goal, traffic, load_prompts)
        searcher = EngineSearcher(traffic, served, goal, calibration,
                                  (original.version, start))
        baseline = searcher.predict(original, costs[original.version], start)
        ranked = searcher.search(versions, costs, say)
        if not ranked:
            raise TuneError("no version was kept: every one lost more than --max-drop")

        def calibrate_engine(threads: int) -> GenerationCalibration:
            """The starting deployment with ``threads`` per engine, served and calibrated
            as the start was."""
            copy = work / f"threads-{threads}"
            write_engine_deployment(copy, model_dir, replace(
                baseline, knobs={**baseline.knobs, "threads": threads}))
            with ServerProcess(copy, cpus=request.server_cpus) as server:
                threaded = calibrate_generation(server, name, costs[original.version],
                                                start, lengths, goal, calibration_prompts)[0]
            # the server's own work under the load is the same, whatever its engines
            return replace(threaded, load_scale=calibration.load_scale,
                           load_rate_rps=calibration.load_rate_rps,
                           ttft_extra_p50_ms=calibration.ttft_extra_p50_ms,
                           ttft_extra_p99_ms=calibration.ttft_extra_p99_ms,
                           ttft_extra_p99_range_ms=calibration.ttft_extra_p99_range_ms)

        pools, pools_why = search_engine_pools(traffic, goal, versions, costs, served,
                                               (original.version, start), calibrate_engine,
                                               say, gpu=on_gpu(config))
        ranked = sorted(ranked + pools,
                        key=lambda c: rank_key(c, goal.strictest(searcher.classes), goal))

        def attempt(number: int, candidate: PlanCandidate) -> tuple[list[Replayed], Path]:
            target = write_engine_deployment(work / f"attempt-{number}", model_dir,
                                             candidate, searcher.priority)
            return replay_generation(baseline_server, target, name, candidate, baseline,
                                     goal, served, prompts, warmup_prompts, load,
                                     request.server_cpus, traffic.classes,
                                     traffic.class_sequence(), say), target

        attempts, stop, stays = _prove(ranked, baseline, goal,
                                       goal.strictest(searcher.classes), started, attempt,
                                       say)
        kept_start = (baseline, write_engine_deployment(
            work / "start", model_dir, baseline, searcher.priority)) if stays else None
    chosen, shown, kept = _conclude(attempts, ranked, output, kept_start)
    return PlanResult(
        model=name, repository=str(model_dir.parent), output=str(output),
        goal=goal.plan_dict(), traffic={**traffic.describe(), **served.describe()},
        environment=environment(), calibration=calibration.to_dict(), versions=versions,
        baseline=baseline, candidates=kept, chosen=chosen.name if chosen else None,
        levers=engine_levers(versions, baseline, chosen, served, searcher.priority,
                             pools_why, bool(pools)),
        proof=[r for _, replayed, _ in attempts for r in replayed],
        verdict=verdict(shown, goal, chosen, baseline, stays), stop_reason=stop,
        elapsed_s=time.monotonic() - started)


def _conclude(attempts: list[Attempt], ranked: list[PlanCandidate], output: Path,
              kept_start: tuple[PlanCandidate, Path] | None = None
              ) -> tuple[PlanCandidate | None, list[Replayed], list[PlanCandidate]]:
    """The deployment kept: the start where it stays (``kept_start``: it and where it was
    written), else the first attempt that met the SLA on replay, else the one replayed
    fastest at p99, moved to ``output/repository`` with its ``serve.sh``; its replay
    (with the start's); and the candidates the document keeps (the best ranked, the
    Pareto front and the chosen), the front marked."""
    chosen: PlanCandidate | None = None
    shown: list[Replayed] = []
    if attempts:
        if kept_start is not None:  # the last replay: the start's, and the change tried
            (chosen, target), shown = kept_start, attempts[-1][1]
            met = shown[-2].meets_sla
        else:
            chosen, shown, target = min(attempts, key=lambda a: (
                not a[1][-1].meets_sla, a[1][-1].p99_ms or math.inf))
            met = shown[-1].meets_sla
        deployment = output / "repository"
        with local_resource(f"cannot write the plan into {output}"):
            shutil.move(str(target), deployment)
            write_serve_script(output, deployment, chosen, met=met)
    front = pareto(ranked)
    kept = ranked[:KEPT_CANDIDATES] + [c for c in ranked[KEPT_CANDIDATES:]
                                       if c.name in front or c == chosen]
    return chosen, shown, [replace(c, pareto=c.name in front) for c in kept]


def _plan(request: PlanRequest, goal: Goal, config: ModelConfig, output: Path,
          started: float, say: Progress) -> PlanResult:
    """A tensor model's plan (``goal``: the request's, priced for the model's GPUs)."""
    name, work = config.name, output / WORK
    say("measuring every version (tradeoff optimize)")
    optimized = optimize_model(work / "candidates" / name, OptimizePlan(
        variants=request.variants, max_drop=goal.max_drop,
        seconds_per_version=request.seconds_per_version), say)
    versions = weigh(optimized, goal.max_drop)
    original = next(v for v in versions if v.version == optimized.source_version)
    with ServerProcess(work / "baseline", cpus=request.server_cpus) as baseline_server:
        say("calibrating on the starting deployment")
        start_knobs = Knobs.of(config.to_dict())
        calibration = calibrate_tensor(baseline_server, name, original, start_knobs,
                                       request.traffic)
        # predicted for the replay: a cache that starts empty, over the requests it sends
        cache = cache_choice(request.traffic, config,
                             goal.replay_requests(request.traffic.rate_rps))
        # one pool for every class meets the strictest class's SLA
        shared = replace(goal, sla_p99_ms=goal.strictest(request.traffic.classes))
        start = (original.version, start_knobs)
        searcher = Searcher(config, request.traffic, shared, calibration, start)
        baseline = searcher.predict(original, start_knobs, NO_CACHE)
        ranked = searcher.search(versions, cache, say)
        if not ranked:
            raise TuneError("no version was kept: every one lost more than --max-drop")
        pools, pools_why = search_pools(request.traffic, goal, config, versions, calibration,
                                        start, say)
        ranked = sorted(ranked + pools, key=lambda c: rank_key(c, shared.sla_p99_ms))
        candidates = work / "candidates" / config.name

        def attempt(number: int, candidate: PlanCandidate) -> tuple[list[Replayed], Path]:
            target = write_deployment(work / f"attempt-{number}", candidates, candidate,
                                      config)
            return replay_tensor(baseline_server, target, config.name, candidate, baseline,
                                 request.traffic, goal, request.server_cpus, say), target

        attempts, stop, stays = _prove(ranked, baseline, goal, shared.sla_p99_ms, started,
                                       attempt, say)
        kept_start = (baseline, write_deployment(work / "start", candidates, baseline,
                                                 config)) if stays else None
    proof = [r for _, replayed, _ in attempts for r in replayed]
    chosen, shown, kept = _conclude(attempts, ranked, output, kept_start)
    return PlanResult(
        model=name, repository=str(Path(request.model_dir).parent), output=str(output),
        goal=goal.plan_dict(), traffic=request.traffic.describe(), environment=environment(),
        calibration=calibration.to_dict(), versions=versions, baseline=baseline,
        candidates=kept, chosen=chosen.name if chosen else None,
        levers=levers(versions, original, baseline, chosen, cache, pools_why,
                      bool(pools)),
        proof=proof, verdict=verdict(shown, goal, chosen, baseline, stays),
        stop_reason=stop, elapsed_s=time.monotonic() - started)


Attempt = tuple[PlanCandidate, list[Replayed], Path]


def _prove(ranked: list[PlanCandidate], start: PlanCandidate, goal: Goal, sla_ms: float,
           started: float,
           attempt: Callable[[int, PlanCandidate], tuple[list[Replayed], Path]],
           say: Progress) -> tuple[list[Attempt], str, bool]:
    """Write and replay the best ranked (``attempt``: the written deployment's replay,
    the start's first, and where it was written), then the next while each misses the
    SLA on replay (at most ATTEMPTS, within the budget); the attempts, why it stopped,
    and whether the start stays: it met the SLA on replay and the change, costing no
    less, was not faster by more than the machine's noise."""
    attempts: list[Attempt] = []
    stop = "met the SLA on replay"
    for number, candidate in enumerate(ranked[:ATTEMPTS], 1):
        if not candidate.meets_sla and attempts:
            return attempts, stop + "; no further candidate is predicted to meet the SLA", \
                False
        if goal.budget_s - (time.monotonic() - started) < _replay_seconds(goal):
            return attempts, (f"the budget ({goal.budget_s:.0f} s) ran out before "
                              f"replaying {candidate.name}"), False
        say(f"writing and replaying {candidate.name}")
        replayed, target = attempt(number, candidate)
        attempts.append((candidate, replayed, target))
        if candidate.name != start.name and \
                no_gain(replayed[-2], replayed[-1], candidate, start) is not None:
            return attempts, (f"the start met the SLA on replay and {candidate.name} "
                              "was not faster by more than the machine's noise"), True
        if not candidate.meets_sla:  # the best is predicted to miss: none can meet it
            return attempts, (f"no deployment is predicted to meet p99 <= {sla_ms:g} ms"
                              f"{_and_tpot(goal)}: the best, {candidate.name}, is "
                              f"predicted at {candidate.predicted.p99_ms:.2f} ms and "
                              f"measured at {_shown(replayed[-1].p99_ms)} on replay"), False
        if replayed[-1].meets_sla:
            return attempts, "met the SLA on replay" + (f" (attempt {number})"
                                                        if number > 1 else ""), False
        stop = f"{candidate.name} missed the SLA on replay"
    return attempts, stop + (f" ({ATTEMPTS} attempts)" if len(attempts) == ATTEMPTS
                             else ""), False


def noise_ms(*replays: Replayed) -> float | None:
    """The machine's noise in a replay: the widest spread of one deployment's p99 (a
    generative model's TTFT) between its rounds; None without two rounds measured."""
    spreads = [max(known) - min(known) for known in
               ([x for x in r.p99_rounds_ms if x is not None] for r in replays)
               if len(known) >= 2]
    return max(spreads) if spreads else None


def no_gain(baseline: Replayed, plan: Replayed, candidate: PlanCandidate,
            start: PlanCandidate) -> float | None:
    """The noise that ``candidate``'s p99 gain over the start does not beat, where the
    start met the SLA on replay and the candidate costs no less (a change must then beat
    the start by more than the noise); None where the change is worth making. With
    classes each has its own SLA, which one p99 does not weigh: None."""
    if not baseline.meets_sla or candidate.cost < start.cost or plan.classes or \
            baseline.p99_ms is None or plan.p99_ms is None:
        return None
    noise = noise_ms(baseline, plan) or 0.0
    return noise if baseline.p99_ms - plan.p99_ms <= noise else None


def _and_tpot(goal: Goal) -> str:
    return "" if goal.sla_tpot_ms is None else f" (TTFT) and TPOT <= {goal.sla_tpot_ms:g} ms"


def pareto(ranked: list[PlanCandidate]) -> set[str]:
    """The candidates no other beats on cost (cores without a price), p99 and accuracy
    at once."""
    finite = [c for c in ranked if math.isfinite(c.predicted.p99_ms)]
    return {c.name for c in front(finite, lambda c: (c.cost, c.predicted.p99_ms, c.drop))}


ANSWERS_PER_REPLAY = 3  # a replay round lasts at least this many answers alone


def _replay_long_enough(goal: Goal, answer_s: float, say: Progress) -> Goal:
    """``goal`` with a replay round long enough for a few whole answers: a round shorter
    than one answer completes none, and would report 0 requests/s."""
    if not math.isfinite(answer_s):
        return goal
    needed = math.ceil(ANSWERS_PER_REPLAY * answer_s)
    if goal.replay_s >= needed:
        return goal
    say(f"replay rounds lengthened from {goal.replay_s:g} s to {needed} s: one answer "
        f"takes about {answer_s:.1f} s alone, and a round measures whole answers")
    return replace(goal, replay_s=float(needed))


def _replay_seconds(goal: Goal) -> float:
    return 2 * 2 * (goal.replay_s + 1) + 10  # two rounds of two deployments, and a start


def _shown(p99_ms: float | None) -> str:
    return "no answer" if p99_ms is None else f"{p99_ms:.2f} ms"


def _per_class(plan: Replayed, sla: str) -> str:
    """Which classes met their SLAs on replay and which missed, by name."""
    met = [c.request_class for c in plan.classes if c.meets_sla]
    missed = [c.request_class for c in plan.classes if not c.meets_sla]
    if not missed:
        return f"meets the {sla} of every class"
    if not met:
        return f"misses the {sla} of every class"
    return f"meets the {sla} of {', '.join(met)} and misses those of {', '.join(missed)}"


def _rounds(replayed: Replayed) -> str:
    """`` (rounds 2.10-2.61 ms)``: the p99 of each replay round, where there are two."""
    known = [x for x in replayed.p99_rounds_ms if x is not None]
    if len(known) < 2:
        return ""
    return f" (rounds {min(known):.2f}-{max(known):.2f} ms)"


def verdict(proof: list[Replayed], goal: Goal, chosen: PlanCandidate | None = None,
            start: PlanCandidate | None = None, stays: bool = False) -> str:
    """One line: did the written deployment meet the SLA on replay (``proof``: the start's
    replay and its own), against the start; with classes, each class against its own.
    Each p99 comes with its rounds' spread; "no change" where the start stays (the plan
    is the start, or ``stays``: the change did not beat it by more than the machine's
    noise), "not decided" where the noise between rounds is larger than the difference
    between the plan and the start."""
    if not proof:
        return "not replayed"
    baseline, plan = proof[-2], proof[-1]
    noise = noise_ms(baseline, plan)
    if stays:
        return (f"no change: the starting deployment meets the SLA of p99 <= "
                f"{goal.sla_p99_ms:g} ms on replay, p99 {_shown(baseline.p99_ms)}"
                f"{_rounds(baseline)}, and {plan.name} was not faster by more than the "
                f"machine's noise ({noise or 0:.2f} ms between rounds): p99 "
                f"{_shown(plan.p99_ms)}{_rounds(plan)}")
    said = _verdict(baseline, plan, goal)
    if chosen is not None and start is not None and chosen.name == start.name:
        return f"no change: the plan is the starting deployment; {said}"
    if noise is not None and baseline.p99_ms is not None and plan.p99_ms is not None and \
            abs(plan.p99_ms - baseline.p99_ms) <= noise:
        return (f"not decided: the machine's noise between replay rounds ({noise:.2f} ms) "
                f"is larger than the difference between the plan and the start "
                f"({abs(plan.p99_ms - baseline.p99_ms):.2f} ms); {said}")
    return said


def _verdict(baseline: Replayed, plan: Replayed, goal: Goal) -> str:
    met = "meets" if plan.meets_sla else "misses"
    if plan.classes and goal.sla_tpot_ms is not None:
        start = {c.request_class: c for c in baseline.classes}
        each = "; ".join(
            f"{c.request_class} TTFT p99 {_shown(c.p99_ms)} against <= {c.sla_p99_ms:g} ms "
            f"and TPOT {_shown(c.tpot_p99_ms)} against <= {c.sla_tpot_ms or math.inf:g} ms "
            f"(predicted {c.predicted.p99_ms:.2f} and {c.predicted.tpot_p99_ms or math.inf:.2f}"
            f" ms, starting {_shown(start[c.request_class].p99_ms)} and "
            f"{_shown(start[c.request_class].tpot_p99_ms)})" if c.request_class in start else
            f"{c.request_class} TTFT p99 {_shown(c.p99_ms)}" for c in plan.classes)
        return f"the plan {_per_class(plan, 'SLAs')} on replay: {each}"
    if goal.sla_tpot_ms is not None:
        return (f"the plan {met} the SLA of TTFT p99 <= {goal.sla_p99_ms:g} ms and TPOT "
                f"p99 <= {goal.sla_tpot_ms:g} ms on replay: TTFT {_shown(plan.p99_ms)}"
                f"{_rounds(plan)}, TPOT "
                f"{_shown(plan.tpot_p99_ms)} (predicted {plan.predicted.p99_ms:.2f} and "
                f"{plan.predicted.tpot_p99_ms or math.inf:.2f} ms) against the starting "
                f"deployment's {_shown(baseline.p99_ms)}{_rounds(baseline)} and "
                f"{_shown(baseline.tpot_p99_ms)}")
    if plan.classes:
        start = {c.request_class: c for c in baseline.classes}
        each = "; ".join(
            f"{c.request_class} p99 {_shown(c.p99_ms)} against <= {c.sla_p99_ms:g} ms "
            f"(predicted {c.predicted.p99_ms:.2f} ms, starting "
            f"{_shown(start[c.request_class].p99_ms) if c.request_class in start else '-'})"
            for c in plan.classes)
        return f"the plan {_per_class(plan, 'SLA')} on replay: {each}"
    return (f"the plan {met} the SLA of p99 <= {goal.sla_p99_ms:g} ms on replay: p99 "
            f"{_shown(plan.p99_ms)}{_rounds(plan)} (predicted {plan.predicted.p99_ms:.2f} "
            f"ms) against the starting deployment's {_shown(baseline.p99_ms)}"
            f"{_rounds(baseline)} (predicted {baseline.predicted.p99_ms:.2f} ms)")
