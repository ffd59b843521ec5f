"""The OpenAI-compatible API for generative models: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, with ``stream: true`` as
server-sent events ending in ``data: [DONE]``, ``usage`` (and, with
``stream_options.include_usage``, a last chunk carrying it), and errors in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.


Like the v2 routes, these handlers only translate: admission, API keys, readiness and
shutdown are the data plane's (:meth:`DataPlane.generate` tokenizes and queues).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from tradeoff.errors import InvalidInput, RequestError
from tradeoff.repository.router import PRIORITY_LIMIT
from tradeoff.server.access import TENANT, Access
from tradeoff.server.asgi import (
    DisconnectWatch,
    Receive,
    Scope,
    Send,
    send_json,
)
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.generation import Finished, Generation, TextDelta, Usage
from tradeoff.server.router import RoutedModel

__all__ = ["OpenAIApi", "error_document", "sampling_params", "send_error"]

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


# The request fields the /v1 handlers read, with their JSON schemas: server/openapi.py
# describes the requests from these, and tests/unit/test_request_fields.py checks that
# every key the handlers read is one of them (or refused).
GENERATION_FIELDS: dict[str, Any] = {
    "model": {"type": "string"},
    "max_tokens": {"type": "integer", "minimum": 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1,
                              "description": "OpenAI's newer name of max_tokens"},
    "temperature": {"type": "number", "minimum": 0},
    "top_p": {"type": "number"},
    "top_k": {"type": "integer", "minimum": 0},
    "seed": {"type": "integer"},
    "stop": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object", "properties": {"include_usage": {"type": "boolean"}}},
    "ignore_eos": {"type": "boolean"},
    "cache": {"type": "boolean", "description": "false: skip the response cache"},
    "user": {"type": "string", "description": "the end user (a router's sticky key)"},
    "class": {"type": "string", "description": "a router's request class"},
    "priority": {"type": "integer", "minimum": -(2**31), "maximum": 2**31 - 1,
                 "description": "the engine's order under scheduling: priority (lower "
                                "first, as vLLM's); below the key's allowance (serve "
                                "--priority-floor, 0 by default) it is served at the "
                                "allowance; a router's route may set it"},
    "n": {"type": "integer", "enum": [1]},
    "best_of": {"type": "integer", "enum": [1]},
}
COMPLETION_FIELDS: dict[str, Any] = {
    **GENERATION_FIELDS,
    "prompt": {"oneOf": [{"type": "string"},
                         {"type": "array", "items": {"type": "string"}, "maxItems": 1}]},
}
MESSAGE_FIELDS: dict[str, Any] = {"role": {"type": "string"}, "content": {"type": "string"}}
CHAT_FIELDS: dict[str, Any] = {
    **GENERATION_FIELDS,
    "messages": {"type": "array", "minItems": 1, "items": {
        "type": "object", "required": ["role", "content"], "properties": MESSAGE_FIELDS}},
}
# read only to refuse them when set: not in the schema
REFUSED_FIELDS = ("logprobs", "top_logprobs", "echo", "logit_bias", "suffix")

def _number(doc: dict[str, Any], key: str, default: float, kind: type = float) -> Any:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and not isinstance(value, int)):
        raise InvalidInput(f"'{key}' must be {'an integer' if kind is int else 'a number'}")
    return kind(value)


def sampling_params(doc: dict[str, Any], max_default: int) -> Any:
    from tradeoff.generate.sampling import SamplingParams

    stop = doc.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("'stop' must be a string or a list of strings")
    if doc.get("n", 1) not in (1, None):
        raise InvalidInput("only n=1 is supported")
    for unsupported in REFUSED_FIELDS:
        if doc.get(unsupported):  # refused rather than silently ignored
            raise InvalidInput(f"'{unsupported}' is not supported by this server")
    if doc.get("best_of", 1) not in (1, None):
        raise InvalidInput("only best_of=1 is supported")
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)
                             or not -(2**63) <= seed < 2**64):
        raise InvalidInput("'seed' must be an integer from -2**63 to 2**64 - 1")
    max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
    return SamplingParams(
        max_tokens=max_default if max_tokens is None else _number(
            {"max_tokens": max_tokens}, "max_tokens", 16, int),
        temperature=_number(doc, "temperature", 1.0), top_p=_number(doc, "top_p", 1.0),
        top_k=_number(doc, "top_k", 0, int), seed=seed, stop=tuple(stop),
        ignore_eos=bool(doc.get("ignore_eos", False)))


class OpenAIApi:
    """The ``/v1`` handlers of the HTTP app (the route table names them)."""

    def __init__(self, dataplane: DataPlane,
                 read_json: Callable[[Scope, Receive], Awaitable[dict[str, Any]]],
                 access: Access | None = None) -> None:
        self.dataplane = dataplane
        self._json = read_json  # the body as a JSON object, within --max-body-memory
        self.access = access or Access()  # whose priority is honoured how far

    async def openai_models(self, scope: Scope, receive: Receive, send: Send,
                            params: dict[str, str]) -> None:
        aliases = [{"id": r.name, "object": "model", "created": 0, "owned_by": "tradeoff"}
                   for r in self.dataplane.manager.served_versions()
                   if isinstance(r, RoutedModel) and r.generative]
        await send_json(send, 200, {"object": "list", "data": [
            *({"id": m.name, "object": "model", "created": m.created, "owned_by": "tradeoff"}
              for m in self.dataplane.generative_models()), *aliases]})

    async def completions(self, scope: Scope, receive: Receive, send: Send,
                          params: dict[str, str]) -> None:
        doc = await self._json(scope, receive)
        prompt = doc.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1:
            prompt = prompt[0]
        if not isinstance(prompt, str):
            raise InvalidInput("'prompt' must be a string")
        await self._generate(doc, prompt, False, receive, send, scope)

    async def chat_completions(self, scope: Scope, receive: Receive, send: Send,
                               params: dict[str, str]) -> None:
        doc = await self._json(scope, receive)
        messages = doc.get("messages")
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str)
                and isinstance(m.get("content"), str) for m in messages):
            raise InvalidInput("'messages' must be a non-empty list of "
                               "{role, content} objects with string content")
        await self._generate(doc, messages, True, receive, send, scope)

    async def _generate(self, doc: dict[str, Any], prompt: str | list[dict[str, str]],
                        chat: bool, receive: Receive, send: Send, scope: Scope) -> None:
        name = doc.get("model")
        if not isinstance(name, str):
            raise InvalidInput("'model' must name a model (GET /v1/models lists them)")
        params = sampling_params(doc, max_default=16)
        stream = bool(doc.get("stream", False))
        options = doc.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        wants_cache = doc.get("cache", True)
        if not isinstance(wants_cache, bool):
            raise InvalidInput("'cache' must be true or false")
        # only whole answers that the same request always gets again are cached
        cacheable = wants_cache and not stream and params.deterministic
        priority = _number(doc, "priority", 0, int)
        if not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT:
            raise InvalidInput("'priority' must be an integer from -2**31 to 2**31 - 1")
        # a caller may make itself less urgent, more only as far as its key allows (a
        # router's route priority, the operator's, replaces it whatever it is)
        priority = self.access.priority(scope.get(TENANT, b""), priority)
        generation = await self.dataplane.generate(
            name, prompt, params, priority=priority, cache=cacheable,
            route_parameters=_route_parameters(doc, scope), tenant=scope.get(TENANT, b""))
        reply = _Reply(generation, chat)
        async with generation:
            with DisconnectWatch(receive, generation.abort):
                if not await generation.begin():  # a refusal raises before anything is sent
                    return  # the client left while its request waited
                if stream:
                    await reply.stream(send, include_usage)
                else:
                    await reply.whole(send)


def _route_parameters(doc: dict[str, Any], scope: Scope) -> dict[str, Any]:
    """What a router reads from an OpenAI request: the body's ``class`` (or the header
    X-Tradeoff-Class) and ``user`` (OpenAI's end-user id: the sticky key)."""
    out = {key: doc[key] for key in ("class", "user") if isinstance(doc.get(key), str)}
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
