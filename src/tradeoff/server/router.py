"""A router serving: the loaded form of ``router.yaml`` (repository/router.py) and what it
counts. Its fallback walk and its shadow copies are written here once, for routers of
tensor models and of generative models alike; the data plane says what one attempt on a
target is.

    routed = RoutedModel("mlp_router", config, signature)
    await routed.start()                                      # its pools' first checks
    answer, target = await routed.send(parameters, attempt)   # attempt(target) -> answer
    routed.shadow(busy, copy)                                 # a background copy, bounded

A target that names one of the router's ``pools`` is served by other servers
(:mod:`tradeoff.server.replica_pool`, :mod:`tradeoff.server.gateway`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any, TypeVar

import numpy as np

from tradeoff import dtypes
from tradeoff.errors import (
    Forbidden,
    InferenceFailed,
    InvalidInput,
    NotFound,
    RequestError,
    Unavailable,
)
from tradeoff.protocol.v2 import TensorOutput
from tradeoff.repository.router import Decision, RouterConfig, Signature, Target, class_name_problem
from tradeoff.server.replica_pool import ReplicaPool

__all__ = ["SHADOW_IN_FLIGHT", "RoutedModel", "RouterStats", "ShadowStats", "T", "check_direct",
           "common_prefix", "merge_router_stats"]

SHADOW_IN_FLIGHT = 8  # shadow copies a router holds at once; more are dropped

T = TypeVar("T")


def common_prefix(a: str, b: str, block: int = 4096) -> int:
    """How many characters ``a`` and ``b`` share before their first difference: blocks
    compared whole, then one block character by character."""
    if a == b:
        return len(a)
    end = min(len(a), len(b))
    start = 0
    while start < end and a[start:start + block] == b[start:start + block]:
        start += block
    stop = min(start + block, end)
    return next((i for i in range(start, stop) if a[i] != b[i]), stop)


@dataclass
class ShadowStats:
    """Shadow copies: sent, dropped (target busy), failed, and how their answers
    compared with the primary's."""

    sent: int = 0
    dropped: int = 0
    failed: int = 0
    compared: int = 0
    max_abs_diff: float = 0.0      # the largest seen
    sum_max_abs_diff: float = 0.0  # of each comparison's largest difference
    top1_agree: int = 0
    top1_total: int = 0
    token_agree: int = 0   # generations: positions where the shadow chose the same token
    token_total: int = 0   # ... out of the primary answer's tokens
    texts_compared: int = 0  # generations compared by their text (a pool's side is text)
    texts_identical: int = 0
    text_prefix_chars: int = 0  # the primary answer's characters before the shadow's differ
    text_chars: int = 0         # ... out of the primary answer's characters

    def compare_tokens(self, primary: list[int], shadow: list[int]) -> None:
        """Record how many of the primary answer's tokens the shadow chose alike, position
        by position."""
        self.token_agree += sum(a == b for a, b in zip(primary, shadow, strict=False))
        self.token_total += len(primary)
        self.compared += 1

    def compare_text(self, primary: str, shadow: str) -> None:
        """Record whether the shadow's answer text is the primary's, and how much of the
        primary's it matched before the first difference (answers from other servers
        come as text: their tokens are the replica's own)."""
        same = common_prefix(primary, shadow)
        self.texts_compared += 1
        self.texts_identical += primary == shadow
        self.text_prefix_chars += same
        self.text_chars += len(primary)
        self.compared += 1

    def compare(self, primary: list[TensorOutput], shadow: list[TensorOutput]) -> None:
        """Record how ``shadow``'s numeric outputs differ from ``primary``'s."""
        by_name = {o.name: o.array for o in shadow}
        worst = 0.0
        for output in primary:
            other = by_name.get(output.name)
            if other is None or output.array.dtype.kind not in "iuf" or \
                    other.shape != output.array.shape:
                continue
            if output.array.size:
                difference = np.abs(output.array.astype(np.float64) - other.astype(np.float64))
                worst = max(worst, float(difference.max()))
            if output.array.ndim >= 2 and output.array.shape[-1] > 1:
                same = np.argmax(output.array, axis=-1) == np.argmax(other, axis=-1)
                self.top1_agree += int(same.sum())
                self.top1_total += int(same.size)
        self.compared += 1
        self.max_abs_diff = max(self.max_abs_diff, worst)
        self.sum_max_abs_diff += worst

    def to_dict(self) -> dict[str, Any]:
        """The counts (which :meth:`from_dict` reads back) and the ratios they give."""
        return {**asdict(self),
                "mean_max_abs_diff": self.sum_max_abs_diff / self.compared
                if self.compared else None,
                "top1_agreement": self.top1_agree / self.top1_total
                if self.top1_total else None,
                "token_agreement": self.token_agree / self.token_total
                if self.token_total else None,
                "text_identical": self.texts_identical / self.texts_compared
                if self.texts_compared else None,
                "text_prefix_agreement": self.text_prefix_chars / self.text_chars
                if self.text_chars else None}

    @classmethod
    def from_dict(cls, doc: dict[str, Any]) -> ShadowStats:
        return cls(**{f.name: doc[f.name] for f in fields(cls)})

    def add(self, other: ShadowStats) -> None:
        """Count ``other``'s copies too (another front end's)."""
        for f in fields(self):
            mine, theirs = getattr(self, f.name), getattr(other, f.name)
            setattr(self, f.name, max(mine, theirs) if f.name == "max_abs_diff"
                    else mine + theirs)


