"""One of ``serve --workers``' front ends, from its own side: the link to its supervisor
(``server/workers.py``) through which it reaches the shared executor processes and the
other front ends.

    link = SupervisorLink(sock)
    await link.start()
    address, authkey, pid = await link.executor("cpu")         # SharedExecutors
    await link.coordinator.register.remote(...)                 # as ReplicaLink calls it
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import signal
import socket
from collections.abc import Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tradeoff.errors import Unavailable
from tradeoff.server.build import BuildLimits

__all__ = ["Channel", "FrontEnd", "InflightCounts", "SupervisorLink", "front_end_id"]

log = logging.getLogger("tradeoff.server")

_HEADER = 4  # bytes: each message's length, big-endian


def front_end_id(index: int, pid: int) -> str:
    """How the front ends' coordinator names a front end (a restarted one anew)."""
    return f"front-end-{index}-{pid}"


class InflightCounts:
    """The requests each front end holds, in memory they all share, so that
    ``--max-inflight`` bounds the whole server: a front end writes its own count only
    and admits against the sum. Two front ends that admit at the same instant may pass
    the limit by one each; a lock could do better, but one held by a front end that dies
    would stop them all."""

    def __init__(self, counts: Any, index: int) -> None:
        self.counts = counts  # multiprocessing RawArray("q", front ends), handed down
        self.index = index

    def set(self, count: int) -> None:
        self.counts[self.index] = count

    def total(self) -> int:
        return sum(self.counts)


class Channel:
    """Messages between the supervisor and a front end: pickled, each after its length,
    over a socket pair, on the event loop (written without blocking, read whole)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Channel:
        return cls(*await asyncio.open_unix_connection(sock=sock))

    def send(self, message: Any) -> None:
        """Queue ``message``; nothing when the other side is gone."""
        if self.writer.is_closing():
            return
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        self.writer.write(len(data).to_bytes(_HEADER, "big") + data)

    async def receive(self) -> Any:
        """The next message; EOFError once the other side is gone."""
        try:
            size = int.from_bytes(await self.reader.readexactly(_HEADER), "big")
            return pickle.loads(await self.reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError) as exc:
            raise EOFError("the other side closed the channel") from exc

    def close(self) -> None:
        self.writer.close()


class _Method:
    """A coordinator method, called as a Ray actor's is (``.remote(...)``)."""

    def __init__(self, link: SupervisorLink, name: str) -> None:
        self.link = link
        self.name = name

    def remote(self, *args: Any) -> Awaitable[Any]:
        return self.link.call("coordinator", self.name, *args)


class _Coordinator:
    """The supervisor's :class:`~tradeoff.server.replicas.ReplicaCoordinator`, as
    :class:`~tradeoff.server.replicas.ReplicaLink` expects an actor handle."""

    def __init__(self, link: SupervisorLink) -> None:
        self._link = link

    def __getattr__(self, name: str) -> _Method:
        return _Method(self._link, name)


class SupervisorLink:
    """A front end's calls to its supervisor. When the supervisor is gone, the front end
    stops as on SIGTERM."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.coordinator = _Coordinator(self)
        self._channel: Channel | None = None
        self._calls: dict[int, asyncio.Future[Any]] = {}
        self._numbers = itertools.count(1)
        self._reader: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._channel = await Channel.open(self.sock)
        self._reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        assert self._channel is not None
        try:
            while True:
                number, ok, value = await self._channel.receive()
                future = self._calls.pop(number, None)
                if future is None or future.done():
                    continue
                if ok:
                    future.set_result(value)
                else:
                    future.set_exception(Unavailable(f"the server's supervisor: {value}"))
        except EOFError:
            pass
        for future in self._calls.values():
            if not future.done():
                future.set_exception(Unavailable("the server's supervisor is gone"))
        self._calls.clear()
        log.warning("the supervisor of this front end is gone: stopping")
        os.kill(os.getpid(), signal.SIGTERM)

    async def call(self, kind: str, *args: Any) -> Any:
        """Ask the supervisor (``kind``: ``executor``, or ``coordinator`` and a method)."""
        if self._channel is None or (self._reader is not None and self._reader.done()):
            raise Unavailable("the server's supervisor is gone")
        number = next(self._numbers)
        future = self._calls[number] = asyncio.get_running_loop().create_future()
        self._channel.send((number, kind, args))
        return await future

    async def executor(self, device: str, dead: int | None = None
                       ) -> tuple[str, bytes, int]:
        """The device's shared executor process: its address, key and pid (a new one
        when the one of pid ``dead`` is still named)."""
        address, authkey, pid = await self.call("executor", device, dead)
        return address, authkey, pid

    async def engine(self, root: Path, name: str, limits: BuildLimits, share: str,
                     dead: int | None = None) -> tuple[str, bytes, int]:
        """The shared engine process of a generative model's load ``share``."""
        address, authkey, pid = await self.call("engine", root, name, limits, share, dead)
        return address, authkey, pid

    def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._channel is not None:
            self._channel.close()


@dataclass
class FrontEnd:
    """What a front end is given: its number and its link to the supervisor (which holds
    the ports: the front end binds them too, with SO_REUSEPORT)."""

    index: int
    link: SupervisorLink = field(repr=False)
    inflight: InflightCounts | None = field(default=None, repr=False)
