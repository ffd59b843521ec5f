"""Tensor models' batchers and instances in a process of their own, one per device
(``tradeoff serve --executors process``): the server's event loop parses, validates and
answers; the executor process batches and runs, under a GIL of its own.

    processes = ExecutorProcesses(arena_bytes=64 << 20)
    process = await processes.get("cpu")
    numbers = await process.load(name, root, None, limits, inline_limit_ns, cancel)
    executor = RemoteExecutor(process, numbers[1], name, stats)  # a TensorExecutor
    timings, outputs = await executor.infer(request)

Requests and answers are small messages on a pipe (``server/executor_messages.py``);
tensor bytes cross in two shared arenas, one per direction: the server copies a request's
inputs in, the executor batches straight from them, writes each answer's outputs into the
other, and the server copies them out and gives the blocks back. A full arena answers
503 at once; it never grows.

Inside, each model version runs the same :class:`Scheduler` as in process, with
statistics that record into a list: every :class:`Answered` carries what they recorded,
and the server's :class:`ModelStats` records it again, so the statistics extension and
``/metrics`` read the server's own counters.

An executor process that dies fails its requests in flight with 503 at once; its models'
``on_dead`` tells the model manager, which loads them again into a new process. One whose
server goes away sees its pipe close and exits.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from tradeoff import errors
from tradeoff.errors import InferenceFailed, ModelLoadError, RequestError, Unavailable
from tradeoff.repository.config import ModelConfig
from tradeoff.scheduling.executor import Answer as ExecutorAnswer
from tradeoff.scheduling.executor import ExecutorLoad
from tradeoff.scheduling.priority import TensorPriority
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.build import BuildLimits, load_failure
from tradeoff.server.executor_messages import (
    Answer,
    Answered,
    BatchRecord,
    Cancel,
    CancelLoad,
    Drain,
    Failure,
    FromExecutor,
    Infer,
    Loaded,
    LoadFailed,
    LoadModel,
    ModelDied,
    Release,
    Released,
    ToExecutor,
    Unload,
    Unloaded,
    decode_from_executor,
    decode_to_executor,
    encode,
    read_tensor,
    write_tensors,
)
from tradeoff.server.shared_arena import SharedArena

__all__ = ["ExecutorProcess", "ExecutorProcesses", "RemoteExecutor", "device_of"]

log = logging.getLogger("tradeoff.server")

CANCEL_POLL_S = 0.2  # how often a load in progress looks at its cancel event


def device_of(config: ModelConfig) -> str:
    """The executor process a model's instances run in: ``cpu``, or its GPUs."""
    gpus = sorted({str(d) for g in config.instance_groups if g.kind == "KIND_GPU"
                   for d in g.devices()})
    return f"gpu{','.join(gpus)}" if gpus else "cpu"


def _error(failure: Failure) -> RequestError:
    """The request error an executor named (anything else: the batch failed)."""
    kind = getattr(errors, failure.error, None)
    if isinstance(kind, type) and issubclass(kind, RequestError):
        return kind(failure.message)
    return InferenceFailed(failure.message)


def _record(stats: ModelStats, record: BatchRecord) -> None:
    """Record in the server what the executor's statistics recorded."""
    for rows, input_ns, infer_ns, output_ns in record.executions:
        stats.record_execution(rows, Timings(0, input_ns, infer_ns, output_ns, rows))
    for totals, queues, (input_ns, infer_ns, output_ns, rows) in record.successes:
        stats.record_successes(totals, queues, Timings(0, input_ns, infer_ns, output_ns, rows))
    for total, reason in record.failures:
        stats.record_failure(total, reason)


# ------------------------------------------------------------------ the executor process

