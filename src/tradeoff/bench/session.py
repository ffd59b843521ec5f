"""One benchmark from start to finish: prepare the endpoint, run, build the result.

    result, records, start_ns = run_benchmark(V2Adapter("http://127.0.0.1:8000", "mlp"),
                                              LoadSpec(concurrency=8, duration_s=10))
    result.summary.throughput_rps

:func:`run_benchmark` gives the typed :class:`~tradeoff.results.BenchResult`;
``result.to_dict()`` (or :func:`~tradeoff.results.write_json`) is the JSON document that
``tradeoff bench --json`` writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

from rich.console import Console

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import REFUSED, Records
from tradeoff.bench.result import build_result
from tradeoff.bench.runner import Runner, WindowReport, run_coroutine
from tradeoff.bench.workers import run_workers, split_spec
from tradeoff.errors import BenchSetupError
from tradeoff.results import BenchResult
from tradeoff.stats.progress import progress_text

__all__ = ["PLAIN_EVERY_S", "run_benchmark"]

PLAIN_EVERY_S = 10.0  # a progress line this often when the output is not a terminal


async def _progress(runner: Runner, console: Console, spec: LoadSpec) -> None:
    """Once a second: elapsed (with the share done and the time left for a run of fixed
    length), achieved rate, p50/p99 and errors over the last second. Not on a terminal
    (a log, CI), a plain line every PLAIN_EVERY_S instead."""
    total_s = spec.warmup_s + spec.duration_s if spec.duration_s is not None else None
    live = console.is_terminal
    with console.status("starting") if live else contextlib.nullcontext() as status:
        started = time.monotonic()
        printed = started
        while True:
            await asyncio.sleep(1.0)
            now = runner.clock()
            last = runner.live_window(0, now - 1_000_000_000, now + 1)
            phase = "measuring" if runner.measuring(now) else "warmup"
            elapsed = time.monotonic() - started
            done = f" ({progress_text(elapsed, total_s, elapsed)})" if total_s else ""
            text = (f"{phase} {elapsed:4.0f}s{done}  {last.throughput_rps:,.0f} req/s  "
                    f"errors {last.errors}")
            if last.completed > last.errors:
                text += f"  p50 {last.p50_ms:.2f} ms  p99 {last.p99_ms:.2f} ms"
            if status is not None:
                status.update(text)
            elif time.monotonic() - printed >= PLAIN_EVERY_S:
                console.print(text)
                printed = time.monotonic()


def run_benchmark(adapter: Adapter, spec: LoadSpec, console: Console | None = None
                  ) -> tuple[BenchResult, Records, int]:
    """Run the load; returns (result, raw records, clock origin of the run). The load
    comes from this process, or from ``spec.workers`` processes or Ray actors."""
    requests = adapter.prepare()
    adapter.input_count = len(requests)
    if spec.workers > 1 or spec.ray_address is not None:
        split_spec(spec, spec.workers)  # refuse a bad split before any request is sent
        cold_runner = Runner(adapter, requests, spec)
        cold = run_coroutine(cold_runner.cold_start())
        _refuse_if_unreachable(adapter, cold)
        where = f" on Ray at {spec.ray_address}" if spec.ray_address else ""
        with console.status(f"{spec.workers} workers running{where}") if console else \
                contextlib.nullcontext():
            if spec.ray_address is not None:
                from tradeoff.bench.ray_load import run_ray_workers

                outcome = run_ray_workers(adapter, requests, spec, cold)
            else:
                outcome = run_workers(adapter, requests, spec, cold)
        return (build_result(adapter, spec, outcome, spec.workers), outcome.records,
                outcome.start_ns)
    runner = Runner(adapter, requests, spec,
                    on_window=_window_printer(console) if console else None)

    async def main() -> Any:
        ticker = asyncio.ensure_future(_progress(runner, console, spec)) if console else None
        try:
            return await runner.run()
        finally:
            if ticker:
                ticker.cancel()

    outcome = run_coroutine(main())
    _refuse_if_unreachable(adapter, outcome.cold_start)
    return build_result(adapter, spec, outcome), outcome.records, outcome.start_ns


def _refuse_if_unreachable(adapter: Adapter, cold: Records) -> None:
    if len(cold) and cold.outcome[0] == REFUSED:
        raise BenchSetupError(f"{adapter.url}: connection refused; is the server running?")


def _window_printer(console: Console) -> Any:
    def show(window: WindowReport) -> None:
        console.print(f"window {window.index + 1}: {window.throughput_rps:,.1f} req/s, "
                      f"p50 {window.p50_ms:.2f} ms, p99 {window.p99_ms:.2f} ms, "
                      f"errors {window.errors}")
    return show
