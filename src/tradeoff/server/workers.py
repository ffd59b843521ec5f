"""``tradeoff serve --workers N``: N front-end processes on one port, the processes they
share (one executor per device, one engine per generative model), and the supervisor
that keeps them.

    serve_workers(options, workers=4)     # this process supervises until SIGTERM/SIGINT

The supervisor holds the ports (HTTP, gRPC, metrics: bound with SO_REUSEPORT, never
listening) and every front end binds and listens on them too, so the kernel gives each new
connection to one of the front ends listening (by a hash of its addresses), never to one
still loading or gone. A front end parses, validates, routes, tokenizes, caches and
answers; tensor models run in the executor processes (``server/executor_core.py``), and
each generative model in an engine process (``server/engine_process.py``), which the
supervisor starts when a front end first asks for one, and again after one has died.

The front ends are kept in step as Ray Serve's replicas are (``server/replicas.py``: the
same coordinator, here in the supervisor, reached over a socket pair): a repository load
or unload on one is applied on every other, and the statistics extension and ``/metrics``
add up all of them. A front end that dies is started again (it loads the repository and
replays the changes made since); only its own connections are lost.

On SIGTERM or SIGINT every front end drains as a single server does, then the shared
processes stop and the supervisor exits 0.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import secrets
import signal
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing import resource_tracker
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from tradeoff.errors import InvalidValue
from tradeoff.server.build import BuildLimits, engine_loader
from tradeoff.server.engine_process import ready_or_failed, run_shared_engine
from tradeoff.server.executor_core import run_shared
from tradeoff.server.front_end import (
    Channel,
    FrontEnd,
    InflightCounts,
    SupervisorLink,
    front_end_id,
)
from tradeoff.server.options import ServeOptions
from tradeoff.server.replicas import ReplicaCoordinator
from tradeoff.server.shared_arena import check_room, remove_stale_segments

__all__ = ["RESTARTS_WITHIN_S", "Supervisor", "run_front_end", "serve_workers"]

log = logging.getLogger("tradeoff.server")

RESTARTS_WITHIN_S = 30.0  # a front end that dies this soon after its start, 3 times over,
FAILED_STARTS = 3         # stops the server (it would only fail again)
EXECUTOR_START_S = 60.0   # longest an executor process may take to listen


def _listening(control: multiprocessing.connection.Connection, process: BaseProcess
               ) -> None:
    """Wait for an executor process to listen for its front ends. Blocking."""
    if not control.poll(EXECUTOR_START_S):
        raise InvalidValue(f"{process.name} did not start within {EXECUTOR_START_S:g} s")
    control.recv_bytes()


def run_front_end(options: ServeOptions, index: int, link: socket.socket, log_level: int,
                  inflight: Any) -> None:
    """A front end's main (a spawned process); ``inflight``: every front end's count of
    requests held (:class:`InflightCounts`)."""
    logging.basicConfig(level=log_level, format="%(asctime)s %(levelname)s %(name)s "
                                                "%(processName)s: %(message)s")
    from tradeoff.server.runner import serve

    serve(options, FrontEnd(index, SupervisorLink(link), InflightCounts(inflight, index)))


@dataclass
class _Member:
    """A front end as the supervisor keeps it."""

    index: int
    process: BaseProcess
    channel: Channel
    started: float
    reader: asyncio.Task[None] | None = None
    ready: bool = False  # it joined the others, its repository loaded


@dataclass
class _Executor:
    """An executor or engine process the front ends share, and its supervisor's pipe."""

    process: BaseProcess
    control: multiprocessing.connection.Connection
    address: str


