"""A generative model's statistics: counted by its engine core as it steps, read as
a :class:`StatsSnapshot` (a copy) for ``/metrics`` and Triton's statistics extension,
with the response cache's counts that the front end keeps beside it."""

from __future__ import annotations

import bisect
import threading
import time
from typing import Any

import msgspec

__all__ = ["TOKEN_BUCKETS_S", "GenerationStats", "StatsSnapshot"]

TOKEN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
HISTOGRAMS = ("ttft", "itl", "e2e")


class StatsSnapshot(msgspec.Struct, frozen=True):
    """The engine's counters at one moment. ``batches``: steps and their nanoseconds
    per number of sequences they ran; ``histograms``: per kind, observations per bucket
    of TOKEN_BUCKETS_S (the last past every bound) and their sum in seconds."""

    name: str
    version: int
    steps: int = 0
    requests_failed: int = 0
    requests_finished: int = 0
    last_inference_ms: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    preemptions: int = 0
    batches: dict[int, tuple[int, int]] = {}
    histograms: dict[str, tuple[list[int], float]] = {}

    def to_dict(self, cache_hit: tuple[int, int] = (0, 0),
                cache_miss: tuple[int, int] = (0, 0)) -> dict[str, Any]:
        """Triton's ``model_stats`` entry: a request is one generation (success time is
        arrival to last token), an execution one engine step; ``batch_stats`` has the
        steps and their compute time per number of sequences they ran. ``cache_hit``,
        ``cache_miss``: the response cache's (count, lookup ns)."""
        e2e_total = self.histograms["e2e"][1] if "e2e" in self.histograms else 0.0
        zero = {"count": 0, "ns": 0}
        hits, hit_ns = cache_hit
        return {
            "name": self.name, "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.requests_finished, "execution_count": self.steps,
            "inference_stats": {
                "success": {"count": self.requests_finished + hits,
                            "ns": int(e2e_total * 1e9) + hit_ns},
                "fail": {"count": self.requests_failed, "ns": 0},
                **{part: zero for part in ("queue", "compute_input", "compute_infer",
                                           "compute_output")},
                "cache_hit": {"count": hits, "ns": hit_ns},
                "cache_miss": {"count": cache_miss[0], "ns": cache_miss[1]}},
            "batch_stats": [{"batch_size": size, "compute_input": zero,
                             "compute_infer": {"count": count, "ns": ns},
                             "compute_output": zero}
                            for size, (count, ns) in sorted(self.batches.items())]}


class GenerationStats:
    """Counters and latency samples, updated on the engine core's thread; ``snapshot``
    copies them under a lock, so a reader on another thread sees one whole step."""

    def __init__(self, name: str = "", version: int = 1) -> None:
        self.name = name
        self.version = version
        self.steps = 0
        self.requests_failed = 0
        self.last_inference_ms = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.preemptions = 0
        self.batches: dict[int, list[int]] = {}  # sequences in a step: [steps, ns]
        # per histogram: observations per bucket (the last one past every bound) and sum
        self.histograms = {kind: ([0] * (len(TOKEN_BUCKETS_S) + 1), [0.0])
                           for kind in HISTOGRAMS}
        self._arrival: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._lock = threading.Lock()

    def snapshot(self) -> StatsSnapshot:
        with self._lock:
            return StatsSnapshot(
                self.name, self.version, self.steps, self.requests_failed,
                self.requests_finished, self.last_inference_ms, self.prompt_tokens,
                self.generation_tokens, self.preemptions,
                {size: (count, ns) for size, (count, ns) in self.batches.items()},
                {kind: (list(counts), total[0])
                 for kind, (counts, total) in self.histograms.items()})

    def observe(self, kind: str, seconds: float) -> None:
        counts, total = self.histograms[kind]
        counts[bisect.bisect_left(TOKEN_BUCKETS_S, seconds)] += 1
        total[0] += seconds

    def arrived(self, seq_id: int, prompt_tokens: int) -> None:
        with self._lock:
            self._arrival[seq_id] = time.perf_counter()
            self.prompt_tokens += prompt_tokens

    def forget(self, seq_id: int) -> None:
        self._arrival.pop(seq_id, None)
        self._last.pop(seq_id, None)

    def failed(self, seq_ids: list[int]) -> None:
        """Requests that ended in an error."""
        with self._lock:
            self.requests_failed += len(seq_ids)
            for seq_id in seq_ids:
                self.forget(seq_id)

    def stopped(self, seq_id: int, at: float) -> None:
        """A request a stop string ended (found by the client): finished, its
        end-to-end time ending at ``at``, when its last token was published."""
        with self._lock:
            self.requests_finished += 1
            self.last_inference_ms = int(time.time() * 1000)
            self.observe("e2e", at - self._arrival.get(seq_id, at))
            self.forget(seq_id)

    def step(self, report: Any, now: float) -> None:
        with self._lock:
            self._step(report, now)

    def _step(self, report: Any, now: float) -> None:
        if report.sequences:  # a step that ran (one scheduled on nothing did not)
            self.steps += 1
            batch = self.batches.setdefault(report.sequences, [0, 0])
            batch[0] += 1
            batch[1] += int(report.seconds * 1e9)
        if report.finished:
            self.last_inference_ms = int(time.time() * 1000)  # Triton reports epoch ms
        self.preemptions += report.preempted
        for seq in report.decoded:
            self.generation_tokens += 1
            last = self._last.get(seq.seq_id)
            if last is None:
                self.observe("ttft", now - self._arrival.get(seq.seq_id, now))
            else:
                self.observe("itl", now - last)
            self._last[seq.seq_id] = now
        for seq in report.finished:
            self.requests_finished += 1
            self.observe("e2e", now - self._arrival.get(seq.seq_id, now))
            self.forget(seq.seq_id)
