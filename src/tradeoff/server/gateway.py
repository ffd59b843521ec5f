"""Requests sent on to a pool's replicas on other servers, and their answers read back:
v2 tensor requests over HTTP or gRPC, and OpenAI completions (whole or streamed).

    outputs = await infer_v2(pool, request, headers)       # RemoteAnswer
    stream = await open_generation(pool, body, "/chat/completions", headers, stream=True,
                                   prompt=b"...", session=None)
    async for chunk in stream.chunks():                     # the replica's bytes as they come
        ...

Each request goes to the replica the pool's policy picks. Until anything of its answer
has been passed on, a request that a replica fails (a refused or broken connection, a
timeout, a 502/503/504, a 429, or a 500 when ``idempotent``) is sent to another
replica, within the pool's retry budget (a refused connection, which sent nothing, is
retried outside it). A streamed answer is committed at its first
bytes: a replica that breaks after that ends the stream with an error event (the
caller's), never a silent cut. The client's headers are not passed on, except those the
pool lists in ``forward_headers``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import orjson

from tradeoff.errors import (
    BadGateway,
    InvalidInput,
    ModelLoadError,
    NotFound,
    PayloadTooLarge,
    RequestError,
    Unavailable,
    failure_text,
)
from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol.http_client import Connection, Response
from tradeoff.protocol.openai_answers import finished_text
from tradeoff.protocol.v2 import (
    RelayedAnswer,
    TensorOutput,
    V2Request,
    decode_response,
    encode_request,
    read_relayed,
)
from tradeoff.repository.router import Signature
from tradeoff.scheduling.request import Timings
from tradeoff.server.asgi import off_loop_if_large
from tradeoff.server.grpc_replica import infer_request, response_outputs
from tradeoff.server.replica_pool import Replica, ReplicaPool

__all__ = ["MAX_SERVER_TIMING", "STREAM_BUFFER_BYTES", "GenerationCopy", "Pieces",
           "RemoteAnswer", "RemoteStream", "infer_v2", "open_generation", "outgoing_headers",
           "passed_on_timing", "pool_signature"]

# a replica's status that says it never ran the request: always safe to send elsewhere
_NOT_RUN = {429, 503}
# a streamed answer's bytes held for a client reading slowly before the replica's
# connection is no longer read
STREAM_BUFFER_BYTES = 1 << 20
_GATEWAY_FAILURES = {502, 504}
MAX_SERVER_TIMING = 1024  # a replica's Server-Timing passed on; a longer one is not
_KEYS_HINT = (" (the pool's own key comes from its api_key_env; the client's credentials "
              "are passed on only when its forward_headers lists their header)")


@dataclass
class RemoteAnswer:
    """A v2 answer from a replica: which one, the version it says answered, and the
    outputs as the client asked for them."""

    replica: str
    version: str
    timings: Timings
    outputs: list[TensorOutput] | RelayedAnswer  # relayed: as the replica sent them


def outgoing_headers(pool: ReplicaPool, client: dict[bytes, bytes], content_type: str
                     ) -> dict[str, str]:
    """The headers a request to a replica carries: its content type, and the client's
    headers that the pool's ``forward_headers`` names (credentials stay here unless
    listed)."""
    headers = {"Content-Type": content_type}
    for name in pool.config.forward_headers:
        value = client.get(name.encode())
        if value is not None:
            headers[name] = value.decode("latin-1")
    return headers


async def infer_v2(pool: ReplicaPool, request: V2Request, client_headers: dict[bytes, bytes],
                   idempotent: bool = False, relay: bool = False) -> RemoteAnswer:
    """Send a tensor request to a replica of ``pool`` (v2 over HTTP, or over gRPC with raw
    contents) and read its answer. ``relay``: a request that came as a v2 HTTP body
    (``request.wire``) goes on as it came, and its answer comes back as the replica sent
    it (a RelayedAnswer: the tensors neither decoded nor encoded again); otherwise the
    request goes with binary tensors and the answer's are decoded."""
    if pool.config.protocol == "v2-grpc":
        return await _infer_grpc(pool, request, client_headers, idempotent)
    wire = request.wire if relay else None
    json_length: int | None
    body, json_length = encode_request(request) if wire is None else wire
    headers = outgoing_headers(pool, client_headers, "application/json" if json_length is
                               None else "application/octet-stream")
    if json_length is not None:
        headers["Inference-Header-Content-Length"] = str(json_length)
    path = f"/v2/models/{pool.config.model}/infer"
    exchange = await _exchange(pool, lambda r: _send(pool, r, r.request("POST", path, body,
                                                                       headers),
                                                     False, idempotent))
    assert exchange.response is not None
    return await _answer(pool, exchange.replica, len(exchange.response.body),
                         _http_outputs if wire is None else _relayed, exchange.response,
                         request, exchange.response.headers.get(b"server-timing"))


