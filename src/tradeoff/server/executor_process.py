"""Tensor models' batchers and instances in a process of their own, one per device
(``tradeoff serve --executors process``): the server's event loop parses, validates and
answers; the executor process batches and runs, under a GIL of its own.

    processes = ExecutorProcesses(arena_bytes=64 << 20)
    process = await processes.get("cpu")
    numbers = await process.load(name, root, None, limits, inline_limit_ns, cancel, "a")
    executor = RemoteExecutor(process, numbers[1], name, stats)  # a TensorExecutor
    timings, outputs = await executor.infer(request)

Requests and answers are small messages on a pipe (``server/executor_messages.py``);
tensor bytes cross in two shared arenas, one per direction: the server copies a request's
inputs in, the executor batches straight from them, writes each answer's outputs into the
other, and the server copies them out and gives the blocks back. A full arena answers
503 at once; it never grows.

Inside (``server/executor_core.py``), each model version runs the same
:class:`Scheduler` as in process, with statistics that record into a list: every
:class:`Answered` carries what they recorded, and the server's :class:`ModelStats`
records it again, so the statistics extension and ``/metrics`` read the server's own
counters.

An executor process that dies fails its requests in flight with 503 at once; its models'
``on_dead`` tells the model manager, which loads them again into a new process. One whose
server goes away sees its pipe close and exits.

With ``serve --workers N`` the executor processes are the supervisor's, one per device,
and each front end dials them (:class:`SharedExecutors`) with arenas of its own; what
runs inside is ``server/executor_core.py``.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import threading
import time
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Protocol

import msgspec

from tradeoff import errors
from tradeoff.errors import InferenceFailed, ModelLoadError, RequestError, Unavailable
from tradeoff.repository.config import ModelConfig
from tradeoff.scheduling.executor import Answer as ExecutorAnswer
from tradeoff.scheduling.executor import ExecutorLoad
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.build import BuildLimits
from tradeoff.server.executor_core import run_single, watch_pipe
from tradeoff.server.executor_messages import (
    Answered,
    BatchRecord,
    Cancel,
    CancelLoad,
    Drain,
    Failure,
    FromExecutor,
    Hello,
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
    encode,
    read_tensor,
    write_tensors,
)
from tradeoff.server.shared_arena import SharedArena

__all__ = ["ExecutorProcess", "ExecutorProcesses", "RemoteExecutor", "SharedExecutors",
           "device_of"]

log = logging.getLogger("tradeoff.server")

CANCEL_POLL_S = 0.2  # how often a load in progress looks at its cancel event


def device_of(config: ModelConfig) -> str:
    """The executor process a model's instances run in: ``cpu``, or its GPUs."""
    gpus = sorted({str(d) for g in config.instance_groups if g.kind == "KIND_GPU"
                   for d in g.devices()})
    return f"gpu{','.join(gpus)}" if gpus else "cpu"


class SharedExecutors(Protocol):
    """Where the processes a server's front ends share are (``serve --workers``: its
    supervisor starts an executor per device, and an engine per generative model and
    load, when first asked, and again after one died)."""

    async def executor(self, device: str, dead: int | None = None
                       ) -> tuple[str, bytes, int]:
        """The device's executor: its address, the key to dial it, its pid; a new one
        when the one this front end saw die (pid ``dead``) is still named."""

    async def engine(self, root: Path, name: str, limits: BuildLimits, share: str,
                     dead: int | None = None) -> tuple[str, bytes, int]:
        """The engine process of generative model ``name`` for the load ``share`` (its
        address, key and pid), started and loaded when none runs."""


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


# ------------------------------------------------------------------ the server's side

