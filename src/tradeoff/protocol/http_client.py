"""A small keep-alive HTTP/1.1 client (asyncio protocol + httptools): the load generator's,
and the gateway's to its replicas.

General clients (httpx, aiohttp) spend more CPU per request than a small model server
does, which would make the client the bottleneck of the measurement. This one sends
prebuilt request bytes and lets httptools' C parser read the response.

    connection = Connection("127.0.0.1", 8000)
    response = await connection.request(build_request("GET", "127.0.0.1", "/v2"))

Every request has one deadline for all of it (connect, send, the answer to its last byte),
not a timer per read that a dripping endpoint restarts with every byte, and an answer
longer than ``max_bytes`` fails before it is held: at its head when its Content-Length says
so, else at the byte that passes the bound (chunks, or a body that ends at the close). The
connection then stops reading and closes, and what had come of the body is dropped at once,
so a client's memory is a few ``max_bytes`` at most however many answers fail. :func:`get`
does the same for the few blocking reads around a run (an endpoint's metadata, a server's
``/metrics``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import http.client
import socket
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

import httptools

__all__ = [
    "DEFAULT_MAX_RESPONSE_BYTES",
    "Connection",
    "Response",
    "ResponseTooLarge",
    "build_request",
    "get",
]

DEFAULT_MAX_RESPONSE_BYTES = 64 << 20  # one answer, head included


class ResponseTooLarge(ConnectionError):
    """An answer longer than the client's bound on answers."""

    @classmethod
    def over(cls, limit: int, announced: int | None = None) -> ResponseTooLarge:
        """The error of an answer past ``limit``; ``announced``: its Content-Length, when
        that alone said so."""
        said = "" if announced is None else f": its Content-Length is {announced:,}"
        return cls(f"the answer passed {limit:,} bytes (--max-response-size){said}")


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
        self.received = 0  # bytes of the answer under way, head and framing included
        self.limit = DEFAULT_MAX_RESPONSE_BYTES
        self.stopped = False  # an answer past the limit: nothing more is read or kept

    # asyncio callbacks
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.stopped:
            return
        self.received += len(data)
        if self.received > self.limit:
            self._stop(ResponseTooLarge.over(self.limit))
            return
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

    def on_headers_complete(self) -> None:
        try:
            announced = int(self._headers.get(b"content-length", b""))
        except ValueError:  # none: chunks, or a body to the close, counted as they come
            return
        if announced > self.limit:
            self._stop(ResponseTooLarge.over(self.limit, announced))

    def on_body(self, body: bytes) -> None:
        if self.stopped:  # the rest of the piece that passed the limit
            return
        if self.sink is not None:
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
        self._body = []  # a failed answer's pieces go now, not when the protocol goes
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)

    def _stop(self, exc: ResponseTooLarge) -> None:
        """An answer past the limit: read no more of it, and close the connection."""
        self.stopped = True
        self._fail(exc)
        if self.transport is not None:
            self.transport.abort()