class _RecordingStats(ModelStats):
    """The executor's statistics: what the scheduler records, kept for the server."""

    def __init__(self, name: str, version: int) -> None:
        super().__init__(name, version)
        self._record = BatchRecord([], [], [])

    def record_execution(self, rows: int, timings: Timings) -> None:
        self._record.executions.append((rows, timings.compute_input_ns,
                                        timings.compute_infer_ns, timings.compute_output_ns))

    def record_successes(self, totals: list[int], queues: list[int], timings: Timings
                         ) -> None:
        self._record.successes.append((totals, queues, (
            timings.compute_input_ns, timings.compute_infer_ns, timings.compute_output_ns,
            timings.batch_size)))

    def record_failure(self, total_ns: int, reason: str) -> None:
        self._record.failures.append((total_ns, reason))

    def take(self) -> BatchRecord:
        record, self._record = self._record, BatchRecord([], [], [])
        return record


class _Executor:
    """The executor process's side: its models' schedulers, fed from the pipe."""

    def __init__(self, conn: multiprocessing.connection.Connection, inputs: SharedArena,
                 outputs: SharedArena) -> None:
        self.conn = conn
        self.inputs = inputs
        self.outputs = outputs
        self.loop = asyncio.get_running_loop()
        self.models: dict[int, tuple[Any, _RecordingStats]] = {}  # number -> scheduler
        self.pending: dict[tuple[int, int], InferenceRequest] = {}
        self.loads: dict[int, threading.Event] = {}
        self.outbox: dict[int, list[Answer]] = {}
        self.outgoing: list[FromExecutor] = []
        self.numbers = itertools.count(1)
        self.closed = asyncio.Event()
        self.tasks: set[asyncio.Task] = set()

    def send(self, message: FromExecutor) -> None:
        """Queue a message: those of one loop turn leave in one write."""
        if not self.outgoing:
            self.loop.call_soon(self._write)
        self.outgoing.append(message)

    def _write(self) -> None:
        messages, self.outgoing = self.outgoing, []
        try:
            self.conn.send_bytes(encode(messages))
        except OSError:
            self.closed.set()  # the server is gone

    def readable(self) -> None:
        """The pipe has data (the loop watches it): every whole message waiting."""
        try:
            while self.conn.poll(0):
                self.handle_all(decode_to_executor(self.conn.recv_bytes()))
        except (EOFError, OSError):
            self.loop.remove_reader(self.conn.fileno())
            self.closed.set()

    def _task(self, work: Any) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def handle_all(self, messages: list[ToExecutor]) -> None:
        for message in messages:
            self.handle(message)

    def handle(self, message: ToExecutor) -> None:
        if isinstance(message, Infer):
            self.infer(message)
        elif isinstance(message, Release):
            for start in message.starts:
                self.outputs.free(start)
        elif isinstance(message, Cancel):
            request = self.pending.get((message.model, message.request))
            if request is not None:
                self.models[message.model][0].cancel(request)
        elif isinstance(message, LoadModel):
            self._task(self.load(message))
        elif isinstance(message, CancelLoad):
            cancel = self.loads.get(message.load)
            if cancel is not None:
                cancel.set()
        elif isinstance(message, Drain):
            if message.model in self.models:
                self.models[message.model][0].drain()
        elif isinstance(message, Unload):
            self._task(self.unload(message.model))

    async def load(self, message: LoadModel) -> None:
        from tradeoff.repository.repository import ModelRepository
        from tradeoff.scheduling.scheduler import Scheduler
        from tradeoff.server.build import build_tensor

        cancel = self.loads[message.load] = threading.Event()
        try:
            config, built = await asyncio.to_thread(
                build_tensor, ModelRepository(Path(message.root)), message.name,
                message.config_override, message.limits, cancel)
        except Exception as exc:  # said as the server says a failed load
            self.send(LoadFailed(message.load, type(exc).__name__,
                                 str(load_failure(message.name, exc))))
            return
        finally:
            del self.loads[message.load]
        numbers = {}
        for version, (backends, _) in built.items():
            number = numbers[version] = next(self.numbers)
            stats = _RecordingStats(message.name, version)
            scheduler = Scheduler(config, backends, stats,
                                  inline_limit_ns=message.inline_limit_ns)
            await scheduler.start()
            scheduler.on_dead = functools.partial(self.died, number)
            self.models[number] = (scheduler, stats)
        self.send(Loaded(message.load, numbers))

    def infer(self, message: Infer) -> None:
        key = (message.model, message.request)
        model = self.models.get(message.model)
        if model is None:
            self.answer(message.model, Answer(message.request, (0, 0, 0, 0, 0), failure=Failure(
                "Unavailable", "the model is not loaded in its executor process")))
            return
        scheduler = model[0]
        request = InferenceRequest(
            {ref.name: read_tensor(self.inputs, ref, copy=False) for ref in message.inputs},
            message.rows, tuple((name, tuple(dims)) for name, dims in message.shape_key),
            TensorPriority(message.priority), message.timeout_us)
        request.on_released = functools.partial(self.released, *key)
        self.pending[key] = request
        try:
            scheduler.submit_call(request, functools.partial(self.done, *key))
        except RequestError as exc:  # refused at once (queue full, draining)
            del self.pending[key]
            self.answer(message.model, Answer(message.request, (0, 0, 0, 0, 0), failure=Failure(
                type(exc).__name__, str(exc))))
            return
        self._outbox(message.model)  # the server sees its queue grow (/metrics)

    def done(self, model: int, request: int, result: ExecutorAnswer | BaseException) -> None:
        self.pending.pop((model, request), None)
        try:
            self._answer_with(model, request, result)
        except Exception as exc:  # whatever went wrong, the request is answered
            log.exception("model %d: an answer could not be sent", model)
            self.answer(model, Answer(request, (0, 0, 0, 0, 0), failure=Failure(
                "InferenceFailed", f"the answer could not be returned: "
                                   f"{type(exc).__name__}: {exc}")))

    def _answer_with(self, model: int, request: int, result: ExecutorAnswer | BaseException
                     ) -> None:
        if isinstance(result, BaseException):
            self.answer(model, Answer(request, (0, 0, 0, 0, 0), failure=Failure(
                type(result).__name__, str(result))))
            return
        t, outputs = result
        timings = (t.queue_ns, t.compute_input_ns, t.compute_infer_ns, t.compute_output_ns,
                   t.batch_size)
        refs = write_tensors(self.outputs, outputs)
        if refs is None:
            self.answer(model, Answer(request, timings, failure=Failure(
                "Unavailable", f"the executor's shared memory for answers is full "
                               f"({self.outputs.used_bytes} of {self.outputs.size} bytes "
                               "held): try again, or serve --executor-memory-mb larger")))
            return
        self.answer(model, Answer(request, timings, refs))

    def answer(self, model: int, answer: Answer) -> None:
        """Queue an answer: those of one loop turn (one batch's) leave in one message."""
        self._outbox(model).append(answer)

    def _outbox(self, model: int) -> list[Answer]:
        """The model's answers of this loop turn, sent at its end with its load."""
        if not self.outbox:
            self.loop.call_soon(self.flush)
        return self.outbox.setdefault(model, [])

    def flush(self) -> None:
        outbox, self.outbox = self.outbox, {}
        for number, answers in outbox.items():
            model = self.models.get(number)
            load = model[0].load() if model else ExecutorLoad(0, 0, 0)
            record = model[1].take() if model else BatchRecord([], [], [])
            self.send(Answered(number, answers, record, load))

    def released(self, model: int, request: int, dropped: bool) -> None:
        self.pending.pop((model, request), None)
        stats = self.models[model][1] if model in self.models else None
        self.send(Released(model, request, stats.take() if stats else BatchRecord([], [], [])))

    def died(self, number: int, cause: str) -> None:
        def tell() -> None:
            self.flush()  # the requests its scheduler failed first
            self.send(ModelDied(number, cause))

        self.loop.call_soon(tell)

    async def unload(self, number: int) -> None:
        model = self.models.get(number)
        if model is None:
            self.send(Unloaded(number, BatchRecord([], [], [])))
            return
        await model[0].stop()
        self.flush()
        del self.models[number]
        self.send(Unloaded(number, model[1].take()))

    async def close(self) -> None:
        """The server is gone: answer nothing more, release every instance."""
        for cancel in self.loads.values():
            cancel.set()
        for scheduler, _ in list(self.models.values()):
            scheduler.drain()
            await scheduler.stop()


