"""The HTTP transport: a plain ASGI app speaking the Open Inference Protocol v2.

Routes are matched by splitting the path, not by a framework: this is the hot path, and
every microsecond of per-request overhead shows up in the served throughput of small
models. Everything here translates between HTTP and :class:`DataPlane` calls.
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
from tradeoff.protocol.v2 import decode_request, encode_response, parse_json_object
from tradeoff.server import metrics, openapi
from tradeoff.server.access import Access
from tradeoff.server.dataplane import DataPlane

log = logging.getLogger("tradeoff.server")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]

JSON_HEADERS = [(b"content-type", b"application/json")]
DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024


async def _send(send: Send, status: int, body: bytes,
                headers: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = list(headers if headers is not None else JSON_HEADERS if body else [])
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _json(send: Send, status: int, doc: Any) -> None:
    await _send(send, status, orjson.dumps(doc))


async def _error(send: Send, status: int, message: str,
                 extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    await _send(send, status, orjson.dumps({"error": message}),
                JSON_HEADERS + (extra_headers or []))


_WANTED_HEADERS = frozenset((b"content-length", b"content-encoding", b"accept-encoding",
                             b"inference-header-content-length"))


def _headers(scope: Scope) -> dict[bytes, bytes]:
    """The request headers this app reads, in one pass (names arrive lower-cased)."""
    return {k: v for k, v in scope["headers"] if k in _WANTED_HEADERS}


class HttpApp:
    """ASGI application: the v2 API on the HTTP port, ``/metrics`` on the metrics port.

        app = HttpApp(dataplane, registry, metrics_port=8002)
        uvicorn.run(app, ...)
    """

    def __init__(self, dataplane: DataPlane, registry: Any, *, metrics_port: int | None,
                 max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
                 on_startup: Callable[[], Awaitable[None]] | None = None,
                 on_shutdown: Callable[[], Awaitable[None]] | None = None,
                 access: Access | None = None, openai: Any = None) -> None:
        self.access = access or Access()
        self.openai = openai  # the OpenAI-compatible API of generative models, if any
        self._openapi = orjson.dumps(openapi.document())
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
            except RequestError as exc:
                headers = [(b"retry-after", b"1")] if isinstance(exc, Unavailable) else \
                    [(b"www-authenticate", b"Bearer")] if isinstance(exc, Unauthorized) else None
                await _error(send, exc.status, str(exc), headers)
            except Exception as exc:  # the server must answer and keep serving
                log.exception("internal error on %s %s", scope["method"], scope["path"])
                await _error(send, 500, f"internal error: {type(exc).__name__}: {exc}")
        elif kind == "lifespan":
            await self._lifespan(receive, send)

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
        headers = headers if headers is not None else _headers(scope)
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_request_bytes:
            raise PayloadTooLarge(f"request body of {int(declared)} bytes is over the limit of "
                                  f"{self.max_request_bytes} (--max-request-bytes)")
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise InvalidInput("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_request_bytes:
                raise PayloadTooLarge(f"request body is over the limit of "
                                      f"{self.max_request_bytes} bytes (--max-request-bytes)")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get(b"content-encoding")
        if encoding and encoding not in (b"identity",):
            body = self._decompress(body, encoding)
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
            raise InvalidInput(f"request body is not valid {encoding.decode()} data: {exc}") from None
        if len(data) > self.max_request_bytes:
            raise PayloadTooLarge(f"decompressed body is over the limit of "
                                  f"{self.max_request_bytes} bytes (--max-request-bytes)")
        return data

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        server = scope.get("server")
        if self.metrics_port is not None and server and server[1] == self.metrics_port:
            if scope["path"] == "/metrics":
                await _send(send, 200, metrics.render(self.registry),
                            [(b"content-type", metrics.CONTENT_TYPE.encode())])
                return
            raise NotFound(f"no route {scope['path']}; the metrics port serves /metrics")
        method = scope["method"]
        if scope["path"].startswith("/v1/") and self.openai is not None:
            return await self.openai(scope, receive, send,
                                     lambda: self._read_body(scope, receive))
        if scope["path"] == "/openapi.json":
            self._method(method, "GET", scope)
            return await _send(send, 200, self._openapi)
        parts = scope["path"].strip("/").split("/")
        if not parts or parts[0] != "v2":
            raise NotFound(f"no route {scope['path']}; the API lives under /v2")
        if self.access.enabled and not _is_health(parts):
            self.access.check_headers(scope["headers"], admin=_is_admin(parts))
        n = len(parts)
        if n == 1:
            self._method(method, "GET", scope)
            return await _json(send, 200, self.dataplane.server_metadata())
        if parts[1] == "health" and n == 3 and parts[2] in ("live", "ready"):
            self._method(method, "GET", scope)
            ok = self.dataplane.live() if parts[2] == "live" else self.dataplane.ready()
            return await _send(send, 200 if ok else 503, b"")
        if parts[1] == "models" and n >= 3:
            if n == 3 and parts[2] == "stats":
                self._method(method, "GET", scope)
                return await _json(send, 200, self.dataplane.statistics(None, None))
            name = parts[2]
            version = None
            rest = parts[3:]
            if len(rest) >= 2 and rest[0] == "versions":
                version, rest = rest[1], rest[2:]
            action = rest[0] if rest else ""
            if len(rest) <= 1:
                return await self._model_route(scope, receive, send, name, version, action)
        if parts[1] == "repository":
            if n == 3 and parts[2] == "index":
                self._method(method, "POST", scope)
                body = await self._read_body(scope, receive)
                ready_only = bool(self._json_body(body).get("ready", False))
                return await _json(send, 200, self.dataplane.manager.index(ready_only))
            if n == 5 and parts[2] == "models" and parts[4] in ("load", "unload"):
                self._method(method, "POST", scope)
                document = self._json_body(await self._read_body(scope, receive))
                if parts[4] == "load":
                    parameters = document.get("parameters") or {}
                    if not isinstance(parameters, dict):
                        raise InvalidInput("'parameters' must be a JSON object")
                    await self.dataplane.load_model(parts[3], parameters)
                else:
                    await self.dataplane.manager.unload(parts[3])
                return await _send(send, 200, b"{}")
        raise NotFound(f"no route {method} {scope['path']}")

    @staticmethod
    def _method(method: str, allowed: str, scope: Scope) -> None:
        if method != allowed:
            raise _MethodNotAllowed(f"{method} is not allowed on {scope['path']}; use {allowed}")

    @staticmethod
    def _json_body(body: bytes) -> dict[str, Any]:
        return parse_json_object(body, "request body") if body.strip() else {}

    async def _model_route(self, scope: Scope, receive: Receive, send: Send, name: str,
                           version: str | None, action: str) -> None:
        method = scope["method"]
        dp = self.dataplane
        if action == "infer":
            self._method(method, "POST", scope)
            return await self._infer(scope, receive, send, name, version)
        self._method(method, "GET", scope)
        if action == "":
            return await _json(send, 200, dp.model_metadata(name, version))
        if action == "ready":
            try:
                dp.manager.get(name, version)  # unknown model or version: 404
            except Unavailable:
                return await _send(send, 503, b"")
            return await _send(send, 200, b"")
        if action == "config":
            return await _json(send, 200, dp.model_config(name, version))
        if action == "stats":
            return await _json(send, 200, dp.statistics(name, version))
        raise NotFound(f"no route {method} {scope['path']}")

    async def _infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                     version: str | None) -> None:
        self.dataplane.admit()  # before the body is read: memory stays bounded
        try:
            await self._admitted_infer(scope, receive, send, name, version)
        finally:
            self.dataplane.release()

    async def _admitted_infer(self, scope: Scope, receive: Receive, send: Send, name: str,
                              version: str | None) -> None:
        headers = _headers(scope)
        body = await self._read_body(scope, receive, headers)
        header_length = headers.get(b"inference-header-content-length")
        length = None
        if header_length is not None:
            if not header_length.isdigit():
                raise InvalidInput("Inference-Header-Content-Length must be a non-negative "
                                   "integer")
            length = int(header_length)
        request = decode_request(body, length, self.dataplane.limits)
        handler = asyncio.current_task()
        watch = asyncio.ensure_future(receive())  # answers http.disconnect if the client goes
        gone = answered = False

        def on_message(message: asyncio.Future[dict[str, Any]]) -> None:
            nonlocal gone
            if not answered and handler is not None and not message.cancelled() and \
                    message.exception() is None and message.result()["type"] == "http.disconnect":
                gone = True
                handler.cancel()  # the scheduler drops the request if it is still queued

        watch.add_done_callback(on_message)
        try:
            served, timings, outputs = await self.dataplane.infer(name, version, request)
        except asyncio.CancelledError:
            if gone:
                return  # the client went away: nobody to answer
            raise
        finally:
            answered = True  # a disconnect noticed from now on cancels nothing
            watch.remove_done_callback(on_message)
            watch.cancel()
        payload, json_length = encode_response(name, str(served.version), request.id, outputs)
        reply = [(b"content-type", b"application/json" if json_length is None
                  else b"application/octet-stream"),
                 (b"server-timing", timings.server_timing().encode())]
        if json_length is not None:
            reply.append((b"inference-header-content-length", str(json_length).encode()))
        accept = headers.get(b"accept-encoding")
        if accept:
            payload = _compress(payload, accept, reply)
        await _send(send, 200, payload, reply)


def _is_health(parts: list[str]) -> bool:
    """Liveness, readiness and model readiness stay open to probes without keys: exactly
    /v2/health/{live,ready}, /v2/models/{m}/ready and /v2/models/{m}/versions/{v}/ready."""
    n = len(parts)
    if n == 3:
        return parts[1] == "health" and parts[2] in ("live", "ready")
    if n < 4 or parts[1] != "models" or parts[-1] != "ready":
        return False
    return n == 4 or (n == 6 and parts[3] == "versions")


def _is_admin(parts: list[str]) -> bool:
    return len(parts) == 5 and parts[1] == "repository" and parts[4] in ("load", "unload")


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


class _MethodNotAllowed(RequestError):
    status = 405
