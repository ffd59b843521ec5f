"""The OpenAI-compatible API for generative models: ``GET /v1/models``,
``POST /v1/completions`` and ``POST /v1/chat/completions``, with ``stream: true`` as
server-sent events ending in ``data: [DONE]``, ``usage`` (and, with
``stream_options.include_usage``, a last chunk carrying it), and errors in OpenAI's shape:
``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from tradeoff.errors import InvalidInput, NotFound, RequestError
from tradeoff.protocol.v2 import parse_json_object
from tradeoff.server.access import Access
from tradeoff.server.generative import GenerativeModel, GenerativeModels, Handle

Send = Callable[[dict[str, Any]], Awaitable[None]]
Receive = Callable[[], Awaitable[dict[str, Any]]]

_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error",
                403: "permission_error", 404: "not_found_error", 413: "invalid_request_error",
                503: "service_unavailable", 500: "server_error"}


async def _send_json(send: Send, status: int, doc: Any,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps(doc)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()), *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, exc: RequestError) -> None:
    status = exc.status
    headers = [(b"retry-after", b"1")] if status == 503 else \
        [(b"www-authenticate", b"Bearer")] if status == 401 else []
    await _send_json(send, status, {"error": {
        "message": str(exc), "type": _ERROR_TYPES.get(status, "server_error"),
        "param": None, "code": None}}, headers)


def _number(doc: dict[str, Any], key: str, default: float, kind: type = float) -> Any:
    value = doc.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (kind is int and not isinstance(value, int)):
        raise InvalidInput(f"'{key}' must be {'an integer' if kind is int else 'a number'}")
    return kind(value)


def sampling_params(doc: dict[str, Any], max_default: int) -> Any:
    from tradeoff.scheduling.sampling import SamplingParams

    stop = doc.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
        raise InvalidInput("'stop' must be a string or a list of strings")
    if doc.get("n", 1) not in (1, None):
        raise InvalidInput("only n=1 is supported")
    seed = doc.get("seed")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InvalidInput("'seed' must be an integer")
    max_tokens = doc.get("max_completion_tokens", doc.get("max_tokens"))
    return SamplingParams(
        max_tokens=max_default if max_tokens is None else _number(
            {"max_tokens": max_tokens}, "max_tokens", 16, int),
        temperature=_number(doc, "temperature", 1.0), top_p=_number(doc, "top_p", 1.0),
        top_k=_number(doc, "top_k", 0, int), seed=seed, stop=tuple(stop),
        ignore_eos=bool(doc.get("ignore_eos", False)))


class OpenAIApi:
    """Handles every ``/v1/...`` request of the HTTP app."""

    def __init__(self, models: GenerativeModels, access: Access) -> None:
        self.models = models
        self.access = access

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send,
                       read_body: Callable[[], Awaitable[bytes]]) -> None:
        try:
            if self.access.enabled:
                self.access.check_headers(scope["headers"], admin=False)
            path, method = scope["path"].rstrip("/"), scope["method"]
            if path == "/v1/models" and method == "GET":
                return await _send_json(send, 200, {"object": "list", "data": [
                    {"id": m.name, "object": "model", "created": m.created,
                     "owned_by": "tradeoff"} for m in self.models.models.values()]})
            if path in ("/v1/completions", "/v1/chat/completions") and method == "POST":
                doc = parse_json_object(await read_body(), "request body")
                return await self._generate(doc, path.endswith("chat/completions"), receive,
                                            send)
            raise NotFound(f"no route {method} {scope['path']} in the OpenAI-compatible API")
        except RequestError as exc:
            await send_error(send, exc)

    async def _generate(self, doc: dict[str, Any], chat: bool, receive: Receive,
                        send: Send) -> None:
        name = doc.get("model")
        if not isinstance(name, str):
            raise InvalidInput("'model' must name a model (GET /v1/models lists them)")
        model = self.models.get(name)
        tokenizer = model.tokenizer
        if chat:
            messages = doc.get("messages")
            if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str) for m in messages):
                raise InvalidInput("'messages' must be a non-empty list of "
                                   "{role, content} objects with string content")
            prompt_text = tokenizer.chat(messages)
        else:
            prompt_text = doc.get("prompt")
            if isinstance(prompt_text, list) and len(prompt_text) == 1:
                prompt_text = prompt_text[0]
            if not isinstance(prompt_text, str):
                raise InvalidInput("'prompt' must be a string")
        prompt = tokenizer.encode(prompt_text)
        if not prompt:
            raise InvalidInput("the prompt is empty")
        params = sampling_params(doc, max_default=16)
        limit = model.decoder.config.max_position
        if len(prompt) + params.max_tokens > limit:
            raise InvalidInput(f"prompt ({len(prompt)} tokens) + max_tokens "
                               f"({params.max_tokens}) is over the model's {limit} positions")
        stream = bool(doc.get("stream", False))
        options = doc.get("stream_options") or {}
        include_usage = bool(isinstance(options, dict) and options.get("include_usage"))
        handle = model.submit(prompt, params)
        first = await handle.events.get()  # a refusal arrives before anything is sent
        if first[0] == "error":
            raise first[1] if isinstance(first[1], RequestError) else RequestError(str(first[1]))
        reply = _Reply(model, handle, chat, len(prompt))
        watch = asyncio.ensure_future(receive())  # http.disconnect if the client leaves

        def on_message(message: asyncio.Future[dict[str, Any]]) -> None:
            if not message.cancelled() and message.exception() is None and \
                    message.result()["type"] == "http.disconnect":
                model.abort(handle)  # stop generating for nobody
                handle.events.put_nowait(("done", "abort"))

        watch.add_done_callback(on_message)
        try:
            if stream:
                await reply.stream(first, send, include_usage)
            else:
                await reply.whole(first, send)
        finally:
            watch.remove_done_callback(on_message)
            watch.cancel()


class _Reply:
    """Builds the answer of one generation from the engine's events."""

    def __init__(self, model: GenerativeModel, handle: Handle, chat: bool,
                 prompt_tokens: int) -> None:
        self.model = model
        self.handle = handle
        self.chat = chat
        self.prompt_tokens = prompt_tokens
        self.tokens: list[int] = []
        self.sent_text = ""
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    def usage(self) -> dict[str, Any]:
        cached = self.handle.seq.cached_tokens if self.handle.seq is not None else 0
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": len(self.tokens),
                "total_tokens": self.prompt_tokens + len(self.tokens),
                "prompt_tokens_details": {"cached_tokens": cached}}

    def _delta(self, final: bool) -> str:
        """New text since the last piece sent, holding back a split UTF-8 character."""
        text = self.model.tokenizer.decode(self.tokens)
        if not final and text.endswith("\ufffd"):
            return ""
        delta = text[len(self.sent_text):] if text.startswith(self.sent_text) else ""
        self.sent_text = text
        return delta

    def _apply(self, event: tuple[Any, ...]) -> str | None:
        """Record one event; returns the finish reason once done."""
        if event[0] == "token":
            self.tokens.append(event[1])
            return None
        if event[0] == "done":
            return str(event[1])
        raise RequestError(f"generation failed: {event[1]}")

    def _stop_trim(self, text: str) -> str:
        for stop in self.handle.params.stop:
            index = text.find(stop)
            if index >= 0:
                text = text[:index]
        return text

    async def whole(self, first: tuple[Any, ...], send: Send) -> None:
        reason = self._apply(first)
        while reason is None:
            reason = self._apply(await self.handle.events.get())
        text = self._stop_trim(self.model.tokenizer.decode(self.tokens))
        if self.chat:
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None,
                                      "message": {"role": "assistant", "content": text}}
        else:
            choice = {"index": 0, "text": text, "finish_reason": reason, "logprobs": None}
        await _send_json(send, 200, {
            "id": self.id, "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created, "model": self.model.name, "choices": [choice],
            "usage": self.usage()})

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
               "text_completion", "created": self.created, "model": self.model.name,
               "choices": [choice]}
        return b"data: " + orjson.dumps(doc) + b"\n\n"

    async def stream(self, first: tuple[Any, ...], send: Send, include_usage: bool) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"),
                                (b"cache-control", b"no-cache")]})

        async def body(data: bytes) -> None:
            await send({"type": "http.response.body", "body": data, "more_body": True})

        if self.chat:
            await body(self._chunk("", None, role=True))
        event: tuple[Any, ...] | None = first
        while True:
            if event is None:
                event = await self.handle.events.get()
            reason = self._apply(event)
            event = None
            if reason == "abort":
                return  # the client left
            delta = self._delta(final=reason is not None)
            if self.handle.params.stop:
                kept = self._stop_trim(self.sent_text)
                if len(kept) < len(self.sent_text):  # a stop string arrived: cut it
                    delta = delta[:max(len(delta) - (len(self.sent_text) - len(kept)), 0)]
            if delta:
                await body(self._chunk(delta, None))
            if reason is not None:
                await body(self._chunk(None if self.chat else "", reason))
                break
        if include_usage:
            doc: dict[str, Any] = {
                   "id": self.id, "object": "chat.completion.chunk" if self.chat else
                   "text_completion", "created": self.created, "model": self.model.name,
                   "choices": [], "usage": self.usage()}
            await body(b"data: " + orjson.dumps(doc) + b"\n\n")
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n",
                    "more_body": False})