def _watch(loop: asyncio.AbstractEventLoop, conn: multiprocessing.connection.Connection,
           readable: Callable[[], None]) -> None:
    """The loop reads the pipe itself when it has data: no reader thread, no hand-off
    per message. The pipe stays blocking (uvloop makes a watched descriptor non-blocking):
    a message is read, and written, whole."""
    loop.add_reader(conn.fileno(), readable)
    os.set_blocking(conn.fileno(), True)


def _child(conn: multiprocessing.connection.Connection, inputs: str, outputs: str) -> None:
    """The executor process's main."""
    async def main() -> None:
        executor = _Executor(conn, SharedArena.attach(inputs), SharedArena.attach(outputs))
        _watch(executor.loop, conn, executor.readable)
        await executor.closed.wait()
        await executor.close()

    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


# ------------------------------------------------------------------ the server's side

class ExecutorProcess:
    """One executor process, from the server: its pipe, its two arenas and the models
    loaded in it. Used from the event loop, which also reads the pipe."""

    def __init__(self, device: str, arena_bytes: int, loop: asyncio.AbstractEventLoop
                 ) -> None:
        self.device = device
        self.loop = loop
        self.inputs = SharedArena.create("in", arena_bytes)
        self.outputs = SharedArena.create("out", arena_bytes)
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_child, name=f"executor-{device}",
                                        args=(child, self.inputs.name, self.outputs.name),
                                        daemon=True)
        self._process.start()
        child.close()
        self.alive = True
        self._outgoing: list[ToExecutor] = []
        self.models: dict[int, RemoteExecutor] = {}
        self._loads: dict[int, asyncio.Future[dict[int, int]]] = {}
        self._load_numbers = itertools.count(1)
        _watch(loop, self._conn, self._readable)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def send(self, message: ToExecutor) -> None:
        """Queue a message: those of one loop turn leave in one write."""
        if not self.alive:
            return
        if not self._outgoing:
            self.loop.call_soon(self._write)
        self._outgoing.append(message)

    def _write(self) -> None:
        messages, self._outgoing = self._outgoing, []
        if not self.alive:
            return
        try:
            self._conn.send_bytes(encode(messages))
        except OSError:
            pass  # gone: the reader reports its end

    async def load(self, name: str, root: Path, config_override: dict[str, Any] | None,
                   limits: BuildLimits, inline_limit_ns: int, cancel: threading.Event
                   ) -> dict[int, int]:
        """Build a model's versions in the process (sessions, warmups): each version's
        executor number. Raises the load's error."""
        number = next(self._load_numbers)
        answer = self._loads[number] = self.loop.create_future()
        self.send(LoadModel(number, str(root), name, config_override, limits,
                            inline_limit_ns))
        told = False
        try:
            while True:
                done, _ = await asyncio.wait({answer}, timeout=CANCEL_POLL_S)
                if done:
                    return answer.result()
                if cancel.is_set() and not told:
                    self.send(CancelLoad(number))
                    told = True
        finally:
            self._loads.pop(number, None)

    def _readable(self) -> None:
        """The pipe has data: every whole message waiting; at its end, the process's."""
        try:
            while self._conn.poll(0):
                for message in decode_from_executor(self._conn.recv_bytes()):
                    self._on_message(message)
        except (EOFError, OSError):
            self.stop_reading()
            if self.alive:  # reaped off the loop, then every request in it fails
                reaped = self.loop.run_in_executor(None, self._process.join, 5)
                reaped.add_done_callback(lambda _: self._ended(self._process.exitcode))

    def stop_reading(self) -> None:
        """The loop stops watching the pipe (on the loop, before :meth:`close`)."""
        if not self._conn.closed:
            self.loop.remove_reader(self._conn.fileno())

    def _on_message(self, message: FromExecutor) -> None:
        if isinstance(message, (Loaded, LoadFailed)):
            answer = self._loads.get(message.load)
            if answer is None or answer.done():
                return
            if isinstance(message, Loaded):
                answer.set_result(message.models)
            else:
                answer.set_exception(ModelLoadError(message.message))
            return
        model = self.models.get(message.model)
        if model is not None:
            model.on_message(message)

    def _ended(self, code: int | None) -> None:
        """The process is gone: every request in it fails, every model in it dies."""
        if not self.alive:
            return
        self.alive = False
        cause = f"its executor process ended (exit code {code})"
        log.error("executor process %s (pid %s): ended with exit code %s", self.device,
                  self.pid, code)
        for answer in self._loads.values():
            if not answer.done():
                answer.set_exception(ModelLoadError(cause))
        self.inputs.free_all()
        self.outputs.free_all()
        for model in list(self.models.values()):
            model.process_ended(cause)

    def close(self, timeout_s: float = 10.0) -> None:
        """Stop the process (its pipe closes: it releases its instances and exits) and
        unlink the arenas. Blocking."""
        self.alive = False
        self._conn.close()
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)
        self.inputs.close()
        self.outputs.close()