async def _answer(pool: ReplicaPool, replica: Replica, size: int,
                  read: Callable[[Any, V2Request],
                                 tuple[str, list[TensorOutput] | RelayedAnswer]],
                  response: Any, request: V2Request,
                  server_timing: bytes | str | None) -> RemoteAnswer:
    """A replica's answer read (``read``: its version and outputs; off the loop when
    ``size`` is large), its ``server_timing`` passed on; BadGateway, counted as the
    replica's failure, when it cannot be read."""
    try:
        version, outputs = await off_loop_if_large(size, read, response, request)
    except (InvalidInput, ValueError) as exc:
        pool.request_failed(replica, "an unreadable answer")
        raise BadGateway(f"replica {replica.name} of pool {pool.config.name!r} "
                         f"answered what cannot be read: {exc}") from None
    timings = Timings()
    timings.route = f"{pool.config.name}@{replica.name}"
    timings.upstream = passed_on_timing(server_timing)
    return RemoteAnswer(replica.name, version, timings, outputs)


def passed_on_timing(value: bytes | str | None) -> str:
    """A replica's Server-Timing, to pass on: "" when it sent none, or one that is not
    short printable text."""
    if value is None or len(value) > MAX_SERVER_TIMING:
        return ""
    text = value.decode("latin-1") if isinstance(value, bytes) else value
    return text if text.isascii() and text.isprintable() else ""


def _json_length(response: Response) -> int | None:
    """A v2 HTTP answer's Inference-Header-Content-Length (None: all of it is JSON)."""
    length = response.headers.get(b"inference-header-content-length")
    return int(length) if length is not None and length.isdigit() else None


def _http_outputs(response: Response, request: V2Request) -> tuple[str, list[TensorOutput]]:
    """A v2 HTTP answer's version and outputs, each binary or JSON as the client asked."""
    answer = decode_response(response.body, _json_length(response))
    for output in answer.outputs:
        output.binary = request.binary_for(output.name)
    return answer.model_version, answer.outputs


def _relayed(response: Response, request: V2Request) -> tuple[str, RelayedAnswer]:
    """A v2 HTTP answer to pass on as it came (asked for as the client asked)."""
    answer = read_relayed(response.body, _json_length(response))
    return str(answer.header.get("model_version", "")), answer


def _grpc_outputs(response: pb.ModelInferResponse, request: V2Request
                  ) -> tuple[str, list[TensorOutput]]:
    return response.model_version, response_outputs(response, request)


