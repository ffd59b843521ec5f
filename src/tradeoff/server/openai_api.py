"""The OpenAI-compatible API for generative models: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, with ``stream: true`` as
server-sent events ending in ``data: [DONE]``, ``usage`` (and, with
``stream_options.include_usage``, a last chunk carrying it), and errors in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.


Like the v2 routes, these handlers only translate: admission, API keys, readiness and
shutdown are the data plane's (:meth:`DataPlane.generate` tokenizes and queues); the
bodies are the types of :mod:`tradeoff.server.openai_requests`, which check them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from tradeoff.errors import RequestError
from tradeoff.protocol.openai_answers import AnswerReader
from tradeoff.repository.router import Target
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority
from tradeoff.server.access import TENANT, Access
from tradeoff.server.asgi import (
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    off_loop_if_large,
    send_json,
)
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.gateway import GenerationCopy, RemoteStream, open_generation
from tradeoff.server.generation import Finished, Generation, TextDelta, Usage
from tradeoff.server.generations import Prompt
from tradeoff.server.openai_requests import (
    Body,
    ChatRequest,
    CompletionRequest,
    GenerationRequest,
    decode,
)
from tradeoff.server.router import SHADOW_IN_FLIGHT, RoutedModel

__all__ = ["OpenAIApi", "error_document", "send_error"]

log = logging.getLogger("tradeoff.server")
# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "invalid_request_error",
                503: "service_unavailable", 500: "server_error"}


def error_document(exc: Exception) -> dict[str, Any]:
    """An error in OpenAI's shape."""
    status = exc.status if isinstance(exc, RequestError) else 500
    return {"error": {"message": str(exc), "type": _ERROR_TYPES.get(status, "server_error"),
                      "param": None, "code": None}}


