"""HTTP/1.1 connection limits that hold before the app sees a request.

uvicorn parses requests with httptools and, left alone, buffers a request line or a
header of any size, keeps a socket that never sends a byte open for ever, and accepts
connections until the process runs out of file descriptors. :func:`guarded_protocol`
gives uvicorn a protocol class that, on each connection:

- refuses the request head (request line and headers) past ``max_header_bytes``:
  414 when the URL is what grew, 431 otherwise, then closes;
- closes a connection whose request head is not complete ``header_timeout_s`` after it
  opened or after the head's first byte (408 when part of a head arrived);
- answers 408 and closes when a request body sends nothing for ``body_timeout_s`` (the
  app, waiting on the body, sees the client gone and releases what it held);
- refuses connections past ``max_connections`` in all, or past
  ``max_connections_per_client`` from one client address, with 503 and closes them.

A response that ends a request whose body is still arriving (a refusal: 413, 503, 408)
closes the connection after a *lingering close*: the server sends its answer and FIN,
then reads and drops what the client still sends for up to ``LINGER_S`` before closing.
Closing at once would make the kernel answer the unread bytes with a reset, and a client
still sending its body would lose the answer.

The bytes of bodies held at once are the app's business
(:class:`tradeoff.server.http.HttpApp`): by then the route, the key and the declared
length are known.

The hot route, infer with a small body, skips ASGI: when the app's ``direct_route``
takes a request (decided once its head is in), the connection keeps it in a
:class:`_DirectCycle` instead of uvicorn's ASGI cycle, waits for its whole body, hands it
to ``infer_direct`` and writes the answer itself, in one write, with uvicorn's own
keep-alive and pipelining bookkeeping (no task, no ASGI messages, no event, no
disconnect watcher per request). Everything else, and every request the app does not
take, goes through ASGI as before.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from collections import Counter
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, cast

import orjson
from uvicorn.protocols.http.httptools_impl import (
    STATUS_LINE,
    HttpToolsProtocol,
    RequestResponseCycle,
)

from tradeoff.server.options import TransportLimits

__all__ = [
    "LINGER_S",
    "UVICORN_ATTRIBUTES",
    "UVICORN_METHODS",
    "DirectRoutes",
    "GuardedHttpProtocol",
    "Respond",
    "guarded_protocol",
    "raise_open_files_limit",
    "raw_response",
]

log = logging.getLogger("tradeoff.server")

# What the protocol below takes from uvicorn's HttpToolsProtocol beyond its public API: the
# methods it overrides or calls and the attributes it reads. pyproject.toml pins uvicorn to the
# versions these were checked against, and tests/unit/test_uvicorn_internals.py fails,
# naming the missing one, when an upgrade drops or renames any of them.
UVICORN_METHODS = ("_start_asgi_task", "_unset_keepalive_if_required", "connection_lost",
                   "connection_made", "data_received", "on_body", "on_header",
                   "on_headers_complete", "on_message_begin", "on_message_complete",
                   "on_response_complete", "resume_writing", "timeout_keep_alive_handler")
UVICORN_ATTRIBUTES = ("app", "client", "connections", "cycle", "expect_100_continue", "flow",
                      "headers", "limit_concurrency", "loop", "parser", "pipeline",
                      "root_path", "scope", "server_state", "timeout_keep_alive",
                      "timeout_keep_alive_task", "transport", "url")

LINGER_S = 2.0  # longest a refused upload is read and dropped before the close

_REASONS = {408: b"Request Timeout", 414: b"URI Too Long",
            431: b"Request Header Fields Too Large", 503: b"Service Unavailable"}


def raw_response(status: int, message: str) -> bytes:
    """A whole HTTP/1.1 error response with a JSON body, that closes the connection."""
    body = orjson.dumps({"error": message})
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n" \
           b"connection: close\r\n\r\n%s" % (status, _REASONS[status], len(body), body)


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit of open files towards ``wanted`` (up to the hard
    limit); returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("could not raise the open-files limit to %d: %s", target, exc)
    return soft


class _LingeringTransport:
    """A connection's transport whose ``close`` lingers while a request body is still
    arriving (see the module's docstring); everything else is the transport's own."""

    def __init__(self, transport: Any, protocol: Any) -> None:
        self._transport = transport
        self._protocol = protocol
        # the calls of every request, bound once (not looked up through __getattr__)
        self.write = transport.write
        self.get_extra_info = transport.get_extra_info
        self.pause_reading = transport.pause_reading
        self.resume_reading = transport.resume_reading

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        """True while lingering too: uvicorn must start no queued request, write no
        ``100 Continue``, on a connection that is ending."""
        return self._protocol._lingering or self._transport.is_closing()

    def close(self) -> None:
        protocol = self._protocol
        if protocol._lingering or not protocol._body_open or \
                self._transport.is_closing() or not self._transport.can_write_eof():
            self._transport.close()
            return
        protocol._lingering = True
        self._transport.write_eof()  # after the response: the client sees its end
        protocol._linger_timer = protocol.loop.call_later(LINGER_S, self._transport.close)
        protocol.flow.resume_reading()


Respond = Callable[[int, bytes, list[tuple[bytes, bytes]]], None]


class _NoEvent:
    """Stands for the ASGI cycle's message event, which uvicorn sets when a client
    leaves: nothing waits on a direct request's."""

    @staticmethod
    def set() -> None:
        pass


class _DirectCycle:
    """A request answered without ASGI, as the connection's current cycle: what uvicorn's
    protocol and ours read of a cycle, without the task, the event and the parsed URL
    that uvicorn's ``RequestResponseCycle`` builds for every request."""

    __slots__ = ("body", "disconnected", "headers", "keep_alive", "more_body",
                 "response_complete", "response_started", "scope", "target")
    message_event = _NoEvent

    def __init__(self, scope: Any, target: Any, headers: dict[bytes, bytes],
                 keep_alive: bool) -> None:
        self.scope = scope
        self.target = target  # what the app's direct_route returned
        self.headers = headers  # its kept values of the app's direct headers
        self.keep_alive = keep_alive
        self.body = bytearray()
        self.more_body = True
        self.response_started = self.response_complete = self.disconnected = False


class DirectRoutes(Protocol):
    """What the app offers for requests answered without ASGI (HttpApp has it): the
    connection keeps the values of ``direct_headers`` as a head arrives and hands them
    over with the scope."""

    direct_headers: frozenset[bytes]

    def direct_route(self, scope: Any, headers: dict[bytes, bytes]) -> Any | None:
        """What to hand :meth:`infer_direct` for this request, or None: ASGI's."""

    def infer_direct(self, scope: Any, target: Any, headers: dict[bytes, bytes],
                     body: bytes, respond: Respond) -> Callable[[], None]: ...


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with the limits of the module's docstring; uvicorn
    makes one per connection. It serves through a subclass from :func:`guarded_protocol`,
    whose class attributes are what one server's connections share."""

    # bound by guarded_protocol: read as class attributes, set once per server
    _limits: ClassVar[TransportLimits]
    _routes: ClassVar[DirectRoutes | None]  # the app's routes answered without ASGI
    _wanted: ClassVar[frozenset[bytes]]  # the direct headers whose values a head keeps
    _clients: ClassVar[Counter[str]]  # open connections per client address, all of them

    _head_left: int  # bytes the head being read may still take
    _in_head = True
    _timer: asyncio.TimerHandle | None = None  # the head's or the body's deadline
    _raw_transport: Any = None
    _client_host: str | None = None
    _body_open = False  # a request's head arrived, its body has not ended
    _heads_done = 0
    _trailer_left: int  # bytes the trailers of a chunked body may still take
    _lingering = False
    _linger_timer: asyncio.TimerHandle | None = None
    _direct: _DirectCycle | None = None  # started, not yet answered
    _direct_cancel: Callable[[], None] | None = None  # the request runs: to drop it
    _after_drain: Callable[[], None] | None = None  # answered, the client not reading
    _kept: dict[bytes, bytes]  # this head's values of the direct headers
    _idle_since: float | None = None  # the last answer, when nothing came after it

    def connection_made(self, transport: Any) -> None:
        limits = self._limits
        clients = self._clients
        self._raw_transport = transport
        self._kept = {}
        self._head_left = self._trailer_left = limits.max_header_bytes
        super().connection_made(cast(asyncio.Transport, _LingeringTransport(transport, self)))
        host = self.client[0] if self.client else ""
        if len(self.connections) > limits.max_connections:
            self._refuse(503, f"the server holds its limit of {limits.max_connections} "
                              "connections (--max-connections); retry later")
        elif clients[host] >= limits.max_connections_per_client:
            self._refuse(503, f"{host} holds its limit of "
                              f"{limits.max_connections_per_client} connections "
                              "(--max-connections-per-client); reuse them")
        else:
            clients[host] += 1
            self._client_host = host
            self._arm(limits.header_timeout_s, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self.timeout_keep_alive_task is not None:
            self.timeout_keep_alive_task.cancel()
            self.timeout_keep_alive_task = None
        if self._direct_cancel is not None:
            self._direct_cancel()
            self._direct_cancel = None
        self._direct = self._after_drain = None
        if self._linger_timer is not None:
            self._linger_timer.cancel()
        if self._client_host is not None:
            clients = self._clients
            clients[self._client_host] -= 1
            if not clients[self._client_host]:
                del clients[self._client_host]
            self._client_host = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a refused body: dropped
        limits = self._limits
        # a read longer than what the head may still take is fed in pieces: the
        # parser buffers a header line whole, so it must never see more than that
        while self._in_head and len(data) > self._head_left:
            heads = self._heads_done
            cut = self._head_left
            super().data_received(data[:cut])
            data = data[cut:]
            if self._raw_transport.is_closing():
                return
            if self._in_head and self._heads_done == heads:  # one head, too long
                self._head_too_large()
                return
            if self._in_head:  # a head ended in the piece and the next one began
                self._head_left = limits.max_header_bytes
        if not data:
            return
        if self._in_head:
            self._head_left -= len(data)
        super().data_received(data)
        # timers only for what is left waiting: a whole request in one read sets none
        if self._body_open:
            self._arm(limits.body_timeout_s, self._body_timed_out)  # from its last byte
        elif self._in_head and self._head_left < limits.max_header_bytes and \
                self._timer is None:
            self._arm(limits.header_timeout_s, self._head_timed_out)  # from its start

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._kept = {}

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._body_open = True
        self._heads_done += 1
        self._trailer_left = self._limits.max_header_bytes
        self._disarm()
        if not self._take_direct():
            super().on_headers_complete()

    def _take_direct(self) -> bool:
        """Whether the app's direct route takes this head's request; if so it becomes
        the current cycle, started now or queued behind a pipelined one."""
        direct = self._routes
        parser = self.parser
        url = self.url
        # origin-form paths with nothing to unquote, as uvicorn would read them
        if direct is None or parser.get_method() != b"POST" \
                or parser.should_upgrade() or self.limit_concurrency is not None or \
                self.root_path or url[:1] != b"/" or not url.isascii() or \
                b"?" in url or b"%" in url or b"#" in url:
            return False
        scope = self.scope
        scope["method"] = "POST"
        scope["path"] = url.decode("ascii")
        version = parser.get_http_version()
        if version != "1.1":
            scope["http_version"] = version
        existing = self.cycle
        busy = existing is not None and not existing.response_complete
        # Expect: 100-continue is answered at once, so only when no earlier request
        # on this connection still owes its answer (the 100 must come after it)
        if self.expect_100_continue and busy:
            return False
        target = direct.direct_route(scope, self._kept)
        if target is None:
            return False
        cycle = _DirectCycle(scope, target, self._kept,
                             version != "1.0" and parser.should_keep_alive())
        self.cycle = cast(RequestResponseCycle, cycle)
        if self.expect_100_continue:  # curl waits for it before sending the body
            self.expect_100_continue = False
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        if not busy:
            self._direct = cycle
        else:  # answered when the earlier requests are (on_response_complete)
            self.flow.pause_reading()
            self.pipeline.appendleft((cast(RequestResponseCycle, cycle), self.app))
        return True

    def on_body(self, body: bytes) -> None:
        cycle = self.cycle
        if cycle.__class__ is _DirectCycle:  # declared, at most FREE_BODY_BYTES
            cycle.body += body
        else:
            super().on_body(body)

    def on_header(self, name: bytes, value: bytes) -> None:
        if not self._in_head:  # a trailer of a chunked body: bounded like a head
            self._trailer_left -= len(name) + len(value) + 4
            if self._trailer_left < 0:
                if self.cycle is not None and not self.cycle.response_started:
                    self._refuse(431, "the request's trailers are over the limit of "
                                      f"{self._limits.max_header_bytes} bytes "
                                      "(--max-header-bytes)")
                else:
                    self._raw_transport.close()
                return
        # uvicorn's own on_header, written out: it runs for every header
        name = name.lower()
        if name == b"expect" and value.lower() == b"100-continue":
            self.expect_100_continue = True
        self.headers.append((name, value))
        # the last value of a repeated header, but the first Authorization: what the
        # ASGI path's checks read
        if name in self._wanted and self._in_head and \
                (name != b"authorization" or name not in self._kept):
            self._kept[name] = value.strip(b" \t")  # optional whitespace, as _headers

    def on_message_complete(self) -> None:
        self._body_open = False
        self._disarm()
        cycle = self.cycle
        if cycle.__class__ is _DirectCycle:
            cycle.more_body = False
            if cycle is self._direct and self._direct_cancel is None:
                self._run_direct()
        else:
            super().on_message_complete()
        limits = self._limits
        self._in_head = True  # the next request's head, if any, starts here
        self._head_left = limits.max_header_bytes
        if self.cycle is not None and self.cycle.response_complete:
            # the body ended after its answer (an early refusal): uvicorn's keep-alive
            # timer is gone, so the next head has --header-timeout to start
            self._arm(limits.header_timeout_s, self._head_timed_out)

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: Any) -> None:
        if cycle.__class__ is not _DirectCycle:
            super()._start_asgi_task(cycle, app)
            return
        self._direct = cast(_DirectCycle, cycle)  # a pipelined one, started in turn
        if not cycle.more_body:  # whole already
            self._run_direct()

    def _run_direct(self) -> None:
        cycle = self._direct
        direct = self._routes
        assert cycle is not None and direct is not None
        body = bytes(cycle.body)
        cycle.body = bytearray()

        def respond(status: int, payload: bytes, headers: list[tuple[bytes, bytes]]) -> None:
            self._respond(cycle, status, payload, headers)

        self._direct_cancel = _nothing  # running: a disconnect from here on cancels
        cancel = direct.infer_direct(cycle.scope, cycle.target, cycle.headers, body,
                                     respond)
        if self._direct is cycle:  # not answered at once
            self._direct_cancel = cancel

    def _respond(self, cycle: _DirectCycle, status: int, payload: bytes,
                 headers: list[tuple[bytes, bytes]]) -> None:
        """Write a direct answer in one write, then what uvicorn does when an ASGI
        response ends (close, or keep alive and start a pipelined request)."""
        if self._direct is not cycle or cycle.disconnected:
            return
        self._direct = None
        self._direct_cancel = None
        head = [STATUS_LINE[status]]
        for name, value in headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-length: %d\r\n" % len(payload))
        if not cycle.keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", payload)
        cycle.response_started = cycle.response_complete = True
        self.transport.write(b"".join(head))
        if not cycle.keep_alive:
            self.transport.close()
        if self.flow.write_paused:  # the next pipelined request waits for the reader
            self._after_drain = self.on_response_complete
        else:
            self.on_response_complete()

    # uvicorn arms a keep-alive timer after every answer and cancels it when the next
    # request's bytes arrive; here one timer stays armed and checks, when it fires,
    # whether the connection has been idle for the whole timeout

    def _unset_keepalive_if_required(self) -> None:
        self._idle_since = None  # bytes arrived: not idle

    def on_response_complete(self) -> None:
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._idle_since = None
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
            return
        self._idle_since = self.loop.time()
        if self.timeout_keep_alive_task is None:
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self._keep_alive_due)

    def _keep_alive_due(self) -> None:
        self.timeout_keep_alive_task = None
        if self._idle_since is None:
            return  # busy: the next answer arms the timer again
        left = self._idle_since + self.timeout_keep_alive - self.loop.time()
        if left > 0:
            self.timeout_keep_alive_task = self.loop.call_later(left, self._keep_alive_due)
        else:
            self.timeout_keep_alive_handler()

    def resume_writing(self) -> None:
        super().resume_writing()
        after, self._after_drain = self._after_drain, None
        if after is not None:
            after()

    def _head_too_large(self) -> None:
        url = getattr(self, "url", b"")
        limits = self._limits
        if len(url) >= limits.max_header_bytes // 2 and not self.headers:
            self._refuse(414, f"the URL is over the limit of {limits.max_header_bytes} "
                              "bytes (--max-header-bytes)")
        else:
            self._refuse(431, f"the request line and headers are over the limit of "
                              f"{limits.max_header_bytes} bytes (--max-header-bytes)")

    def _arm(self, seconds: float, callback: Any) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _waiting_on_us(self, callback: Any, seconds: float) -> bool:
        """Whether the server, not the client, is why nothing arrives (an earlier
        pipelined request is being answered, or reading is paused): wait again."""
        if self.pipeline or self.flow.read_paused:
            self._arm(seconds, callback)
            return True
        return False

    def _head_timed_out(self) -> None:
        self._timer = None
        limits = self._limits
        if not self._in_head or self._raw_transport.is_closing() or \
                self._waiting_on_us(self._head_timed_out, limits.header_timeout_s):
            return
        if self._head_left < limits.max_header_bytes:  # part of a head arrived
            self._refuse(408, f"the request head did not arrive within "
                              f"{limits.header_timeout_s:g} s (--header-timeout)")
        else:
            self._raw_transport.close()

    def _body_timed_out(self) -> None:
        """No body bytes for --body-timeout: 408 if nothing was answered yet (the app
        sees the client gone), then close; what the body held is released."""
        self._timer = None
        limits = self._limits
        if not self._body_open or self._raw_transport.is_closing() or \
                self._waiting_on_us(self._body_timed_out, limits.body_timeout_s):
            return
        if self.cycle is not None and not self.cycle.response_started:
            self._refuse(408, f"the request body stalled: no bytes for "
                              f"{limits.body_timeout_s:g} s (--body-timeout)")
        else:
            self._raw_transport.close()

    def _refuse(self, status: int, message: str) -> None:
        self._in_head = False
        self._disarm()
        if status != 503:
            log.debug("%s: %d %s", self.client, status, message)
        self._raw_transport.write(raw_response(status, message))
        self._raw_transport.close()


def guarded_protocol(limits: TransportLimits,
                     direct: DirectRoutes | None = None) -> type[GuardedHttpProtocol]:
    """uvicorn's httptools protocol with ``limits`` applied (pass it as ``http=``); with
    ``direct``, the routes it takes are answered without ASGI. Each call makes a class of
    its own, so the connections one server counts are its own."""

    class ServerHttpProtocol(GuardedHttpProtocol):
        _limits = limits
        _routes = direct
        _wanted = direct.direct_headers if direct is not None else frozenset()
        _clients: ClassVar[Counter[str]] = Counter()

    return ServerHttpProtocol


def _nothing() -> None:
    pass