async def pool_signature(pool: ReplicaPool) -> tuple[Signature, int]:
    """What the pool's model takes and gives, and its max_batch_size, as a ready replica
    says (its v2 metadata and config); ModelLoadError when none can say."""
    model = pool.config.model
    problems = []
    for replica in pool.replicas:
        if not replica.ready:
            problems.append(f"{replica.name}: not ready")
            continue
        if replica.grpc is not None:
            try:
                return await replica.grpc.signature(model, pool.config.timeout_s)
            except grpc.aio.AioRpcError as exc:
                problems.append(f"{replica.name}: ModelMetadata failed: "
                                f"{exc.code().name}: {exc.details()}")
                continue
        connection = await replica.acquire()
        kept = False
        try:
            metadata = await connection.request(
                replica.request("GET", f"/v2/models/{model}"), timeout=pool.config.timeout_s)
            config = await connection.request(
                replica.request("GET", f"/v2/models/{model}/config"),
                timeout=pool.config.timeout_s)
            kept = True
        except (OSError, TimeoutError, ConnectionError) as exc:
            problems.append(f"{replica.name}: {failure_text(exc)}")
            continue
        finally:
            replica.release(connection, kept)
        if metadata.status != 200:
            hint = " (a replica that wants a key: set the pool's api_key_env)" \
                if metadata.status in (401, 403) else ""
            problems.append(f"{replica.name}: /v2/models/{model} answered {metadata.status}: "
                            f"{_error_message(metadata.body)}{hint}")
            continue
        try:
            doc = orjson.loads(metadata.body)
            signature = Signature(*(tuple((t["name"], t["datatype"], tuple(t["shape"]))
                                          for t in doc[kind]) for kind in ("inputs", "outputs")))
        except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
            problems.append(f"{replica.name}: its metadata cannot be read ({exc})")
            continue
        batch = 0
        if config.status == 200:
            try:
                batch = int(orjson.loads(config.body).get("max_batch_size", 0))
            except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
                batch = 0
        return signature, batch
    raise ModelLoadError(f"pool {pool.config.name!r}: no replica told model {model!r}'s "
                         f"inputs and outputs ({'; '.join(problems)})")


class Pieces:
    """A streamed answer's pieces as they arrive from the replica, until the client takes
    them. Past ``limit`` bytes waiting (a client that reads slowly), the replica's
    connection is no longer read, so its window fills and the replica's own flow control
    holds its writes, until the client has taken half of them. Only a 200's pieces are
    held back so: any other answer is read whole (within the connection's bound) to be
    answered with."""

    def __init__(self, connection: Connection | None, limit: int = STREAM_BUFFER_BYTES
                 ) -> None:
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        self.statuses: list[int] = []
        self.waiting = 0  # bytes
        self.paused = False
        self.was_paused = False
        self._connection = connection
        self._limit = limit

    def put(self, status: int, piece: bytes) -> None:
        """What arrived (the connection's ``on_body``)."""
        self.statuses.append(status)
        self.queue.put_nowait(piece)
        self.waiting += len(piece)
        if not self.paused and self.waiting > self._limit and status == 200 and \
                self._connection is not None:
            self.paused = self.was_paused = True
            self._connection.pause_reading()

    def taken(self, piece: bytes) -> bytes:
        """``piece`` was taken to pass on."""
        self.waiting -= len(piece)
        if self.paused and self.waiting <= self._limit // 2:
            self.paused = False
            assert self._connection is not None
            self._connection.resume_reading()
        return piece


