"""Each lever a plan weighs, taken or left, and why: what its document says of the
deployment it chose against the starting one.

    levers(versions, original, baseline, chosen, cache, pools_why, bool(pools))
    engine_levers(versions, baseline, chosen, lengths, priorities, pools_why, bool(pools))

A tensor model's levers: precision, batching (max batch size and queue delay), instances,
the response cache and a pool per class. A generative model's: precision, the engine's
batch (sequences and token budget), prefix caching and, with classes, scheduling by class
and an engine per class.
"""

from __future__ import annotations

from tradeoff.plan.continuous import Lengths
from tradeoff.plan.search import CacheChoice
from tradeoff.results import PlanCandidate, PlanLever, PlanVersion

__all__ = ["engine_levers", "levers"]


def levers(versions: list[PlanVersion], original: PlanVersion, baseline: PlanCandidate,
           chosen: PlanCandidate | None, cache: CacheChoice, pools_why: str,
           pools_weighed: bool) -> list[PlanLever]:
    """Each lever, taken or left, and why (``pools_why``: what the search of a pool per
    class found; ``pools_weighed``: whether any was ranked)."""
    if chosen is None:
        return [PlanLever("plan", False, "no deployment was replayed")]
    left = [v for v in versions if not v.kept]
    # each pool's own version and knobs, or the one deployment's
    parts = [(f"{p.request_class}: ", p.candidate) for p in chosen.pools] or [("", chosen)]
    precision = PlanLever(
        "precision", any(c.version != original.version for _, c in parts),
        "; ".join(f"{at}version {c.version} ({c.precision}, {c.drop:.2%} lost)"
                  for at, c in parts) + " ranked best"
        + "".join(f"; v{v.version} {v.precision} left out: {v.why}" for v in left))
    old = baseline.knobs
    batching = PlanLever(
        "batching", any((old["max_batch_size"], old["max_queue_delay_us"]) !=
                        (c.knobs["max_batch_size"], c.knobs["max_queue_delay_us"])
                        for _, c in parts),
        "; ".join(f"{at}max_batch_size {old['max_batch_size']} -> "
                  f"{c.knobs['max_batch_size']}, queue delay {old['max_queue_delay_us']} -> "
                  f"{c.knobs['max_queue_delay_us']} us: predicted mean batch "
                  f"{c.predicted.mean_batch:.1f}" for at, c in parts))
    instances = PlanLever(
        "instances", any(old["instances"] != c.knobs["instances"] for _, c in parts),
        "; ".join(f"{at}{old['instances']} -> {c.knobs['instances']} instance(s) of "
                  f"{c.knobs['threads']} thread(s), predicted utilisation "
                  f"{c.predicted.utilisation:.0%}" for at, c in parts)
        + f": {chosen.cores} core(s)")
    cached = PlanLever("cache", chosen.cache_bytes > 0, cache.why + (
        "" if chosen.cache_bytes or not cache.capacity else
        "; the deployment without it ranked better"))
    classes = PlanLever("classes", bool(chosen.pools), pools_why + (
        "" if not pools_weighed else "; the pools ranked best" if chosen.pools else
        "; one pool ranked better"))
    return [precision, batching, instances, cached, classes]


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
