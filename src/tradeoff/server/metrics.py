"""Prometheus metrics, read from :class:`ModelStats` at scrape time.

Nothing is counted twice: the hot path updates ``ModelStats`` only, and this collector
turns it into metric families when ``/metrics`` is scraped. Names follow Triton's
(``nv_inference_*``) with the ``tradeoff_`` prefix; docs/metrics.md has the mapping.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    SummaryMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from tradeoff.generate.engine_client import EngineClient
from tradeoff.generate.generation_stats import TOKEN_BUCKETS_S
from tradeoff.scheduling.stats import LATENCY_BUCKETS_S
from tradeoff.server.catalog import ModelVersion
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.models import ModelManager
from tradeoff.server.router import RoutedModel

__all__ = [
    "CONTENT_TYPE",
    "CacheCollector",
    "GenerationCollector",
    "RouterCollector",
    "ServerCollector",
    "counts_only",
    "families",
    "make_registry",
    "render",
    "render_summed",
]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _histogram(name: str, doc: str, bucket_counts: list[int], bounds: tuple[float, ...],
               total: float, labels: list[str], family: HistogramMetricFamily | None
               ) -> HistogramMetricFamily:
    family = family or HistogramMetricFamily(name, doc, labels=["model", "version"])
    cumulative = []
    running = 0
    for bound, count in zip(bounds, bucket_counts, strict=False):
        running += count
        cumulative.append((repr(float(bound)), running))
    running += bucket_counts[-1]
    cumulative.append(("+Inf", running))
    family.add_metric(labels, cumulative, sum_value=total)
    return family


class ServerCollector(Collector):
    """Collects every served model version's counters."""

    def __init__(self, manager: ModelManager, dataplane: DataPlane | None = None) -> None:
        self.manager = manager
        self.dataplane = dataplane

    def collect(self) -> Iterator:
        labels = ["model", "version"]
        success = CounterMetricFamily("tradeoff_inference_request_success",
                                      "Successful inference requests", labels=labels)
        failure = CounterMetricFamily("tradeoff_inference_request_failure",
                                      "Failed inference requests, by reason (REJECTED: "
                                      "queue full or timed out; CANCELED; BACKEND)",
                                      labels=[*labels, "reason"])
        count = CounterMetricFamily("tradeoff_inference_count",
                                    "Inferences performed (batch rows of successful requests)",
                                    labels=labels)
        executions = CounterMetricFamily("tradeoff_inference_exec_count",
                                         "Model executions (batches run); inference_count / "
                                         "exec_count is the mean batch size", labels=labels)
        on_loop = CounterMetricFamily("tradeoff_inference_exec_on_loop_count",
                                      "Model executions run on the event loop, not a worker "
                                      "thread (short batches, --inline-batch-us)",
                                      labels=labels)
        durations = {
            part: CounterMetricFamily(f"tradeoff_inference_{part}_duration_us",
                                      f"Cumulative {part.replace('_', ' ')} time of successful "
                                      "requests, microseconds", labels=labels)
            for part in ("request", "queue", "compute_input", "compute_infer", "compute_output")
        }
        queue_depth = GaugeMetricFamily("tradeoff_inference_queue_depth",
                                        "Requests waiting in the model's queue", labels=labels)
        in_flight = GaugeMetricFamily("tradeoff_inference_in_flight",
                                      "Requests accepted and not yet answered", labels=labels)
        ready = GaugeMetricFamily("tradeoff_model_ready", "1 when the model version serves",
                                  labels=labels)
        delay = GaugeMetricFamily("tradeoff_batcher_queue_delay_us",
                                  "The queue delay the adaptive batcher (target_p99_ms) uses "
                                  "now, microseconds", labels=labels)
        cap = GaugeMetricFamily("tradeoff_batcher_batch_cap",
                                "The most rows the adaptive batcher lets a batch take now",
                                labels=labels)
        request_hist = queue_hist = batch_hist = None
        for served in self.manager.tensor_versions():
            stats = served.stats
            lv = [served.name, str(served.version)]
            success.add_metric(lv, stats.success[0])
            for reason in ("REJECTED", "CANCELED", "BACKEND"):
                failure.add_metric([*lv, reason], stats.fail_reasons.get(reason, 0))
            count.add_metric(lv, stats.inference_count)
            executions.add_metric(lv, stats.execution_count)
            load = served.executor.load()
            on_loop.add_metric(lv, load.inline_batches)
            for part, pair in (("request", stats.success), ("queue", stats.queue),
                               ("compute_input", stats.compute_input),
                               ("compute_infer", stats.compute_infer),
                               ("compute_output", stats.compute_output)):
                durations[part].add_metric(lv, pair[1] / 1000)
            queue_depth.add_metric(lv, load.queue_depth)
            in_flight.add_metric(lv, load.in_flight)
            ready.add_metric(lv, 1)
            if load.adaptive_delay_us is not None and load.adaptive_cap is not None:
                delay.add_metric(lv, load.adaptive_delay_us)
                cap.add_metric(lv, load.adaptive_cap)
            request_hist = _histogram(
                "tradeoff_inference_request_duration_seconds",
                "Server-side latency of successful requests (queue + compute)",
                stats.request_buckets, LATENCY_BUCKETS_S, stats.success[1] / 1e9, lv,
                request_hist)
            queue_hist = _histogram(
                "tradeoff_inference_queue_duration_seconds",
                "Time successful requests waited in the queue",
                stats.queue_buckets, LATENCY_BUCKETS_S, stats.queue[1] / 1e9, lv, queue_hist)
            bounds = _batch_bounds(max(served.config.max_batch_size, 1))
            sizes = [0] * (len(bounds) + 1)
            rows_total = 0
            for size, entry in stats.batches.items():
                index = next((i for i, b in enumerate(bounds) if size <= b), len(bounds))
                sizes[index] += entry[0]
                rows_total += size * entry[0]
            batch_hist = _histogram(
                "tradeoff_batch_size",
                "Rows per model execution: is dynamic batching working?",
                sizes, bounds, rows_total, lv, batch_hist)
        yield from (success, failure, count, executions, on_loop, *durations.values(),
                    queue_depth, in_flight, ready, delay, cap)
        if self.dataplane is not None:
            yield GaugeMetricFamily("tradeoff_server_in_flight",
                                    "Inference requests admitted by the server and not yet "
                                    "answered (all models)", value=self.dataplane.in_flight)
            yield CounterMetricFamily("tradeoff_server_overload_refusals",
                                      "Requests refused at once because the server held "
                                      "--max-inflight requests",
                                      value=self.dataplane.overload_refusals)
        yield from self._executor_memory()
        yield from (h for h in (request_hist, queue_hist, batch_hist) if h is not None)

    def _executor_memory(self) -> Iterator:
        """With --executors process: each executor process's shared memory for requests,
        held now and in all (a full arena answers 503)."""
        processes = self.manager.executor_processes
        if processes is None:
            return
        used = GaugeMetricFamily("tradeoff_executor_shared_memory_used_bytes",
                                 "Shared memory the requests in an executor process hold",
                                 labels=["device"])
        size = GaugeMetricFamily("tradeoff_executor_shared_memory_size_bytes",
                                 "Shared memory for requests of an executor process, in all",
                                 labels=["device"])
        for process in processes.running():
            used.add_metric([process.device], process.inputs.used_bytes)
            size.add_metric([process.device], process.inputs.size)
        yield from (used, size)