class ExecutorProcesses:
    """The server's executor processes, one per device, started when a model first
    needs one and again after one has died."""

    def __init__(self, arena_bytes: int) -> None:
        self.arena_bytes = arena_bytes
        self._processes: dict[str, ExecutorProcess] = {}
        self._lock = asyncio.Lock()

    async def get(self, device: str) -> ExecutorProcess:
        async with self._lock:
            process = self._processes.get(device)
            if process is not None and process.alive:
                return process
            if process is not None:
                process.stop_reading()
                await asyncio.to_thread(process.close)
            process = self._processes[device] = ExecutorProcess(
                device, self.arena_bytes, asyncio.get_running_loop())
            log.info("executor process %s: pid %s", device, process.pid)
            return process

    def running(self) -> list[ExecutorProcess]:
        return [p for p in self._processes.values() if p.alive]

    async def close(self) -> None:
        for process in self._processes.values():
            process.stop_reading()
            await asyncio.to_thread(process.close)
        self._processes.clear()


class RemoteExecutor:
    """A model version's executor in an executor process: the
    :class:`~tradeoff.scheduling.executor.TensorExecutor` the data plane calls."""

    def __init__(self, process: ExecutorProcess, number: int, name: str,
                 stats: ModelStats) -> None:
        self.process = process
        self.number = number
        self.name = name
        self.stats = stats
        self.on_dead: Callable[[str], None] | None = None
        self.process_died = False  # it died with its process (not its instances)
        self.state = "running"
        self._pending: dict[int, tuple[InferenceRequest, Callable[[Any], None],
                                       list[int]]] = {}
        self._ids: dict[int, int] = {}  # id(request) -> its number
        self._numbers = itertools.count(1)
        self._last = ExecutorLoad(0, 0, 0)
        self._stopped: asyncio.Future[None] | None = None
        process.models[number] = self

    @property
    def queue_depth(self) -> int:
        return self._last.queue_depth

    def load(self) -> ExecutorLoad:
        return msgspec.structs.replace(self._last, in_flight=len(self._pending))

    async def start(self) -> None:
        pass

    def drain(self) -> None:
        if self.state == "running":
            self.state = "draining"
            self.process.send(Drain(self.number))

    async def stop(self) -> None:
        if self.state == "stopped":
            return
        if self.state != "dead" and self.process.alive:
            self.state = "draining"
            self._stopped = self.process.loop.create_future()
            self.process.send(Unload(self.number))
            await self._stopped
        self.state = "stopped"
        self.process.models.pop(self.number, None)

    async def infer(self, request: InferenceRequest) -> ExecutorAnswer:
        future: asyncio.Future[ExecutorAnswer] = self.process.loop.create_future()

        def done(result: ExecutorAnswer | BaseException) -> None:
            if future.done():
                return
            if isinstance(result, BaseException):
                future.set_exception(result)
            else:
                future.set_result(result)

        self.submit_call(request, done)
        try:
            return await future
        except asyncio.CancelledError:
            self.cancel(request)
            raise

    def submit_call(self, request: InferenceRequest,
                    on_done: Callable[[ExecutorAnswer | BaseException], None]) -> None:
        if self.state != "running":
            raise Unavailable(f"model {self.name!r} is not accepting requests "
                              f"({self.state})")
        arena = self.process.inputs
        refs = write_tensors(arena, request.inputs)
        if refs is None:
            self.stats.record_failure(0, "REJECTED")
            raise Unavailable(f"model {self.name!r}: the executor's shared memory for "
                              f"requests is full ({arena.used_bytes} of {arena.size} "
                              "bytes held): try again, or serve --executor-memory-mb larger")
        number = next(self._numbers)
        self._pending[number] = (request, on_done,
                                 [r.start for r in refs if r.items is None])
        self._ids[id(request)] = number
        request.enqueue_ns = time.perf_counter_ns()
        self.process.send(Infer(self.number, number, refs, request.rows,
                                [(n, tuple(dims)) for n, dims in request.shape_key],
                                int(request.priority), request.timeout_us))

    def cancel(self, request: InferenceRequest) -> None:
        request.cancelled = True
        number = self._ids.get(id(request))
        if number is not None:
            self.process.send(Cancel(self.number, number))

    def _let_go(self, number: int) -> tuple[InferenceRequest, Callable[[Any], None]] | None:
        """A request the executor no longer holds: its input blocks freed."""
        entry = self._pending.pop(number, None)
        if entry is None:
            return None
        request, on_done, starts = entry
        self._ids.pop(id(request), None)
        for start in starts:
            self.process.inputs.free(start)
        return request, on_done

    def on_message(self, message: FromExecutor) -> None:
        if isinstance(message, Answered):
            self._answered(message)
        elif isinstance(message, Released):
            _record(self.stats, message.record)
            self._let_go(message.request)
        elif isinstance(message, Unloaded):
            _record(self.stats, message.record)
            if self._stopped is not None and not self._stopped.done():
                self._stopped.set_result(None)
        elif isinstance(message, ModelDied):
            self._die(message.cause)

    def _answered(self, message: Answered) -> None:
        _record(self.stats, message.record)
        self._last = message.load
        arena = self.process.outputs
        copied: list[int] = []
        for answer in message.answers:
            entry = self._let_go(answer.request)
            refs = answer.outputs or []
            copied += [ref.start for ref in refs if ref.items is None]
            if entry is None:
                continue
            request, on_done = entry
            if request.cancelled:
                continue
            result: ExecutorAnswer | BaseException
            if answer.failure is not None:
                result = _error(answer.failure)
            else:
                t = request.timings
                (t.queue_ns, t.compute_input_ns, t.compute_infer_ns, t.compute_output_ns,
                 t.batch_size) = answer.timings
                result = (t, {ref.name: read_tensor(arena, ref, copy=True) for ref in refs})
            try:
                on_done(result)
            except Exception:  # one caller's failure must not cost the others their answers
                log.exception("model %s: a request's callback failed", self.name)
        if copied:
            self.process.send(Release(copied))

    def _die(self, cause: str) -> None:
        if self.state in ("dead", "stopped"):
            return
        self.state = "dead"
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
        if self.on_dead is not None:
            self.on_dead(cause)

    def process_ended(self, cause: str) -> None:
        """The process died: every request in flight fails now (503)."""
        error = Unavailable(f"model {self.name!r} is not ready: {cause}; it is being "
                            "loaded again")
        pending, self._pending = self._pending, {}
        self._ids.clear()
        for request, on_done, _ in pending.values():
            self.stats.record_failure(time.perf_counter_ns() - request.enqueue_ns, "BACKEND")
            if not request.cancelled:
                try:
                    on_done(error)
                except Exception:
                    log.exception("model %s: a request's callback failed", self.name)
        self.process_died = True
        self._die(cause)