async def send_error(send: Send, exc: RequestError,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    status = exc.status
    headers = (headers or []) + ([(b"retry-after", b"1")] if status == 503 else
                                 [(b"www-authenticate", b"Bearer")] if status == 401 else [])
    await send_json(send, status, error_document(exc), headers)


class OpenAIApi:
    """The ``/v1`` handlers of the HTTP app (the route table names them)."""

    def __init__(self, dataplane: DataPlane,
                 read_json: Callable[[Scope, Receive], Awaitable[bytes]],
                 access: Access | None = None) -> None:
        self.dataplane = dataplane
        self._json = read_json  # the body's JSON text, within --max-body-memory
        self.access = access or Access()  # whose priority is honoured how far

    async def openai_models(self, scope: Scope, receive: Receive, send: Send,
                            params: dict[str, str]) -> None:
        aliases = [{"id": r.name, "object": "model", "created": 0, "owned_by": "tradeoff"}
                   for r in self.dataplane.manager.served_versions()
                   if isinstance(r, RoutedModel) and r.generative]
        await send_json(send, 200, {"object": "list", "data": [
            *({"id": m.name, "object": "model", "created": m.created, "owned_by": "tradeoff"}
              for m in self.dataplane.generations.models()), *aliases]})

    async def completions(self, scope: Scope, receive: Receive, send: Send,
                          params: dict[str, str]) -> None:
        body, request = await self._body(scope, receive, CompletionRequest)
        local = await self._through_pools(request, body, "/completions", request.text,
                                          request.prompt_bytes, receive, send, scope)
        if local is not None:
            await self._generate(request, request.text, False, receive, send, scope, local)

    async def chat_completions(self, scope: Scope, receive: Receive, send: Send,
                               params: dict[str, str]) -> None:
        body, request = await self._body(scope, receive, ChatRequest)
        local = await self._through_pools(request, body, "/chat/completions",
                                          request.messages, request.prompt_bytes, receive,
                                          send, scope)
        if local is not None:
            await self._generate(request, request.messages, True, receive, send, scope,
                                 local)

    async def _body(self, scope: Scope, receive: Receive, body_type: type[Body]
                    ) -> tuple[bytes, Body]:
        body = await self._json(scope, receive)
        request: Body = await off_loop_if_large(len(body), decode, body_type, body)
        return body, request

    async def _through_pools(self, request: GenerationRequest, body: bytes, path: str,
                             prompt: Prompt, prompt_bytes: bytes, receive: Receive,
                             send: Send, scope: Scope) -> _Local | None:
        """A request for a router with pools: sent to the target its rules choose, a
        pool's replica (its answer passed on as it comes: None, answered) or a model of
        this server (to generate here: the router that chose it and what it set). Any
        other request is generated here as it names its model. ``prompt_bytes``: what a
        pool matches prefixes on."""
        if self.dataplane.shutting_down:
            return _Local()  # refused where every request is
        routed = self.dataplane.manager.models.get(request.model)
        router = routed.latest if routed is not None else None
        if not isinstance(router, RoutedModel) or not router.pools or not router.generative:
            return _Local()
        parameters = _route_parameters(request, scope)
        headers = dict(scope["headers"])
        doc = await off_loop_if_large(len(body), orjson.loads, body)

        decision = router.decide(parameters)
        route_priority = router.config.routes[decision.route].priority  # checked at load
        # a route's priority replaces the client's; a client's own is held to what its
        # key allows here, as a local engine would hold it (the replica trusts the
        # gateway's key, not the client's claim)
        # (a shadow copy here runs at the priority the request would have had here)
        priority = self.access.priority(scope.get(TENANT, b""),
                                        request.priority or DEFAULT_GENERATION_PRIORITY)
        if route_priority is not None:
            priority = GenerationPriority(route_priority)
            doc = {**doc, "priority": route_priority}
        elif request.priority is not None:
            doc = {**doc, "priority": int(priority)}

        async def attempt(target: Target) -> RemoteStream | None:
            pool = router.pools.get(target.model)
            if pool is None:  # a model of this server: generated by the caller
                self.dataplane.manager.generative(target.model).check_accepting()
                return None
            session = None
            if pool.config.session == "user":
                session = request.user
            elif pool.config.session is not None:
                value = headers.get(pool.config.session.lower().encode())
                session = None if value is None else value.decode("latin-1")
            return await open_generation(pool, doc, path, headers,
                                         stream=bool(request.stream), prompt=prompt_bytes,
                                         session=session, idempotent=router.config.idempotent)

        stream, target = await router.send(parameters, attempt, timed=False,
                                           decision=decision)
        shadow_config = router.config.shadow
        copy = None  # only a shadow pool is sent the request again
        if shadow_config is not None and shadow_config.target.model in router.pools:
            copy = GenerationCopy(doc, path, headers, prompt_bytes)
        if stream is None:
            request.model = target.model
            return _Local(router, None if route_priority is None else
                          GenerationPriority(route_priority), copy)
        kept = shadow = None
        # a copy is drawn now, so that only its answer is read as it is passed on
        if shadow_config is not None and router.shadows_in_flight < SHADOW_IN_FLIGHT and \
                _deterministic(request):
            shadow = router.wants_shadow()
            if shadow is not None:
                kept = AnswerReader(path == "/chat/completions", bool(request.stream))
        await _relay(stream, bool(request.stream), f"{target.model}@{stream.replica.name}",
                     receive, send, kept)
        if shadow is not None and kept is not None:
            ours = await off_loop_if_large(kept.received, kept.text)
            if ours is not None:
                self._shadow(router, shadow, ours, prompt, request, priority, copy)
        return None

    def _shadow(self, router: RoutedModel, shadow: Target, ours: str, prompt: Prompt,
                request: GenerationRequest, priority: GenerationPriority,
                copy: GenerationCopy | None) -> None:
        """A shadow copy of an answer a pool gave: the same request to the shadow
        target, its answer's text compared with ``ours`` in the background."""
        generations = self.dataplane.generations
        params = request.sampling_params()

        async def compare(target: Target) -> None:
            theirs = await generations.answer_text(router, target, prompt, params,
                                                   priority, copy)
            router.stats.shadow.compare_text(ours, theirs)

        generations.in_background(router.copy_to(
            shadow, partial(generations.shadow_busy, router), compare))

    async def _generate(self, request: GenerationRequest, prompt: Prompt,
                        chat: bool, receive: Receive, send: Send, scope: Scope,
                        local: _Local) -> None:
        params = request.sampling_params()
        stream = bool(request.stream)
        # only whole answers that the same request always gets again are cached
        cacheable = request.cache and not stream and params.deterministic
        tenant = scope.get(TENANT, b"")
        # a caller may make itself less urgent, more only as far as its key allows (a
        # router's route priority, the operator's, replaces it whatever it is)
        priority = self.access.priority(tenant,
                                        request.priority or DEFAULT_GENERATION_PRIORITY)
        if local.priority is not None:  # a router's route chose it
            priority = local.priority
        generation = await self.dataplane.generate(
            request.model, prompt, params, priority=priority, cache=cacheable,
            route_parameters=_route_parameters(request, scope), tenant=tenant,
            via=local.via, copy=local.copy)
        reply = _Reply(generation, chat)
        async with generation:
            with DisconnectWatch(receive, generation.abort):
                if not await generation.begin():  # a refusal raises before anything is sent
                    return  # the client left while its request waited
                if stream:
                    await reply.stream(send, request.include_usage)
                else:
                    await reply.whole(send)


@dataclass(frozen=True)
class _Local:
    """A request generated by a model of this server: ``via`` the router with pools that
    chose it (None: it names its model or a router of local models), with the
    ``priority`` the route set and the request as a shadow pool gets it."""

    via: RoutedModel | None = None
    priority: GenerationPriority | None = None
    copy: GenerationCopy | None = None


def _deterministic(request: GenerationRequest) -> bool:
    """Whether the same request always gets the same answer (a shadow copy compares
    only those): greedy or seeded."""
    try:
        return request.sampling_params().deterministic
    except RequestError:  # the replica has said what it makes of the request
        return False


async def _relay(stream: RemoteStream, streaming: bool, route: str, receive: Receive,
                 send: Send, kept: Callable[[bytes], None] | None = None) -> None:
    """Pass a replica's answer on as it comes (each chunk to ``kept`` too, if given); a
    stream that breaks off ends with an error event and ``[DONE]``, never a silent
    cut."""
    headers = [(b"content-type", b"text/event-stream" if streaming else b"application/json"),
               (b"server-timing", f'route;desc="{route}"'.encode())]
    if streaming:
        headers.append((b"cache-control", b"no-cache"))
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    ended_event = True
    try:
        with DisconnectWatch(receive, stream.close):
            async for chunk in stream.chunks():
                ended_event = chunk.endswith(b"\n\n")
                if kept is not None:
                    kept(chunk)
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
    except RequestError as exc:
        request_log.warning("%s", exc)
        if streaming:
            await send({"type": "http.response.body", "more_body": True, "body":
                        (b"" if ended_event else b"\n\n") + b"data: " +
                        orjson.dumps(error_document(exc)) + b"\n\ndata: [DONE]\n\n"})
    finally:
        stream.close()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


def _route_parameters(request: GenerationRequest, scope: Scope) -> dict[str, Any]:
    """What a router reads from an OpenAI request: the body's ``class`` (or the header
    X-Tradeoff-Class) and ``user`` (OpenAI's end-user id: the sticky key)."""
    out = {key: value for key, value in (("class", request.request_class),
                                         ("user", request.user)) if value is not None}
    if "class" not in out:
        for header, value in scope["headers"]:
            if header == b"x-tradeoff-class":
                out["class"] = value.decode("latin-1")
    return out


class _Reply:
    """Formats one generation's outputs as OpenAI's answer: one JSON document, or
    server-sent events."""

    def __init__(self, generation: Generation, chat: bool) -> None:
        self.generation = generation
        self.chat = chat
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    @staticmethod
    def usage(usage: Usage) -> dict[str, Any]:
        return {"prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "total_tokens": usage.prompt_tokens + usage.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": usage.cached_tokens}}

    async def whole(self, send: Send) -> None:
        """Send the answer in one JSON document (nothing when the client left)."""
        pieces = []
        async for output in self.generation:
            if isinstance(output, TextDelta):
                pieces.append(output.text)
                continue
            text = "".join(pieces)
            if self.chat:
                choice: dict[str, Any] = {
                    "index": 0, "finish_reason": output.reason, "logprobs": None,
                    "message": {"role": "assistant", "content": text}}
            else:
                choice = {"index": 0, "text": text, "finish_reason": output.reason,
                          "logprobs": None}
            await send_json(send, 200, {
                "id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                "created": self.created, "model": self.generation.name, "choices": [choice],
                "usage": self.usage(output.usage)}, self._timing_header())

    def _timing_header(self) -> list[tuple[bytes, bytes]]:
        """``Server-Timing`` naming the router's target and the cache's verdict, when
        either applies."""
        parts = []
        generation = self.generation
        if generation.route:
            parts.append(f'route;desc="{generation.route}"')
        if generation.cache:
            parts.append(f"cache;desc={generation.cache};dur={generation.cache_ns / 1e6:.3f}")
        return [(b"server-timing", ", ".join(parts).encode())] if parts else []

    def _chunk(self, delta: str | None, reason: str | None, role: bool = False) -> bytes:
        if self.chat:
            piece: dict[str, Any] = {"role": "assistant"} if role else {}
            if delta is not None:
                piece["content"] = delta
            choice: dict[str, Any] = {"index": 0, "delta": piece, "finish_reason": reason,
                                      "logprobs": None}
        else:
            choice = {"index": 0, "text": delta or "", "finish_reason": reason,
                      "logprobs": None}
        doc = {"id": self.id, "object": "chat.completion.chunk" if self.chat else
               "text_completion", "created": self.created, "model": self.generation.name,
               "choices": [choice]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    async def stream(self, send: Send, include_usage: bool) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache"), *self._timing_header()]})

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if self.chat:
            await body(self._chunk("", None, role=True))
        finished: Finished | None = None
        try:
            async for output in self.generation:
                if isinstance(output, TextDelta):
                    if output.text:
                        await body(self._chunk(output.text, None))
                else:
                    finished = output
                    await body(self._chunk(None if self.chat else "", output.reason))
        except Exception as exc:  # headers are sent: the error is the last event
            if not isinstance(exc, RequestError):
                request_log.exception("model %s: a streamed answer failed",
                                      self.generation.name)
            await body(b"data: " + orjson.dumps(error_document(exc)) + b"\n\n")
        else:
            if finished is None:
                return  # the client left
            if include_usage:
                await body(b"data: " + orjson.dumps({
                    "id": self.id, "object": "chat.completion.chunk" if self.chat else
                    "text_completion", "created": self.created,
                    "model": self.generation.name, "choices": [],
                    "usage": self.usage(finished.usage)}) + b"\n\n")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})