def _batch_bounds(max_batch: int) -> tuple[float, ...]:
    bounds = []
    size = 1
    while size < max_batch:
        bounds.append(float(size))
        size *= 2
    bounds.append(float(max_batch))
    return tuple(bounds)


class GenerationCollector(Collector):
    """Generative models: requests running and waiting, TTFT, inter-token and end-to-end
    latency histograms, prompt and generated tokens, KV cache usage, preemptions, prefix
    cache lookups and hits (in tokens)."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator:
        labels = ["model"]
        running = GaugeMetricFamily("tradeoff_generation_requests_running",
                                    "Sequences in the running batch", labels=labels)
        waiting = GaugeMetricFamily("tradeoff_generation_requests_waiting",
                                    "Requests waiting to be admitted", labels=labels)
        kv = GaugeMetricFamily("tradeoff_generation_kv_cache_usage_ratio",
                               "Fraction of KV cache blocks in use", labels=labels)
        prompt = CounterMetricFamily("tradeoff_generation_prompt_tokens",
                                     "Prompt tokens of admitted requests", labels=labels)
        generated = CounterMetricFamily("tradeoff_generation_generation_tokens",
                                        "Tokens generated", labels=labels)
        preempted = CounterMetricFamily("tradeoff_generation_preemptions",
                                        "Sequences preempted (recomputed later) for KV blocks",
                                        labels=labels)
        finished = CounterMetricFamily("tradeoff_generation_requests_finished",
                                       "Requests that finished", labels=labels)
        queries = CounterMetricFamily("tradeoff_generation_prefix_cache_queries",
                                      "Prompt tokens looked up in the prefix cache",
                                      labels=labels)
        hits = CounterMetricFamily("tradeoff_generation_prefix_cache_hits",
                                   "Prompt tokens found in the prefix cache (not computed)",
                                   labels=labels)
        # one family per histogram, one sample set per model: each name appears once
        histograms = {kind: HistogramMetricFamily(name, doc, labels=labels) for name, doc, kind in (
            ("tradeoff_generation_time_to_first_token_seconds",
             "Arrival to first generated token", "ttft"),
            ("tradeoff_generation_inter_token_latency_seconds",
             "Between consecutive tokens of a request", "itl"),
            ("tradeoff_generation_e2e_request_latency_seconds",
             "Arrival to the last token", "e2e"))}
        for model in self.manager.generative_versions():
            snapshot, lv = model.stats, [model.name]
            stats, load = snapshot.engine, snapshot.load
            running.add_metric(lv, load.running)
            waiting.add_metric(lv, load.waiting + model.pending)
            kv.add_metric(lv, load.kv_usage)
            prompt.add_metric(lv, stats.prompt_tokens)
            generated.add_metric(lv, stats.generation_tokens)
            preempted.add_metric(lv, stats.preemptions)
            finished.add_metric(lv, stats.requests_finished)
            queries.add_metric(lv, load.prefix_queries)
            hits.add_metric(lv, load.prefix_hits)
            for kind, family in histograms.items():
                counts, total = stats.histograms[kind]
                cumulative = np.cumsum(counts)
                # cumulative has one count more than there are bounds: the +Inf bucket
                buckets = [(str(b), float(c))
                           for b, c in zip(TOKEN_BUCKETS_S, cumulative, strict=False)]
                buckets.append(("+Inf", float(cumulative[-1])))
                family.add_metric(lv, buckets, total)
        yield from (running, waiting, kv, prompt, generated, preempted, finished, queries, hits,
                    *histograms.values())


class CacheCollector(Collector):
    """The response cache: per model version its lookups, hits and misses; for the cache
    as a whole its insertions, evictions, bytes, rejected and unreadable values, answers
    too large to keep, requests coalesced onto an identical one, and Redis errors."""

    def __init__(self, manager: ModelManager, dataplane: DataPlane) -> None:
        self.manager = manager
        self.dataplane = dataplane

    def collect(self) -> Iterator:
        cache = self.dataplane.cache
        if cache is None:
            return
        labels = ["model", "version"]
        lookups = CounterMetricFamily("tradeoff_cache_lookups",
                                      "Response cache lookups", labels=labels)
        hits = CounterMetricFamily("tradeoff_cache_hits",
                                   "Requests answered from the response cache (or by an "
                                   "identical request in flight)", labels=labels)
        misses = CounterMetricFamily("tradeoff_cache_misses",
                                     "Lookups that found nothing: the model ran",
                                     labels=labels)
        lookup_time = CounterMetricFamily("tradeoff_cache_hit_duration_us",
                                          "Cumulative lookup time of hits, microseconds",
                                          labels=labels)
        versions: list[ModelVersion | EngineClient] = [
            *self.manager.tensor_versions(), *self.manager.generative_versions()]
        for served in versions:
            lv = [served.name, str(served.version)]
            # a generative model's counts are its client's: no snapshot of its engine
            counts = served if isinstance(served, EngineClient) else served.stats
            hit, miss = counts.cache_hit, counts.cache_miss
            lookups.add_metric(lv, hit[0] + miss[0])
            hits.add_metric(lv, hit[0])
            misses.add_metric(lv, miss[0])
            lookup_time.add_metric(lv, hit[1] / 1000)
        yield from (lookups, hits, misses, lookup_time)
        kind = [cache.store.kind]
        for name, doc, value in (
                ("tradeoff_cache_insertions", "Answers written to the cache", cache.insertions),
                ("tradeoff_cache_evictions", "Entries the local LRU evicted for room",
                 cache.evictions),
                ("tradeoff_cache_rejected", "Stored answers that are not their key's (a "
                 "failed MAC in Redis, a key collision): served as misses", cache.rejected),
                ("tradeoff_cache_unreadable", "Stored answers that could not be decoded or "
                 "are not what the model makes: served as misses", cache.unreadable),
                ("tradeoff_cache_too_large", "Answers over max_item, not kept",
                 cache.too_large),
                ("tradeoff_cache_coalesced", "Requests answered by an identical request in "
                 "flight (single-flight)", cache.coalesced),
                ("tradeoff_cache_errors", "Failed calls to the cache's store (Redis): each "
                 "was served as a miss", cache.errors)):
            family = CounterMetricFamily(name, doc, labels=["store"])
            family.add_metric(kind, value)
            yield family
        size = GaugeMetricFamily("tradeoff_cache_bytes", "Bytes the local cache holds "
                                 "(keys, values, overhead)", labels=["store"])
        size.add_metric(kind, cache.bytes)
        yield size
        if cache.entries is not None:
            entries = GaugeMetricFamily("tradeoff_cache_entries", "Answers the local cache "
                                        "holds", labels=["store"])
            entries.add_metric(kind, cache.entries)
            yield entries


class RouterCollector(Collector):
    """Routers: requests per route and target, fallbacks, failures, and the shadow's
    copies and how its answers differed from the primary's."""

    def __init__(self, manager: ModelManager) -> None:
        self.manager = manager

    def collect(self) -> Iterator:
        routers = [v for v in self.manager.served_versions() if isinstance(v, RoutedModel)]
        if not routers:
            return
        requests = CounterMetricFamily("tradeoff_router_requests",
                                       "Requests a router sent, by route and arm (the target "
                                       "its rules chose)", labels=["router", "route", "target"])
        fallbacks = CounterMetricFamily("tradeoff_router_fallbacks",
                                        "Requests answered by a fallback target",
                                        labels=["router", "target"])
        failures = CounterMetricFamily("tradeoff_router_failures",
                                       "Requests no target answered", labels=["router"])
        shadow = CounterMetricFamily("tradeoff_router_shadow",
                                     "Shadow copies: sent, dropped (target busy), failed",
                                     labels=["router", "outcome"])
        difference = GaugeMetricFamily("tradeoff_router_shadow_max_abs_diff",
                                       "Largest difference seen between a shadow answer and "
                                       "the primary's", labels=["router"])
        agreement = GaugeMetricFamily("tradeoff_router_shadow_top1_agreement",
                                      "Share of rows whose top-1 class agreed with the primary's",
                                      labels=["router"])
        tokens = GaugeMetricFamily("tradeoff_router_shadow_token_agreement",
                                   "Share of a generation's tokens the shadow chose alike, "
                                   "position by position", labels=["router"])
        text = GaugeMetricFamily("tradeoff_router_shadow_text_agreement",
                                 "Share of a generation's characters the shadow matched "
                                 "before its first difference (answers compared as text: "
                                 "a pool's)", labels=["router"])
        for routed in routers:
            stats = routed.stats
            for row in stats.routes():
                requests.add_metric([routed.name, str(row["route"]), row["target"]], row["count"])
            for target, count in stats.fallbacks.items():
                fallbacks.add_metric([routed.name, target], count)
            failures.add_metric([routed.name], stats.fail[0])
            for outcome in ("sent", "dropped", "failed"):
                shadow.add_metric([routed.name, outcome], getattr(stats.shadow, outcome))
            difference.add_metric([routed.name], stats.shadow.max_abs_diff)
            shares = stats.shadow.to_dict()
            if shares["top1_agreement"] is not None:
                agreement.add_metric([routed.name], shares["top1_agreement"])
            if shares["token_agreement"] is not None:
                tokens.add_metric([routed.name], shares["token_agreement"])
            if shares["text_prefix_agreement"] is not None:
                text.add_metric([routed.name], shares["text_prefix_agreement"])
        yield from (requests, fallbacks, failures, shadow, difference, agreement, tokens, text)
        yield from _replica_families(routers)