class RemoteStream:
    """A replica's answer being passed on: its bytes as they come (:meth:`chunks`)."""

    def __init__(self, pool: ReplicaPool, replica: Replica, connection: Connection | None,
                 task: asyncio.Future[Response], pieces: Pieces, first: bytes,
                 started: float) -> None:
        self.pool = pool
        self.replica = replica
        self._connection = connection
        self._task = task
        self._pieces = pieces
        self._first = first
        self._started = started
        self._ended = False

    @property
    def buffered(self) -> int:
        """Bytes of the answer arrived and not yet passed on."""
        return self._pieces.waiting

    @classmethod
    def whole(cls, pool: ReplicaPool, replica: Replica, response: Response,
              started: float | None = None) -> RemoteStream:
        """A whole answer as one chunk, its connection given back: counted already, or
        (``started``: when it was sent) counted once it is passed on."""
        done: asyncio.Future[Response] = asyncio.get_running_loop().create_future()
        done.set_result(response)
        stream = cls(pool, replica, None, done, Pieces(None), response.body,
                     0.0 if started is None else started)
        stream._ended = started is None
        return stream

    async def chunks(self) -> AsyncIterator[bytes]:
        """The answer's bytes; BadGateway when the replica breaks off before its end."""
        if self._first:
            yield self._first
        pieces, task = self._pieces, self._task
        queue = pieces.queue
        if self._connection is None:  # a whole answer: it was all in the first bytes
            self._end(True)
            return
        while True:
            if queue.empty():
                if task.done():
                    break
                getter = asyncio.ensure_future(queue.get())
                waited: set[asyncio.Future[Any]] = {getter, task}
                await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
                if not getter.done():
                    getter.cancel()
                    continue
                yield pieces.taken(getter.result())
            else:
                yield pieces.taken(queue.get_nowait())
        if task.cancelled():  # closed: the client left
            self._end(None)
            return
        error = task.exception()
        if isinstance(error, TimeoutError) and pieces.was_paused:
            # the answer's time ran out while the client was slow to read it: the
            # replica's fault no more than the client's, so not counted against it
            self._end(None)
            raise BadGateway(f"the answer from replica {self.replica.name} took longer "
                             f"than the pool's timeout_s ({self.pool.config.timeout_s:g} s),"
                             " held back by a client reading it slowly")
        if error is not None:
            self._end(False)
            self.pool.request_failed(self.replica, f"its answer broke off: {failure_text(error)}")
            raise BadGateway(f"replica {self.replica.name} of pool {self.pool.config.name!r}"
                             f" broke off its answer: {failure_text(error)}")
        self._end(True)

    def close(self) -> None:
        """The client left, or the answer was passed on whole: stop reading it."""
        if not self._ended:
            self._task.cancel()
            self._end(None)

    def _end(self, ok: bool | None) -> None:
        if self._ended:
            return
        self._ended = True
        self.replica.in_flight -= 1
        if self._connection is not None:  # None: given back already (a whole answer)
            self.replica.release(self._connection, kept=ok is True and self._task.done())
        if ok:
            self.replica.finished(True, time.perf_counter() - self._started, timed=False)


async def open_generation(pool: ReplicaPool, body: dict[str, Any], path: str,
                          client_headers: dict[bytes, bytes], *, stream: bool,
                          prompt: bytes, session: str | None,
                          idempotent: bool = False) -> RemoteStream:
    """Send an OpenAI request (``path``: /completions or /chat/completions) to a replica
    of ``pool``, its ``model`` field set to the pool's; returns once its answer is
    committed (its first bytes of a 200)."""
    sent = dict(body, model=pool.config.model)
    payload = orjson.dumps(sent)
    headers = outgoing_headers(pool, client_headers, "application/json")
    blocks = pool.prefixes.blocks(prompt) if pool.prefixes is not None else None
    exchange = await _exchange(pool, lambda r: _send(pool, r, r.request("POST", path,
                                                                       payload, headers),
                                                     stream, idempotent),
                               prefix=blocks, session=session)
    if exchange.stream is not None:
        return exchange.stream
    assert exchange.response is not None  # a whole answer, counted and given back already
    return RemoteStream.whole(pool, exchange.replica, exchange.response)


@dataclass(frozen=True)
class GenerationCopy:
    """An OpenAI request as a shadow copy sends it again, to a pool: its body (as the
    primary target was sent it), ``path``, the client's headers, and the ``prompt`` the
    pool matches prefixes on."""

    body: dict[str, Any]
    path: str
    client_headers: dict[bytes, bytes]
    prompt: bytes

    async def text(self, pool: ReplicaPool, max_tokens: int | None = None) -> str:
        """The text of the whole answer a replica of ``pool`` gives (asked unstreamed;
        ``max_tokens`` set when the primary's was not the client's), if it ended
        normally; BadGateway when the answer is not one, or ended otherwise."""
        body = {k: v for k, v in self.body.items() if k not in ("stream", "stream_options")}
        if max_tokens is not None:
            body.pop("max_completion_tokens", None)
            body["max_tokens"] = max_tokens
        stream = await open_generation(pool, body, self.path, self.client_headers,
                                       stream=False, prompt=self.prompt, session=None)
        try:
            answer = b"".join([chunk async for chunk in stream.chunks()])
        finally:
            stream.close()
        try:
            return await off_loop_if_large(len(answer), finished_text, answer,
                                           self.path.endswith("/chat/completions"))
        except ValueError as exc:
            raise BadGateway(f"replica {stream.replica.name} of pool "
                             f"{pool.config.name!r}: {exc}") from None