class Supervisor:
    """The processes of one ``serve --workers`` server, on this process's event loop."""

    def __init__(self, options: ServeOptions, workers: int) -> None:
        self.options = options
        self.workers = workers
        self.context = multiprocessing.get_context("spawn")
        self.inflight = self.context.RawArray("q", workers)  # each front end's, shared
        self.coordinator = ReplicaCoordinator()
        self.members: dict[int, _Member] = {}
        self.executors: dict[str, _Executor] = {}
        self.engines: dict[tuple[str, str], _Executor] = {}  # (model, share) -> its engine
        self._engine_numbers = itertools.count(1)
        self._engine_lock = asyncio.Lock()
        self.folder = Path(tempfile.mkdtemp(prefix="tradeoff-executors-"))  # 0700
        self.authkey = secrets.token_bytes(32)
        self.failed_starts = 0
        self.stopping = False
        self.exit_code = 0
        self.stopped = asyncio.Event()
        self._executor_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()

    # ------------------------------------------------------------ front ends
    async def start_front_end(self, index: int) -> None:
        mine, theirs = socket.socketpair()
        process = self.context.Process(
            target=run_front_end, name=f"front-end-{index}",
            args=(self.options, index, theirs, logging.getLogger().level, self.inflight))
        process.start()
        theirs.close()
        channel = await Channel.open(mine)
        member = _Member(index, process, channel, time.monotonic())
        member.reader = asyncio.create_task(self._serve_calls(member))
        self.members[index] = member
        asyncio.get_running_loop().add_reader(process.sentinel, self._ended, member)
        log.info("front end %d: pid %s", index, process.pid)

    def _ended(self, member: _Member) -> None:
        """A front end's process is gone: expected while stopping; else start another."""
        loop = asyncio.get_running_loop()
        loop.remove_reader(member.process.sentinel)
        member.process.join()
        if member.reader is not None:
            member.reader.cancel()
        member.channel.close()
        if self.members.get(member.index) is member:
            del self.members[member.index]
            self.inflight[member.index] = 0  # what it held went with it
        # no load waits for it to apply, no statistics for it to answer
        self._background(self.coordinator.leave(front_end_id(member.index,
                                                             member.process.pid or 0)))
        for name in remove_stale_segments():  # its arenas, when it was killed
            resource_tracker.unregister(f"/{name}", "shared_memory")
        if self.stopping:
            if not self.members:
                self.stopped.set()
            return
        code = member.process.exitcode
        early = time.monotonic() - member.started < RESTARTS_WITHIN_S
        self.failed_starts = self.failed_starts + 1 if early else 0
        if self.failed_starts >= FAILED_STARTS:
            log.error("front end %d ended with exit code %s, %d times within %g s of its "
                      "start: stopping the server", member.index, code, FAILED_STARTS,
                      RESTARTS_WITHIN_S)
            self.exit_code = 1
            self.stop()
            return
        log.error("front end %d (pid %s) ended with exit code %s: starting it again",
                  member.index, member.process.pid, code)
        self._background(self.start_front_end(member.index))

    def _background(self, work: Any) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve_calls(self, member: _Member) -> None:
        while True:
            try:
                number, kind, args = await member.channel.receive()
            except EOFError:
                return
            self._background(self._answer(member, number, kind, args))

    async def _answer(self, member: _Member, number: int, kind: str, args: tuple) -> None:
        channel = member.channel
        try:
            if kind == "executor":
                value = await self.executor(*args)
            elif kind == "engine":
                value = await self.engine(*args)
            elif kind == "coordinator":
                if args[0] == "poll":  # its first: the changes since the start replayed
                    self._joined(member)
                value = await getattr(self.coordinator, args[0])(*args[1:])
            else:
                raise InvalidValue(f"no such call: {kind}")
            channel.send((number, True, value))
        except Exception as exc:
            channel.send((number, False, f"{type(exc).__name__}: {exc}"))

    def _joined(self, member: _Member) -> None:
        """A front end serves: its repository is loaded and the changes made since the
        server started are applied."""
        if member.ready:
            return
        member.ready = True
        if len(self.members) == self.workers and all(m.ready for m in self.members.values()):
            log.info("ready: %d front ends", self.workers)

    # ------------------------------------------------------------ shared processes
    async def executor(self, device: str, dead: int | None = None
                       ) -> tuple[str, bytes, int]:
        """The device's executor process, started if none runs, or it died: a front end
        that saw its pipe close names it (``dead``), maybe before it is reaped."""
        async with self._executor_lock:
            return await self._shared(
                self.executors, device, dead, f"executor process {device}", run_shared,
                (), str(self.folder / f"{device.replace(',', '-')}.sock"), _listening)

    async def engine(self, root: Path, name: str, limits: BuildLimits, share: str,
                     dead: int | None = None) -> tuple[str, bytes, int]:
        """The engine process of a generative model's load ``share``, started (and the
        model loaded there) if none runs; it ends when the last front end leaves it."""
        def loaded(control: multiprocessing.connection.Connection,
                   process: BaseProcess) -> None:
            ready_or_failed(control, name, limits.warmup_timeout_s, process)

        async with self._engine_lock:
            return await self._shared(
                self.engines, (name, share), dead, f"engine process {name}",
                run_shared_engine, (name, 1, engine_loader(root, name, limits)),
                str(self.folder / f"engine-{next(self._engine_numbers)}.sock"), loaded)

    async def _shared(self, running: dict[Any, _Executor], key: Any, dead: int | None,
                      label: str, target: Any, args: tuple, address: str,
                      ready: Callable[[multiprocessing.connection.Connection, BaseProcess],
                                      None]) -> tuple[str, bytes, int]:
        """``running[key]``: the process the front ends dial (its address, the key to
        dial it, its pid), started (``target(control, address, authkey, *args)``, and
        waited for until ``ready`` returns) if none runs or it is the ``dead`` one."""
        old = running.get(key)
        if old is not None and old.process.is_alive() and old.process.pid != dead:
            return old.address, self.authkey, old.process.pid or 0
        if old is not None:
            old.process.kill()  # gone already, or no longer answering
            await asyncio.to_thread(old.process.join, 10)
            log.error("%s (pid %s) ended with exit code %s: starting another", label,
                      old.process.pid, old.process.exitcode)
            old.control.close()
        if self.stopping:
            raise InvalidValue("the server is stopping")
        control, theirs = self.context.Pipe()
        process = self.context.Process(target=target, name=label.replace(" process ", "-"),
                                       args=(theirs, address, self.authkey, *args),
                                       daemon=True)
        process.start()
        theirs.close()
        try:
            await asyncio.to_thread(ready, control, process)
        except Exception:
            process.kill()
            control.close()
            raise
        running[key] = _Executor(process, control, address)
        log.info("%s: pid %s", label, process.pid)
        return address, self.authkey, process.pid or 0

    # ------------------------------------------------------------ stopping
    def stop(self) -> None:
        """Every front end drains (SIGTERM), then the executors stop."""
        if self.stopping:
            return
        self.stopping = True
        for member in self.members.values():
            if member.process.pid is not None:
                try:
                    os.kill(member.process.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        if not self.members:
            self.stopped.set()

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._signalled, signum)
        for index in range(self.workers):
            await self.start_front_end(index)
        await self.stopped.wait()
        processes = [*self.executors.values(), *self.engines.values()]
        for running in processes:
            running.control.close()  # the process releases its instances and exits
        for running in processes:
            await asyncio.to_thread(running.process.join, 10)
            if running.process.is_alive():
                running.process.kill()
        for path in self.folder.glob("*"):
            path.unlink(missing_ok=True)
        self.folder.rmdir()
        log.info("stopped")
        return self.exit_code

    def _signalled(self, signum: int) -> None:
        log.info("signal %s: the front ends finish what they accepted",
                 signal.Signals(signum).name)
        self.stop()


