"""A small keep-alive HTTP/1.1 client for load generation (asyncio protocol + httptools).

General clients (httpx, aiohttp) spend more CPU per request than a small model server
does, which would make the client the bottleneck of the measurement. This one sends
prebuilt request bytes and lets httptools' C parser read the response.

    connection = Connection("127.0.0.1", 8000)
    response = await connection.request(build_request("GET", "127.0.0.1", "/v2"))
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

import httptools


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def build_request(method: str, host: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one HTTP/1.1 request, reusable for every send."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class _ResponseProtocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[Response] | None = None
        self.parser = httptools.HttpResponseParser(self)
        self._headers: dict[bytes, bytes] = {}
        self._body: list[bytes] = []
        self.closed = False
        self.sink: Callable[[int, bytes], None] | None = None  # streams the body when set
        self.last_piece = 0.0  # loop time of the last body piece given to the sink
        self._now: Callable[[], float] = time.monotonic

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self._now = asyncio.get_running_loop().time

    def data_received(self, data: bytes) -> None:
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(ConnectionError(f"malformed HTTP response: {exc}"))

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._fail(exc or ConnectionResetError("server closed the connection"))

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._headers[name.lower()] = value

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.last_piece = self._now()
            self.sink(self.parser.get_status_code(), body)
        else:
            self._body.append(body)

    def on_message_complete(self) -> None:
        waiter, self.waiter = self.waiter, None
        response = Response(self.parser.get_status_code(), self._headers,
                            b"".join(self._body))
        self._headers = {}
        self._body = []
        if waiter is not None and not waiter.done():
            waiter.set_result(response)

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


class Connection:
    """One keep-alive connection, one request at a time; reconnects when closed."""

    def __init__(self, host: str, port: int, timeout: float = 30.0, tls: bool = False) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.tls = _tls_context() if tls else None
        self._protocol: _ResponseProtocol | None = None

    async def _connect(self) -> _ResponseProtocol:
        loop = asyncio.get_running_loop()
        _, protocol = await asyncio.wait_for(
            loop.create_connection(_ResponseProtocol, self.host, self.port, ssl=self.tls),
            self.timeout)
        return protocol

    async def request(self, raw: bytes,
                      on_body: Callable[[int, bytes], None] | None = None) -> Response:
        """Send prebuilt request bytes; raises OSError/TimeoutError on failure. With
        ``on_body`` the body goes to it piece by piece as it arrives, with the status
        (for server-sent events), and the response's ``body`` stays empty; the timeout
        then counts from the last piece."""
        protocol = self._protocol
        if protocol is None or protocol.closed or protocol.transport is None or \
                protocol.transport.is_closing():
            protocol = self._protocol = await self._connect()
        loop = asyncio.get_running_loop()
        waiter = protocol.waiter = loop.create_future()
        if on_body is None:
            timer = loop.call_later(self.timeout, _expire, waiter)
        else:
            # one timer per answer, not one per piece (a stream at 20,000 tokens/s would
            # cancel and arm 20,000 a second): when it fires, it waits again for whatever
            # is left of the timeout after the last piece
            def idle() -> None:
                nonlocal timer
                until = protocol.last_piece + self.timeout
                if until > loop.time():
                    timer = loop.call_at(until, idle)
                else:
                    _expire(waiter)

            protocol.last_piece = loop.time()
            timer = loop.call_later(self.timeout, idle)
            protocol.sink = on_body
        assert protocol.transport is not None
        try:
            protocol.transport.write(raw)
        except RuntimeError:  # the server closed it between the check and the write
            timer.cancel()
            self.close()
            raise ConnectionResetError("the server closed the connection") from None
        try:
            response = await waiter
        except BaseException:
            self.close()
            raise
        finally:
            timer.cancel()
            protocol.sink = None
        if response.headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return response

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """HTTPS with the system's certificate store (SSL_CERT_FILE adds one), made once."""
    return ssl.create_default_context()


def _expire(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no response within the timeout"))
