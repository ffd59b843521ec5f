"""Inside an executor process: tensor models' schedulers, fed by one or several servers'
front ends (``server/executor_process.py`` is their side).

Each front end is a client with its own pipe and its own two shared arenas (requests in,
answers out), named in its :class:`Hello`. A model loaded by several front ends with the
same repository, name, config and share (one repository change) is built once and held
by each; it is released when the
last one unloads it or goes away. A request is answered on the pipe it came from.

What a model's statistics record leaves with the next answers of any front end, once, so
the front ends' counters add up to the executor's. A front end that goes away has its
requests cancelled and its arenas let go; the others go on.

    python: executor = ExecutorCore(); executor.add_client(conn) ... (the process's main:
    ``run_single`` for one server's pipe, ``run_shared`` for a listener front ends dial)
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import json
import logging
import multiprocessing.connection
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tradeoff.errors import RequestError
from tradeoff.scheduling.executor import Answer as ExecutorAnswer
from tradeoff.scheduling.executor import ExecutorLoad
from tradeoff.scheduling.priority import TensorPriority
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.build import load_failure
from tradeoff.server.executor_messages import (
    Answer,
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
    decode_to_executor,
    encode,
    read_tensor,
    write_tensors,
)
from tradeoff.server.shared_arena import SharedArena

__all__ = ["ExecutorCore", "run_shared", "run_single", "watch_pipe"]

log = logging.getLogger("tradeoff.server")

_NO_TIMINGS = (0, 0, 0, 0, 0)


def watch_pipe(loop: asyncio.AbstractEventLoop, conn: multiprocessing.connection.Connection,
               readable: Callable[[], None]) -> None:
    """The loop reads the pipe itself when it has data: no reader thread, no hand-off
    per message. The pipe stays blocking (uvloop makes a watched descriptor non-blocking):
    a message is read, and written, whole."""
    loop.add_reader(conn.fileno(), readable)
    os.set_blocking(conn.fileno(), True)


class _RecordingStats(ModelStats):
    """A model's statistics in the executor: what the scheduler records, kept for the
    front ends to record again."""

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


@dataclass
class _Model:
    """A model version built here, and the front ends that hold it."""

    scheduler: Any
    stats: _RecordingStats
    key: str
    holders: set[int] = field(default_factory=set)


@dataclass
class _Load:
    """A build in progress: the front ends waiting on it (the first named its number)."""

    cancel: threading.Event
    done: asyncio.Future[dict[int, int]]
    waiting: dict[int, int] = field(default_factory=dict)  # client -> its load number


class _Client:
    """One front end: its pipe, its arenas, and the messages of this loop turn."""

    def __init__(self, number: int, conn: multiprocessing.connection.Connection) -> None:
        self.number = number
        self.conn = conn
        self.inputs: SharedArena | None = None
        self.outputs: SharedArena | None = None
        self.outgoing: list[FromExecutor] = []

    def attach(self, hello: Hello) -> None:
        self.inputs = SharedArena.attach(hello.inputs)
        self.outputs = SharedArena.attach(hello.outputs)


class ExecutorCore:
    """The executor process's models and front ends, on its event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.clients: dict[int, _Client] = {}
        self.models: dict[int, _Model] = {}  # executor number -> model version
        self.by_key: dict[str, dict[int, int]] = {}  # load key -> version -> number
        self.loading: dict[str, _Load] = {}
        self.pending: dict[tuple[int, int, int], InferenceRequest] = {}
        # (front end, model) -> set once none of its requests there is pending
        self.settling: dict[tuple[int, int], asyncio.Event] = {}
        self.outbox: dict[tuple[int, int], list[Answer]] = {}
        self.touched: set[int] = set()  # models whose queue changed this loop turn
        self.heard: dict[tuple[int, int], int] = {}  # (front end, model) -> queue depth
        self.numbers = itertools.count(1)
        self.client_numbers = itertools.count(1)
        self.closed = asyncio.Event()
        self.single = False  # one server's pipe: its end is the process's
        self.tasks: set[asyncio.Task] = set()

    # ------------------------------------------------------------ front ends
    def add_client(self, conn: multiprocessing.connection.Connection,
                   hello: Hello | None = None) -> _Client:
        client = _Client(next(self.client_numbers), conn)
        if hello is not None:
            client.attach(hello)
        self.clients[client.number] = client
        watch_pipe(self.loop, conn, functools.partial(self.readable, client))
        return client

    def send(self, client: int, message: FromExecutor) -> None:
        """Queue a message: those of one loop turn leave in one write."""
        to = self.clients.get(client)
        if to is None:
            return  # gone: nothing to tell it
        if not to.outgoing:
            self.loop.call_soon(self._write, to)
        to.outgoing.append(message)

    def _write(self, client: _Client) -> None:
        messages, client.outgoing = client.outgoing, []
        if client.number not in self.clients:
            return
        try:
            client.conn.send_bytes(encode(messages))
        except OSError:
            self.client_gone(client)

    def readable(self, client: _Client) -> None:
        """A front end's pipe has data (the loop watches it): every whole message."""
        try:
            while client.conn.poll(0):
                for message in decode_to_executor(client.conn.recv_bytes()):
                    self.handle(client, message)
        except (EOFError, OSError):
            self.client_gone(client)

    def client_gone(self, client: _Client) -> None:
        """A front end went away: its requests are cancelled, its arenas let go, its
        models released where no other front end holds them."""
        if self.clients.pop(client.number, None) is None:
            return
        try:
            self.loop.remove_reader(client.conn.fileno())
        except (OSError, ValueError):
            pass
        client.conn.close()
        for key in [k for k in self.pending if k[0] == client.number]:
            request = self._forget(key)
            model = self.models.get(key[1])
            if model is not None and request is not None:
                model.scheduler.cancel(request)
        for box in [k for k in self.outbox if k[0] == client.number]:
            del self.outbox[box]
        for box in [k for k in self.heard if k[0] == client.number]:
            del self.heard[box]
        for load in self.loading.values():
            load.waiting.pop(client.number, None)
            if not load.waiting:
                load.cancel.set()
        for number, model in list(self.models.items()):
            if client.number in model.holders:
                self._task(self.unload(client.number, number, tell=False))
        for arena in (client.inputs, client.outputs):
            if arena is not None:  # a batch still reading one keeps its mapping till done
                arena.close()
        if self.single:
            self.closed.set()

    def _task(self, work: Any) -> None:
        task = self.loop.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def handle(self, client: _Client, message: ToExecutor) -> None:
        if isinstance(message, Infer):
            self.infer(client, message)
        elif isinstance(message, Release):
            if client.outputs is not None:
                for start in message.starts:
                    client.outputs.free(start)
        elif isinstance(message, Cancel):
            request = self.pending.get((client.number, message.model, message.request))
            if request is not None:
                self.models[message.model].scheduler.cancel(request)
        elif isinstance(message, LoadModel):
            self._task(self.load(client.number, message))
        elif isinstance(message, CancelLoad):
            for load in self.loading.values():
                if load.waiting.get(client.number) == message.load:
                    del load.waiting[client.number]
                    if not load.waiting:  # no other front end waits for it
                        load.cancel.set()
                    self.send(client.number, LoadFailed(
                        message.load, "ModelLoadError", "the load was cancelled"))
        elif isinstance(message, Drain):
            model = self.models.get(message.model)
            if model is not None and model.holders <= {client.number}:
                model.scheduler.drain()
        elif isinstance(message, Unload):
            self._task(self.unload(client.number, message.model))
        elif isinstance(message, Hello):
            client.attach(message)

    # ------------------------------------------------------------ models
    async def load(self, client: int, message: LoadModel) -> None:
        """Build the model's versions, or hold those another front end built with the
        same repository, name and config."""
        key = json.dumps([message.root, message.name, message.config_override,
                          message.share], sort_keys=True, default=str)
        if key not in self.by_key:
            load = self.loading.get(key)
            if load is None:
                load = self.loading[key] = _Load(threading.Event(), self.loop.create_future())
                self._task(self._build(key, message, load))
            load.waiting[client] = message.load
            try:
                await asyncio.shield(load.done)
            except _BuildFailed as exc:
                if load.waiting.pop(client, None) is not None:
                    self.send(client, LoadFailed(message.load, exc.error, exc.message))
                return
            if load.waiting.pop(client, None) is None:
                return  # cancelled by this front end, or it went away
        numbers = self.by_key[key]
        for number in numbers.values():
            self.models[number].holders.add(client)
        self.send(client, Loaded(message.load, numbers))

    async def _build(self, key: str, message: LoadModel, load: _Load) -> None:
        from tradeoff.repository.repository import ModelRepository
        from tradeoff.scheduling.scheduler import Scheduler
        from tradeoff.server.build import build_tensor

        try:
            config, built = await asyncio.to_thread(
                build_tensor, ModelRepository(Path(message.root)), message.name,
                message.config_override, message.limits, load.cancel)
            numbers = {}
            for version, (backends, _) in built.items():
                number = numbers[version] = next(self.numbers)
                stats = _RecordingStats(message.name, version)
                scheduler = Scheduler(config, backends, stats,
                                      inline_limit_ns=message.inline_limit_ns)
                await scheduler.start()
                scheduler.on_dead = functools.partial(self.died, number)
                self.models[number] = _Model(scheduler, stats, key)
        except Exception as exc:  # said as the server says a failed load
            load.done.set_exception(_BuildFailed(type(exc).__name__,
                                                 str(load_failure(message.name, exc))))
            load.done.exception()  # retrieved: a cancelled load has no one waiting
            return
        finally:
            del self.loading[key]
        if not load.waiting:  # every front end that asked cancelled, or went away
            for number in numbers.values():
                await self.models.pop(number).scheduler.stop()
            load.done.set_exception(_BuildFailed("ModelLoadError", "the load was cancelled"))
            load.done.exception()
            return
        self.by_key[key] = numbers
        load.done.set_result(numbers)

    async def unload(self, client: int, number: int, tell: bool = True) -> None:
        """The front end lets the model go; the last to do so stops it (its accepted
        requests answered first)."""
        model = self.models.get(number)
        if model is None or client not in model.holders:
            if tell:
                self.send(client, Unloaded(number, BatchRecord([], [], [])))
            return
        model.holders.discard(client)
        if model.holders:  # others still send to it: this front end's requests end first
            await self._settled(client, number)
            self.flush()
            if tell:
                self.send(client, Unloaded(number, model.stats.take()))
            return
        await model.scheduler.stop()
        self.flush()
        self.models.pop(number, None)
        self._forget_model(number)
        numbers = self.by_key.get(model.key, {})
        if number in numbers.values() and not any(n in self.models for n in numbers.values()):
            del self.by_key[model.key]
        if tell:
            self.send(client, Unloaded(number, model.stats.take()))

    def _forget_model(self, number: int) -> None:
        for box in [k for k in self.heard if k[1] == number]:
            del self.heard[box]

    async def _settled(self, client: int, number: int) -> None:
        """Until none of the front end's requests to the model is pending."""
        if any(key[:2] == (client, number) for key in self.pending):
            settled = self.settling.setdefault((client, number), asyncio.Event())
            await settled.wait()

    def _forget(self, key: tuple[int, int, int]) -> InferenceRequest | None:
        """A request no longer pending (answered, released, its front end gone)."""
        request = self.pending.pop(key, None)
        waiter = self.settling.get(key[:2])
        if waiter is not None and not any(k[:2] == key[:2] for k in self.pending):
            del self.settling[key[:2]]
            waiter.set()
        return request

    def died(self, number: int, cause: str) -> None:
        def tell() -> None:
            self.flush()  # the requests its scheduler failed first
            model = self.models.pop(number, None)
            self._forget_model(number)
            if model is None:
                return
            if number in self.by_key.get(model.key, {}).values():
                del self.by_key[model.key]  # loaded again, it is built anew
            for client in model.holders:
                self.send(client, ModelDied(number, cause))

        self.loop.call_soon(tell)

    # ------------------------------------------------------------ requests
    def infer(self, client: _Client, message: Infer) -> None:
        key = (client.number, message.model, message.request)
        model = self.models.get(message.model)
        if model is None or client.number not in model.holders or client.inputs is None:
            self.answer(client.number, message.model, Answer(
                message.request, _NO_TIMINGS, failure=Failure(
                    "Unavailable", "the model is not loaded in its executor process")))
            return
        request = InferenceRequest(
            {ref.name: read_tensor(client.inputs, ref, copy=False) for ref in message.inputs},
            message.rows, tuple((name, tuple(dims)) for name, dims in message.shape_key),
            TensorPriority(message.priority), message.timeout_us)
        request.on_released = functools.partial(self.released, *key)
        self.pending[key] = request
        try:
            model.scheduler.submit_call(request, functools.partial(self.done, *key))
        except RequestError as exc:  # refused at once (queue full, draining)
            self._forget(key)
            self.answer(client.number, message.model, Answer(
                message.request, _NO_TIMINGS, failure=Failure(type(exc).__name__, str(exc))))
            return
        self._outbox(client.number, message.model)  # the front end sees the queue grow

    def done(self, client: int, model: int, request: int,
             result: ExecutorAnswer | BaseException) -> None:
        if self._forget((client, model, request)) is None:
            return  # its front end went away
        try:
            self._answer_with(client, model, request, result)
        except Exception as exc:  # whatever went wrong, the request is answered
            log.exception("model %d: an answer could not be sent", model)
            self.answer(client, model, Answer(request, _NO_TIMINGS, failure=Failure(
                "InferenceFailed", f"the answer could not be returned: "
                                   f"{type(exc).__name__}: {exc}")))

    def _answer_with(self, client: int, model: int, request: int,
                     result: ExecutorAnswer | BaseException) -> None:
        if isinstance(result, BaseException):
            self.answer(client, model, Answer(request, _NO_TIMINGS, failure=Failure(
                type(result).__name__, str(result))))
            return
        t, outputs = result
        timings = (t.queue_ns, t.compute_input_ns, t.compute_infer_ns, t.compute_output_ns,
                   t.batch_size)
        arena = self.clients[client].outputs
        refs = write_tensors(arena, outputs) if arena is not None else None
        if refs is None:
            self.answer(client, model, Answer(request, timings, failure=Failure(
                "Unavailable", f"the executor's shared memory for answers is full "
                               f"({arena.used_bytes if arena else 0} of "
                               f"{arena.size if arena else 0} bytes held): try again, or "
                               "serve --executor-memory-mb larger")))
            return
        self.answer(client, model, Answer(request, timings, refs))

    def answer(self, client: int, model: int, answer: Answer) -> None:
        """Queue an answer: those of one loop turn (one batch's) leave in one message."""
        self._outbox(client, model).append(answer)

    def _outbox(self, client: int, model: int) -> list[Answer]:
        """The model's answers to a front end this loop turn, sent at its end."""
        self._touch(model)
        return self.outbox.setdefault((client, model), [])

    def _touch(self, model: int) -> None:
        """The model's queue changed: at the turn's end, every front end that holds it
        hears its load (each reads the shared queue's depth from it), those that sent
        or got nothing this turn only when the depth is not the one they last heard."""
        if not self.outbox and not self.touched:
            self.loop.call_soon(self.flush)
        self.touched.add(model)

    def flush(self) -> None:
        outbox, self.outbox = self.outbox, {}
        touched, self.touched = self.touched, set()
        loads = {}  # every model with an answer box was touched
        for number in touched:
            model = self.models.get(number)
            if model is None:
                continue
            loads[number] = load = model.scheduler.load()
            for client in model.holders:
                if (client, number) not in outbox and \
                        self.heard.get((client, number)) != load.queue_depth:
                    outbox[(client, number)] = []
        for (client, number), answers in outbox.items():
            model = self.models.get(number)
            load = loads.get(number, ExecutorLoad(0, 0, 0))
            record = model.stats.take() if model else BatchRecord([], [], [])
            self.heard[(client, number)] = load.queue_depth
            self.send(client, Answered(number, answers, record, load))

    def released(self, client: int, model: int, request: int, dropped: bool) -> None:
        self._forget((client, model, request))
        stats = self.models[model].stats if model in self.models else None
        self.send(client, Released(model, request,
                                   stats.take() if stats else BatchRecord([], [], [])))
        self._touch(model)

    async def close(self) -> None:
        """Every front end is gone, or the process is told to stop: release every
        instance."""
        for load in self.loading.values():
            load.cancel.set()
        for model in list(self.models.values()):
            model.scheduler.drain()
            await model.scheduler.stop()


