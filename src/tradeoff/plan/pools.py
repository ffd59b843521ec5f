"""A pool per class of requests, weighed against one pool for all.

    pools, why = search_pools(traffic, goal, config, versions, calibration, start)
    pools, why = search_engine_pools(traffic, goal, versions, costs, lengths, start,
                                     calibrate)          # a generative model: an engine each

Each class's own traffic (:meth:`~tradeoff.plan.traffic.Traffic.part`) is searched alone
under its own SLA with the plan's own searcher (the tensor plan's
:class:`~tradeoff.plan.search.Searcher`, or the engine's
:class:`~tradeoff.plan.engine_search.EngineSearcher`), and the classes' deployments are
combined within the cores (:func:`~tradeoff.plan.search.pooled`). On replay each class is
measured against its own SLA (:func:`~tradeoff.plan.measure.class_replays`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from tradeoff.plan.continuous import EngineSettings, Lengths, StepCost
from tradeoff.plan.engine_search import EngineSearcher, GenerationCalibration
from tradeoff.plan.search import (
    MAX_POOLED_CLASSES,
    Calibration,
    ClassSearch,
    Searcher,
    cache_choice,
    pooled,
)
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.config import ModelConfig
from tradeoff.results import PlanCandidate, PlanVersion
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

__all__ = ["search_engine_pools", "search_pools"]


def search_pools(traffic: Traffic, goal: Goal, config: ModelConfig,
                 versions: list[PlanVersion], calibration: Calibration,
                 start: tuple[int, Knobs], say: Callable[[str], None] = lambda _: None
                 ) -> tuple[list[PlanCandidate], str]:
    """With two or more classes: each class's traffic searched alone under its own SLA,
    combined into a pool per class (:func:`tradeoff.plan.search.pooled`); the candidates
    and what the classes lever says of them."""
    classes = traffic.classes
    named = ", ".join(f"{c} {share:.0%} at p99 <= {goal.sla_for(c):g} ms"
                      for c, share in classes.items())
    refused = _not_pooled(traffic, goal, named)
    if refused:
        return [], refused
    parts = []
    for request_class, share in classes.items():
        part = traffic.part(request_class)
        sla = goal.sla_for(request_class)
        alone = replace(goal, sla_p99_ms=sla, cores=goal.cores - len(classes) + 1)
        cache = cache_choice(part, config, alone.replay_requests(part.rate_rps))
        say(f"class {request_class}: its own pool at p99 <= {sla:g} ms")
        searcher = Searcher(config, part, alone, calibration, start)
        parts.append(ClassSearch(request_class, share, sla, searcher.search(versions, cache)))
    return _combined(parts, goal, traffic.rate_rps, named)


def _not_pooled(traffic: Traffic, goal: Goal, named: str) -> str | None:
    """Why the classes get no pool each (None: they may)."""
    classes = traffic.classes
    if len(classes) < 2:
        return "one class of traffic"
    if len(classes) > MAX_POOLED_CLASSES:
        return f"{len(classes)} classes ({named}): more than {MAX_POOLED_CLASSES}, so one " \
            "pool serves them all"
    if goal.cores < len(classes):
        return f"{len(classes)} classes ({named}): a pool each needs a core each, and the " \
            f"server has {goal.cores}"
    return None


def _combined(parts: list[ClassSearch], goal: Goal, rate: float, named: str
              ) -> tuple[list[PlanCandidate], str]:
    """Each class's own deployments combined into a pool each within the cores, or why
    none was; ``rate``: what the cost is per (requests, or output tokens, per second)."""
    pools = pooled(parts, goal, rate)
    missing = [p.request_class for p in parts if not any(c.meets_sla for c in p.ranked)]
    if missing:
        return [], f"{named}: no pool of its own is predicted to meet the SLA of " \
            f"{', '.join(missing)}"
    if not pools:
        return [], f"{named}: the pools that meet each class's SLA need more than the " \
            f"{goal.cores} cores the server has"
    return pools, f"{named}: a pool per class behind a router ranked against one pool " \
        "for all (which must meet the strictest SLA)"


def search_engine_pools(traffic: Traffic, goal: Goal, versions: list[PlanVersion],
                        costs: dict[int, StepCost], lengths: Lengths,
                        start: tuple[int, EngineSettings],
                        calibrate: Callable[[int], GenerationCalibration],
                        say: Callable[[str], None] = lambda _: None, gpu: bool = False
                        ) -> tuple[list[PlanCandidate], str]:
    """A generative model's classes, each with an engine of its own: the cores split
    evenly between the engines (``threads`` each in generate.yaml), each class's traffic
    searched alone under its own TTFT and TPOT SLAs on the step costs ``calibrate(threads)``
    measures for an engine of that many threads; combined like the tensor pools. Not on
    a GPU (``gpu``): engines there share the device, which the step costs do not hold."""
    classes = traffic.classes
    named = ", ".join(f"{c} {share:.0%} at TTFT p99 <= {goal.sla_for(c):g} ms"
                      for c, share in classes.items())
    refused = _not_pooled(traffic, goal, named) or (
        f"{named}: engines on one GPU would share it; one engine serves every class"
        if gpu else None)
    if refused:
        return [], refused
    threads = goal.cores // len(classes)
    say(f"calibrating an engine of {threads} thread(s), as each class's own would run")
    calibration = calibrate(threads)
    parts = []
    for request_class, share in classes.items():
        alone = replace(goal, sla_p99_ms=goal.sla_for(request_class),
                        sla_tpot_ms=goal.tpot_for(request_class), class_sla_ms={},
                        class_tpot_ms={}, cores=threads)
        say(f"class {request_class}: its own engine at TTFT p99 <= {alone.sla_p99_ms:g} ms")
        searcher = EngineSearcher(traffic.part(request_class), lengths, alone, calibration,
                                  start)
        ranked = [replace(c, knobs={**c.knobs, "threads": threads})
                  for c in searcher.search(versions, costs)]
        parts.append(ClassSearch(request_class, share, alone.sla_p99_ms, ranked))
    pools, why = _combined(parts, goal, traffic.rate_rps * lengths.output, named)
    return [replace(p, class_predicted={pool.request_class: pool.candidate.predicted
                                        for pool in p.pools}) for p in pools], why