class _NotSent(Unavailable):
    """The replica refused the connection: the request never left the gateway."""


@dataclass
class _Exchange:
    replica: Replica
    response: Response | None = None      # a whole answer
    stream: RemoteStream | None = None    # an answer being passed on
    grpc: pb.ModelInferResponse | None = None  # a gRPC replica's answer
    server_timing: str | None = None  # ... and its Server-Timing (trailing metadata)


async def _exchange(pool: ReplicaPool,
                    send: Callable[[Replica], Awaitable[_Exchange | RequestError]], *,
                    prefix: list[int] | None = None, session: str | None = None
                    ) -> _Exchange:
    """One request through the pool: a replica by the policy, then others while it fails
    before any answer was passed on and the retry budget allows."""
    tried: set[int] = set()
    error: RequestError | None = None
    while True:
        replica = pool.choose(tried, prefix, session)
        if replica is None:
            raise error or Unavailable(pool.unavailable_reason())
        # a request that never reached a replica costs the others nothing: retried freely
        retry = bool(tried) and not isinstance(error, _NotSent)
        if retry and not pool.may_retry():
            assert error is not None
            raise error
        tried.add(replica.index)
        replica.stats.requests += 1
        replica.in_flight += 1
        if retry:
            pool.retries_in_flight += 1
            replica.stats.retries += 1
        committed = False
        try:
            result = await send(replica)
            if isinstance(result, RequestError):
                error = result
                continue
            committed = True
            return result
        finally:
            if retry:
                pool.retries_in_flight -= 1
            if not committed or result.stream is None:  # type: ignore[union-attr]
                replica.in_flight -= 1


