"""The measurement engine: offers the load, records every request, watches itself.

    outcome = asyncio.run(Runner(adapter, requests, spec).run())

Closed loop keeps ``concurrency`` requests outstanding, one keep-alive connection each.
Open loop sends at scheduled times on as many connections as it needs (up to
``max_connections``) and measures latency from the scheduled time, so a server that stalls
is charged for every request that should have been sent meanwhile.

Each request has ``timeout_s`` in all. When the run stops (``--duration``, or stability),
the requests still in flight have ``LoadSpec.grace_s`` more to end; those that have not
are cut then and recorded as timeouts, so an endpoint that never finishes an answer
cannot hold the run past its length.
"""

from __future__ import annotations

import asyncio
import operator
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tradeoff.bench.adapters import Adapter, Connection
from tradeoff.bench.load import LoadSpec, arrival_offsets_ns
from tradeoff.bench.records import (
    HTTP_ERROR,
    OK,
    OTHER,
    STREAM,
    Generated,
    RecordBuffer,
    Records,
    classify,
)
from tradeoff.errors import InvalidValue, RunStopped
from tradeoff.heap import settled_heap
from tradeoff.protocol.http_client import ResponseTooLarge
from tradeoff.protocol.openai_answers import StreamReader

__all__ = [
    "CONNECTION_WAIT",
    "DEFAULT_WINDOW_S",
    "TIMER_SLACK_S",
    "RunOutcome",
    "Runner",
    "WindowReport",
    "fixed_end",
    "fixed_windows",
    "instability",
    "is_stable",
    "resume_runs",
    "run_coroutine",
    "stop_runs",
    "window_report",
]

DEFAULT_WINDOW_S = 5.0
CONNECTION_WAIT = "waited for a free connection"  # the note that says so (see diagnose)
TIMER_SLACK_S = 0.002  # past a start time even when the loop rounds a timer to its tick


def run_coroutine(coro: Any) -> Any:
    """Run on uvloop (a faster client loop) where it exists. On the main thread the run
    can be stopped by :func:`stop_runs`: it then raises :class:`RunStopped`."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - Windows
        return asyncio.run(coro)
    if threading.current_thread() is not threading.main_thread():
        return uvloop.run(coro)
    return uvloop.run(_STOP.stoppable(coro))


class _RunStop:
    """The stop request for load runs on the main thread, and the run in progress."""

    def __init__(self) -> None:
        self.requested = False
        self.running: asyncio.Task[Any] | None = None

    async def stoppable(self, coro: Any) -> Any:
        self.running = asyncio.current_task()  # before the check: a stop between is seen
        try:
            if self.requested:
                coro.close()
                raise RunStopped("the load run was stopped before it began")
            return await coro
        except asyncio.CancelledError:
            if self.requested:
                raise RunStopped("the load run was stopped") from None
            raise
        finally:
            self.running = None

    def stop(self) -> None:
        self.requested = True
        task = self.running
        if task is not None:
            task.get_loop().call_soon_threadsafe(task.cancel)


_STOP = _RunStop()


def stop_runs() -> None:
    """Stop the load run going on in the main thread, and refuse later ones with
    :class:`RunStopped` until :func:`resume_runs`. Meant for signal handlers: it asks the
    run's loop to cancel the run, which the loop does between its callbacks. An exception
    raised by the handler itself would land wherever the main thread happens to be, and
    there it can be lost: uvloop logs one raised inside a protocol callback and goes on,
    and a C extension's module import can drop one."""
    _STOP.stop()


def resume_runs() -> None:
    """Let load runs start again after :func:`stop_runs`."""
    _STOP.requested = False


@dataclass
class WindowReport:
    """What one measurement window saw (requests that ended in it)."""

    index: int
    start_ns: int
    end_ns: int
    completed: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "duration_s": (self.end_ns - self.start_ns) / 1e9,
                "completed": self.completed, "errors": self.errors,
                "throughput_rps": self.throughput_rps, "p50_ms": self.p50_ms,
                "p99_ms": self.p99_ms}


