"""The plan's search: every deployment the levers allow, predicted, ranked.

A deployment is a version of the model (a precision within the accuracy budget), serving
knobs (``tune serve``'s :class:`~tradeoff.tune.knobs.Knobs`: batch size, queue
delay, instances x threads) and a response cache sized from the traffic's repetition.
Each is predicted by :func:`tradeoff.plan.predict.simulate` over the traffic's own
arrivals; the ones that cannot keep up (the rate they see above what they can serve) are
predicted as failing without a simulation. The rank: those meeting the SLA first, then
the cheapest (cost per 1M requests, or the cores used without a price), then p99, then
the least accuracy lost.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tradeoff import dtypes
from tradeoff.plan.predict import BatchCost, Simulated, simulate
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.config import ModelConfig
from tradeoff.results import (
    OptimizeResult,
    PlanCandidate,
    PlanPool,
    PlanVersion,
    Prediction,
    VersionReport,
)
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

__all__ = ["BENCH_INPUTS", "DELAYS_US", "MAX_POOLED_CLASSES", "NO_CACHE", "CacheChoice",
           "Calibration",
           "ClassSearch", "Searcher", "answer_bytes", "cache_choice", "label",
           "pooled", "rank_key", "supported_range", "version_cost", "weigh"]

DELAYS_US = (0, 100, 500, 1000, 2000, 5000, 10000)
MIN_HIT_RATIO = 0.02  # a cache predicted to answer less costs more than it saves
ENTRY_OVERHEAD_BYTES = 256  # key, header and check of one stored answer


@dataclass(frozen=True)
class Calibration:
    """What the batch cost alone does not hold, measured on the starting deployment: the
    server's CPU per request beside the model (it shares the core), and the latency the
    simulation leaves out at p50 and p99 (the client, the wire, the OS), measured at
    ``rate_rps`` as the measured latency less the simulated one. ``wire_p99_range_ms``:
    the least and the most of each window's p99 less the simulated one in that run (below
    zero where a window's p99 was under the simulation's), as the machine's load moved
    while it was measured (None: not measured so)."""

    cpu_ms: float
    wire_p50_ms: float
    wire_p99_ms: float
    rate_rps: float
    wire_p99_range_ms: tuple[float, float] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"server_cpu_ms_per_request": self.cpu_ms, "wire_p50_ms": self.wire_p50_ms,
                "wire_p99_ms": self.wire_p99_ms, "rate_rps": self.rate_rps,
                "wire_p99_range_ms": None if self.wire_p99_range_ms is None
                else list(self.wire_p99_range_ms)}

    def p99_range(self, simulated_p99_ms: float) -> list[float] | None:
        """The p99 the calibration supports for a simulated one (:func:`supported_range`)."""
        return supported_range(simulated_p99_ms, self.wire_p99_ms, self.wire_p99_range_ms)


def supported_range(simulated_ms: float, extra_ms: float,
                    extra_range_ms: tuple[float, float] | None) -> list[float] | None:
    """A predicted p99 as the range its calibration supports: the simulated p99 plus the
    least and the most of what the calibration's windows found the simulation leaves
    out, the prediction itself (plus ``extra_ms``) always inside; None without windows."""
    if extra_range_ms is None or not math.isfinite(simulated_ms):
        return None
    low, high = extra_range_ms
    point = simulated_ms + extra_ms
    return [min(point, simulated_ms + low), max(point, simulated_ms + high)]


@dataclass(frozen=True)
class CacheChoice:
    """The cache the traffic's repetition asks for (capacity 0: none) and why."""

    capacity: int
    size_bytes: int
    hit_ratio: float
    why: str


NO_CACHE = CacheChoice(0, 0, 0.0, "off")
# said of a cache predicted from a bench --records CSV
BENCH_INPUTS = ("; these inputs are the bench's own set (its --distinct-inputs or "
                "--input-data), not your users' requests: the prediction holds only as far "
                "as that set is like them (a JSON lines trace with each request's input "
                "predicts from real ones)")


def answer_bytes(config: ModelConfig) -> int:
    """Bytes of one answer's outputs (variable dimensions and strings counted as 1 and 64
    bytes): what a cached answer holds."""
    total = 0
    for t in config.outputs:
        elements = math.prod(max(d, 1) for d in t.dims)
        total += elements * (dtypes.element_size(t.datatype) or 64)
    return total


