"""A small HTTP/1.1 server whose behaviour the tests control, on 127.0.0.1.

Paths: ``/fixed?ms=20`` answers after 20 ms; ``/status?code=503`` answers that status;
``/close`` drops the connection without an answer; ``/freeze?after=N&s=1`` answers at
once but blocks the whole server (event loop included) for ``s`` seconds when it receives
its N-th request; ``/serial?ms=5`` serves one request at a time, ``ms`` each (a server
without batching: its throughput is capped at 1000/ms whatever the load);
``/growing?us=50`` answers after (requests so far x ``us``) microseconds, a server that
slows down as it runs. Every request is counted.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import TypeVar
from urllib.parse import parse_qs, urlsplit

_Server = TypeVar("_Server", bound="ThreadedServer")


class ThreadedServer:
    """An asyncio server on 127.0.0.1 (a free port) in a thread of its own, for the
    length of a ``with`` block; subclasses answer connections in ``_handle``."""

    def __init__(self) -> None:
        self.port = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self: _Server) -> _Server:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        raise NotImplementedError

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", 0, backlog=1024))
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()
        self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self._loop.close()


class ControlServer(ThreadedServer):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self._serial: asyncio.Lock | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                target = lines[0].split(" ")[1]
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if length:
                    await reader.readexactly(length)
                self.count += 1
                parts = urlsplit(target)
                query = {k: v[0] for k, v in parse_qs(parts.query).items()}
                status = 200
                if parts.path == "/fixed":
                    await asyncio.sleep(float(query.get("ms", "0")) / 1000)
                elif parts.path == "/growing":
                    await asyncio.sleep(self.count * float(query.get("us", "0")) / 1e6)
                elif parts.path == "/serial":
                    self._serial = self._serial or asyncio.Lock()
                    async with self._serial:
                        await asyncio.sleep(float(query.get("ms", "0")) / 1000)
                elif parts.path == "/status":
                    status = int(query.get("code", "500"))
                elif parts.path == "/close":
                    writer.close()
                    return
                elif parts.path == "/freeze" and self.count == int(query.get("after", "1")):
                    time.sleep(float(query.get("s", "1")))  # noqa: ASYNC251 (the freeze)
                body = b'{"ok": true}'
                writer.write(b"HTTP/1.1 %d X\r\nContent-Length: %d\r\n"
                             b"Content-Type: application/json\r\n\r\n%s"
                             % (status, len(body), body))
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