@dataclass
class RunOutcome:
    """Raw material of a result: every record, the phases, and the runner's own health."""

    records: Records
    cold_start: Records
    start_ns: int
    measure_start_ns: int
    measure_end_ns: int
    windows: list[WindowReport]
    stable: bool | None
    stop_reason: str
    client_cpu_percent: float
    server_before: dict[str, Any] | None = None
    server_after: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    # (clock ns, cumulative server statistics) at each window boundary, when available
    server_snapshots: list[tuple[int, dict[str, Any]]] = field(default_factory=list)
    # how late the client's event loop woke for 10 ms timers during the load (ms), and
    # the same at rest just before it: what this machine's timers do with no load (p99)
    loop_lag_ms: np.ndarray = field(default_factory=lambda: np.empty(0))
    idle_lag_ms: float = 0.0
    # load from Ray workers: where each ran, and the uncertainty of their common start
    hosts: list[dict[str, Any]] = field(default_factory=list)
    start_skew_ms: float | None = None


def window_report(index: int, start_ns: int, end_ns: int, end: np.ndarray, ok: np.ndarray,
                  latency_ms: np.ndarray) -> WindowReport:
    """Statistics of the requests that ended in ``[start_ns, end_ns)``."""
    inside = (end >= start_ns) & (end < end_ns)
    good = inside & ok
    lat = latency_ms[good]
    seconds = (end_ns - start_ns) / 1e9
    return WindowReport(index, start_ns, end_ns, int(inside.sum()), int((inside & ~ok).sum()),
                        float(good.sum() / seconds) if seconds > 0 else 0.0,
                        float(np.percentile(lat, 50)) if lat.size else float("nan"),
                        float(np.percentile(lat, 99)) if lat.size else float("nan"))


def instability(windows: list[WindowReport], percent: float) -> str | None:
    """Why the last three windows do not agree within ``percent`` of their mean on
    throughput and p99 (None when they do)."""
    if len(windows) < 3:
        return f"only {len(windows)} windows; 3 must agree"
    last = windows[-3:]
    for name, values in (("throughput", [w.throughput_rps for w in last]),
                         ("p99", [w.p99_ms for w in last])):
        mean = float(np.mean(values))
        if not np.isfinite(mean) or mean == 0:
            return f"no {name} to compare (no successful requests)"
        spread = max(abs(v - mean) for v in values) / mean * 100
        if spread > percent:
            return (f"{name} of the last 3 windows differs from their mean by "
                    f"{spread:.0f}% (limit {percent:g}%)")
    return None


def is_stable(windows: list[WindowReport], percent: float) -> bool:
    """The last three windows agree within ``percent`` of their mean, on throughput and p99."""
    return instability(windows, percent) is None