def _replica_families(routers: list[RoutedModel]) -> Iterator:
    """Each pool's replicas: what they were sent, how it went, their state now."""
    pools = [(routed.name, pool) for routed in routers for pool in routed.pools.values()]
    if not pools:
        return
    labels = ["router", "pool", "replica"]
    counted = {key: CounterMetricFamily(f"tradeoff_gateway_replica_{key}", text, labels=labels)
               for key, text in (
                   ("requests", "Requests sent to a replica (retries included)"),
                   ("errors", "Requests a replica failed: refused connection, timeout, 5xx, "
                              "broken answer"),
                   ("refused", "Requests a replica answered 429 or 503 (sent elsewhere)"),
                   ("retries", "Requests a replica got after another failed them"),
                   ("ejections", "Times a replica was taken out of its pool"))}
    prefix = CounterMetricFamily("tradeoff_gateway_replica_prefix_blocks",
                                 "Prompt blocks sent to a replica (kind=sent) and those it "
                                 "was known to hold (kind=matched)", labels=[*labels, "kind"])
    latency = SummaryMetricFamily("tradeoff_gateway_replica_latency_seconds",
                                  "Time to a replica's whole answer", labels=labels)
    in_flight = GaugeMetricFamily("tradeoff_gateway_replica_in_flight",
                                  "Requests at a replica now", labels=labels)
    ready = GaugeMetricFamily("tradeoff_gateway_replica_ready",
                              "1 when a replica takes requests (ready, not ejected or "
                              "draining)", labels=labels)
    queued = GaugeMetricFamily("tradeoff_gateway_replica_reported_queue",
                               "Requests waiting in a replica's own queue, by its last "
                               "report (pools with queue)", labels=labels)
    now = time.monotonic()
    for router, pool in pools:
        for replica in pool.replicas:
            names = [router, pool.config.name, replica.name]
            stats = replica.stats
            for key, family in counted.items():
                family.add_metric(names, getattr(stats, key))
            prefix.add_metric([*names, "sent"], stats.prefix_blocks)
            prefix.add_metric([*names, "matched"], stats.prefix_blocks_matched)
            latency.add_metric(names, stats.answered, stats.latency_s)
            in_flight.add_metric(names, replica.in_flight)
            ready.add_metric(names, 1 if replica.available(now) else 0)
            if replica.reported_queue is not None:
                queued.add_metric(names, replica.reported_queue)
    yield from (*counted.values(), prefix, latency, in_flight, ready, queued)