class Connection:
    """One keep-alive connection, one request at a time; reconnects when closed."""

    def __init__(self, host: str, port: int, timeout: float = 30.0, tls: bool = False,
                 max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self.max_bytes = max_bytes
        self.tls = _tls_context() if tls else None
        self._protocol: _ResponseProtocol | None = None

    async def _connect(self, timeout: float) -> _ResponseProtocol:
        loop = asyncio.get_running_loop()
        _, protocol = await asyncio.wait_for(
            loop.create_connection(_ResponseProtocol, self.host, self.port, ssl=self.tls),
            timeout)
        return protocol

    async def request(self, raw: bytes, on_body: Callable[[int, bytes], None] | None = None,
                      timeout: float | None = None) -> Response:
        """Send prebuilt request bytes; raises OSError/TimeoutError on failure. The whole
        request (connecting included) has ``timeout`` seconds (default: the connection's),
        and its answer at most ``max_bytes`` (ResponseTooLarge). With ``on_body`` the body
        goes to it piece by piece as it arrives, with the status (for server-sent events),
        and the response's ``body`` stays empty."""
        loop = asyncio.get_running_loop()
        timeout = self.timeout if timeout is None else timeout
        deadline = loop.time() + timeout
        protocol = self._protocol
        if protocol is None or protocol.closed or protocol.transport is None or \
                protocol.transport.is_closing():
            protocol = self._protocol = await self._connect(timeout)
        waiter = protocol.waiter = loop.create_future()
        # one timer per answer, none per piece: a stream at 20,000 tokens/s costs no more
        timer = loop.call_at(deadline, _expire, waiter, timeout)
        protocol.sink = on_body
        protocol.received = 0
        protocol.limit = self.max_bytes
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
            # the error's traceback holds this frame, and the waiter holds the error: a
            # cycle, which only Python's rare full collections would free
            del waiter
        if response.headers.get(b"connection", b"").lower() == b"close":
            self.close()
        return response

    def pause_reading(self) -> None:
        """Stop reading the answer (the server's writes then wait on the full window)
        until :meth:`resume_reading`."""
        transport = self._protocol.transport if self._protocol is not None else None
        if transport is not None and not transport.is_closing():
            transport.pause_reading()

    def resume_reading(self) -> None:
        transport = self._protocol.transport if self._protocol is not None else None
        if transport is not None and not transport.is_closing():
            transport.resume_reading()

    def close(self) -> None:
        if self._protocol is not None and self._protocol.transport is not None:
            self._protocol.transport.close()
        self._protocol = None


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """HTTPS with the system's certificate store (SSL_CERT_FILE adds one), made once."""
    return ssl.create_default_context()


def _expire(waiter: asyncio.Future, timeout: float) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError(f"no whole answer within the timeout of "
                                          f"{timeout:g} s"))


def get(url: str, *, timeout_s: float, max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        headers: dict[str, str] | None = None) -> Response:
    """``GET url``, blocking, with the bounds of :meth:`Connection.request`: ``timeout_s``
    for all of it (connect, head, body), so an endpoint that drips its answer cannot stretch
    it, and a body over ``max_bytes`` raises ResponseTooLarge before it is held. Any status
    is returned; OSError (TimeoutError at the deadline) when no whole answer came."""
    parts = urlsplit(url)
    if parts.scheme == "https":
        connection: http.client.HTTPConnection = http.client.HTTPSConnection(
            parts.hostname or "", parts.port, timeout=timeout_s, context=_tls_context())
    else:
        connection = http.client.HTTPConnection(parts.hostname or "", parts.port,
                                                timeout=timeout_s)
    expired = threading.Event()

    def expire() -> None:  # wakes a read that is blocked at the deadline
        expired.set()
        if connection.sock is not None:
            with contextlib.suppress(OSError):
                connection.sock.shutdown(socket.SHUT_RDWR)

    watchdog = threading.Timer(timeout_s, expire)
    watchdog.daemon = True
    watchdog.start()
    try:
        connection.connect()
        if expired.is_set():
            raise TimeoutError
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        connection.request("GET", path, headers=headers or {})
        answer = connection.getresponse()
        if answer.length is not None and answer.length > max_bytes:
            raise ResponseTooLarge.over(max_bytes, answer.length)
        body = bytearray()
        while chunk := answer.read1(1 << 16):
            if len(body) + len(chunk) > max_bytes:
                raise ResponseTooLarge.over(max_bytes)
            body += chunk
        if expired.is_set():
            raise TimeoutError
    except (OSError, http.client.HTTPException) as exc:
        if expired.is_set():
            raise TimeoutError(f"no whole answer within {timeout_s:g} s") from None
        where = f"{parts.hostname}:{parts.port}"
        if isinstance(exc, ConnectionRefusedError):
            raise ConnectionRefusedError(
                f"nothing listens at {where}: is the server running there? (tradeoff "
                "serve --model-repository DIR starts one on :8000)") from None
        if isinstance(exc, OSError):
            raise
        line = str(exc.args[0]) if exc.args else ""
        if line.startswith("\x00\x00"):  # an HTTP/2 frame: gRPC's port
            raise ConnectionError(
                f"{where} answers in HTTP/2 frames, as a gRPC port does: give the HTTP "
                "port (tradeoff serve: 8000, metrics 8002), or bench a gRPC endpoint with "
                "--protocol v2-grpc HOST:PORT") from None
        raise ConnectionError(f"malformed HTTP answer: {exc!r}") from None
    finally:
        watchdog.cancel()
        connection.close()
    return Response(answer.status, {k.lower().encode(): v.encode("latin-1", "replace")
                                    for k, v in answer.getheaders()}, bytes(body))
