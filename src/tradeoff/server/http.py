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

from tradeoff.errors import InvalidInput, NotFound, PayloadTooLarge, Unavailable
from tradeoff.protocol.v2 import parse_json_object
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
from tradeoff.server.dataplane import Admission, DataPlane
from tradeoff.server.infer_call import InferCall, Respond, error_answer, request_error
from tradeoff.server.openai_api import OpenAIApi, send_error
from tradeoff.server.options import DEFAULT_MAX_REQUEST_BYTES, TransportLimits
from tradeoff.server.origins import OriginPolicy
from tradeoff.server.routes import ADMIN, OPEN, ROUTES, MethodNotAllowed, Route, Router

__all__ = [
    "DIRECT_HEADERS",
    "FREE_BODY_BYTES",
    "JSON_EXPANSION",
    "HttpApp",
    "Params",
    "request_headers",
]

log = logging.getLogger("tradeoff.server")

Params = dict[str, str]


# Bodies up to this size are not charged to --max-body-memory: with the connection limits
# they cannot add up to much, and a full budget must not refuse every small request.
FREE_BODY_BYTES = 64 * 1024

# decoding JSON holds up to this many times the text more, as Python objects (measured
# with orjson: a list of small numbers 16x, of empty objects or arrays 33-36x)
JSON_EXPANSION = 40

# per-request state the app keeps in the ASGI scope
_HEADERS = "tradeoff.headers"    # request_headers(scope)
_ADMISSION = "tradeoff.admission"  # the route's Admission: taken once its body is read
_CHARGED = "tradeoff.charged"    # body bytes charged to --max-body-memory
_BODY_READ = "tradeoff.body_read"  # the whole body arrived


# the request headers this app reads (the direct path keeps them as the head arrives)
DIRECT_HEADERS = frozenset((b"content-length", b"content-encoding", b"accept-encoding",
                            b"inference-header-content-length", b"x-tradeoff-class",
                            b"transfer-encoding", b"host", b"origin", b"authorization"))


