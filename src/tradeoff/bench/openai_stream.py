"""One streamed generation from an OpenAI-compatible API, timed piece by piece.

The body of a ``stream: true`` answer is server-sent events; :class:`StreamReader` reads
them as they arrive (``Connection.request(raw, on_body=reader)``) and stamps every event
that carries generated text. From those stamps:

* TTFT: request sent -> first event with text;
* ITL: the gaps between consecutive events with text;
* TPOT: (end-to-end latency - TTFT) / (output tokens - 1);
* output tokens: the server's ``usage.completion_tokens`` (asked for with
  ``stream_options.include_usage``); without it, the number of text events, flagged.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

import orjson

from tradeoff.protocol.http_client import Connection, build_request

__all__ = [
    "MAX_ERROR_BODY",
    "MAX_EVENT_BYTES",
    "GenerationTiming",
    "StreamReader",
    "generation_body",
    "generation_request",
    "stream_once",
]

MAX_EVENT_BYTES = 1 << 20  # one server-sent event; a longer one fails the answer
MAX_ERROR_BODY = 1 << 16  # of an error answer, the part kept to say why


def generation_body(model: str, *, prompt: str | None = None,
                    messages: list[dict[str, str]] | None = None, max_tokens: int = 16,
                    ignore_eos: bool = False, temperature: float = 0.0,
                    stream: bool = True, extra: dict[str, Any] | None = None) -> bytes:
    """The JSON body of a completions (``prompt``) or chat (``messages``) request."""
    doc: dict[str, Any] = {"model": model, "max_tokens": max_tokens,
                           "temperature": temperature, "stream": stream}
    if messages is not None:
        doc["messages"] = messages
    else:
        doc["prompt"] = prompt or ""
    if stream:
        doc["stream_options"] = {"include_usage": True}
    if ignore_eos:
        doc["ignore_eos"] = True
    doc.update(extra or {})
    return orjson.dumps(doc)


def generation_request(host: str, base_path: str, body: bytes, chat: bool,
                       headers: dict[str, str] | None = None) -> bytes:
    """The request bytes for ``POST {base_path}/completions`` (or chat/completions)."""
    path = base_path.rstrip("/") + ("/chat/completions" if chat else "/completions")
    return build_request("POST", host, path, body,
                         {"Content-Type": "application/json", **(headers or {})})


@dataclass
class StreamReader:
    """Reads one answer's server-sent events (a sink for ``Connection.request``);
    without ``keep_text`` the text is only stamped, not kept."""

    chat: bool
    keep_text: bool = True
    status: int = 0
    text_ns: list[int] = field(default_factory=list)  # arrival of each event with text
    pieces: list[str] = field(default_factory=list)
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    error: str | None = None
    done: bool = False  # saw ``data: [DONE]``
    received: int = 0  # body bytes
    _pending: bytearray = field(default_factory=bytearray)  # an event not yet ended
    _error_body: bytes = b""
    _overlong: bool = False

    def __call__(self, status: int, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.status = status
        self.received += len(data)
        if status != 200:
            if len(self._error_body) < MAX_ERROR_BODY:
                self._error_body += data[:MAX_ERROR_BODY]
            return
        if self._overlong:
            return
        # at 20,000 tokens/s this runs 20,000 times a second: no copy of the whole buffer
        # per event, no line splitting for the usual event (one ``data:`` line)
        pending = self._pending
        if pending:
            # an event that came in pieces (a drip): look for its end in the new bytes only
            seen = len(pending)
            pending += data
            if pending.find(b"\n\n", seen - 1) < 0 and \
                    pending.find(b"\n\r\n", max(seen - 2, 0)) < 0:
                if len(pending) > MAX_EVENT_BYTES:
                    self._overlong = True
                    self.error = f"an event longer than {MAX_EVENT_BYTES:,} bytes"
                    pending.clear()
                return
            data = bytes(pending)
            pending.clear()
        if b"\r" in data:
            data = data.replace(b"\r\n", b"\n")
        start = 0
        while (end := data.find(b"\n\n", start)) >= 0:
            self._event(data[start:end], now)
            start = end + 2
        if start < len(data):
            pending += memoryview(data)[start:]
            if len(pending) > MAX_EVENT_BYTES:
                self._overlong = True
                self.error = f"an event longer than {MAX_EVENT_BYTES:,} bytes"
                pending.clear()

    def _event(self, event: bytes, now: int) -> None:
        if event.startswith(b"data:") and b"\n" not in event:
            data = event[5:].lstrip(b" ")
        else:
            data = b"\n".join(line[5:].lstrip(b" ") for line in event.split(b"\n")
                              if line.startswith(b"data:"))
        if not data:
            return  # a comment or keep-alive
        if data == b"[DONE]":
            self.done = True
            return
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            self.error = f"malformed event: {data[:80]!r}"
            return
        if not isinstance(doc, dict):
            self.error = f"malformed event: {data[:80]!r}"
            return
        if doc.get("error"):
            problem = doc["error"]
            self.error = str(problem.get("message", problem) if isinstance(problem, dict)
                             else problem)
            return
        if doc.get("usage"):
            self.usage = doc["usage"]
        for choice in doc.get("choices") or []:
            piece = (choice.get("delta") or {}).get("content") if self.chat \
                else choice.get("text")
            if piece:
                self.text_ns.append(now)
                if self.keep_text:
                    self.pieces.append(piece)
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]

    def failure(self) -> str | None:
        """Why this answer failed, or None: an HTTP error, an error event, or a stream
        that ended without ``[DONE]``."""
        if self.status == 0:  # no body came: the connection's error says why
            return self.error or "no response"
        if self.status != 200:
            try:
                doc = orjson.loads(self._error_body)
                message = doc["error"]["message"] if isinstance(doc.get("error"), dict) \
                    else doc.get("error", doc)
            except (orjson.JSONDecodeError, AttributeError, TypeError, KeyError):
                message = self._error_body[:200].decode("utf-8", "replace")
            return f"HTTP {self.status}: {message}"
        if self.error:
            return self.error
        if not self.done:
            return "the stream ended before data: [DONE]"
        return None


@dataclass(frozen=True)
class GenerationTiming:
    """The timeline of one streamed generation (nanoseconds, perf_counter clock)."""

    start_ns: int
    end_ns: int
    text_ns: tuple[int, ...]
    output_tokens: int
    prompt_tokens: int | None
    tokens_from_usage: bool
    finish_reason: str | None
    error: str | None
    text: str

    @classmethod
    def of(cls, reader: StreamReader, start_ns: int, end_ns: int) -> GenerationTiming:
        usage = reader.usage or {}
        from_usage = isinstance(usage.get("completion_tokens"), int)
        return cls(start_ns, end_ns, tuple(reader.text_ns),
                   usage["completion_tokens"] if from_usage else len(reader.text_ns),
                   usage.get("prompt_tokens"), from_usage, reader.finish_reason,
                   reader.failure(), "".join(reader.pieces))

    @property
    def ttft_s(self) -> float | None:
        return (self.text_ns[0] - self.start_ns) / 1e9 if self.text_ns else None

    @property
    def latency_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9

    @property
    def tpot_s(self) -> float | None:
        """(latency - TTFT) / (output tokens - 1); None below two tokens."""
        ttft = self.ttft_s
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.latency_s - ttft) / (self.output_tokens - 1)

    @property
    def itl_s(self) -> list[float]:
        return [(b - a) / 1e9 for a, b in itertools.pairwise(self.text_ns)]


async def stream_once(host: str, port: int, raw: bytes, chat: bool, *,
                      at_ns: int | None = None, timeout_s: float = 600.0) -> GenerationTiming:
    """Send one streaming request on a connection of its own (at ``at_ns`` on the
    perf_counter clock, if given) and time it. Times count from the scheduled moment, so
    a late send counts against the endpoint, not for it."""
    if at_ns is not None and (delay := (at_ns - time.perf_counter_ns()) / 1e9) > 0:
        await asyncio.sleep(delay)
    start_ns = at_ns if at_ns is not None else time.perf_counter_ns()
    reader = StreamReader(chat=chat)
    connection = Connection(host, port, timeout=timeout_s)
    try:
        await connection.request(raw, on_body=reader)
    except (OSError, TimeoutError) as exc:
        reader.error = f"{type(exc).__name__}: {exc}"
    finally:
        connection.close()
    return GenerationTiming.of(reader, start_ns, time.perf_counter_ns())