def make_registry(manager: ModelManager, dataplane: DataPlane | None = None
                  ) -> CollectorRegistry:
    """A registry of the server's own (not the process-global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServerCollector(manager, dataplane))
    registry.register(GenerationCollector(manager))
    registry.register(RouterCollector(manager))
    if dataplane is not None:
        registry.register(CacheCollector(manager, dataplane))
    ProcessCollector(registry=registry)
    return registry


def render(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


# serve --workers: gauges each front end holds a share of, summed over them; the other
# gauges read alike in every front end (an executor's batcher, a model's readiness) and
# the highest is shown, but for the start time, the earliest
SUMMED_GAUGES = frozenset({
    "tradeoff_inference_in_flight", "tradeoff_server_in_flight", "tradeoff_cache_bytes",
    "tradeoff_cache_entries", "tradeoff_executor_shared_memory_used_bytes",
    "tradeoff_executor_shared_memory_size_bytes", "process_resident_memory_bytes",
    "process_virtual_memory_bytes", "process_open_fds", "tradeoff_gateway_replica_in_flight"})
EARLIEST_GAUGES = frozenset({"process_start_time_seconds"})


def families(registry: CollectorRegistry) -> list[dict[str, Any]]:
    """The registry's metric families now, as plain data (for another process to sum)."""
    return [{"name": f.name, "documentation": f.documentation, "type": f.type,
             "unit": f.unit, "samples": [[x.name, x.labels, x.value] for x in f.samples]}
            for f in registry.collect()]