@dataclass
class RouterStats:
    """Per route and arm, per fallback target, and the shadow's; in the statistics
    extension's shape, with the routing counts beside it."""

    name: str
    config: RouterConfig
    success: list[int] = field(default_factory=lambda: [0, 0])
    fail: list[int] = field(default_factory=lambda: [0, 0])
    last_inference_ms: int = 0
    arms: dict[tuple[int, int], int] = field(default_factory=dict)
    fallbacks: dict[str, int] = field(default_factory=dict)
    shadow: ShadowStats = field(default_factory=ShadowStats)
    pools: list[ReplicaPool] = field(default_factory=list)

    def served(self, decision: Decision, fallback: Target | None, total_ns: int) -> None:
        key = (decision.route, decision.arm)
        self.arms[key] = self.arms.get(key, 0) + 1
        if fallback is not None:
            self.fallbacks[fallback.label] = self.fallbacks.get(fallback.label, 0) + 1
        self.success[0] += 1
        self.success[1] += total_ns
        self.last_inference_ms = int(time.time() * 1000)

    def failed(self, total_ns: int) -> None:
        self.fail[0] += 1
        self.fail[1] += total_ns
        self.last_inference_ms = int(time.time() * 1000)

    def routes(self) -> list[dict[str, Any]]:
        return [{"route": r, "arm": a, "target": route.arms[a].label,
                 "count": self.arms.get((r, a), 0)}
                for r, route in enumerate(self.config.routes) for a in range(len(route.arms))]

    def to_dict(self) -> dict[str, Any]:
        """The statistics extension's entry. A router holds no queue: each answered
        request passed its (empty) queue once, as through an ensemble's, so tools that
        find the version serving by its queue count (perf_analyzer) find it."""
        zero = {"count": 0, "ns": 0}
        return {
            "name": self.name, "version": "1", "last_inference": self.last_inference_ms,
            "inference_count": 0, "execution_count": 0,
            "inference_stats": {
                "success": {"count": self.success[0], "ns": self.success[1]},
                "fail": {"count": self.fail[0], "ns": self.fail[1]},
                "queue": {"count": self.success[0], "ns": 0},
                **{part: zero for part in ("compute_input", "compute_infer",
                                           "compute_output", "cache_hit", "cache_miss")}},
            "batch_stats": [],
            "routes": self.routes(), "fallbacks": dict(self.fallbacks),
            "shadow": self.shadow.to_dict(),
            **({"pools": [pool.snapshot() for pool in self.pools]} if self.pools else {})}