def cache_choice(traffic: Traffic, config: ModelConfig, requests: int | None = None
                 ) -> CacheChoice:
    """The smallest LRU that gets 95% of the hit ratio a cache of every input would, by
    Che's approximation over the traffic's input shares, for a cache that starts empty
    and sees ``requests`` (None: the steady state); none when the traffic does not repeat
    or the best hit ratio is under 2%."""
    if not traffic.repeats or traffic.distinct_inputs is None:
        return CacheChoice(0, 0, 0.0, "every request's input differs: nothing to reuse")
    distinct = traffic.distinct_inputs
    best = traffic.hit_ratio(distinct, requests)
    if best < MIN_HIT_RATIO:
        return CacheChoice(0, 0, best, f"a cache of every input would answer {best:.1%} of "
                           "requests: less than the lookups cost")
    capacity = distinct
    for size in (2 ** k for k in range(4, max(5, distinct.bit_length()))):
        if size < distinct and traffic.hit_ratio(size, requests) >= 0.95 * best:
            capacity = size
            break
    hit = traffic.hit_ratio(capacity, requests)
    size_bytes = max(capacity * (answer_bytes(config) + ENTRY_OVERHEAD_BYTES) * 5 // 4,
                     1 << 20)
    return CacheChoice(capacity, size_bytes, hit,
                       f"{traffic.distinct_inputs:,} distinct inputs (Zipf "
                       f"{traffic.zipf or 0:.2f}): {capacity:,} answers predicted to "
                       f"answer {hit:.1%} of requests ({best:.1%} with all of them)"
                       + (BENCH_INPUTS if traffic.inputs_from == "bench" else ""))


def weigh(optimized: OptimizeResult, max_drop: float,
          loss: Callable[[VersionReport], float] = lambda v: v.drop,
          shown: Callable[[float], str] = lambda d: f"lost {d:.2%}") -> list[PlanVersion]:
    """Each version ``tradeoff optimize`` measured, as the plan weighs it: what it lost
    (``loss``: the optimize run's drop, or a generative model's perplexity rise), kept
    within ``max_drop`` and why, and the time of one batch at each size."""
    out = []
    for v in optimized.versions:
        lost = loss(v)
        over = lost > max_drop
        why = (f"{shown(lost)}, over the budget of {max_drop:.2%}" if over else
               "the original" if v.version == optimized.source_version else
               f"{shown(lost)}, within the budget of {max_drop:.2%}")
        out.append(PlanVersion(v.version, v.precision, v.method, lost, not over, why,
                               {b: 1e3 * b / t for b, t in sorted(v.throughput_by_batch.items())
                                if t > 0}))
    return out


def label(version: PlanVersion, knobs: Knobs, cache: CacheChoice) -> str:
    """A deployment in a few words: ``v4 int8 b16 d500 2x1 c4096``: version and
    precision, max batch size, queue delay (us), instances x threads, cached answers."""
    return (f"v{version.version} {version.precision} b{knobs.max_batch_size} "
            f"d{knobs.max_queue_delay_us} {knobs.instances}x{knobs.threads}"
            + (f" c{cache.capacity}" if cache.capacity else ""))


def version_cost(version: PlanVersion) -> BatchCost:
    """The measured batch times of a version, as the predictor reads them."""
    sizes = sorted(version.batch_ms)
    return BatchCost(tuple(sizes), tuple(version.batch_ms[b] for b in sizes))


def rank_key(candidate: PlanCandidate, sla_p99_ms: float, goal: Goal | None = None
             ) -> tuple[float, ...]:
    """Meets the SLA, then cost (cores without a price), then p99 to 5% of the SLA (a
    closer difference is within what the prediction can tell), then the fewest changes
    from the starting deployment, then accuracy. With each class predicted apart
    (``class_predicted``) and ``goal``, the p99 read is the class closest to its own SLA's,
    as a share of it: the most headroom where it is least."""
    p99 = candidate.predicted.p99_ms
    share = p99 / sla_p99_ms
    if goal is not None and candidate.class_predicted:
        share = max(p.p99_ms / goal.sla_for(c) for c, p in candidate.class_predicted.items())
    return (0.0 if candidate.meets_sla else 1.0, candidate.cost if candidate.meets_sla else 0.0,
            math.floor(share / 0.05) if math.isfinite(share) else math.inf,
            float(candidate.changes), candidate.drop, p99)


