"""Per model-version statistics in Triton's statistics-extension shape.

Updated only on the event loop thread, so no locks; ``/v2/models/{m}/stats`` and
``/metrics`` both read from here, so every timing is recorded exactly once.
"""

from __future__ import annotations

import copy
import time
from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

from tradeoff.scheduling.request import InferenceRequest, Timings

__all__ = ["LATENCY_BUCKETS_S", "ModelStats", "merge_model_stats", "response_cache_only"]

# Upper bounds (seconds) of the latency histogram buckets in /metrics.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                     0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
_BUCKETS_NS = tuple(int(b * 1e9) for b in LATENCY_BUCKETS_S)


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


class ModelStats:
    """Counters of one model version."""

    def __init__(self, name: str, version: int) -> None:
        self.name = name
        self.version = version
        self.success = [0, 0]
        self.fail = [0, 0]
        self.queue = [0, 0]
        self.compute_input = [0, 0]
        self.compute_infer = [0, 0]
        self.compute_output = [0, 0]
        self.fail_reasons: dict[str, int] = {}  # REJECTED, CANCELED, BACKEND
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        # batch size (rows) -> [executions, input ns, infer ns, output ns]
        self.batches: dict[int, list[int]] = {}
        self.request_buckets = [0] * (len(_BUCKETS_NS) + 1)
        self.queue_buckets = [0] * (len(_BUCKETS_NS) + 1)
        self.cache_hit = [0, 0]   # answered from the response cache: count, lookup ns
        self.cache_miss = [0, 0]  # looked up and computed: count, lookup + insertion ns

    def record_execution(self, rows: int, timings: Timings) -> None:
        entry = self.batches.get(rows)
        if entry is None:
            entry = self.batches[rows] = [0, 0, 0, 0]
        entry[0] += 1
        entry[1] += timings.compute_input_ns
        entry[2] += timings.compute_infer_ns
        entry[3] += timings.compute_output_ns
        self.execution_count += 1

    def record_batch_success(self, requests: Sequence[InferenceRequest], timings: Timings,
                             end_ns: int) -> None:
        """The requests of a batch that ran as one, all answered (``timings``: the batch's
        compute times and rows); the sums are added once per batch."""
        self.record_successes([end_ns - r.enqueue_ns for r in requests],
                              [r.timings.queue_ns for r in requests], timings)

    def record_successes(self, totals: list[int], queues: list[int], timings: Timings
                         ) -> None:
        """:meth:`record_batch_success` from each request's total and queue ns (an
        executor process's batch, recorded again in the server)."""
        count = len(totals)
        self.success[0] += count
        self.success[1] += sum(totals)
        self.queue[0] += count
        self.queue[1] += sum(queues)
        self.compute_input[0] += count
        self.compute_input[1] += count * timings.compute_input_ns
        self.compute_infer[0] += count
        self.compute_infer[1] += count * timings.compute_infer_ns
        self.compute_output[0] += count
        self.compute_output[1] += count * timings.compute_output_ns
        self.inference_count += timings.batch_size
        self.last_inference_ms = int(time.time() * 1000)  # wall clock: Triton reports epoch ms
        for total in totals:
            self.request_buckets[bisect_left(_BUCKETS_NS, total)] += 1
        for queue in queues:
            self.queue_buckets[bisect_left(_BUCKETS_NS, queue)] += 1

    def record_cache_hit(self, lookup_ns: int, total_ns: int) -> None:
        """A request answered from the response cache: a success that neither queued nor
        ran the model (Triton counts it in success, not in inference_count)."""
        self.cache_hit[0] += 1
        self.cache_hit[1] += lookup_ns
        self.success[0] += 1
        self.success[1] += total_ns
        self.last_inference_ms = int(time.time() * 1000)
        self.request_buckets[bisect_left(_BUCKETS_NS, total_ns)] += 1

    def record_cache_miss(self, lookup_ns: int) -> None:
        self.cache_miss[0] += 1
        self.cache_miss[1] += lookup_ns

    def record_cache_insert(self, insert_ns: int) -> None:
        self.cache_miss[1] += insert_ns

    def record_failure(self, total_ns: int, reason: str) -> None:
        """A request answered with an error: REJECTED (queue full or timed out in the
        queue), CANCELED (client gone) or BACKEND (the batch failed)."""
        self.fail[0] += 1
        self.fail[1] += total_ns
        self.fail_reasons[reason] = self.fail_reasons.get(reason, 0) + 1
        self.last_inference_ms = int(time.time() * 1000)

    def to_dict(self) -> dict[str, Any]:
        """Triton's ``model_stats`` entry."""
        return {
            "name": self.name,
            "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.inference_count,
            "execution_count": self.execution_count,
            "inference_stats": {
                "success": _duration(*self.success),
                "fail": _duration(*self.fail),
                "queue": _duration(*self.queue),
                "compute_input": _duration(*self.compute_input),
                "compute_infer": _duration(*self.compute_infer),
                "compute_output": _duration(*self.compute_output),
                "cache_hit": _duration(*self.cache_hit),
                "cache_miss": _duration(*self.cache_miss),
            },
            "batch_stats": [
                {"batch_size": size,
                 "compute_input": _duration(e[0], e[1]),
                 "compute_infer": _duration(e[0], e[2]),
                 "compute_output": _duration(e[0], e[3])}
                for size, e in sorted(self.batches.items())
            ],
        }


def merge_model_stats(documents: list[dict[str, Any]]) -> dict[str, Any]:
    """Several servers' ``{"model_stats": [...]}`` (replicas of one deployment) as one:
    counts and durations add up per model version and per batch size; the last
    inference is the latest of any."""
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for document in documents:
        for entry in document.get("model_stats", []):
            key = (entry["name"], entry["version"])
            into = merged.get(key)
            if into is None:
                merged[key] = copy.deepcopy(entry)
                continue
            into["last_inference"] = max(into["last_inference"], entry["last_inference"])
            into["inference_count"] += entry["inference_count"]
            into["execution_count"] += entry["execution_count"]
            _add_durations(into["inference_stats"], entry["inference_stats"])
            sizes = {b["batch_size"]: b for b in into["batch_stats"]}
            for batch in entry["batch_stats"]:
                if batch["batch_size"] in sizes:
                    _add_durations(sizes[batch["batch_size"]], batch)
                else:
                    into["batch_stats"].append(copy.deepcopy(batch))
            into["batch_stats"].sort(key=lambda b: b["batch_size"])
    return {"model_stats": [merged[key] for key in sorted(merged)]}


def response_cache_only(entry: dict[str, Any]) -> dict[str, Any]:
    """A ``model_stats`` entry with only its response cache's counts (each hit a
    success): what one server adds to another's entry for the same model executions."""
    zero = {"count": 0, "ns": 0}
    stats = entry["inference_stats"]
    hits, misses = stats.get("cache_hit", zero), stats.get("cache_miss", zero)
    return {"name": entry["name"], "version": entry["version"],
            "last_inference": entry["last_inference"], "inference_count": 0,
            "execution_count": 0,
            "inference_stats": {**{part: dict(zero) for part in stats},
                                "success": dict(hits), "cache_hit": dict(hits),
                                "cache_miss": dict(misses)},
            "batch_stats": []}


def _add_durations(into: dict[str, Any], other: dict[str, Any]) -> None:
    for part, duration in other.items():
        if isinstance(duration, dict):
            total = into.setdefault(part, _duration(0, 0))
            total["count"] += duration["count"]
            total["ns"] += duration["ns"]