class ExecutorProcess:
    """One executor process, from the server: its pipe, its two arenas and the models
    loaded in it. Used from the event loop, which also reads the pipe."""

    def __init__(self, device: str, loop: asyncio.AbstractEventLoop, inputs: SharedArena,
                 outputs: SharedArena, conn: multiprocessing.connection.Connection,
                 process: BaseProcess | None = None, pid: int | None = None) -> None:
        self.device = device
        self.loop = loop
        self.inputs = inputs
        self.outputs = outputs
        self._conn = conn
        self._process = process  # None: a shared executor this front end dialled
        self._pid = pid
        self.alive = True
        self._outgoing: list[ToExecutor] = []
        self.models: dict[int, RemoteExecutor] = {}
        self._loads: dict[int, asyncio.Future[dict[int, int]]] = {}
        self._load_numbers = itertools.count(1)
        watch_pipe(loop, self._conn, self._readable)

    @classmethod
    def spawn(cls, device: str, arena_bytes: int, loop: asyncio.AbstractEventLoop
              ) -> ExecutorProcess:
        """A new executor process of this server's own."""
        inputs = SharedArena.create("in", arena_bytes)
        outputs = SharedArena.create("out", arena_bytes)
        context = multiprocessing.get_context("spawn")
        conn, child = context.Pipe()
        process = context.Process(target=run_single, name=f"executor-{device}",
                                  args=(child, inputs.name, outputs.name), daemon=True)
        process.start()
        child.close()
        return cls(device, loop, inputs, outputs, conn, process)

    @classmethod
    async def dial(cls, device: str, arena_bytes: int, address: str, authkey: bytes,
                   pid: int) -> ExecutorProcess:
        """The executor process a server's front ends share (``serve --workers``), at
        ``address``: this front end's arenas are named to it first."""
        conn = await asyncio.to_thread(multiprocessing.connection.Client, address,
                                       "AF_UNIX", authkey)
        inputs = SharedArena.create("in", arena_bytes)
        outputs = SharedArena.create("out", arena_bytes)
        conn.send_bytes(encode([Hello(inputs.name, outputs.name)]))
        return cls(device, asyncio.get_running_loop(), inputs, outputs, conn, pid=pid)

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else self._pid

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
                   limits: BuildLimits, inline_limit_ns: int, cancel: threading.Event,
                   share: str) -> dict[int, int]:
        """Build a model's versions in the process (sessions, warmups), or hold those
        another front end built for the same ``share``: each version's executor number.
        Raises the load's error."""
        number = next(self._load_numbers)
        answer = self._loads[number] = self.loop.create_future()
        self.send(LoadModel(number, str(root), name, config_override, limits,
                            inline_limit_ns, share))
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
            process = self._process
            if self.alive and process is None:  # a shared one: not ours to reap
                self._ended(None)
            elif self.alive and process is not None:  # reaped off the loop, then every
                reaped = self.loop.run_in_executor(None, process.join, 5)  # request fails
                reaped.add_done_callback(lambda _: self._ended(process.exitcode))

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
        if self._process is not None:
            self._process.join(timeout_s)
            if self._process.is_alive():
                self._process.kill()
                self._process.join(5)
        self.inputs.close()
        self.outputs.close()


class ExecutorProcesses:
    """The server's executor processes, one per device, started when a model first
    needs one and again after one has died."""

    def __init__(self, arena_bytes: int, shared: SharedExecutors | None = None) -> None:
        self.arena_bytes = arena_bytes
        self.shared = shared  # serve --workers: the supervisor's, which front ends dial
        self._processes: dict[str, ExecutorProcess] = {}
        self._lock = asyncio.Lock()

    async def get(self, device: str) -> ExecutorProcess:
        async with self._lock:
            process = self._processes.get(device)
            if process is not None and process.alive:
                return process
            dead = None
            if process is not None:
                dead = process.pid
                process.stop_reading()
                await asyncio.to_thread(process.close)
            if self.shared is None:
                process = ExecutorProcess.spawn(device, self.arena_bytes,
                                                asyncio.get_running_loop())
            else:
                address, authkey, pid = await self.shared.executor(device, dead)
                process = await ExecutorProcess.dial(device, self.arena_bytes, address,
                                                     authkey, pid)
            self._processes[device] = process
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
        self._fail_pending(Unavailable(f"model {self.name!r} was unloaded before it "
                                       "answered"), "REJECTED")

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
        self._fail_pending(Unavailable(f"model {self.name!r} is not ready: {cause}; it is "
                                       "being loaded again"), "BACKEND")
        self.process_died = True
        self._die(cause)

    def _fail_pending(self, error: RequestError, reason: str) -> None:
        """Answer every request still waiting with ``error``: none is left without an
        answer when no more will come."""
        pending, self._pending = self._pending, {}
        self._ids.clear()
        for request, on_done, starts in pending.values():
            if self.process.alive:  # its inputs' blocks are this front end's to reuse
                for start in starts:
                    self.process.inputs.free(start)
            self.stats.record_failure(time.perf_counter_ns() - request.enqueue_ns, reason)
            if not request.cancelled:
                try:
                    on_done(error)
                except Exception:
                    log.exception("model %s: a request's callback failed", self.name)
