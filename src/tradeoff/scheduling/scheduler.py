"""The model scheduler: a :class:`BatchQueue` feeding a pool of backend instances.

The event loop owns the queue; each batch runs on a worker thread (one per instance), so
blocking inference never runs on the loop. Results come back to the loop in one callback
per batch, which answers every request of the batch.

A batch is run on the loop itself instead when its model has shown that such batches
are short: the backend allows it (``Backend.inline``), the last ``INLINE_STREAK`` batches
each took less than ``inline_limit_ns`` (``--inline-batch-us``) and this one has no more
rows than the largest of them. Handing a batch to a thread and back costs two to six
context switches and a GIL hand-off (measured: 190 µs of CPU per batch on a 2-vCPU VM),
far more than a small model's batch. A batch is timed by its thread's CPU time: wall
time would count the waits for the GIL on a worker, and other processes taking the core
on the loop. A batch on the loop that takes longer than the limit sends the model back
to its thread until it has shown a streak twice as long as the last.

    scheduler = Scheduler(config, [backend], stats)
    await scheduler.start()
    timings, outputs = await scheduler.infer(request)
    await scheduler.stop()
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import enum
import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tradeoff.backends.base import Backend
from tradeoff.errors import (
    InferenceFailed,
    InstanceDied,
    InvalidValue,
    RequestError,
    RequestTimeout,
    Unavailable,
)
from tradeoff.repository.config import ModelConfig
from tradeoff.scheduling.adaptive import AdaptiveBatcher
from tradeoff.scheduling.batch_queue import BatchQueue
from tradeoff.scheduling.executor import ExecutorLoad, Outputs
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import ModelStats

__all__ = [
    "INLINE_STREAK",
    "INLINE_STREAK_MAX",
    "Scheduler",
    "SchedulerState",
    "run_batch",
]

log = logging.getLogger(__name__)

# batches in a row, each shorter than the limit, before the next runs on the loop
INLINE_STREAK = 16
INLINE_STREAK_MAX = 4096


class SchedulerState(enum.Enum):
    CREATED = "created"
    RUNNING = "running"
    DRAINING = "draining"
    DEAD = "dead"  # every instance died; the model must be loaded again
    STOPPED = "stopped"


def run_batch(backend: Backend, config: ModelConfig, batch: Sequence[InferenceRequest],
              output_names: Sequence[str]) -> tuple[list[Outputs], Timings]:
    """Concatenate a batch, run it, split the outputs. Runs on a worker thread."""
    clock = time.perf_counter_ns
    t0 = clock()
    if len(batch) == 1:
        inputs = batch[0].inputs
    else:
        inputs = {name: np.concatenate([r.inputs[name] for r in batch])
                  for name in batch[0].inputs}
    rows = sum(r.rows for r in batch)
    inputs = _reshape_inputs(config, inputs, rows)
    t1 = clock()
    try:
        outputs = backend.run(inputs, output_names)
    except RequestError:  # already says what the client is told
        raise
    except Exception as exc:  # the runtime's own error types vary; name the cause
        raise InferenceFailed(f"model {config.name!r} failed on a batch of {rows}: "
                              f"{type(exc).__name__}: {exc}") from exc
    t2 = clock()
    per_request = _split_outputs(config, batch, outputs, rows)
    t3 = clock()
    return per_request, Timings(0, t1 - t0, t2 - t1, t3 - t2, rows)


def _reshape_inputs(config: ModelConfig, inputs: dict[str, np.ndarray],
                    rows: int) -> dict[str, np.ndarray]:
    reshaped = None
    for tensor in config.inputs:
        if tensor.reshape is not None and tensor.name in inputs:
            reshaped = reshaped or dict(inputs)
            lead = (rows,) if config.max_batch_size > 0 else ()
            reshaped[tensor.name] = inputs[tensor.name].reshape(lead + tensor.reshape)
    return reshaped or inputs


def _split_outputs(config: ModelConfig, batch: Sequence[InferenceRequest],
                   outputs: Outputs, rows: int) -> list[Outputs]:
    for tensor in config.outputs:
        if tensor.reshape is not None and tensor.name in outputs:
            lead = (rows,) if config.max_batch_size > 0 else ()
            outputs[tensor.name] = outputs[tensor.name].reshape(
                lead + tuple(d if d != -1 else -1 for d in tensor.dims))
    if len(batch) == 1:
        return [outputs]
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != rows:
            raise InferenceFailed(f"model {config.name!r} output {name!r} has shape "
                                  f"{list(array.shape)}; expected {rows} rows for the batch")
    offsets = np.cumsum([0] + [r.rows for r in batch]).tolist()
    return [{name: array[offsets[i]:offsets[i + 1]] for name, array in outputs.items()}
            for i in range(len(batch))]


class Scheduler:
    """Queue, batcher and instance pool of one model version, in this process: the
    in-process :class:`~tradeoff.scheduling.executor.TensorExecutor`."""

    def __init__(self, config: ModelConfig, instances: Sequence[Backend], stats: ModelStats,
                 *, clock: Callable[[], int] = time.perf_counter_ns,
                 inline_limit_ns: int = 0) -> None:
        if not instances:
            raise InvalidValue("a scheduler needs at least one backend instance")
        self.config = config
        self.stats = stats
        self.queue = BatchQueue(config.name, config.max_batch_size, config.dynamic_batching)
        self.output_names = [t.name for t in config.outputs]
        self.state = SchedulerState.CREATED
        self.in_flight = 0  # requests accepted and not yet answered
        self._clock = clock
        self._instances = list(instances)
        self._free = list(instances)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=len(instances), thread_name_prefix=f"infer-{config.name}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: int | None = None
        self._scheduled = False
        self._cancelled = False
        self._callbacks: list[tuple[InferenceRequest, Any]] = []  # submit_call's, due
        self._running = 0
        self._idle: asyncio.Event | None = None
        preserve = config.dynamic_batching is not None and config.dynamic_batching.preserve_ordering
        self._preserve_ordering = preserve
        self._order: deque[InferenceRequest] = deque()
        self._dead: list[Backend] = []
        # 0: every batch on a thread
        self.inline_limit_ns = inline_limit_ns if all(b.inline for b in instances) else 0
        self._fast_streak = 0  # batches in a row shorter than the limit
        self._streak_needed = INLINE_STREAK  # doubles after each slow batch on the loop
        self._fast_rows = 0  # the most rows among them
        self.inline_batches = 0  # run on the loop, of all batches (stats)
        batching = config.dynamic_batching
        self.adaptive = None if batching is None or batching.target_p99_ms is None else \
            AdaptiveBatcher(batching.target_p99_ms, config.max_batch_size, len(instances),
                            batching.max_queue_delay_us, clock())
        # called once when the last instance has died, with the cause
        self.on_dead: Callable[[str], None] | None = None

    @property
    def queue_depth(self) -> int:
        return len(self.queue)

    def load(self) -> ExecutorLoad:
        adaptive = self.adaptive
        return ExecutorLoad(len(self.queue), self.in_flight, self.inline_batches,
                            None if adaptive is None else adaptive.delay_ns / 1000,
                            None if adaptive is None else adaptive.cap)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._idle = asyncio.Event()
        self._idle.set()
        self.state = SchedulerState.RUNNING

    def drain(self) -> None:
        """Refuse new requests and run every queued one now, without waiting for delays."""
        if self.state is SchedulerState.RUNNING:
            self.state = SchedulerState.DRAINING
            self._wake()

    async def stop(self) -> None:
        """Stop taking requests; answer the queued and running ones, then release."""
        if self.state is SchedulerState.STOPPED:
            return
        self.state = SchedulerState.DRAINING
        self._wake()
        assert self._idle is not None
        await self._idle.wait()
        # answers still due on the next loop turn are given now: whoever stops the model
        # may forget its callers' channel right after (an executor process's front end)
        self._call_back()
        if self._timer:
            self._timer.cancel()
        self._executor.shutdown(wait=True)
        for backend in self._instances:
            backend.close()
        self.state = SchedulerState.STOPPED

    async def infer(self, request: InferenceRequest) -> tuple[Timings, Outputs]:
        """Queue a request and wait for its outputs."""
        future = self.submit(request)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel(request)
            raise

    def submit(self, request: InferenceRequest) -> asyncio.Future[tuple[Timings, Outputs]]:
        """Queue a request; the future gets its timings and outputs (or its error).
        Whoever stops waiting calls :meth:`cancel`."""
        loop = self._accepting()
        future = request.future = loop.create_future()
        self._enqueue(request)
        return future

    def submit_call(self, request: InferenceRequest,
                    on_done: Callable[[tuple[Timings, Outputs] | BaseException], None]) -> None:
        """:meth:`submit` without a future, for the hot path: ``on_done`` gets the timings
        and outputs (or the error) on the loop turn after the request finishes (when a
        future's callback would run), never after :meth:`cancel`."""
        self._accepting()
        request.on_done = on_done
        self._enqueue(request)

    def _accepting(self) -> asyncio.AbstractEventLoop:
        if self.state is not SchedulerState.RUNNING:
            raise Unavailable(f"model {self.config.name!r} is not accepting requests "
                              f"({self.state.value})")
        assert self._loop is not None
        return self._loop

    def _enqueue(self, request: InferenceRequest) -> None:
        assert self._idle is not None
        try:
            self.queue.push(request, self._clock())
        except Unavailable:
            self.stats.record_failure(0, "REJECTED")  # queue full
            raise
        self.in_flight += 1
        self._idle.clear()
        if self.adaptive is not None:
            self.adaptive.arrived(request.rows)
            self._adapt(request.enqueue_ns)
        # Dispatch on the next loop turn, so requests that arrive together batch together.
        self._wake()

    def cancel(self, request: InferenceRequest) -> None:
        """Nobody waits for ``request`` any more: the batcher drops it if still queued."""
        request.cancelled = True
        if request.future is not None and not request.future.done():
            request.future.cancel()
        self._cancelled = True
        self._wake()

    # ---------------------------------------------------------------- batching

    def _wake(self) -> None:
        if not self._scheduled and self._loop is not None:
            self._scheduled = True
            self._loop.call_soon(self._dispatch)

    def _dispatch(self) -> None:
        self._scheduled = False
        now = self._clock()
        for request in self.queue.expire(now):
            self._fail(request, RequestTimeout(
                f"request to model {self.config.name!r} timed out in the queue"))
        if self._cancelled:
            self._cancelled = False
            for request in self.queue.drop_cancelled():
                self.in_flight -= 1
                self.stats.record_failure(now - request.enqueue_ns, "CANCELED")
                if request.on_released is not None:
                    request.on_released(True)
        wake_at = None
        while self._free and len(self.queue):
            # While draining there is nothing to wait for: run what is queued.
            decide_at = now if self.state is SchedulerState.RUNNING else now + 10**18
            batch, wake_at = self.queue.next_batch(decide_at)
            if batch is None:
                break
            backend = self._free.pop()
            for request in batch:
                request.timings.queue_ns = now - request.enqueue_ns
            if self._preserve_ordering:
                self._order.extend(batch)  # responses leave in the order batches formed
            self._running += 1
            if self._fast_streak >= self._streak_needed and self.inline_limit_ns and \
                    sum(r.rows for r in batch) <= self._fast_rows:
                self.inline_batches += 1
                self._complete(batch, backend, *self._run(backend, batch), True)
                if self.state is SchedulerState.DEAD:
                    return
                now = self._clock()
                continue
            self._executor.submit(self._execute, backend, batch)
        self._arm_timer(wake_at, self.queue.next_deadline())
        self._check_idle()

    def _arm_timer(self, *candidates: int | None) -> None:
        times = [t for t in candidates if t is not None]
        if not times:
            return
        at = min(times)
        if self._timer is not None and self._timer_at is not None and self._timer_at <= at:
            if not self._timer.cancelled() and self._timer_at > self._clock():
                return
        if self._timer is not None:
            self._timer.cancel()
        assert self._loop is not None
        delay = max(at - self._clock(), 0) / 1e9
        self._timer_at = at
        self._timer = self._loop.call_later(delay, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self._dispatch()

    def _run(self, backend: Backend, batch: list[InferenceRequest]
             ) -> tuple[tuple[list[Outputs], Timings] | None, BaseException | None, int]:
        """Run a batch: its result or error, and the CPU time its thread spent on it."""
        start = time.thread_time_ns()
        try:
            result, error = run_batch(backend, self.config, batch, self.output_names), None
        except BaseException as exc:  # every request of the batch must be answered
            result, error = None, exc
        return result, error, time.thread_time_ns() - start

    def _execute(self, backend: Backend, batch: list[InferenceRequest]) -> None:
        """Worker thread: run one batch, then hand the result to the event loop."""
        result, error, busy_ns = self._run(backend, batch)
        assert self._loop is not None
        self._loop.call_soon_threadsafe(self._finish, batch, backend, result, error, busy_ns)

    def _finish(self, batch: list[InferenceRequest], backend: Backend,
                result: tuple[list[Outputs], Timings] | None,
                exc: BaseException | None, busy_ns: int) -> None:
        self._complete(batch, backend, result, exc, busy_ns, False)
        if self.state is not SchedulerState.DEAD:
            self._dispatch()

    def _complete(self, batch: list[InferenceRequest], backend: Backend,
                  result: tuple[list[Outputs], Timings] | None,
                  exc: BaseException | None, busy_ns: int, inline: bool) -> None:
        """Answer a batch's requests and give its instance back."""
        self._running -= 1
        if isinstance(exc, InstanceDied):
            self._dead.append(backend)  # never handed another batch
            log.error("model %s: an instance died: %s", self.config.name, exc)
        else:
            self._free.append(backend)
        end = self._clock()
        if exc is not None or result is None:
            error = exc if isinstance(exc, RequestError) else InferenceFailed(
                f"model {self.config.name!r}: {type(exc).__name__}: {exc}")
            if not isinstance(exc, RequestError):
                log.error("model %s: batch failed", self.config.name, exc_info=exc)
            for request in batch:
                self._fail(request, error, end, "BACKEND")
        else:
            results, timings = result
            self.stats.record_execution(timings.batch_size, timings)
            if busy_ns < self.inline_limit_ns:
                self._fast_streak += 1
                self._fast_rows = max(self._fast_rows, timings.batch_size)
            else:
                self._fast_streak = self._fast_rows = 0
                if inline:
                    self._streak_needed = min(2 * self._streak_needed, INLINE_STREAK_MAX)
            if self.adaptive is not None:
                self.adaptive.executed(timings.batch_size, timings.compute_input_ns
                                       + timings.compute_infer_ns + timings.compute_output_ns)
            self.stats.record_batch_success(batch, timings, end)
            for request, outputs in zip(batch, results, strict=True):
                t = request.timings
                t.compute_input_ns = timings.compute_input_ns
                t.compute_infer_ns = timings.compute_infer_ns
                t.compute_output_ns = timings.compute_output_ns
                t.batch_size = timings.batch_size
                if self.adaptive is not None:
                    self.adaptive.finished(end - request.enqueue_ns)
                self.in_flight -= 1
                request.result = (t, outputs)
                if not self._preserve_ordering:
                    self._answer(request)
        if self._preserve_ordering:
            while self._order and self._order[0].result is not None:
                self._answer(self._order.popleft())
        if len(self._dead) == len(self._instances) and self.state is not SchedulerState.DEAD:
            self._die(str(exc))
            return
        if self.adaptive is not None:
            self._adapt(end)

    def _adapt(self, now: int) -> None:
        """Let the adaptive batcher set the queue's delay and cap (once per tick)."""
        assert self.adaptive is not None
        if self.adaptive.update(now):
            self.queue.delay_ns = self.adaptive.delay_ns
            self.queue.cap = self.adaptive.cap
            log.debug("model %s: %s", self.config.name, self.adaptive.describe())

    def _die(self, cause: str) -> None:
        """Every instance is dead: refuse new requests and answer the queued ones."""
        self.state = SchedulerState.DEAD
        error = Unavailable(f"model {self.config.name!r} is not ready: its instances died "
                            f"({cause}); load it again")
        for request in self.queue.drain():
            self._fail(request, error, reason="BACKEND")
        self._check_idle()
        if self.on_dead is not None:
            self.on_dead(cause)

    def _answer(self, request: InferenceRequest) -> None:
        result = request.result
        request.result = None
        if request.on_done is not None:
            # answered together on the next loop turn, as futures' callbacks would be: the
            # reads that arrived meanwhile are taken first and join the next batch
            if not self._callbacks:
                assert self._loop is not None
                self._loop.call_soon(self._call_back)
            self._callbacks.append((request, result))
            return
        future = request.future
        if future is not None and not future.done():
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

    def _call_back(self) -> None:
        answers, self._callbacks = self._callbacks, []
        for request, result in answers:
            if request.cancelled:
                if request.on_released is not None:
                    request.on_released(False)
            else:
                try:
                    request.on_done(result)  # type: ignore[misc]
                except Exception:  # one caller's failure must not cost the others their answers
                    log.exception("model %s: a request's callback failed", self.config.name)

    def _fail(self, request: InferenceRequest, error: Exception, end: int | None = None,
              reason: str = "REJECTED") -> None:
        end = end if end is not None else self._clock()
        self.stats.record_failure(end - request.enqueue_ns, reason)
        self.in_flight -= 1
        request.result = error
        if not (self._preserve_ordering and request in self._order):
            self._answer(request)

    def _check_idle(self) -> None:
        if self._idle is not None and not self._running and not len(self.queue):
            self._idle.set()
