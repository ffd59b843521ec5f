"""``tradeoff plan``: from a model, its traffic and an SLA to a deployment, replayed.

    result = make_plan(PlanRequest(Path("models/mlp"), traffic, PlanGoal(sla_p99_ms=5,
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
   which the batch cost holds.
3. **Search.** Every kept version x serving knobs (``tune serve``'s) x response cache
   (sized from the traffic's repetition by Che's approximation) is predicted by
   simulating the batcher over the traffic's arrivals (:mod:`tradeoff.plan.search`).
4. **Deployment.** The best is written as a repository beside the original, never over
   it: the chosen version, its ``config.pbtxt``, and the ``tradeoff serve`` flags.
5. **Proof.** The written deployment and the starting one are served side by side and
   the traffic replayed against both (``tradeoff compare``'s interleaved rounds): the
   SLA met or not, measured next to predicted. A deployment that misses the SLA on
   replay is said to, and the next candidate is written and replayed while the budget
   lasts.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from tradeoff.analysis.compare import run_compare
from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.endpoint import EndpointSpec
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.errors import InvalidValue, TuneError, local_resource
from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
from tradeoff.optimize.variants import Variant
from tradeoff.plan.predict import simulate
from tradeoff.plan.search import (
    NO_CACHE,
    CacheChoice,
    Calibration,
    PlanGoal,
    Searcher,
    cache_choice,
    version_cost,
)
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.edit import PBTXT, YAML_FILES, config_text
from tradeoff.repository.repository import ModelRepository
from tradeoff.results import (
    OptimizeResult,
    PlanCandidate,
    PlanLever,
    PlanResult,
    PlanVersion,
    Replayed,
    environment,
)
from tradeoff.server.process import ServerProcess
from tradeoff.stats.pareto import front
from tradeoff.tune.serve_search import Knobs

__all__ = ["WRITTEN_BY", "PlanRequest", "default_output", "levers", "make_plan", "pareto",
           "replay_load", "serve_flags", "serve_script", "verdict", "write_deployment"]

Progress = Callable[[str], None]
WRITTEN_BY = "# written by tradeoff plan"
ATTEMPTS = 3  # candidates replayed at most, while each misses the SLA
KEPT_CANDIDATES = 20  # the best ranked kept in the document, beside the Pareto front


@dataclass(frozen=True)
class PlanRequest:
    """The model, its traffic, the goal, and the precision variants to weigh."""

    model_dir: Path
    traffic: Traffic
    goal: PlanGoal
    variants: tuple[Variant, ...] = (Variant("int8-dynamic", per_channel=True),)
    output: Path | None = None  # default: REPOSITORY-plan/MODEL beside the repository
    seconds_per_version: float = 2.0
    server_cpus: str | None = None  # the cores the servers are pinned to


def default_output(model_dir: Path) -> Path:
    repository = model_dir.resolve().parent
    return repository.parent / f"{repository.name}-plan-{model_dir.name}"


def _check_output(output: Path, model_dir: Path) -> None:
    resolved = output.resolve()
    repository = model_dir.resolve().parent
    if resolved == repository or repository in resolved.parents:
        raise InvalidValue(f"--output {output} is inside the model's repository "
                           f"{repository}: the plan is written beside it, never in it")
    if resolved.exists() and any(resolved.iterdir()):
        raise InvalidValue(f"--output {output} exists and is not empty: give a new folder")


def make_plan(request: PlanRequest, say: Progress = lambda _: None) -> PlanResult:
    """Search, write and replay the deployment (see the module docstring)."""
    started = time.monotonic()
    model_dir = Path(request.model_dir)
    repository = ModelRepository(model_dir.parent)
    name = model_dir.name
    if not model_dir.is_dir() or name not in repository.names():
        raise InvalidValue(f"{model_dir}: not a model directory (give REPOSITORY/MODEL)")
    if repository.kind(name) != "tensor":
        raise TuneError(f"{name} is a {repository.kind(name)} model; this version of plan "
                        "takes tensor models (generative ones: tradeoff tune serve and the "
                        "engine flags, docs/plan.md)")
    output = request.output or default_output(model_dir)
    _check_output(output, model_dir)
    created = not output.exists()
    work = output / ".work"
    try:
        with local_resource(f"cannot write into {output}"):
            output.mkdir(parents=True, exist_ok=True)
            shutil.copytree(model_dir, work / "candidates" / name)
            shutil.copytree(model_dir, work / "baseline" / name)
        return _plan(request, repository.read(name).config, output, started, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        if created and output.is_dir() and not any(output.iterdir()):
            output.rmdir()  # nothing was written: leave no empty folder behind


def _plan(request: PlanRequest, config: ModelConfig, output: Path, started: float,
          say: Progress) -> PlanResult:
    goal, name, work = request.goal, config.name, output / ".work"
    say("measuring every version (tradeoff optimize)")
    optimized = optimize_model(work / "candidates" / name, OptimizePlan(
        variants=request.variants, max_drop=goal.max_drop,
        seconds_per_version=request.seconds_per_version), say)
    versions = _weigh(optimized, goal.max_drop)
    original = next(v for v in versions if v.version == optimized.source_version)
    with ServerProcess(work / "baseline", cpus=request.server_cpus) as baseline_server:
        say("calibrating on the starting deployment")
        start_knobs = Knobs.of(config.to_dict())
        calibration = _calibrate(baseline_server, name, original, start_knobs,
                                 request.traffic)
        # predicted for the replay: a cache that starts empty, over the requests it sends
        cache = cache_choice(request.traffic, config,
                             goal.replay_requests(request.traffic.rate_rps))
        searcher = Searcher(config, request.traffic, goal, calibration,
                            (original.version, start_knobs))
        baseline = searcher.predict(original, start_knobs, NO_CACHE)
        ranked = searcher.search(versions, cache, say)
        if not ranked:
            raise TuneError("no version was kept: every one lost more than --max-drop")
        attempts, stop = _prove(ranked, baseline, baseline_server, request, config,
                                started, say)
    proof = [r for _, replayed, _ in attempts for r in replayed]
    chosen: PlanCandidate | None = None
    shown: list[Replayed] = []
    if attempts:
        # the first that met the SLA on replay, else the one replayed fastest at p99
        chosen, shown, target = min(attempts, key=lambda a: (not a[1][-1].meets_sla,
                                                             a[1][-1].p99_ms or math.inf))
        deployment = output / "repository"
        with local_resource(f"cannot write the plan into {output}"):
            shutil.move(str(target), deployment)
            (output / "serve.sh").write_text(serve_script(deployment, chosen))
    front = pareto(ranked)
    kept = ranked[:KEPT_CANDIDATES] + [c for c in ranked[KEPT_CANDIDATES:]
                                       if c.name in front or c == chosen]
    return PlanResult(
        model=name, repository=str(Path(request.model_dir).parent), output=str(output),
        goal=goal.to_dict(), traffic=request.traffic.describe(), environment=environment(),
        calibration=calibration.to_dict(), versions=versions, baseline=baseline,
        candidates=[replace(c, pareto=c.name in front) for c in kept],
        chosen=chosen.name if chosen else None,
        levers=levers(versions, original, baseline, chosen, cache, request.traffic),
        proof=proof, verdict=verdict(shown, goal), stop_reason=stop,
        elapsed_s=time.monotonic() - started)


Attempt = tuple[PlanCandidate, list[Replayed], Path]


def _prove(ranked: list[PlanCandidate], baseline: PlanCandidate,
           baseline_server: ServerProcess, request: PlanRequest, config: ModelConfig,
           started: float, say: Progress) -> tuple[list[Attempt], str]:
    """Write and replay the best ranked, then the next while each misses the SLA on
    replay (at most ATTEMPTS, within the budget); the attempts and why it stopped."""
    goal, work = request.goal, Path(baseline_server.repository).parent
    attempts: list[Attempt] = []
    stop = "met the SLA on replay"
    for number, candidate in enumerate(ranked[:ATTEMPTS], 1):
        if not candidate.meets_sla and attempts:
            return attempts, stop + "; no further candidate is predicted to meet the SLA"
        if goal.budget_s - (time.monotonic() - started) < _replay_seconds(goal):
            return attempts, (f"the budget ({goal.budget_s:.0f} s) ran out before "
                              f"replaying {candidate.name}")
        say(f"writing and replaying {candidate.name}")
        target = write_deployment(work / f"attempt-{number}", work / "candidates" / config.name,
                                  candidate, config)
        replayed = _replay(baseline_server, target, config.name, candidate, baseline, request)
        attempts.append((candidate, replayed, target))
        if not candidate.meets_sla:  # the best is predicted to miss: none can meet it
            return attempts, (f"no deployment is predicted to meet p99 <= "
                              f"{goal.sla_p99_ms:g} ms: the best, {candidate.name}, is "
                              f"predicted at {candidate.predicted.p99_ms:.2f} ms and "
                              f"measured at {_shown_p99(replayed[-1])} on replay")
        if replayed[-1].meets_sla:
            return attempts, "met the SLA on replay" + (f" (attempt {number})"
                                                        if number > 1 else "")
        stop = f"{candidate.name} missed the SLA on replay"
    return attempts, stop + (f" ({ATTEMPTS} attempts)" if len(attempts) == ATTEMPTS else "")


def _weigh(optimized: OptimizeResult, max_drop: float) -> list[PlanVersion]:
    out = []
    for v in optimized.versions:
        over = optimized.over_max_drop(v)
        why = (f"lost {v.drop:.2%}, over the budget of {max_drop:.2%}" if over else
               "the original" if v.version == optimized.source_version else
               f"lost {v.drop:.2%}, within the budget of {max_drop:.2%}")
        out.append(PlanVersion(v.version, v.precision, v.method, v.drop, not over, why,
                               {b: 1e3 * b / t for b, t in sorted(v.throughput_by_batch.items())
                                if t > 0}))
    return out


def _cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _calibrate(server: ServerProcess, model: str, original: PlanVersion, knobs: Knobs,
               traffic: Traffic) -> Calibration:
    """Two short runs on the starting deployment. One request at a time for 2 s: the
    server's CPU per request beyond the model's batch of one. Then Poisson arrivals at the
    traffic's rate (at most half what the deployment can serve) for 3 s: the latency the
    simulation leaves out, at p50 and p99."""
    assert server.process is not None
    pid = server.process.pid
    batch1 = original.batch_ms[min(original.batch_ms)]
    before = _cpu_seconds(pid)
    result, _, _ = run_benchmark(V2Adapter(server.url, model),
                                 LoadSpec(concurrency=1, duration_s=2.0, warmup_s=0.5))
    cpu_ms = max(0.0, (_cpu_seconds(pid) - before) * 1e3 /
                 max(result.total_requests_sent, 1) - batch1)
    cost = version_cost(original)
    rate = min(traffic.rate_rps,
               0.5 * cost.capacity_rps(knobs.max_batch_size, knobs.instances, cpu_ms))
    seconds = 3.0
    result, _, _ = run_benchmark(V2Adapter(server.url, model),
                                 LoadSpec(rate=rate, duration_s=seconds, warmup_s=1.0))
    p50, p99 = result.summary.latency("p50"), result.summary.latency("p99")
    if p50 is None or p99 is None:
        raise TuneError(f"the starting deployment of {model} answered no request; see the "
                        f"server log {server.log.name}")
    law = Traffic.law(rate)
    run = simulate(law.arrivals(max(2000, int(rate * seconds))), cost, knobs.max_batch_size,
                   knobs.max_queue_delay_us / 1e6, knobs.instances, cpu_ms)
    return Calibration(cpu_ms, max(0.0, p50 - run.p50_ms), max(0.0, p99 - run.p99_ms), rate)


def pareto(ranked: list[PlanCandidate]) -> set[str]:
    """The candidates no other beats on cost (cores without a price), p99 and accuracy
    at once."""
    finite = [c for c in ranked if math.isfinite(c.predicted.p99_ms)]
    return {c.name for c in front(finite, lambda c: (c.cost, c.predicted.p99_ms, c.drop))}


def write_deployment(target: Path, candidates: Path, candidate: PlanCandidate,
                     config: ModelConfig) -> Path:
    """A repository at ``target`` holding the model with only the candidate's version and
    its config: knobs, cache on or off, that version served."""
    model_dir = target / config.name
    knobs = Knobs(**candidate.knobs, preferred=False)
    document = knobs.config(config.to_dict())
    document["version_policy"] = {"specific": {"versions": [candidate.version]}}
    document["response_cache"] = {"enable": candidate.cache_bytes > 0}
    with local_resource(f"cannot write the deployment into {target}"):
        model_dir.mkdir(parents=True)
        shutil.copytree(candidates / str(candidate.version), model_dir / str(candidate.version))
        for extra in candidates.iterdir():
            if not extra.name.isdigit() and extra.name not in (PBTXT, *YAML_FILES):
                copy = shutil.copytree if extra.is_dir() else shutil.copy2
                copy(extra, model_dir / extra.name)
        (model_dir / PBTXT).write_text(f"{WRITTEN_BY}: {candidate.name}\n"
                                       + config_text(document))
    return target


def serve_flags(candidate: PlanCandidate) -> list[str]:
    """The ``tradeoff serve`` flags the deployment needs beyond its repository."""
    if not candidate.cache_bytes:
        return []
    size = f"{math.ceil(candidate.cache_bytes / 2**20)}MiB"
    return ["--cache", f"local,size={size},tenant_size={size}"]


def serve_script(repository: Path, candidate: PlanCandidate) -> str:
    flags = " ".join(["--model-repository", str(repository.resolve()),
                      *serve_flags(candidate)])
    return f"#!/bin/sh\n{WRITTEN_BY}: {candidate.name}\nexec tradeoff serve {flags} \"$@\"\n"


def _replay_seconds(goal: PlanGoal) -> float:
    return 2 * 2 * (goal.replay_s + 1) + 10  # two rounds of two deployments, and a start


def replay_load(traffic: Traffic, seconds: float) -> LoadSpec:
    """The traffic for ``seconds``: a trace's own send times from its start (repeated
    end to end when shorter), or the law."""
    if traffic.offsets_s is not None:
        count = max(2, int(traffic.rate_rps * seconds))
        times = traffic.arrivals(count)
        return LoadSpec(intervals=tuple(float(t) for t in times[times < seconds]),
                        duration_s=seconds, warmup_s=0.0)
    return LoadSpec(rate=traffic.rate_rps, arrival=traffic.arrival, duration_s=seconds,
                    warmup_s=1.0)


def _replay(baseline_server: ServerProcess, target: Path, model: str,
            candidate: PlanCandidate, baseline: PlanCandidate, request: PlanRequest
            ) -> list[Replayed]:
    traffic, goal = request.traffic, request.goal
    with ServerProcess(target, cpus=request.server_cpus,
                       extra_args=tuple(serve_flags(candidate))) as plan_server:
        distinct = traffic.distinct_inputs if traffic.repeats else None
        zipf = traffic.zipf if traffic.repeats else None
        endpoints = [EndpointSpec(url, model=model, name=role, distinct_inputs=distinct,
                                  zipf=zipf)
                     for url, role in ((baseline_server.url, "baseline"),
                                       (plan_server.url, "plan"))]
        compared = run_compare(endpoints, replay_load(traffic, goal.replay_s), rounds=2,
                               sla_p99_ms=goal.sla_p99_ms)
    out = []
    for entry, predicted, role in zip(compared.endpoints, (baseline, candidate),
                                      ("baseline", "plan"), strict=True):
        summary = entry.result.summary
        counts = summary.server_counts
        batch = counts.computed / counts.executions if counts and counts.executions else None
        p99 = summary.latency("p99")
        out.append(Replayed(
            predicted.name, role, summary.latency("p50"), p99, summary.throughput_rps,
            summary.error_percent, counts.cache_hit_ratio if counts else None, batch,
            predicted.predicted,
            p99 is not None and p99 <= goal.sla_p99_ms and summary.error_percent <= 1.0,
            goal.cost_per_million(predicted.cores, summary.throughput_rps)))
    return out


def levers(versions: list[PlanVersion], original: PlanVersion, baseline: PlanCandidate,
           chosen: PlanCandidate | None, cache: CacheChoice, traffic: Traffic
           ) -> list[PlanLever]:
    """Each lever, taken or left, and why."""
    if chosen is None:
        return [PlanLever("plan", False, "no deployment was replayed")]
    left = [v for v in versions if not v.kept]
    precision = PlanLever(
        "precision", chosen.version != original.version,
        f"version {chosen.version} ({chosen.precision}, {chosen.drop:.2%} lost) ranked "
        "best" + "".join(f"; v{v.version} {v.precision} left out: {v.why}" for v in left))
    old, new = baseline.knobs, chosen.knobs
    batching = PlanLever(
        "batching", (old["max_batch_size"], old["max_queue_delay_us"]) !=
        (new["max_batch_size"], new["max_queue_delay_us"]),
        f"max_batch_size {old['max_batch_size']} -> {new['max_batch_size']}, queue delay "
        f"{old['max_queue_delay_us']} -> {new['max_queue_delay_us']} us: predicted mean "
        f"batch {chosen.predicted.mean_batch:.1f}")
    instances = PlanLever(
        "instances", old["instances"] != new["instances"],
        f"{old['instances']} -> {new['instances']} instance(s) of {new['threads']} "
        f"thread(s): {chosen.cores} core(s), predicted utilisation "
        f"{chosen.predicted.utilisation:.0%}")
    cached = PlanLever("cache", chosen.cache_bytes > 0, cache.why + (
        "" if chosen.cache_bytes or not cache.capacity else
        "; the deployment without it ranked better"))
    classes = PlanLever("classes", False, "one class of traffic" if len(traffic.classes) < 2
                        else f"{len(traffic.classes)} classes in the trace "
                        f"({', '.join(traffic.classes)}): this version plans one pool for "
                        "all of them")
    return [precision, batching, instances, cached, classes]


def _shown_p99(replayed: Replayed) -> str:
    return "no answer" if replayed.p99_ms is None else f"{replayed.p99_ms:.2f} ms"


def verdict(proof: list[Replayed], goal: PlanGoal) -> str:
    """One line: did the written deployment meet the SLA on replay (``proof``: the start's
    replay and its own), against the start."""
    if not proof:
        return "not replayed"
    baseline, plan = proof[-2], proof[-1]

    met = "meets" if plan.meets_sla else "misses"
    return (f"the plan {met} the SLA of p99 <= {goal.sla_p99_ms:g} ms on replay: p99 "
            f"{_shown_p99(plan)} (predicted {plan.predicted.p99_ms:.2f} ms) against the "
            f"starting deployment's {_shown_p99(baseline)} (predicted "
            f"{baseline.predicted.p99_ms:.2f} ms)")