class Searcher:
    """Predicts deployments of one model under one traffic and goal."""

    def __init__(self, config: ModelConfig, traffic: Traffic, goal: Goal,
                 calibration: Calibration, start: tuple[int, Knobs], seed: int = 0) -> None:
        self.config = config
        self.start = start  # the starting deployment's version and knobs
        self.traffic = traffic
        self.goal = goal
        self.calibration = calibration
        self.arrivals = traffic.arrivals(goal.simulated_requests, seed)
        self.rng = np.random.default_rng([seed, 0xCAC4E])
        self.threads = int(config.parameters.get("intra_op_thread_count", 1))

    def knobs(self, cost: BatchCost) -> list[Knobs]:
        """Batch sizes measured (up to the config's), delays up to half the SLA,
        instances that fit the cores at the config's threads each."""
        sizes = [b for b in cost.sizes if b <= max(self.config.max_batch_size, 1)] or [1]
        delays = [d for d in DELAYS_US if d <= self.goal.sla_p99_ms * 500]
        most = max(1, self.goal.cores // self.threads)
        seen: dict[Knobs, None] = {}
        for size in sizes:
            for delay in delays:
                for instances in range(1, most + 1):
                    seen.setdefault(Knobs(size, delay, instances, self.threads,
                                          False).normal())
        return list(seen)

    def simulate(self, version: PlanVersion, knobs: Knobs, hit: float = 0.0) -> Simulated:
        """The batcher over the traffic's arrivals, without the calibration's latency."""
        hits = self.rng.random(self.arrivals.size) < hit if hit else None
        return simulate(self.arrivals, version_cost(version), knobs.max_batch_size,
                        knobs.max_queue_delay_us / 1e6, knobs.instances,
                        self.calibration.cpu_ms, hits)

    def predict(self, version: PlanVersion, knobs: Knobs, cache: CacheChoice
                ) -> PlanCandidate:
        cost = version_cost(version)
        hit = cache.hit_ratio if cache.capacity else 0.0
        seen_rate = self.traffic.rate_rps * (1 - hit)
        capacity = cost.capacity_rps(knobs.max_batch_size, knobs.instances,
                                     self.calibration.cpu_ms)
        utilisation = seen_rate / capacity
        name = label(version, knobs, cache)
        if utilisation >= 1:
            prediction = Prediction(math.inf, math.inf, float(knobs.max_batch_size), hit,
                                    utilisation)
        else:
            run = self.simulate(version, knobs, hit)
            prediction = Prediction(run.p50_ms + self.calibration.wire_p50_ms,
                                    run.p99_ms + self.calibration.wire_p99_ms,
                                    run.mean_batch, hit, utilisation,
                                    p99_range_ms=self.calibration.p99_range(run.p99_ms))
        return PlanCandidate(
            name, version.version, version.precision, version.drop,
            {k: getattr(knobs, k) for k in ("max_batch_size", "max_queue_delay_us",
                                            "instances", "threads")},
            cache.size_bytes if cache.capacity else 0, knobs.cores, prediction,
            self.goal.cost_per_million(knobs.cores, self.traffic.rate_rps),
            prediction.p99_ms <= self.goal.sla_p99_ms, self.changes(version, knobs, cache))

    def changes(self, version: PlanVersion, knobs: Knobs, cache: CacheChoice) -> int:
        """How many levers differ from the starting deployment."""
        version_start, start = self.start
        moved = [version.version != version_start, bool(cache.capacity)]
        moved += [getattr(knobs, k) != getattr(start, k)
                  for k in ("max_batch_size", "max_queue_delay_us", "instances", "threads")]
        return sum(moved)

    def search(self, versions: list[PlanVersion], cache: CacheChoice,
               say: Callable[[str], None] = lambda _: None) -> list[PlanCandidate]:
        """Every kept version x knobs x (no cache, the chosen cache), ranked."""
        caches = [NO_CACHE] + ([cache] if cache.capacity else [])
        out = []
        for version in versions:
            if not version.kept:
                continue
            grid = self.knobs(version_cost(version))
            say(f"predicting version {version.version} ({version.precision}): "
                f"{len(grid) * len(caches)} deployments")
            out += [self.predict(version, knobs, c) for knobs in grid for c in caches]
        return sorted(out, key=lambda c: rank_key(c, self.goal.sla_p99_ms))


MAX_POOLED_CLASSES = 4  # more classes: one pool for all (the combinations grow as cores^k)


@dataclass(frozen=True)
class ClassSearch:
    """One request class searched alone: its share, its SLA and its own ranked deployments."""

    request_class: str
    share: float
    sla_p99_ms: float
    ranked: list[PlanCandidate]


def pooled(parts: list[ClassSearch], goal: Goal, rate_rps: float) -> list[PlanCandidate]:
    """Deployments with a pool per class behind a router: for each class, its cheapest
    deployment meeting its own SLA at each number of cores; every combination that fits
    ``goal.cores``, cheapest first. Empty when a class has no deployment meeting its SLA.
    A combination reads as its strictest class's pool (version, knobs, prediction), with
    the cores, cost and accuracy lost of the whole."""
    options: list[list[PlanCandidate]] = []
    for part in parts:
        by_cores: dict[int, PlanCandidate] = {}
        for candidate in part.ranked:  # ranked: the first that meets at a size is best
            if candidate.meets_sla:
                by_cores.setdefault(candidate.cores, candidate)
        if not by_cores:
            return []
        options.append(list(by_cores.values()))
    strictest = min(range(len(parts)), key=lambda i: parts[i].sla_p99_ms)
    out = []
    for chosen in itertools.product(*options):
        cores = sum(c.cores for c in chosen)
        if cores > goal.cores:
            continue
        lead = chosen[strictest]
        pools = [PlanPool(p.request_class, p.share, p.sla_p99_ms, c)
                 for p, c in zip(parts, chosen, strict=True)]
        out.append(replace(
            lead, name="pools: " + " + ".join(f"{p.request_class} {c.name}"
                                               for p, c in zip(parts, chosen, strict=True)),
            drop=max(c.drop for c in chosen),
            cache_bytes=sum(c.cache_bytes for c in chosen), cores=cores,
            cost_per_million=goal.cost_per_million(cores, rate_rps), meets_sla=True,
            changes=1 + max(c.changes for c in chosen), pareto=False, pools=pools))
    return sorted(out, key=lambda c: rank_key(c, parts[strictest].sla_p99_ms))
