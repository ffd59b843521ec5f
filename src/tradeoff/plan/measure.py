"""What the plan measures on served deployments, for tensor and generative models alike:
the calibration of its predictions, and the replay that proves them.

    calibration = calibrate_tensor(server, "mlp", original, start_knobs, traffic)
    alone, lengths = calibrate_generation(server, "llm", cost, start, lengths, goal, prompts)
    calibration = calibrate_generation_load(server, "llm", cost, start, alone, lengths,
                                            goal, traffic, load_prompts)
    replayed = replay_tensor(start_server, written, "mlp", candidate, start, traffic, goal,
                             cpus)                     # the start's replay, then the plan's

**Calibration.** The starting deployment is served (pinned) and measured for what the
predictions' costs do not hold. A tensor model: one request at a time for the server's own
CPU per request beside the model (it shares the core), then the traffic's rate for the
latency the simulation leaves out (the client, the wire). A generative model: its prompts
one at a time for the server's count of their tokens and how much slower (or faster) the
served engine's steps run than the in-process timings, then the traffic's rate for how
much longer they take under load and the time to first token the simulation leaves out.

**Replay.** A written deployment and the starting one are served side by side and the
traffic replayed against both (``tradeoff compare``'s interleaved rounds): each against
the goal (with classes, each class against its own SLAs: :func:`class_replays`), measured
next to predicted.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np

from tradeoff.analysis.compare import run_compare
from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.mix import RequestClass
from tradeoff.bench.prompts import synthetic_prompts
from tradeoff.bench.records import OK, Records
from tradeoff.bench.result import server_counts
from tradeoff.bench.scrape import Snapshot, scrape
from tradeoff.bench.session import run_benchmark
from tradeoff.errors import TuneError, local_resource
from tradeoff.plan.continuous import EngineSettings, Lengths, StepCost, simulate_engine
from tradeoff.plan.deployment import pool_name, serve_flags
from tradeoff.plan.engine_search import (
    SCALE_BOUNDS,
    SIMULATED_REQUESTS,
    GenerationCalibration,
    Progress,
    capacity_rps,
)
from tradeoff.plan.predict import simulate
from tradeoff.plan.search import Calibration, version_cost
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.repository import GENERATIVE_FILE
from tradeoff.results import (
    ClassReplayed,
    ClassSummary,
    PlanCandidate,
    PlanVersion,
    Replayed,
    ServerCounts,
    Summary,
)
from tradeoff.server.process import ServerProcess
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

__all__ = ["calibrate_generation", "calibrate_generation_load", "calibrate_tensor",
           "class_replays", "generation_endpoint", "hits_and_batch", "prefix_hit_ratio",
           "replay_generation", "replay_load", "replay_prompts", "replay_tensor",
           "window_p99s"]

ROLES = ("baseline", "plan")  # the starting deployment's replay, then the written one's
WARMUP = 12  # requests a written deployment answers before its replay
PREFIX_SEED = 7  # the shared prefix: the same words in every file of a plan
LOAD_SECONDS = 8.0  # the at-rate calibration's measurement
CALIBRATION_ANSWERS = 5  # answers one request at a time, at least, by the step costs
CALIBRATION_MAX_S = 60.0  # ... within this long
LOAD_BUSY = 0.7  # ... at the traffic's rate, or the rate that keeps the start this busy


def _cpu_seconds(pid: int) -> float:
    """User and system CPU a process has used (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def calibrate_tensor(server: ServerProcess, model: str, original: PlanVersion,
                     knobs: Knobs, traffic: Traffic) -> Calibration:
    """Two short runs on the starting deployment. One request at a time for 2 s: the
    server's CPU per request beyond the model's batch of one. Then Poisson arrivals at the
    traffic's rate (at most half what the deployment can serve) for 3 s: the latency the
    simulation leaves out, at p50 and p99, and the range of the p99's share over the
    run's three windows."""
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
    # Poisson, as the simulation it is set against (a constant rate queues less)
    load = LoadSpec(rate=rate, arrival="poisson", duration_s=seconds, warmup_s=1.0)
    result, records, start_ns = run_benchmark(V2Adapter(server.url, model), load)
    p50, p99 = result.summary.latency("p50"), result.summary.latency("p99")
    if p50 is None or p99 is None:
        raise TuneError(f"the starting deployment of {model} answered no request; see the "
                        f"server log {server.log.name}")
    law = Traffic.law(rate)
    run = simulate(law.arrivals(max(2000, int(rate * seconds))), cost, knobs.max_batch_size,
                   knobs.max_queue_delay_us / 1e6, knobs.instances, cpu_ms)
    extra50 = max(0.0, p50 - run.p50_ms)  # the tail pays at least the median's extra
    return Calibration(cpu_ms, extra50, max(extra50, p99 - run.p99_ms), rate,
                       _spread(records, records.latency_ms, load, start_ns, run.p99_ms))


CALIBRATION_WINDOWS = 3  # a calibration run's p99 is read in this many parts too


def window_p99s(records: Records, values: np.ndarray, measured_ns: int, seconds: float,
                windows: int = CALIBRATION_WINDOWS) -> list[float]:
    """The p99 of ``values`` (one per record: its latency, its TTFT) over the successes
    scheduled in each of ``windows`` equal parts of a run measured from ``measured_ns``
    for ``seconds`` (parts with none left out): how much the machine's load moved it
    while it ran."""
    ok = (records.outcome == OK) & np.isfinite(values)
    part = (records.scheduled_ns - measured_ns) // (seconds * 1e9 / windows)
    out = []
    for window in range(windows):
        chosen = values[ok & (part == window)]
        if chosen.size:
            out.append(float(np.percentile(chosen, 99)))
    return out


def _spread(records: Records, values: np.ndarray, load: LoadSpec, start_ns: int,
            simulated_ms: float) -> tuple[float, float] | None:
    """The least and the most of a calibration run's window p99s (:func:`window_p99s`)
    less the simulated p99, as measured (below it too); None with fewer than two."""
    assert load.duration_s is not None
    windows = [x - simulated_ms for x in window_p99s(
        records, values, start_ns + int(load.warmup_s * 1e9), load.duration_s)]
    return (min(windows), max(windows)) if len(windows) > 1 else None


def _scale(measured: float | None, simulated: float) -> float:
    if measured is None or not math.isfinite(simulated) or simulated <= 0:
        return 1.0
    return min(max(measured / simulated, SCALE_BOUNDS[0]), SCALE_BOUNDS[1])


def calibrate_generation(server: ServerProcess, model: str, cost: StepCost,
                         start: EngineSettings, lengths: Lengths, goal: Goal, prompts: Path
                         ) -> tuple[GenerationCalibration, Lengths]:
    """The traffic's prompts one at a time (after 1 s of warm-up) on the starting
    deployment, for 4 s or as long as CALIBRATION_ANSWERS answers take by the in-process
    step costs (at most CALIBRATION_MAX_S): the server's count of the prompt's tokens (the
    plan's lengths are words until then), and its median TTFT and TPOT over what the step
    costs give a request alone (nothing queues, so the ratio is the steps' own). A scale
    read from one slow answer would be one sample's."""
    spec = generation_endpoint(server.url, model, "start", prompts, lengths, goal)
    one = simulate_engine(np.zeros(1), replace(lengths, shared_prefix=0), start, cost)
    seconds = min(max(4.0, CALIBRATION_ANSWERS * float(one.e2e_ms[0]) / 1e3),
                  CALIBRATION_MAX_S)
    result, _, _ = run_benchmark(make_adapter(spec), LoadSpec(
        concurrency=1, duration_s=seconds, warmup_s=1.0))
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


def calibrate_generation_load(server: ServerProcess, model: str, cost: StepCost,
                              start: EngineSettings, calibration: GenerationCalibration,
                              lengths: Lengths, goal: Goal, traffic: Traffic, prompts: Path
                              ) -> GenerationCalibration:
    """The starting deployment at the traffic's rate (or the rate that keeps it 70%
    busy) for 8 s, after 1 s: how much longer its steps take under load than alone (its
    TPOT p50 over the simulated one at that rate, refined once), carried to the
    traffic's rate by :meth:`~tradeoff.plan.engine_search.
    GenerationCalibration.at_rate`; then its TTFT p50 and p99
    less the simulated ones, what every prediction adds. One request at a time the
    server's own work waits for the engine; under load it takes a share of the cores."""
    scaled = calibration.cost(cost)
    rate = min(traffic.rate_rps, LOAD_BUSY * capacity_rps(scaled, start, lengths))
    spec = generation_endpoint(server.url, model, "start", prompts, lengths, goal)
    load = LoadSpec(rate=rate, arrival="poisson", duration_s=LOAD_SECONDS, warmup_s=1.0)
    result, records, start_ns = run_benchmark(make_adapter(spec), load)
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
    # the server's own time is in every request: the tail pays at least the median's
    extra[99] = max(extra[99], extra[50])
    return replace(calibration, load_scale=factor, load_rate_rps=rate,
                   ttft_extra_p50_ms=extra[50], ttft_extra_p99_ms=extra[99],
                   ttft_extra_p99_range_ms=_spread(records, records.ttft_ms, load, start_ns,
                                                   run.percentile(run.ttft_ms, 99))
                   ).at_rate(traffic.rate_rps)


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


def _class_mix(classes: dict[str, float] | None) -> tuple[RequestClass, ...]:
    """With two or more classes (their shares), each request drawn to one and carrying it
    (``class`` in the body, which a router reads); none for one class."""
    if not classes or len(classes) < 2:
        return ()
    return tuple(RequestClass(name, share, {"class": name}) for name, share in classes.items())


def _within(p99: float | None, tpot99: float | None, errors: float, sla_ms: float,
            tpot_sla_ms: float | None, goal: Goal) -> bool:
    """A p99 (a generative model's TTFT) within ``sla_ms``, the TPOT p99 within
    ``tpot_sla_ms`` (None: no TPOT SLA) and the errors within the goal's share."""
    return p99 is not None and p99 <= sla_ms and errors <= goal.max_error_percent and (
        tpot_sla_ms is None or (tpot99 is not None and tpot99 <= tpot_sla_ms))


def _met(goal: Goal, per_class: list[ClassReplayed], p99: float | None,
         tpot99: float | None, errors: float) -> bool:
    """Whether a replayed deployment met the goal: with classes, each class its own SLAs;
    else the goal's."""
    if per_class:
        return all(c.meets_sla for c in per_class)
    return _within(p99, tpot99, errors, goal.sla_p99_ms, goal.sla_tpot_ms, goal)


def class_replays(classes: list[ClassSummary], candidate: PlanCandidate, goal: Goal
                  ) -> list[ClassReplayed]:
    """Each class's p99 on replay against its own SLA (a generative model's: TTFT and
    TPOT p99 against both of its SLAs), beside what was predicted for it: its pool's, its
    own in one engine, or the one pool's for every class."""
    predicted = {**{p.request_class: p.candidate.predicted for p in candidate.pools},
                 **candidate.class_predicted}
    generative = goal.sla_tpot_ms is not None
    out = []
    for c in classes:
        p99 = (c.ttft_ms or {}).get("p99") if generative else c.latency("p99")
        tpot99 = (c.tpot_ms or {}).get("p99") if generative else None
        tpot_sla = goal.tpot_for(c.name) if generative else None
        errors = 100.0 * c.errors / c.requests if c.requests else 0.0
        sla = goal.sla_for(c.name)
        out.append(ClassReplayed(c.name, sla, p99, predicted.get(c.name, candidate.predicted),
                                 errors, _within(p99, tpot99, errors, sla, tpot_sla, goal),
                                 tpot_sla, tpot99))
    return out


def replay_tensor(baseline_server: ServerProcess, target: Path, model: str,
                  candidate: PlanCandidate, baseline: PlanCandidate, traffic: Traffic,
                  goal: Goal, cpus: str | None, say: Progress = lambda _: None
                  ) -> list[Replayed]:
    """The starting deployment and the candidate's, served side by side and the traffic
    replayed against both in two interleaved rounds (each said as it begins); with
    classes, each request carries its class (a trace's in its order, else drawn by the
    classes' shares) and each class is measured against its own SLA."""
    classes = _class_mix(traffic.classes)
    with ServerProcess(target, cpus=cpus,
                       extra_args=tuple(serve_flags(candidate))) as plan_server:
        distinct = traffic.distinct_inputs if traffic.repeats else None
        zipf = traffic.zipf if traffic.repeats else None
        # a trace's inputs in its own order (each round from its start); a law's drawn
        sequence = tuple(int(i) for i in traffic.inputs) \
            if traffic.repeats and traffic.inputs is not None else ()
        class_order = traffic.class_sequence() if classes else ()
        endpoints = [EndpointSpec(url, model=model, name=role, distinct_inputs=distinct,
                                  zipf=zipf, classes=classes, input_sequence=sequence,
                                  class_sequence=class_order)
                     for url, role in zip((baseline_server.url, plan_server.url), ROLES,
                                          strict=True)]
        pools = [V2Adapter(plan_server.url, pool_name(model, p.request_class))
                 for p in candidate.pools]
        before = [pool.server_stats() for pool in pools]
        compared = run_compare(endpoints, replay_load(traffic, goal.replay_s), rounds=2,
                               sla_p99_ms=goal.strictest(traffic.classes),
                               on_round=_saying(say))
        pool_counts = [server_counts(b, pool.server_stats())
                       for b, pool in zip(before, pools, strict=True)]
    out = []
    for entry, predicted, role in zip(compared.endpoints, (baseline, candidate), ROLES,
                                      strict=True):
        summary = entry.result.summary
        counts = [summary.server_counts] if not predicted.pools else pool_counts
        hit, batch = hits_and_batch(counts)
        p99 = summary.latency("p99")
        per_class = class_replays(entry.result.classes or [], predicted, goal)
        out.append(Replayed(
            predicted.name, role, summary.latency("p50"), p99, summary.throughput_rps,
            summary.error_percent, hit, batch, predicted.predicted,
            _met(goal, per_class, p99, None, summary.error_percent),
            goal.cost_per_million(predicted.cores, summary.throughput_rps), per_class,
            p99_rounds_ms=[r.latency("p99") for r in entry.rounds]))
    return out


def _saying(say: Progress) -> Callable[[int, str], None]:
    return lambda number, role: say(f"replay round {number} of 2: {role}")


def hits_and_batch(counts: list[ServerCounts | None]) -> tuple[float | None, float | None]:
    """The cache's hit ratio and the mean batch over one model's counts or its pools'."""
    known = [c for c in counts if c is not None]
    if not known:
        return None, None
    executions = sum(c.executions for c in known)
    batch = sum(c.computed for c in known) / executions if executions else None
    lookups = [c for c in known if c.cache_hits is not None]
    looked = sum((c.cache_hits or 0) + (c.cache_misses or 0) for c in lookups)
    hit = sum(c.cache_hits or 0 for c in lookups) / looked if looked else None
    return hit, batch


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
    mix = _class_mix(classes)
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


def replay_generation(baseline: ServerProcess, target: Path, model: str,
                      candidate: PlanCandidate, start: PlanCandidate, goal: Goal,
                      lengths: Lengths, prompts: tuple[Path, Path], warmup_prompts: Path,
                      load: LoadSpec, cpus: str | None, classes: dict[str, float] | None = None,
                      class_sequence: tuple[int, ...] = (), say: Progress = lambda _: None
                      ) -> list[Replayed]:
    """The starting deployment and the candidate's side by side, the prompts replayed at
    the traffic's arrivals: TTFT (p50, p99) and TPOT against both SLAs, and the prefix
    cache's hits read from each server's ``/metrics``; with two or more ``classes``,
    each request carries its class (drawn by the shares, or a trace's in its order:
    ``class_sequence``) and each class is measured against its own SLAs."""
    with ServerProcess(target, cpus=cpus) as plan_server:
        endpoints, later = ([generation_endpoint(url, model, role, file, lengths, goal,
                                                 classes, class_sequence)
                             for url, role in zip((baseline.url, plan_server.url), ROLES,
                                                  strict=True)]
                            for file in prompts)
        # the start was warmed by the calibration: the plan's first answers (lazy set-up,
        # the prefill pacer learning its costs) are not its steady state either
        warm = generation_endpoint(plan_server.url, model, "warm-up", warmup_prompts, lengths,
                                   goal, classes)  # with classes: every engine's
        run_benchmark(make_adapter(warm), LoadSpec(concurrency=2, requests=WARMUP,
                                                   warmup_s=0.0))
        servers = (baseline, plan_server)
        before = [scrape(server.metrics_url) for server in servers]
        # two rounds, each with prompts of its own: a prompt sent again would be found
        # whole in the prefix cache
        compared = run_compare(endpoints, load, rounds=2, later_rounds=[later],
                               on_round=_saying(say))
        engines = ([model], _engines(target))
        hits = [prefix_hit_ratio(b, scrape(server.metrics_url), names)
                for b, server, names in zip(before, servers, engines, strict=True)]
    out = []
    for entry, predicted, role, hit in zip(compared.endpoints, (start, candidate), ROLES,
                                           hits, strict=True):
        summary = entry.result.summary
        ttft50, ttft99, _, tpot99 = _percentiles(summary)
        generation = summary.generation
        tokens_per_s = generation.output_tokens_per_s if generation else 0.0
        per_class = class_replays(entry.result.classes or [], predicted, goal)
        out.append(Replayed(
            predicted.name, role, ttft50, ttft99, summary.throughput_rps,
            summary.error_percent, hit, None, predicted.predicted,
            _met(goal, per_class, ttft99, tpot99, summary.error_percent),
            goal.cost_per_million(predicted.cores, tokens_per_s), per_class,
            tpot_p99_ms=tpot99, output_tokens_per_s=tokens_per_s,
            goodput_rps=generation.goodput_rps if generation else None,
            p99_rounds_ms=[_percentiles(r)[1] for r in entry.rounds]))
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
