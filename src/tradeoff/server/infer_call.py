"""One tensor inference request over HTTP, from its cheap checks to its answer, whichever
path carries it.

Two paths carry infer requests: the direct path of :mod:`tradeoff.server.transport` (a
small body, whole, answered from the connection's callbacks without ASGI) and the ASGI
route of :class:`tradeoff.server.http.HttpApp` (any body: streamed, compressed, large).
Both run the same :class:`InferCall`:

    call = InferCall(dataplane, scope, params, headers, tenant, admission)  # cheap checks
    request = call.decode(body)            # off the loop when the body is large
    cancel = call.start(request, respond)  # respond(status, payload, headers) once

The route's own checks (origin, key, admission: :meth:`HttpApp.check_route`) come
before, on both paths. The model is looked up once, here; the admission slot is taken
in :meth:`InferCall.start` (if reading the body did not take it already) and given back
when the answer is decided or the client leaves.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable
from typing import Any

import orjson

from tradeoff.errors import InvalidInput, RequestError, Unauthorized, Unavailable
from tradeoff.protocol.v2 import (
    RelayedAnswer,
    TensorOutput,
    V2Request,
    decode_request,
    encode_relayed,
    encode_response,
)
from tradeoff.scheduling.request import InferenceRequest, Timings
from tradeoff.server.asgi import JSON_HEADERS, Headers, Scope
from tradeoff.server.dataplane import Admission, Answer, Answerer, DataPlane, TensorTarget
from tradeoff.server.router import RoutedModel

__all__ = [
    "InferCall",
    "Respond",
    "error_answer",
    "header_length",
    "infer_answer",
    "request_error",
]

# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")

Respond = Callable[[int, bytes, Headers], None]


class InferCall:
    """One tensor request for the model (or router) named by ``params``; constructing it
    runs the checks that need no body (the model exists, serves and takes tensors)."""

    __slots__ = ("_internal", "_respond", "_task", "admission", "dataplane", "headers",
                 "name", "request_id", "scope", "target", "tenant")

    def __init__(self, dataplane: DataPlane, scope: Scope, params: dict[str, str],
                 headers: dict[bytes, bytes], tenant: bytes,
                 admission: Admission | None) -> None:
        self.dataplane = dataplane
        self.scope = scope
        self.name = params["model"]
        self.headers = headers  # the request's values of the headers HttpApp reads
        self.tenant = tenant
        self.admission = admission
        self.target: TensorTarget = dataplane.tensor_target(self.name, params.get("version"))
        self._respond: Respond | None = None
        self.request_id: str | None = None
        self._internal: InferenceRequest | None = None
        self._task: asyncio.Future[Any] | None = None

    def json_size(self, body_size: int) -> int:
        """How much of a body of ``body_size`` bytes is JSON (all of it, or the binary
        extension's Inference-Header-Content-Length)."""
        length = header_length(self.headers, body_size)
        return body_size if length is None else length

    def decode(self, body: bytes) -> V2Request:
        """The request in ``body``, with its class and tenant (CPU work: the ASGI route
        runs a large body's in a worker thread)."""
        length = header_length(self.headers, len(body))
        request = decode_request(body, length, self.dataplane.limits)
        request_class = self.headers.get(b"x-tradeoff-class")
        if request_class is not None and "class" not in request.parameters:
            request.parameters["class"] = request_class.decode("latin-1")
        elif isinstance(self.target, RoutedModel):  # its parameters are its body's: a
            request.wire = (body, length)  # router's pools may pass the body on as it is
        request.tenant = self.tenant
        return request

    def start(self, request: V2Request, respond: Respond) -> Callable[[], None]:
        """Take the admission slot and queue ``request``; ``respond(status, payload,
        headers)`` is called once with its answer or its error (at once for an error
        found now, else in a later loop turn), unless the returned cancel is called first
        (the client left: the request is dropped if still queued)."""
        self._respond = respond
        self.request_id = request.id
        try:
            if self.admission is not None:
                self.admission.take()
            dispatch = self.dataplane.dispatch_of(self.target, request)
            if dispatch == "direct":  # a model version, called back by its scheduler
                self._internal = self.dataplane.submit(
                    self.target, request, self._end)  # type: ignore[arg-type]
            else:  # a router or the cache: the data plane's coroutine
                self._task = asyncio.ensure_future(
                    self.dataplane.infer_target(self.target, request, dispatch,
                                                self.headers))
                self._task.add_done_callback(self._task_done)
        except Exception as exc:
            self._end(exc)
        return self.cancel

    def cancel(self) -> None:
        """The client left: answer nobody, drop the request if still queued."""
        if self._respond is None:
            return
        internal, task = self._internal, self._task
        self._respond = self._internal = self._task = None
        if internal is not None:
            self.target.executor.cancel(internal)  # type: ignore[union-attr]
        elif task is not None:
            task.cancel()
        if self.admission is not None:
            self.admission.release()

    def _task_done(self, task: asyncio.Future[Any]) -> None:
        if not task.cancelled():
            self._end(task.exception() or task.result())

    def _end(self, result: Answer | BaseException) -> None:
        respond = self._respond
        if respond is None:
            return  # cancelled: nobody to answer
        # no cycle left (this call -> its queued request -> its callback -> this call):
        # garbage the collector would have to find, at thousands of requests a second
        self._respond = self._internal = self._task = None
        if self.admission is not None:
            self.admission.release()
        if not isinstance(result, BaseException):
            try:
                served, timings, outputs = result
                payload, reply = infer_answer(self.name, served, self.request_id, timings,
                                              outputs, self.headers)
            except Exception as exc:
                result = exc
            else:
                respond(200, payload, reply)
                return
        respond(*error_answer(request_error(result, self.scope)))


def request_error(exc: BaseException, scope: Scope) -> RequestError:
    """``exc`` as the client sees it: a request error as it is, anything else a logged 500."""
    if isinstance(exc, RequestError):
        return exc
    request_log.exception("internal error on %s %s", scope["method"], scope["path"],
                          exc_info=exc)
    return RequestError(f"internal error: {type(exc).__name__}: {exc}")


def error_answer(exc: RequestError) -> tuple[int, bytes, Headers]:
    """Status, JSON body and headers of a v2 error answer."""
    headers = [(b"retry-after", b"1")] if isinstance(exc, Unavailable) else \
        [(b"www-authenticate", b"Bearer")] if isinstance(exc, Unauthorized) else []
    return exc.status, orjson.dumps({"error": str(exc)}), JSON_HEADERS + headers


def header_length(headers: dict[bytes, bytes], body_size: int) -> int | None:
    """The binary extension's Inference-Header-Content-Length, checked against the body."""
    value = headers.get(b"inference-header-content-length")
    if value is None:
        return None
    if not value.isdigit() or len(value) > 19:
        raise InvalidInput("Inference-Header-Content-Length must be a non-negative "
                           "integer no longer than the body")
    length = int(value)
    if length > body_size:
        raise InvalidInput(f"Inference-Header-Content-Length is {length} but the "
                           f"body has {body_size} bytes")
    return length


def infer_answer(name: str, served: Answerer, request_id: str | None, timings: Timings,
                 outputs: list[TensorOutput] | RelayedAnswer, headers: dict[bytes, bytes]
                 ) -> tuple[bytes, Headers]:
    """An infer response's body and headers (compressed when the client accepts it); a
    replica's answer passed on (RelayedAnswer) keeps its tensors as they came."""
    parameters = {"routed_to": timings.route} if timings.route else None
    if isinstance(outputs, RelayedAnswer):
        payload, json_length = encode_relayed(outputs, name, parameters)
    else:
        payload, json_length = encode_response(name, str(served.version), request_id,
                                               outputs, parameters)
    reply = [(b"content-type", b"application/json" if json_length is None
              else b"application/octet-stream"),
             (b"server-timing", timings.server_timing().encode())]
    if json_length is not None:
        reply.append((b"inference-header-content-length", str(json_length).encode()))
    accept = headers.get(b"accept-encoding")
    if accept:
        payload = _compress(payload, accept, reply)
    return payload, reply


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
