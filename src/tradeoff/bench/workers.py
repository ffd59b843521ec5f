"""Several load generators, merged exactly: processes on this host (here), or Ray actors
on the nodes of a cluster (:mod:`tradeoff.bench.ray_load`, which merges the same way).

Each worker offers its share of the load (concurrency split, or the rate split into
interleaved schedules, or every N-th request of a trace) from its own process and event
loop; all start at one agreed instant (here: on the shared monotonic clock). Their raw
records are concatenated, so percentiles are computed over every sample, never averaged.
"""

from __future__ import annotations

import multiprocessing
import time
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import Records
from tradeoff.bench.runner import (
    Runner,
    RunOutcome,
    fixed_end,
    fixed_windows,
    is_stable,
    run_coroutine,
)
from tradeoff.errors import BenchSetupError, InvalidValue

__all__ = ["START_MARGIN_S", "WorkerRuns", "merge_runs", "run_workers", "split_spec"]

START_MARGIN_S = 0.2


def split_spec(spec: LoadSpec, workers: int) -> list[LoadSpec]:
    """Each worker's share of the load."""
    if workers < 1:
        raise InvalidValue(f"--workers must be >= 1, got {workers}")
    if not spec.fixed_length:
        raise InvalidValue("--workers needs --duration, --requests or --intervals "
                           "(stability windows are judged in one process)")
    shares = []
    for k in range(workers):
        share = replace(spec, seed=spec.seed + k, workers=1, ray_address=None)
        if spec.requests is not None:
            count = spec.requests // workers + (1 if k < spec.requests % workers else 0)
            if count == 0:
                raise InvalidValue(f"--requests {spec.requests} is fewer than --workers")
            share = replace(share, requests=count)
        if spec.concurrency is not None:
            if spec.concurrency < workers:
                raise InvalidValue(f"--workers {workers} is more than --concurrency "
                                   f"{spec.concurrency}")
            count = spec.concurrency // workers + (1 if k < spec.concurrency % workers else 0)
            share = replace(share, concurrency=count)
        elif spec.rate is not None:
            # constant: interleaved schedules; Poisson: independent streams (their sum is
            # Poisson at the full rate)
            offset = k / spec.rate if spec.arrival == "constant" else 0.0
            share = replace(share, rate=spec.rate / workers, offset_s=offset,
                            max_connections=max(spec.max_connections // workers, 1))
        else:
            assert spec.intervals is not None
            mine = spec.intervals[k::workers]
            if not mine:
                raise InvalidValue("--workers is more than the requests in the trace")
            share = replace(share, intervals=mine)
        shares.append(share)
    return shares


def _worker(adapter: Adapter, requests: list[bytes], spec: LoadSpec, ready: Any, go: Any,
            start_at: Any, results: Any) -> None:
    runner = Runner(adapter, requests, spec)
    ready.put(True)
    go.wait()
    try:
        outcome = run_coroutine(runner.run(cold_start=False, start_at_ns=start_at.value,
                                 read_server_stats=False))
        results.put(outcome)
    except Exception as exc:  # reported by the parent
        results.put(exc)


@dataclass
class WorkerRuns:
    """What the workers brought back: each outcome on its own clock, and what to add to
    each clock to put it on the coordinating process's clock."""

    outcomes: list[RunOutcome]
    offsets_ns: list[int]
    server_before: dict[str, Any] | None
    server_after: dict[str, Any] | None
    notes: list[str]
    hosts: list[dict[str, Any]] = field(default_factory=list)
    start_skew_ms: float | None = None


def run_workers(adapter: Adapter, requests: list[bytes], spec: LoadSpec,
                cold_start: Records) -> RunOutcome:
    """Run ``spec.workers`` processes here and merge their records into one outcome."""
    shares = split_spec(spec, spec.workers)
    return merge_runs(spec, _run_processes(adapter, requests, spec, shares), cold_start)


def _run_processes(adapter: Adapter, requests: list[bytes], spec: LoadSpec,
                   shares: list[LoadSpec]) -> WorkerRuns:
    context = multiprocessing.get_context("spawn")
    ready, results = context.Queue(), context.Queue()
    go = context.Event()
    start_at = context.Value("q", 0)
    processes = [context.Process(target=_worker, daemon=True,
                                 args=(adapter, requests, share, ready, go, start_at, results))
                 for share in shares]
    for process in processes:
        process.start()
    try:
        for _ in processes:
            ready.get(timeout=120)
        start_at.value = time.perf_counter_ns() + int(START_MARGIN_S * 1e9)
        go.set()
        time.sleep(max(start_at.value + int(spec.warmup_s * 1e9) - time.perf_counter_ns(),
                       0) / 1e9)
        server_before = adapter.server_stats()
        outcomes = []
        for _ in processes:
            item = results.get(timeout=(spec.duration_s or 0) + spec.warmup_s + 3600)
            if isinstance(item, Exception):
                raise BenchSetupError(f"a load worker failed: {item}")
            outcomes.append(item)
        server_after = adapter.server_stats()
    finally:
        for process in processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
    return WorkerRuns(outcomes, [0] * len(outcomes), server_before, server_after,
                      [f"{len(shares)} worker processes; client CPU is the busiest "
                       "worker's"])


def merge_runs(spec: LoadSpec, runs: WorkerRuns, cold_start: Records) -> RunOutcome:
    """One outcome of several workers' runs: records concatenated on one clock, windows
    and stability over all of them."""
    outcomes, offsets = runs.outcomes, runs.offsets_ns
    records = Records.merge([o.records for o in outcomes], offsets)
    measure_start = outcomes[0].measure_start_ns + offsets[0]
    stop_at = max(o.measure_end_ns + off for o, off in zip(outcomes, offsets, strict=True))
    measure_end = fixed_end(spec, records, measure_start, stop_at)
    windows = fixed_windows(spec, records, measure_start, measure_end)
    stable = is_stable(windows, spec.stability_percent) if len(windows) >= 3 else None
    cpu = max(o.client_cpu_percent for o in outcomes)
    lags = np.concatenate([o.loop_lag_ms for o in outcomes])
    return RunOutcome(records, cold_start, outcomes[0].start_ns + offsets[0], measure_start,
                      measure_end, windows, stable, outcomes[0].stop_reason, cpu,
                      runs.server_before, runs.server_after, notes=runs.notes,
                      loop_lag_ms=lags, idle_lag_ms=max(o.idle_lag_ms for o in outcomes),
                      hosts=runs.hosts, start_skew_ms=runs.start_skew_ms)