class Runner:
    """Offers one LoadSpec to one endpoint."""

    def __init__(self, adapter: Adapter, requests: list[bytes], spec: LoadSpec,
                 on_window: Callable[[WindowReport], None] | None = None) -> None:
        if not requests:
            raise InvalidValue("no requests to send")
        self.adapter = adapter
        self.requests = requests
        self.spec = spec
        self.on_window = on_window
        self.buffer = RecordBuffer()
        self.clock = time.perf_counter_ns
        self._stop_at: int | None = None  # no new sends at or after this time
        self._stopping = False
        self._next_request = 0
        self._order = adapter.mix.order(len(requests), spec.seed)
        self._budget: int | None = None
        self._measure_start = 0
        self._in_flight = 0
        self._idle: list[Connection] = []
        self._open_connections = 0
        self._waiters: deque[asyncio.Future[Connection]] = deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._load_done = False
        self.streaming = adapter.streaming
        self.failures: dict[str, int] = {}  # answers that came but failed: why, counted
        self._tasks: set[asyncio.Task] = set()  # what the load runs: cut at the grace
        self._cutting = False
        self._cut = 0  # requests cut at the end of the run
        self._waited = 0  # open loop: requests that waited for a free connection

    def _request_bytes(self) -> tuple[int, bytes]:
        turn = self._next_request
        self._next_request += 1
        index = turn % len(self.requests) if self._order is None else \
            int(self._order[turn % len(self._order)])
        return index, self.requests[index]

    async def _send(self, connection: Connection, scheduled: int) -> None:
        index, raw = self._request_bytes()
        sent = self.clock()
        rows = self.adapter.rows_per_request
        reader = self.adapter.reader() if self.streaming else None
        try:
            try:
                response = await (connection.request(raw) if reader is None else
                                  connection.request(raw, on_body=reader))  # type: ignore[call-arg]
            except asyncio.CancelledError:
                if not self._cutting:
                    raise
                raise self._cut_now() from None
        except (OSError, EOFError, asyncio.IncompleteReadError) as exc:
            if reader is not None or isinstance(exc, ResponseTooLarge):
                self._failed(f"{type(exc).__name__}" + (
                    f" after {len(reader.text_ns)} text event(s)" if reader else "")
                    + f": {exc}")
            self.buffer.add(scheduled, sent, self.clock(), classify(exc), 0, len(raw),
                            0 if reader is None else reader.received, rows, None,
                            None if reader is None else self._generated(reader, index), index)
            return
        end = self.clock()
        ok = 200 <= response.status < 300
        if reader is None:
            outcome = OK if ok else HTTP_ERROR
            if ok and (why := self.adapter.invalid(response)) is not None:
                self._failed(why)
                outcome, ok = OTHER, False
            self.buffer.add(scheduled, sent, end, outcome, response.status,
                            len(raw), len(response.body), rows,
                            self.adapter.server_timing(response) if ok else None, None, index)
            return
        failure = reader.failure()
        if failure is not None:
            self._failed(failure)
        outcome = OK if failure is None else STREAM if ok else HTTP_ERROR
        self.buffer.add(scheduled, sent, end, outcome, response.status, len(raw),
                        reader.received, rows, None, self._generated(reader, index), index)

    def _failed(self, why: str) -> None:
        self.failures[why[:120]] = self.failures.get(why[:120], 0) + 1

    def _cut_now(self) -> TimeoutError:
        """A request cut at the end of the run: counted, and recorded as a timeout."""
        self._cut += 1  # the cancellation ends here: the task then ends normally
        return TimeoutError(f"still in flight {self.spec.grace_s:g} s after the run "
                            "stopped")

    def _generated(self, reader: StreamReader, index: int) -> Generated:
        stamps = reader.text_ns
        usage = reader.usage or {}
        counted = usage.get("completion_tokens")
        prompt = usage.get("prompt_tokens")
        asked = self.adapter.asked_tokens
        return Generated(stamps[0] if stamps else 0,
                         counted if isinstance(counted, int) else len(stamps),
                         prompt if isinstance(prompt, int) else -1, asked[index],
                         isinstance(counted, int),
                         tuple(map(operator.sub, stamps[1:], stamps)))  # the gaps, in C

    # -------------------------------------------------------------- closed loop

    async def _closed_worker(self) -> None:
        connection = self.adapter.connect(self.spec.timeout_s)
        try:
            while not self._stopping:
                now = self.clock()
                if self._stop_at is not None and now >= self._stop_at:
                    return
                if self._budget is not None and now >= self._measure_start:
                    if self._budget <= 0:
                        return
                    self._budget -= 1
                await self._send(connection, now)
        finally:
            connection.close()

    # ---------------------------------------------------------------- open loop

    async def _connection(self) -> Connection:
        """An idle connection, a new one under ``max_connections``, or the next one freed
        (first come, first served: a freed connection wakes one waiter, not all)."""
        if self._idle:
            return self._idle.pop()
        if self._open_connections < self.spec.max_connections:
            self._open_connections += 1
            return self.adapter.connect(self.spec.timeout_s)
        assert self._loop is not None
        waiter: asyncio.Future[Connection] = self._loop.create_future()
        self._waiters.append(waiter)
        self._waited += 1
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._release(waiter.result())  # handed over just as we were cancelled
            raise

    def _release(self, connection: Connection) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self._idle.append(connection)

    async def _open_request(self, scheduled: int) -> None:
        try:
            try:
                connection = await self._connection()
            except asyncio.CancelledError:
                if not self._cutting:
                    raise
                exc = self._cut_now()  # scheduled, never sent: charged to the endpoint
                now = self.clock()
                self.buffer.add(scheduled, now, now, classify(exc), 0, 0, 0,
                                self.adapter.rows_per_request, None, None, -1)
                return
            try:
                await self._send(connection, scheduled)
            except BaseException:
                connection.close()  # in an unknown state: do not reuse it
                self._open_connections -= 1
                self._wake_waiter()
                raise
            self._release(connection)
        finally:
            self._in_flight -= 1

    def _wake_waiter(self) -> None:
        """A connection slot was freed by closing one: let the first waiter open anew."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                self._open_connections += 1
                waiter.set_result(self.adapter.connect(self.spec.timeout_s))
                return

    async def _open_dispatcher(self, start: int) -> None:
        tasks = self._tasks
        for offset in arrival_offsets_ns(self.spec):
            scheduled = start + offset
            if self._stopping or (self._stop_at is not None and scheduled >= self._stop_at):
                break
            if self._budget is not None and scheduled >= self._measure_start:
                if self._budget <= 0:
                    break
                self._budget -= 1
            # the loop's timers work in whole milliseconds and may wake early: wait out
            # the rest, so no request leaves before its time (sub-ms: the next turn)
            while (delay := scheduled - self.clock()) > 0:  # noqa: ASYNC110 (a timer)
                await asyncio.sleep(delay / 1e9)
            self._in_flight += 1
            task = asyncio.ensure_future(self._open_request(scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
        for connection in self._idle:
            connection.close()

    # ------------------------------------------------------------------- phases

    async def cold_start(self) -> Records:
        """Send the very first request alone; its latency is reported apart."""
        return await self._cold_start()

    async def _cold_start(self) -> Records:
        connection = self.adapter.connect(self.spec.timeout_s)
        try:
            await self._send(connection, self.clock())
        finally:
            connection.close()
        cold = self.buffer.freeze()
        self.buffer = RecordBuffer()
        return cold

    async def _sample_server(self, snapshots: list[tuple[int, dict[str, Any]]],
                             window_ns: int) -> None:
        """The server's cumulative statistics at every window boundary."""
        at = self._measure_start
        while not self._load_done:
            await asyncio.sleep(max(at - self.clock(), 0) / 1e9)
            if self._load_done:
                return
            stats = await asyncio.to_thread(self.adapter.server_stats)
            if stats is None:
                return
            snapshots.append((at, stats))
            at += window_ns

    async def _idle_loop_lag(self, samples: int = 10) -> float:
        """The loop's lag at rest (p99 of ``samples`` 10 ms timers, about 0.1 s): the
        floor the lag under load is judged against."""
        lags: list[float] = []
        period_ns = 10_000_000
        for _ in range(samples):
            asked = self.clock() + period_ns
            await asyncio.sleep(period_ns / 1e9)
            lags.append(max(self.clock() - asked, 0) / 1e6)
        return float(np.percentile(lags, 99))

    async def _watch_loop_lag(self, lags: list[float]) -> None:
        """Scheduling lag of the client itself: a busy loop answers timers late, and every
        response it reads late inflates the measured latency."""
        period_ns = 10_000_000
        while not self._load_done:
            asked = self.clock() + period_ns
            await asyncio.sleep(period_ns / 1e9)
            lags.append(max(self.clock() - asked, 0) / 1e6)

    async def _watch_windows(self, windows: list[WindowReport]) -> str:
        """Stability mode: measure windows until the last three agree, or give up."""
        window_ns = int((self.spec.window_s or DEFAULT_WINDOW_S) * 1e9)
        start = self._measure_start
        for index in range(self.spec.max_windows):
            end = start + window_ns
            await asyncio.sleep(max(end - self.clock(), 0) / 1e9)
            report = self.live_window(index, start, end)
            windows.append(report)
            if self.on_window:
                self.on_window(report)
            why = instability(windows, self.spec.stability_percent)
            if why is None:
                return f"stable after {index + 1} windows"
            start = end
        return f"not stable after {self.spec.max_windows} windows: {why}"

    def live_window(self, index: int, start: int, end: int) -> WindowReport:
        """Statistics of the requests that ended in ``[start, end)``, while the run goes on."""
        b = self.buffer
        n = len(b.end_ns)
        first = max(n - 200_000, 0)  # recent records are enough to cover one window
        end_ns = np.asarray(b.end_ns[first:n], np.int64)
        ok = np.asarray(b.outcome[first:n]) == OK
        latency = (end_ns - np.asarray(b.scheduled_ns[first:n], np.int64)) / 1e6
        return window_report(index, start, end, end_ns, ok, latency)

    def measuring(self, now_ns: int) -> bool:
        """Past the warmup."""
        return now_ns >= self._measure_start

    async def run(self, *, cold_start: bool = True, start_at_ns: int | None = None,
                  read_server_stats: bool = True) -> RunOutcome:
        """Cold start, warmup, measurement; returns raw records and the run's facts.

        Workers of a multi-process run skip the cold start and the server statistics
        (the parent does both) and start together at ``start_at_ns``.
        """
        with settled_heap():
            return await self._run(cold_start, start_at_ns, read_server_stats)

    async def _run(self, cold_start: bool, start_at_ns: int | None,
                   read_server_stats: bool) -> RunOutcome:
        spec = self.spec
        cold = await self._cold_start() if cold_start else RecordBuffer().freeze()
        self._loop = asyncio.get_running_loop()
        idle_lag = await self._idle_loop_lag()
        # with no warmup the window opens with the first request: count from before it
        server_before = await asyncio.to_thread(self.adapter.server_stats) \
            if read_server_stats and not spec.warmup_s else None
        if start_at_ns is not None:
            await asyncio.sleep(max(start_at_ns - self.clock(), 0) / 1e9)
            # the loop's timers (millisecond ticks) may wake a little early: a request sent
            # before the start falls outside the --requests budget and is one too many
            if (early := start_at_ns - self.clock()) > 0:
                await asyncio.sleep(early / 1e9 + TIMER_SLACK_S)
        start = start_at_ns if start_at_ns is not None else self.clock()
        self._measure_start = start + int(spec.warmup_s * 1e9)
        if spec.duration_s is not None:
            self._stop_at = self._measure_start + int(spec.duration_s * 1e9)
        if spec.requests is not None:
            self._budget = spec.requests
        cpu_start = time.process_time()

        load_future: asyncio.Future[Any]
        if spec.mode == "closed":
            assert spec.concurrency is not None
            self._tasks.update(asyncio.ensure_future(self._closed_worker())
                               for _ in range(spec.concurrency))
            load_future = asyncio.gather(*self._tasks)
        else:
            load_future = asyncio.ensure_future(self._open_dispatcher(start))
        if spec.warmup_s:
            await asyncio.sleep(spec.warmup_s)
        if read_server_stats and spec.warmup_s:
            server_before = await asyncio.to_thread(self.adapter.server_stats)
        snapshots: list[tuple[int, dict[str, Any]]] = []
        lags: list[float] = []
        lag_watch = asyncio.ensure_future(self._watch_loop_lag(lags))
        sampler = None
        window_s = spec.window_s or (None if spec.fixed_length else DEFAULT_WINDOW_S)
        if read_server_stats and server_before is not None and window_s:
            sampler = asyncio.ensure_future(self._sample_server(snapshots, int(window_s * 1e9)))

        windows: list[WindowReport] = []
        stable = None
        if spec.fixed_length:
            await self._finish(load_future)
            reason = ("--requests reached" if spec.requests is not None else
                      "--duration reached" if spec.duration_s is not None else "trace replayed")
        else:
            reason = await self._watch_windows(windows)
            stable = reason.startswith("stable")
            self._stop_at = self.clock()
            self._stopping = True
            await self._finish(load_future)
        self._load_done = True
        lag_watch.cancel()
        if sampler is not None:
            sampler.cancel()
        measure_end = self._stop_at if self._stop_at is not None else self.clock()
        wall = (self.clock() - start) / 1e9
        cpu = (time.process_time() - cpu_start) / wall * 100 if wall > 0 else 0.0
        server_after = (await asyncio.to_thread(self.adapter.server_stats)
                        if read_server_stats else None)
        records = self.buffer.freeze()
        if spec.fixed_length:
            measure_end = fixed_end(spec, records, self._measure_start, measure_end)
            windows = fixed_windows(spec, records, self._measure_start, measure_end)
            if len(windows) >= 3:
                stable = is_stable(windows, spec.stability_percent)
        return RunOutcome(records, cold, start, self._measure_start, measure_end, windows,
                          stable, reason, cpu, server_before, server_after,
                          server_snapshots=snapshots, loop_lag_ms=np.asarray(lags),
                          idle_lag_ms=idle_lag, notes=self._notes())

    async def _finish(self, load_future: asyncio.Future[Any]) -> None:
        """Wait for the load to end; once the run has stopped, what is still in flight
        ``grace_s`` later is cut (each is recorded as a timeout)."""
        if self._stop_at is not None:  # else --requests or a trace: each has its timeout
            cut_at = self._stop_at + int(self.spec.grace_s * 1e9)
            await asyncio.wait({load_future}, timeout=max(cut_at - self.clock(), 0) / 1e9)
            if not load_future.done():
                self._cutting = True
                for task in list(self._tasks):
                    task.cancel()
        await load_future

    def _notes(self) -> list[str]:
        notes = [f"{n} answer(s) failed: {why}" for why, n in
                 sorted(self.failures.items(), key=lambda kv: -kv[1])[:5]]
        if self._cut:
            notes.append(f"{self._cut} request(s) still in flight {self.spec.grace_s:g} s "
                         "after the run stopped were cut, counted as timeouts")
        if self._waited:
            notes.append(f"{self._waited} request(s) {CONNECTION_WAIT}: the endpoint held "
                         f"all --max-connections {self.spec.max_connections}")
        return notes


def fixed_end(spec: LoadSpec, records: Records, measure_start: int, stop_at: int) -> int:
    """Where a fixed-length measurement ends: the stop time, or (for --requests and traces)
    the last end of a measured request."""
    if spec.duration_s is not None:
        return stop_at
    measured = records.scheduled_ns >= measure_start
    if not measured.any():
        return measure_start
    return int(records.end_ns[measured].max())


def fixed_windows(spec: LoadSpec, records: Records, measure_start: int,
                  measure_end: int) -> list[WindowReport]:
    """Windows of --window seconds over a fixed-length measurement (one when not given)."""
    window_ns = int((spec.window_s or 0) * 1e9) or (measure_end - measure_start)
    if window_ns <= 0:
        return []
    ok = records.outcome == OK
    latency = records.latency_ms
    windows: list[WindowReport] = []
    start = measure_start
    index = 0
    while start < measure_end:
        end = min(start + window_ns, measure_end)
        if end - start < window_ns / 2 and windows:
            break  # a short tail window would only add noise
        windows.append(window_report(index, start, end, records.end_ns, ok, latency))
        start, index = end, index + 1
    return windows