def counts_only(families: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The counters and histograms of :func:`families` (what a process that is gone
    still adds to a server's totals); its gauges, a state of the moment, left out."""
    return [f for f in families if f["type"] in ("counter", "histogram", "summary")]


# a generative model's engine is one process every front end reads: its counts once
SHARED_ENGINE_PREFIX = "tradeoff_generation_"
# counts an executor process keeps (every front end reads the same total): once too
SHARED_COUNTERS = frozenset({"tradeoff_inference_exec_on_loop_count"})


def _combine(kind: str, name: str, a: float, b: float) -> float:
    if name.startswith(SHARED_ENGINE_PREFIX) or name in SHARED_COUNTERS:
        return max(a, b)  # the freshest of the same process's counts
    if kind != "gauge" or name in SUMMED_GAUGES:
        return a + b
    return min(a, b) if name in EARLIEST_GAUGES else max(a, b)


def render_summed(registry: CollectorRegistry, others: list[list[dict[str, Any]]]) -> bytes:
    """``/metrics`` of one server of several processes (``serve --workers``): this
    process's families and the others' (:func:`families`), each family once; counters and
    histograms added up, gauges by :data:`SUMMED_GAUGES` and :data:`EARLIEST_GAUGES`, and
    a shared engine's families (:data:`SHARED_ENGINE_PREFIX`) and an executor's
    (:data:`SHARED_COUNTERS`) counted once."""
    merged: dict[str, tuple[dict[str, Any], dict[tuple[str, tuple], float]]] = {}
    for document in [families(registry), *others]:
        for family in document:
            head, values = merged.setdefault(family["name"], (family, {}))
            for sample, labels, value in family["samples"]:
                key = (sample, tuple(sorted(labels.items())))
                values[key] = value if key not in values else \
                    _combine(head["type"], head["name"], values[key], value)

    class Summed(Collector):
        def collect(self) -> Iterator[Metric]:
            for head, values in merged.values():
                metric = Metric(head["name"], head["documentation"], head["type"],
                                head["unit"])
                for (sample, labels), value in values.items():
                    metric.add_sample(sample, dict(labels), value)
                yield metric

    summed = CollectorRegistry(auto_describe=False)
    summed.register(Summed())
    return generate_latest(summed)
