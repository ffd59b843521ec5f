"""The HTTP transport: a plain ASGI app speaking the Open Inference Protocol v2 (and,
through :mod:`tradeoff.server.openai_api`, the OpenAI-compatible API).

Routes come from the one table in :mod:`tradeoff.server.routes`, matched by splitting
the path, not by a framework: this is the hot path, and every microsecond of
per-request overhead shows up in the served throughput of small models. Everything here
translates between HTTP and :class:`DataPlane` calls.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from tradeoff.errors import (
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RequestError,
    Unauthorized,
    Unavailable,
)
from tradeoff.protocol.v2 import (
    TensorOutput,
    V2Request,
    decode_request,
    encode_response,
    parse_json_object,
)
from tradeoff.scheduling.request import Timings
from tradeoff.scheduling.scheduler import Outputs
from tradeoff.server import metrics, openapi
from tradeoff.server.access import TENANT, Access
from tradeoff.server.asgi import (
    JSON_HEADERS,
    OFF_LOOP_BYTES,
    DisconnectWatch,
    Headers,
    Receive,
    Scope,
    Send,
    off_loop_if_large,
    send_body,
    send_json,
)
from tradeoff.server.dataplane import DataPlane, select_outputs
from tradeoff.server.models import ModelVersion
from tradeoff.server.openai_api import OpenAIApi, send_error
from tradeoff.server.origins import OriginPolicy
from tradeoff.server.routes import ADMIN, OPEN, ROUTES, MethodNotAllowed, Router
from tradeoff.server.transport import TransportLimits

log = logging.getLogger("tradeoff.server")
# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")

Params = dict[str, str]

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024

# Bodies up to this size are not charged to --max-body-memory: with the connection limits
# they cannot add up to much, and a full budget must not refuse every small request.
FREE_BODY_BYTES = 64 * 1024

# decoding JSON holds up to this many times the text more, as Python objects (measured
# with orjson: a list of small numbers 16x, of empty objects or arrays 33-36x)
JSON_EXPANSION = 40

# per-request state the app keeps in the ASGI scope
_ADMIT = "tradeoff.admit"        # the route takes an admission slot once its body is read
_ADMITTED = "tradeoff.admitted"  # it took one: release it when the request ends
_CHARGED = "tradeoff.charged"    # body bytes charged to --max-body-memory
_BODY_READ = "tradeoff.body_read"  # the whole body arrived


_WANTED_HEADERS = frozenset((b"content-length", b"content-encoding", b"accept-encoding",
                             b"inference-header-content-length", b"x-tradeoff-class"))


# what the direct path reads: the connection keeps these as the head arrives
DIRECT_HEADERS = _WANTED_HEADERS | frozenset((b"transfer-encoding", b"host", b"origin",
                                              b"authorization"))


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request headers this app reads, in one pass (names arrive lower-cased; values
    without the optional whitespace HTTP allows around them: libcurl, and so
    perf_analyzer, sends ``Content-Length: 1208 ``)."""
    return {k: v.strip(b" \t") for k, v in scope["headers"] if k in _WANTED_HEADERS}