class _BuildFailed(Exception):
    """A build's failure, as its front ends are told it: the error's class name and the
    server's wording."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message)
        self.error = error
        self.message = message


def _run(main: Callable[[], Any]) -> None:
    try:
        import uvloop

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())


def run_single(conn: multiprocessing.connection.Connection, inputs: str, outputs: str) -> None:
    """An executor process of one server (``serve --executors process``): it serves the
    pipe it was given and ends with it."""
    async def main() -> None:
        executor = ExecutorCore()
        executor.single = True
        executor.add_client(conn, Hello(inputs, outputs))
        await executor.closed.wait()
        await executor.close()

    _run(main)


def run_shared(control: multiprocessing.connection.Connection, address: str,
               authkey: bytes) -> None:
    """An executor process shared by a server's front ends (``serve --workers``): front
    ends dial ``address``; the process ends when ``control`` (its supervisor's pipe)
    closes."""
    if os.path.exists(address):  # a dead executor's, for the same device
        os.unlink(address)

    async def main() -> None:
        executor = ExecutorCore()
        listener = multiprocessing.connection.Listener(address, "AF_UNIX", authkey=authkey)

        def accept() -> None:  # the handshake blocks: a thread of its own
            while True:
                try:
                    conn = listener.accept()
                except (OSError, multiprocessing.AuthenticationError, EOFError):
                    if executor.closed.is_set():
                        return
                    continue
                executor.loop.call_soon_threadsafe(executor.add_client, conn)

        def stop() -> None:  # the supervisor closed the pipe, or said to stop
            executor.loop.remove_reader(control.fileno())
            executor.closed.set()

        threading.Thread(target=accept, name="executor-accept", daemon=True).start()
        watch_pipe(executor.loop, control, stop)
        control.send_bytes(b"ready")
        await executor.closed.wait()
        listener.close()
        await executor.close()

    _run(main)