def request_headers(scope: Scope) -> dict[bytes, bytes]:
    """The request headers this app reads, in one pass, as the direct path keeps them:
    names lower-cased, values without the optional whitespace HTTP allows around them
    (libcurl, and so perf_analyzer, sends ``Content-Length: 1208 ``), the last value of a
    repeated header but the first ``Authorization``."""
    headers: dict[bytes, bytes] = {}
    for name, value in scope["headers"]:
        if name in DIRECT_HEADERS and (name != b"authorization" or name not in headers):
            headers[name] = value.strip(b" \t")
    return headers


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
        openai = OpenAIApi(dataplane, self._read_json_text, self.access)
        handlers = {name: getattr(self, name, None) or getattr(openai, name)
                    for name in {route.handler for route in ROUTES}}
        self._handlers: dict[str, Callable[[Scope, Receive, Send, Params],
                                           Awaitable[None]]] = handlers
        self.dataplane = dataplane
        self.registry = registry
        self.metrics_port = metrics_port
        self.max_request_bytes = max_request_bytes
        self._direct_bytes = min(FREE_BODY_BYTES, max_request_bytes)  # direct_route's bound
        self.on_startup = on_startup
        self.on_shutdown = on_shutdown
        # serve --workers: the other front ends' metric families, summed into /metrics
        self.others_metrics: Callable[[], Awaitable[list[list[dict[str, Any]]]]] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            try:
                await self._http(scope, receive, send)
            except Exception as exc:  # the server must answer and keep serving
                exc = request_error(exc, scope)
                close = [] if await self._body_done(scope, receive) else \
                    [(b"connection", b"close")]
                path = scope["path"]
                if path == "/v1" or path.startswith("/v1/"):  # the OpenAI API's shape
                    return await send_error(send, exc, close)
                status, body, headers = error_answer(exc)
                await send_body(send, status, body, headers + close)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _body_done(self, scope: Scope, receive: Receive) -> bool:
        """Whether a refused request's connection may stay open: its body was read, it
        has none, or it is small (read and dropped; the transport times out a stall).
        A large one is left unread: the answer closes the connection."""
        if scope.get(_BODY_READ) or not _has_body(scope):
            return True
        declared = self._headers(scope).get(b"content-length")
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

    @staticmethod
    def _headers(scope: Scope) -> dict[bytes, bytes]:
        headers: dict[bytes, bytes] | None = scope.get(_HEADERS)
        if headers is None:
            headers = scope[_HEADERS] = request_headers(scope)
        return headers

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        """The whole request body (decompressed), then the admission slot if the route
        takes one: a slow or stalled body holds memory within ``--max-body-memory`` and
        for ``--body-timeout`` between chunks at most, never a slot."""
        headers = self._headers(scope)
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
        admission = scope.get(_ADMISSION)
        if admission is not None:
            admission.take()
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
        body = await self._read_json_text(scope, receive)
        if not body.strip():
            return {}
        doc: dict[str, Any] = await off_loop_if_large(len(body), parse_json_object, body,
                                                      "request body")
        return doc

    async def _read_json_text(self, scope: Scope, receive: Receive) -> bytes:
        """A JSON body not yet decoded, charged to ``--max-body-memory`` for what decoding
        it holds until the request ends (the /v1 routes decode it into their types)."""
        body = await self._read_body(scope, receive)
        if body.strip():
            self._charge_json(scope, len(body), tensors=False)
        return body

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

    def check_route(self, route: Route, headers: dict[bytes, bytes]
                    ) -> tuple[bytes, Admission | None]:
        """The checks every request of ``route`` passes before its body is read, on
        either path: the key its access class needs (the tenant: who asked), then the
        admission slot when the route takes one (refused at once when the server is full)."""
        tenant = self.access.check(headers.get(b"authorization"),
                                   admin=route.access is ADMIN) \
            if route.access is not OPEN and self.access.enabled else b""
        return tenant, Admission(self.dataplane) if route.admit else None

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = self._headers(scope)
        # before keys: no probing
        self.origins.check_values(scope["method"], headers.get(b"host"), headers.get(b"origin"))
        server = scope.get("server")
        if self.metrics_port is not None and server and server[1] == self.metrics_port:
            if scope["path"] == "/metrics":
                self.access.check_metrics(scope["headers"])
                text = metrics.render(self.registry) if self.others_metrics is None else \
                    metrics.render_summed(self.registry, await self.others_metrics())
                await send_body(send, 200, text,
                                [(b"content-type", metrics.CONTENT_TYPE.encode())])
                return
            raise NotFound(f"no route {scope['path']}; the metrics port serves /metrics")
        try:
            route, params = self.router.match(scope["method"], scope["path"])
        except (NotFound, MethodNotAllowed) as exc:
            # without a key, a client learns nothing of the API but its open routes
            if self.access.enabled and getattr(exc, "access", None) is not OPEN:
                self.access.check(headers.get(b"authorization"), admin=False)
            raise
        scope[TENANT], admission = self.check_route(route, headers)
        scope[_ADMISSION] = admission
        try:
            await self._handlers[route.handler](scope, receive, send, params)
        finally:
            if admission is not None:
                admission.release()
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
        await send_body(send, 200, b"", JSON_HEADERS)  # as Triton answers: no body

    async def unload(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        await self._read_body(scope, receive)
        await self.dataplane.unload_model(params["model"])
        await send_body(send, 200, b"", JSON_HEADERS)

    async def infer(self, scope: Scope, receive: Receive, send: Send, params: Params) -> None:
        """The infer route through ASGI: any body (streamed, compressed, large); the
        request itself is the :class:`InferCall` the direct path runs too."""
        call = InferCall(self.dataplane, scope, params, self._headers(scope), scope[TENANT],
                         scope[_ADMISSION])
        body = await self._read_body(scope, receive)
        decoding = self._charge_json(scope, call.json_size(len(body)))
        request = call.decode(body) if len(body) <= OFF_LOOP_BYTES else \
            await asyncio.to_thread(call.decode, body)
        self._charge(scope, -decoding)  # decoded: the arrays are what is left
        answer: asyncio.Future[tuple[int, bytes, Headers]] = \
            asyncio.get_running_loop().create_future()

        def respond(status: int, payload: bytes, headers: Headers) -> None:
            if not answer.done():
                answer.set_result((status, payload, headers))

        cancel = call.start(request, respond)
        handler = asyncio.current_task()
        assert handler is not None
        # a client that leaves cancels this handler, and the call: dropped if still queued
        watch = DisconnectWatch(receive, handler.cancel)
        try:
            with watch:
                status, payload, reply = await answer
        except asyncio.CancelledError:
            cancel()
            if watch.gone:
                return  # the client went away: nobody to answer
            raise
        await send_body(send, status, payload, reply)

    # ------------------------------------------------------------ the direct path
    # The infer route without ASGI, for the common request (see server/transport.py):
    # its whole small body is in, and the connection calls back with the answer.

    direct_headers = DIRECT_HEADERS

    def direct_route(self, scope: Scope, headers: dict[bytes, bytes]
                     ) -> tuple[Route, Params] | None:
        """The infer route and its parameters when ``scope`` can be answered by
        :meth:`infer_direct`: POST to an infer route on the HTTP port, with a declared
        body of at most ``FREE_BODY_BYTES`` (and within --max-request-bytes: a larger one
        is the ASGI route's to refuse), neither chunked nor compressed. ``headers`` holds
        the request's values of ``direct_headers``."""
        if scope["method"] != "POST" or not scope["path"].endswith("/infer"):
            return None
        server = scope.get("server")
        if self.metrics_port is not None and server and server[1] == self.metrics_port:
            return None
        declared = headers.get(b"content-length")
        if declared is None or not declared.isdigit() or int(declared) > self._direct_bytes \
                or b"transfer-encoding" in headers or b"content-encoding" in headers:
            return None
        try:
            route, params = self.router.match("POST", scope["path"])
        except (NotFound, MethodNotAllowed):
            return None
        return (route, params) if route.handler == "infer" else None

    def infer_direct(self, scope: Scope, target: tuple[Route, Params],
                     headers: dict[bytes, bytes], body: bytes, respond: Respond
                     ) -> Callable[[], None]:
        """Answer an infer request whose whole ``body`` has arrived, as the ASGI route
        does (the same checks in the same order, the same :class:`InferCall`), through
        ``respond(status, payload, headers)`` (called once, unless the client leaves).
        Returns what to call when the client leaves first."""
        route, params = target
        try:
            self.origins.check_values("POST", headers.get(b"host"), headers.get(b"origin"))
            tenant, admission = self.check_route(route, headers)
            call = InferCall(self.dataplane, scope, params, headers, tenant, admission)
            request = call.decode(body)
        except Exception as exc:
            respond(*error_answer(request_error(exc, scope)))
            return _nothing
        return call.start(request, respond)


def _nothing() -> None:
    pass


def _has_body(scope: Scope) -> bool:
    """Whether the request declares a body (a length other than 0, or chunks)."""
    for name, value in scope["headers"]:
        if (name == b"content-length" and value.strip(b"0 ")) or \
                name == b"transfer-encoding":
            return True
    return False