def serve_workers(options: ServeOptions, workers: int) -> None:
    """Serve with ``workers`` front-end processes until told to stop (exit code 1 when
    the front ends could not be kept running)."""
    from tradeoff.server.runner import bind, exit_with_parent

    exit_with_parent()
    check_room(options.executor_memory_mb << 20, 2 * workers)
    for name in remove_stale_segments():
        log.info("removed shared memory %s of a server no longer running", name)
    held = {flag: bind(options.host, port, reuse_port=True)  # the ports, for the front ends
            for flag, port in (("http_port", options.http_port),
                               ("metrics_port", options.metrics_port),
                               ("grpc_port", options.grpc_port)) if port is not None}
    options = replace(options, executors="process",
                      **{flag: sock.getsockname()[1] for flag, sock in held.items()})
    log.info("%d front ends on %s:%d (HTTP), sharing one executor process per device",
             workers, options.host, options.http_port)
    if options.cache is not None and options.cache.kind == "local" and workers > 1:
        log.warning("--cache local: each of the %d front ends keeps a cache of its own, so "
                    "a repeated request hits only in a front end that answered it before; "
                    "--cache redis://... shares one", workers)

    async def main() -> int:
        return await Supervisor(options, workers).run()

    try:
        import uvloop

        code = uvloop.run(main())
    except ImportError:
        code = asyncio.run(main())
    finally:
        for sock in held.values():
            sock.close()
    if code:
        raise SystemExit(code)