async def _open_stream(pool: ReplicaPool, replica: Replica, connection: Connection,
                       raw: bytes, started: float) -> _Exchange | Response:
    """Send a request whose answer is passed on as it comes: the exchange once its first
    bytes are a 200's, else the whole response (an error, or an answer that was whole
    before its first bytes were looked at)."""
    pieces = Pieces(connection)
    queue = pieces.queue
    task = asyncio.ensure_future(connection.request(raw, on_body=pieces.put,
                                                    timeout=pool.config.timeout_s))
    try:
        getter = asyncio.ensure_future(queue.get())
        waited: set[asyncio.Future[Any]] = {getter, task}
        await asyncio.wait(waited, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            first = pieces.taken(getter.result())
            if pieces.statuses[0] == 200:  # committed: passed on from here
                replica.observe(time.perf_counter() - started)
                return _Exchange(replica, stream=RemoteStream(
                    pool, replica, connection, task, pieces, first, started))
        else:
            getter.cancel()
            first = b""
        response = await task
    except asyncio.CancelledError:
        task.cancel()
        raise
    chunks = [first]
    while not queue.empty():
        chunks.append(pieces.taken(queue.get_nowait()))
    response.body = b"".join(chunks)
    return response


async def _send(pool: ReplicaPool, replica: Replica, raw: bytes, stream: bool,
                idempotent: bool) -> _Exchange | RequestError:
    """One try at one replica: the exchange, or the error to answer with if no other
    replica does better (raised when the request itself is at fault)."""
    started = time.perf_counter()
    connection = await replica.acquire()
    name = f"replica {replica.name} of pool {pool.config.name!r}"
    try:
        if stream:
            opened = await _open_stream(pool, replica, connection, raw, started)
            if isinstance(opened, _Exchange):
                return opened
            response = opened
        else:
            response = await connection.request(raw, timeout=pool.config.timeout_s)
    except asyncio.CancelledError:
        replica.release(connection, kept=False)
        raise
    except (OSError, TimeoutError, ConnectionError) as exc:
        replica.release(connection, kept=False)
        why = failure_text(exc)
        pool.request_failed(replica, why)
        if isinstance(exc, ConnectionRefusedError):
            return _NotSent(f"{name} refused the connection: {why}")
        return Unavailable(f"{name} could not answer: {why}")
    replica.release(connection, kept=True)
    if stream and response.status == 200:  # whole before its first bytes were looked at
        return _Exchange(replica, stream=RemoteStream.whole(pool, replica, response,
                                                            started))
    status = response.status
    if status == 200:
        replica.finished(True, time.perf_counter() - started)
        return _Exchange(replica, response=response)
    message = _error_message(response.body)
    if status in _NOT_RUN:
        replica.stats.refused += 1
        return Unavailable(f"{name} is busy ({status}): {message}")
    if status in _GATEWAY_FAILURES or (status >= 500 and idempotent):
        pool.request_failed(replica, f"status {status}")
        return BadGateway(f"{name} failed the request ({status}): {message}")
    if status == 404:
        pool.request_failed(replica, "it does not serve the model")
        return NotFound(f"{name} does not serve model {pool.config.model!r}: {message}")
    replica.finished(False)
    if status in (401, 403):
        raise BadGateway(f"{name} refused the gateway ({status}): {message}{_KEYS_HINT}")
    if status == 413:
        raise PayloadTooLarge(f"{name}: {message}")
    if 400 <= status < 500:
        raise InvalidInput(f"{name}: {message}")
    raise BadGateway(f"{name} failed the request ({status}): {message}")


async def _infer_grpc(pool: ReplicaPool, request: V2Request,
                      client_headers: dict[bytes, bytes], idempotent: bool) -> RemoteAnswer:
    message = infer_request(request, pool.config.model)
    metadata = tuple((k.lower(), v) for k, v in
                     outgoing_headers(pool, client_headers, "").items()
                     if k.lower() != "content-type")
    exchange = await _exchange(pool, lambda r: _send_grpc(pool, r, message, metadata,
                                                          idempotent))
    assert exchange.grpc is not None
    return await _answer(pool, exchange.replica, exchange.grpc.ByteSize(), _grpc_outputs,
                         exchange.grpc, request, exchange.server_timing)


async def _send_grpc(pool: ReplicaPool, replica: Replica, message: pb.ModelInferRequest,
                     metadata: tuple[tuple[str, str], ...],
                     idempotent: bool) -> _Exchange | RequestError:
    """One try at one gRPC replica, its status codes read as :func:`_send` reads HTTP's."""
    assert replica.grpc is not None
    name = f"replica {replica.name} of pool {pool.config.name!r}"
    started = time.perf_counter()
    await replica.take_slot()
    try:
        response, server_timing = await replica.grpc.infer(message, pool.config.timeout_s,
                                                           metadata)
    except grpc.aio.AioRpcError as exc:
        code, details = exc.code(), exc.details() or ""
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            replica.stats.refused += 1
            return Unavailable(f"{name} is busy ({code.name}): {details}")
        if code == grpc.StatusCode.UNAVAILABLE:  # a stopping server, or no connection
            pool.request_failed(replica, f"{code.name}: {details}")
            return _NotSent(f"{name} could not take the request ({code.name}): {details}")
        if code == grpc.StatusCode.DEADLINE_EXCEEDED or (
                idempotent and code in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN)):
            pool.request_failed(replica, code.name)
            return BadGateway(f"{name} failed the request ({code.name}): {details}")
        if code == grpc.StatusCode.NOT_FOUND:
            pool.request_failed(replica, "it does not serve the model")
            return NotFound(f"{name} does not serve model {pool.config.model!r}: {details}")
        replica.finished(False)
        if code == grpc.StatusCode.INVALID_ARGUMENT:
            raise InvalidInput(f"{name}: {details}") from None
        if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED):
            raise BadGateway(f"{name} refused the gateway ({code.name}): "
                             f"{details}{_KEYS_HINT}") from None
        raise BadGateway(f"{name} failed the request ({code.name}): {details}") from None
    finally:
        replica.give_slot()
    replica.finished(True, time.perf_counter() - started)
    return _Exchange(replica, grpc=response, server_timing=server_timing)


def _error_message(body: bytes) -> str:
    """A replica's error text: v2's {"error": "..."}, OpenAI's {"error": {"message"}}, or
    the body's start."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return body[:200].decode("utf-8", "replace") or "no message"
    error = doc.get("error") if isinstance(doc, dict) else None
    if isinstance(error, dict):
        error = error.get("message")
    return str(error)[:500] if error else str(doc)[:200]