class HttpApp:
    """ASGI application: the v2 API on the HTTP port, ``/metrics`` on the metrics port.

        app = HttpApp(dataplane, registry, metrics_port=8002)
        uvicorn.run(app, ...)
    """

    def __init__(self, dataplane: DataPlane, registry: Any, *, metrics_port: int | None,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 on_startup: Callable[[], Awaitable[None]] | None = None,
                 on_shutdown: Callable[[], Awaitable[None]] | None = None,
                 access: Access | None = None, limits: TransportLimits | None = None,
                 origins: OriginPolicy | None = None) -> None:
        self.access = access or Access()
        self.origins = origins or OriginPolicy.for_bind("127.0.0.1")
        self.limits = limits or TransportLimits()
        self.body_bytes_held = 0  # charged to limits.max_body_memory
        self.router = Router(ROUTES)
        self._openapi = orjson.dumps(openapi.document(ROUTES))
        openai = OpenAIApi(dataplane, self._read_json)
        handlers = {name: getattr(self, name, None) or getattr(openai, name)
                    for name in {route.handler for route in ROUTES}}
        self._handlers: dict[str, Callable[[Scope, Receive, Send, Params],
                                           Awaitable[None]]] = handlers
        self.dataplane = dataplane
        self.registry = registry
        self.metrics_port = metrics_port
        self.max_request_bytes = max_request_bytes
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                await self._http(scope, receive, send)
            except Exception as exc:  # the server must answer and keep serving
                exc = _request_error(exc, scope)
                close = [] if await self._body_done(scope, receive) else \
                    [(b"connection", b"close")]
                path = scope["path"]
                if path == "/v1" or path.startswith("/v1/"):  # the OpenAI API's shape
                    return await send_error(send, exc, close)
                status, body, headers = _error_answer(exc)
                await send_body(send, status, body, headers + close)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _body_done(self, scope: Scope, receive: Receive) -> bool:
        """Whether a refused request's connection may stay open: its body was read, it
        has none, or it is small (read and dropped; the transport times out a stall).
        A large one is left unread: the answer closes the connection."""
        if scope.get(_BODY_READ) or not _has_body(scope):
            return True
        declared = _headers(scope).get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > FREE_BODY_BYTES:
            return False
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            if not message.get("more_body", False):
                return True

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    if self.on_startup:
                        await self.on_startup()
                except Exception as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if self.on_shutdown:
                    await self.on_shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _read_body(self, scope: Scope, receive: Receive,
                         headers: dict[bytes, bytes] | None = None) -> bytes:
        """The whole request body (decompressed), then the admission slot if the route
        takes one: a slow or stalled body holds memory within ``--max-body-memory`` and
        for ``--body-timeout`` between chunks at most, never a slot."""
        headers = headers if headers is not None else _headers(scope)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise PayloadTooLarge(f"request body of {int(declared)} bytes is over the limit of "
                                  f"{self.max_request_bytes} (--max-request-bytes)")
        chunks = []
        size = 0
        while True:  # a stalled body is the transport's to time out (--body-timeout)
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidInput("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                raise PayloadTooLarge(f"request body is over the limit of "
                                      f"{self.max_request_bytes} bytes (--max-request-bytes)")
            if size > FREE_BODY_BYTES:
                self._charge(scope, size - FREE_BODY_BYTES - scope.get(_CHARGED, 0))
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        scope[_BODY_READ] = True
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding")
        if encoding and encoding not in (b"identity",):
            # the compressed size says nothing of the work or of the size it inflates to
            body = await asyncio.to_thread(self._decompress, body, encoding)
            grown = len(body) - FREE_BODY_BYTES - scope.get(_CHARGED, 0)
            if grown > 0:
                self._charge(scope, grown)
        if scope.get(_ADMIT):
            self.dataplane.admit()
            scope[_ADMITTED] = True
        return body

    def _charge(self, scope: Scope, extra: int) -> None:
        """Charge ``extra`` body bytes of this request to ``--max-body-memory`` or refuse
        it: 413 when this request alone can never fit, 503 when it does not fit now. A
        negative ``extra`` gives bytes back."""
        if extra <= 0:  # a charge given back
            self.body_bytes_held += extra
            scope[_CHARGED] = scope.get(_CHARGED, 0) + extra
            return
        if scope.get(_CHARGED, 0) + extra > self.limits.max_body_memory:
            raise PayloadTooLarge(f"this request needs more than --max-body-memory "
                                  f"({self.limits.max_body_memory} bytes) to hold and decode")
        if self.body_bytes_held + extra > self.limits.max_body_memory:
            raise Unavailable(f"the server holds its limit of {self.limits.max_body_memory} "
                              "bytes of request bodies (--max-body-memory); retry later")
        self.body_bytes_held += extra
        scope[_CHARGED] = scope.get(_CHARGED, 0) + extra

    def _charge_json(self, scope: Scope, size: int, tensors: bool = True) -> int:
        """Refuse JSON over ``--max-json-bytes`` (decoding it holds the interpreter for
        about a second per 30 MB, stalling every other client), and charge what decoding
        ``size`` bytes takes (Python objects: up to ``JSON_EXPANSION`` times the text)
        before it is decoded; returns the charge. ``tensors``: the body is an infer
        request, whose errors point to binary data."""
        if size <= FREE_BODY_BYTES:
            return 0
        remedy = "send the tensors as binary data (binary_data_size, as tritonclient's " \
            "binary_data=True does)" if tensors else "send a smaller document"
        if size > self.limits.max_json_bytes:
            raise PayloadTooLarge(f"the request's JSON is {size} bytes, over --max-json-bytes "
                                  f"({self.limits.max_json_bytes}); {remedy}")
        need = JSON_EXPANSION * (size - FREE_BODY_BYTES)
        if need + scope.get(_CHARGED, 0) > self.limits.max_body_memory:
            raise PayloadTooLarge(
                f"a JSON body of {size} bytes takes about {need + size} bytes to decode, "
                f"over --max-body-memory ({self.limits.max_body_memory}); {remedy}")
        self._charge(scope, need)
        return need

    async def _read_json(self, scope: Scope, receive: Receive) -> dict[str, Any]:
        """A JSON object body (``{}`` when empty), charged to ``--max-body-memory`` for
        what decoding it holds until the request ends, decoded off the loop when large."""
        body = await self._read_body(scope, receive)
        if not body.strip():
            return {}
        self._charge_json(scope, len(body), tensors=False)
        doc: dict[str, Any] = await off_loop_if_large(len(body), parse_json_object, body,
                                                      "request body")
        return doc

    def _decompress(self, body: bytes, encoding: bytes) -> bytes:
        if encoding == b"gzip":
            wbits = 16 + zlib.MAX_WBITS
        elif encoding == b"deflate":
            wbits = zlib.MAX_WBITS
        else:
            raise InvalidInput(f"Content-Encoding {encoding.decode(errors='replace')!r} is not "
                               "supported; use gzip, deflate or none")
        inflater = zlib.decompressobj(wbits)
        try:
            data = inflater.decompress(body, self.max_request_bytes + 1)
        except zlib.error as exc:
            raise InvalidInput(f"request body is not valid {encoding.decode()} data: "
                               f"{exc}") from None
        if len(data) > self.max_request_bytes:
            raise PayloadTooLarge(f"decompressed body is over the limit of "
                                  f"{self.max_request_bytes} bytes (--max-request-bytes)")
        return data

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.origins.check(scope["method"], scope["headers"])  # before keys: no probing
        server = scope.get("server")
        if self.metrics_port is not None and server and server[1] == self.metrics_port:
            if scope["path"] == "/metrics":
                self.access.check_metrics(scope["headers"])
                await send_body(send, 200, metrics.render(self.registry),
                            [(b"content-type", metrics.CONTENT_TYPE.encode())])
                return
            raise NotFound(f"no route {scope['path']}; the metrics port serves /metrics")
        try:
            route, params = self.router.match(scope["method"], scope["path"])
        except (NotFound, MethodNotAllowed) as exc:
            # without a key, a client learns nothing of the API but its open routes
            if self.access.enabled and getattr(exc, "access", None) is not OPEN:
                self.access.check_headers(scope["headers"], admin=False)
            raise
        if route.access is not OPEN and self.access.enabled:
            scope[TENANT] = self.access.check_headers(scope["headers"],
                                                      admin=route.access is ADMIN)
        if route.admit:
            self.dataplane.check_admission()  # refused at once when full, body unread
            scope[_ADMIT] = True
        try:
            await self._handlers[route.handler](scope, receive, send, params)
        finally:
            if scope.get(_ADMITTED):
                self.dataplane.release()
            self.body_bytes_held -= scope.get(_CHARGED, 0)

    # ------------------------------------------------------------------ handlers
    # Each takes (scope, receive, send, path parameters); the route table names them.

    async def openapi(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await send_body(send, 200, self._openapi)

    async def server_metadata(self, scope: Scope, receive: Receive, send: Send,
                              params: Params) -> None:
        await send_json(send, 200, self.dataplane.server_metadata())

    async def live(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await send_body(send, 200 if self.dataplane.live() else 503, b"")

    async def ready(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await send_body(send, 200 if self.dataplane.ready() else 503, b"")

    async def all_stats(self, scope: Scope, receive: Receive, send: Send,
                        params: Params) -> None:
        await send_json(send, 200, await self.dataplane.all_statistics(None, None))

    async def model_metadata(self, scope: Scope, receive: Receive, send: Send,
                             params: Params) -> None:
        await send_json(send, 200, self.dataplane.model_metadata(params["model"],
                                                             params.get("version")))

    async def model_ready(self, scope: Scope, receive: Receive, send: Send,
                          params: Params) -> None:
        ready = self.dataplane.model_ready(params["model"], params.get("version"))
        await send_body(send, 200 if ready else 503, b"")

    async def model_config(self, scope: Scope, receive: Receive, send: Send,
                           params: Params) -> None:
        await send_json(send, 200, self.dataplane.model_config(params["model"],
                                                           params.get("version")))

    async def model_stats(self, scope: Scope, receive: Receive, send: Send,
                          params: Params) -> None:
        await send_json(send, 200, await self.dataplane.all_statistics(
            params["model"], params.get("version")))

    async def repository_index(self, scope: Scope, receive: Receive, send: Send,
                               params: Params) -> None:
        ready_only = bool((await self._read_json(scope, receive)).get("ready", False))
        await send_json(send, 200, self.dataplane.manager.index(ready_only))

    async def load(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        document = await self._read_json(scope, receive)
        parameters = document.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidInput("'parameters' must be a JSON object")
        await self.dataplane.load_model(params["model"], parameters)
        await send_body(send, 200, b"{}")

    async def unload(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await self._read_body(scope, receive)
        await self.dataplane.unload_model(params["model"])
        await send_body(send, 200, b"{}")

    async def infer(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await self._infer(scope, receive, send, params["model"], params.get("version"))

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                     version: str | None) -> None:
        self.dataplane.check_target(name, version)  # the cheap checks before the body
        headers = _headers(scope)
        body = await self._read_body(scope, receive, headers)
        length = _header_length(headers, len(body))
        decoding = self._charge_json(scope, len(body) if length is None else length)
        # off_loop_if_large, written out: the hot path skips its extra coroutine
        request = decode_request(body, length, self.dataplane.limits) \
            if len(body) <= OFF_LOOP_BYTES else \
            await asyncio.to_thread(decode_request, body, length, self.dataplane.limits)
        self._charge(scope, -decoding)  # decoded: the arrays are what is left
        _set_class(request, headers)
        request.tenant = scope.get(TENANT, b"")
        handler = asyncio.current_task()
        assert handler is not None
        # a client that leaves cancels this handler: the scheduler drops the request if
        # it is still queued
        watch = DisconnectWatch(receive, handler.cancel)
        try:
            with watch:
                served, timings, outputs = await self.dataplane.infer(name, version, request)
        except asyncio.CancelledError:
            if watch.gone:
                return  # the client went away: nobody to answer
            raise
        payload, reply = _infer_answer(name, served, request, timings, outputs, headers)
        await send_body(send, 200, payload, reply)

    # ------------------------------------------------------------ the direct path
    # The infer route without ASGI, for the common request (see server/transport.py):
    # its whole small body is in, and the connection calls back with the answer.

    direct_headers = DIRECT_HEADERS

    def direct_route(self, scope: Scope, headers: dict[bytes, bytes]) -> Params | None:
        """The infer route's parameters when ``scope`` can be answered by
        :meth:`infer_direct`: POST to an infer route on the HTTP port, with a declared
        body of at most ``FREE_BODY_BYTES``, neither chunked nor compressed. ``headers``
        holds the request's values of ``direct_headers``."""
        if scope["method"] != "POST" or not scope["path"].endswith("/infer"):
            return None
        server = scope.get("server")
        if self.metrics_port is not None and server and server[1] == self.metrics_port:
            return None
        declared = headers.get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > FREE_BODY_BYTES or \
                b"transfer-encoding" in headers or b"content-encoding" in headers:
            return None
        try:
            route, params = self.router.match("POST", scope["path"])
        except (NotFound, MethodNotAllowed):
            return None
        return params if route.handler == "infer" else None

    def infer_direct(self, scope: Scope, params: Params, headers: dict[bytes, bytes],
                     body: bytes, respond: Callable[[int, bytes, Headers], None]
                     ) -> Callable[[], None]:
        """Answer an infer request whose whole ``body`` has arrived, as the ASGI route
        would: the same checks in the same order, the same answers and errors, through
        ``respond(status, payload, headers)`` (called once, unless the client leaves).
        Returns what to call when the client leaves first."""
        name, version = params["model"], params.get("version")
        admitted = False
        try:
            self.origins.check_values("POST", headers.get(b"host"), headers.get(b"origin"))
            tenant = self.access.check(headers.get(b"authorization"), admin=False) \
                if self.access.enabled else b""
            self.dataplane.check_admission()
            self.dataplane.check_target(name, version)
            if len(body) > self.max_request_bytes:
                raise PayloadTooLarge(f"request body of {len(body)} bytes is over the limit "
                                      f"of {self.max_request_bytes} (--max-request-bytes)")
            self.dataplane.admit()
            admitted = True
            request = decode_request(body, _header_length(headers, len(body)),
                                     self.dataplane.limits)
            _set_class(request, headers)
            request.tenant = tenant

            def done(result: tuple[Timings, Outputs] | BaseException) -> None:
                self.dataplane.release()
                if isinstance(result, BaseException):
                    respond(*_error_answer(_request_error(result, scope)))
                else:
                    self._direct_answer(scope, name, request, headers, served, result,
                                        respond)

            submitted = self.dataplane.submit(name, version, request, done)
        except Exception as exc:
            if admitted:
                self.dataplane.release()
            respond(*_error_answer(_request_error(exc, scope)))
            return _nothing
        if submitted is None:  # a router or the cache: the data plane's coroutine
            task = asyncio.ensure_future(self.dataplane.infer(name, version, request))

            def task_done(task: asyncio.Future[Any]) -> None:
                self.dataplane.release()
                if task.cancelled():
                    return  # the client went away: nobody to answer
                try:
                    served, timings, outputs = task.result()
                    payload, reply = _infer_answer(name, served, request, timings, outputs,
                                                   headers)
                except Exception as exc:
                    respond(*_error_answer(_request_error(exc, scope)))
                    return
                respond(200, payload, reply)

            task.add_done_callback(task_done)

            def cancel_task() -> None:
                task.cancel()

            return cancel_task
        served, internal = submitted  # done() runs in a later loop turn, never before this

        def cancel() -> None:
            served.scheduler.cancel(internal)  # done() is not called from here on
            self.dataplane.release()

        return cancel

    def _direct_answer(self, scope: Scope, name: str, request: V2Request,
                       headers: dict[bytes, bytes], served: ModelVersion,
                       result: tuple[Timings, Outputs],
                       respond: Callable[[int, bytes, Headers], None]) -> None:
        """Answer a direct request from the scheduler's timings and raw outputs."""
        try:
            timings, raw = result
            outputs = select_outputs(served.config, request, raw)
            payload, reply = _infer_answer(name, served, request, timings, outputs, headers)
        except Exception as exc:
            respond(*_error_answer(_request_error(exc, scope)))
            return
        respond(200, payload, reply)


def _nothing() -> None:
    pass


def _request_error(exc: BaseException, scope: Scope) -> RequestError:
    """``exc`` as the client sees it: a request error as it is, anything else a logged 500."""
    if isinstance(exc, RequestError):
        return exc
    request_log.exception("internal error on %s %s", scope["method"], scope["path"],
                          exc_info=exc)
    return RequestError(f"internal error: {type(exc).__name__}: {exc}")


def _error_answer(exc: RequestError) -> tuple[int, bytes, Headers]:
    """Status, JSON body and headers of a v2 error answer."""
    headers = [(b"retry-after", b"1")] if isinstance(exc, Unavailable) else \
        [(b"www-authenticate", b"Bearer")] if isinstance(exc, Unauthorized) else []
    return exc.status, orjson.dumps({"error": str(exc)}), JSON_HEADERS + headers


def _header_length(headers: dict[bytes, bytes], body_size: int) -> int | None:
    """The binary extension's Inference-Header-Content-Length, checked against the body."""
    header_length = headers.get(b"inference-header-content-length")
    if header_length is None:
        return None
    if not header_length.isdigit() or len(header_length) > 19:
        raise InvalidInput("Inference-Header-Content-Length must be a non-negative "
                           "integer no longer than the body")
    length = int(header_length)
    if length > body_size:
        raise InvalidInput(f"Inference-Header-Content-Length is {length} but the "
                           f"body has {body_size} bytes")
    return length


def _set_class(request: V2Request, headers: dict[bytes, bytes]) -> None:
    """X-Tradeoff-Class, unless the request's parameters name a class themselves."""
    request_class = headers.get(b"x-tradeoff-class")
    if request_class is not None and "class" not in request.parameters:
        request.parameters["class"] = request_class.decode("latin-1")


def _infer_answer(name: str, served: ModelVersion, request: V2Request, timings: Timings,
                  outputs: list[TensorOutput], headers: dict[bytes, bytes]
                  ) -> tuple[bytes, Headers]:
    """An infer response's body and headers (compressed when the client accepts it)."""
    payload, json_length = encode_response(
        name, str(served.version), request.id, outputs,
        {"routed_to": timings.route} if timings.route else None)
    reply = [(b"content-type", b"application/json" if json_length is None
              else b"application/octet-stream"),
             (b"server-timing", timings.server_timing().encode())]
    if json_length is not None:
        reply.append((b"inference-header-content-length", str(json_length).encode()))
    accept = headers.get(b"accept-encoding")
    if accept:
        payload = _compress(payload, accept, reply)
    return payload, reply


def _has_body(scope: Scope) -> bool:
    """Whether the request declares a body (a length other than 0, or chunks)."""
    for name, value in scope["headers"]:
        if (name == b"content-length" and value.strip(b"0 ")) or \
                name == b"transfer-encoding":
            return True
    return False


def _compress(payload: bytes, accept: bytes, headers: list[tuple[bytes, bytes]]) -> bytes:
    """gzip/deflate the response when the client asked for it (tritonclient can)."""
    offered = {token.split(b";")[0].strip() for token in accept.split(b",")}
    if b"gzip" in offered:
        compressor = zlib.compressobj(1, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        encoding = b"gzip"
    elif b"deflate" in offered:
        compressor = zlib.compressobj(1, zlib.DEFLATED, zlib.MAX_WBITS)
        encoding = b"deflate"
    else:
        return payload
    headers.append((b"content-encoding", encoding))
    return compressor.compress(payload) + compressor.flush()