def merge_router_stats(entries: list[dict[str, Any]]) -> dict[str, Any]:
    """One router's ``routes``, ``fallbacks`` and ``shadow`` from several front ends'
    statistics (:meth:`RouterStats.to_dict`) as one: every count added."""
    arms: dict[tuple[int, int], dict[str, Any]] = {}
    fallbacks: dict[str, int] = {}
    shadow = ShadowStats()
    for entry in entries:
        for route in entry["routes"]:
            key = (route["route"], route["arm"])
            if key in arms:
                arms[key]["count"] += route["count"]
            else:
                arms[key] = dict(route)
        for label, count in entry["fallbacks"].items():
            fallbacks[label] = fallbacks.get(label, 0) + count
        shadow.add(ShadowStats.from_dict(entry["shadow"]))
    merged: dict[str, Any] = {"routes": [arms[key] for key in sorted(arms)],
                              "fallbacks": fallbacks, "shadow": shadow.to_dict()}
    pools = [pool for entry in entries for pool in entry.get("pools", [])]
    if pools:
        merged["pools"] = _merge_pools(pools)
    return merged


def _merge_pools(pools: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each pool's replicas as all front ends saw them: counts added, ready where any
    front end finds it ready."""
    by_name: dict[str, dict[str, Any]] = {}
    for pool in pools:
        kept = by_name.setdefault(pool["pool"], {**pool, "replicas": []})
        replicas = {r["replica"]: r for r in kept["replicas"]}
        for replica in pool["replicas"]:
            mine = replicas.get(replica["replica"])
            if mine is None:
                kept["replicas"].append(dict(replica))
                continue
            for key, value in replica.items():
                if key == "reported_queue":  # every front end reads the same replica
                    mine[key] = value if mine[key] is None else \
                        mine[key] if value is None else max(mine[key], value)
                elif isinstance(value, bool):
                    mine[key] = mine[key] or value if key == "ready" else mine[key] and value
                elif isinstance(value, (int, float)):
                    mine[key] += value
    return list(by_name.values())


class RoutedModel:
    """A router as served: its rules, its targets' common signature, its counts."""

    version = 1

    def __init__(self, name: str, config: RouterConfig, signature: Signature | None,
                 generative: bool = False, max_batch_size: int = 0) -> None:
        self.name = name
        self.config = config
        self.signature = signature  # None for a router of generative models
        self.generative = generative
        self.max_batch_size = max_batch_size  # the least max_batch_size of the targets
        self.pools = {pool_name: ReplicaPool(pool) for pool_name, pool in config.pools.items()}
        self.stats = RouterStats(name, config, pools=list(self.pools.values()))
        self.shadows_in_flight = 0
        self._random = random.Random()

    def decide(self, parameters: dict[str, Any]) -> Decision:
        """Where a request with these parameters goes (``class``; ``timeout`` in µs)."""
        request_class = parameters.get("class")
        if request_class is not None and (problem := class_name_problem(request_class)):
            raise InvalidInput(problem)
        timeout = parameters.get("timeout")
        deadline_ms = timeout / 1000 if isinstance(timeout, int) and timeout > 0 else None
        return self.config.decide(request_class, deadline_ms, parameters,
                                  self._random.random())

    def candidates(self, decision: Decision) -> list[Target]:
        """The target the rules chose, then each fallback not already that one."""
        return [decision.target, *(t for t in self.config.fallback if t != decision.target)]

    def check_takes_tensors(self) -> None:
        """InvalidInput when this router sends to generative models."""
        if self.generative:
            raise InvalidInput(f"router {self.name!r} sends to generative models: send it "
                               "text at /v1/completions or /v1/chat/completions")

    async def send(self, parameters: dict[str, Any],
                   attempt: Callable[[Target], Awaitable[T]], timed: bool = True,
                   decision: Decision | None = None) -> tuple[T, Target]:
        """One request's way through the router: the target its rules choose, then each
        fallback in turn, past a refusal (503) or a target not serving (404), and for an
        idempotent router past a failure of a target that ran it; the first answer is
        the answer. The request's own mistake (any other 4xx) is the same everywhere:
        raised at once. ``timed``: count the time to the answer (a generation's answer
        streams after this returns: counted as 0); ``decision``: the rules' choice when
        the caller has made it."""
        started = time.perf_counter_ns()

        def elapsed() -> int:
            return time.perf_counter_ns() - started if timed else 0

        decision = decision or self.decide(parameters)
        error: RequestError | None = None
        for index, target in enumerate(self.candidates(decision)):
            try:
                answer = await attempt(target)
            except (Unavailable, NotFound) as exc:  # refused or not serving: never started
                error = exc
                continue
            except InferenceFailed as exc:  # it ran and failed: again only if idempotent
                if not self.config.idempotent:
                    self.stats.failed(elapsed())
                    raise
                error = exc
                continue
            except RequestError:
                self.stats.failed(elapsed())
                raise
            self.stats.served(decision, target if index else None, elapsed())
            return answer, target
        self.stats.failed(elapsed())
        assert error is not None
        raise error

    def shadow(self, busy: Callable[[Target], bool],
               copy: Callable[[Target], Awaitable[None]]) -> asyncio.Task[None] | None:
        """A shadow copy of the request just answered, when this one gets one
        (:meth:`wants_shadow`, then :meth:`copy_to`)."""
        target = self.wants_shadow()
        return None if target is None else self.copy_to(target, busy, copy)

    def copy_to(self, target: Target, busy: Callable[[Target], bool],
                copy: Callable[[Target], Awaitable[None]]) -> asyncio.Task[None] | None:
        """A shadow copy to ``target`` (drawn by :meth:`wants_shadow`): dropped when
        ``busy(target)`` says the target is (or raises a request error: it does not
        serve), or ``SHADOW_IN_FLIGHT`` copies are out; else ``copy(target)`` runs in
        the background (returned), which compares the answers into ``stats.shadow``.
        Its failure is counted, never the caller's."""
        stats = self.stats.shadow
        try:
            dropped = self.shadows_in_flight >= SHADOW_IN_FLIGHT or busy(target)
        except RequestError:
            dropped = True
        if dropped:
            stats.dropped += 1
            return None
        self.shadows_in_flight += 1
        stats.sent += 1

        async def run() -> None:
            try:
                await copy(target)
            except Exception:
                stats.failed += 1
            finally:
                self.shadows_in_flight -= 1

        return asyncio.ensure_future(run())

    def wants_shadow(self) -> Target | None:
        """The shadow target for this request, if it gets a copy."""
        shadow = self.config.shadow
        if shadow is None or self._random.random() >= shadow.fraction:
            return None
        return shadow.target

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The model metadata of the router (one version): its targets' common signature."""
        signature = self.signature

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": n, "datatype": d, "shape": list(s)} for n, d, s in items]

        return {"name": self.name, "versions": versions, "platform": "router",
                "inputs": tensors(signature.inputs) if signature else [],
                "outputs": tensors(signature.outputs) if signature else []}

    def model_config(self) -> dict[str, Any]:
        """Triton's config shape: the common signature, and the targets as a parameter."""
        skip = 1 if self.max_batch_size > 0 else 0
        signature = self.signature

        def tensors(items: Any) -> list[dict[str, Any]]:
            return [{"name": n, "data_type": dtypes.to_config_type(d), "dims": list(s[skip:])}
                    for n, d, s in items]

        return {"name": self.name, "platform": "router", "backend": "router",
                "version_policy": {"latest": {"num_versions": 1}},
                "max_batch_size": self.max_batch_size,
                "input": tensors(signature.inputs) if signature else [],
                "output": tensors(signature.outputs) if signature else [],
                "parameters": {"targets": {"string_value": ", ".join(self.config.models())}}}

    def adopt(self, previous: RoutedModel) -> None:
        """Take over what ``previous`` (this router before a reload) learnt of the
        replicas of the pools both have (ReplicaPool.adopt)."""
        for name, pool in self.pools.items():
            old = previous.pools.get(name)
            if old is not None:
                pool.adopt(old)

    async def start(self) -> None:
        """Check each pool's replicas once (the pools side by side), then keep checking
        them."""
        await asyncio.gather(*(pool.start() for pool in self.pools.values()))

    def begin_drain(self, timeout_s: float) -> None:
        """Nothing queues here: the targets drain their own requests."""

    async def stop(self, timeout_s: float | None = None) -> None:
        """The pools' requests in flight finish (up to ``timeout_s``) and their
        connections close; the local targets are models of their own."""
        for pool in self.pools.values():
            await pool.stop(timeout_s)


def check_direct(hidden: Mapping[str, str], name: str) -> None:
    """Forbidden (403) when a router hides model ``name`` (``hidden``: each hidden model's
    router, by its ``hide_targets``): only that router sends to it."""
    router = hidden.get(name)
    if router is not None:
        raise Forbidden(f"model {name!r} answers only through router {router!r} (its "
                        f"router.yaml hides its targets): send the request to {router!r}")
