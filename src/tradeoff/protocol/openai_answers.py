"""An OpenAI-compatible API's answer read back: server-sent events as they arrive
(:class:`StreamReader`, a sink for ``Connection.request``), or a whole answer's JSON
(:func:`whole_answer`); each gives the answer's text and why it ended.
:class:`AnswerReader` reads either as it passes by, for its text if it ended normally.

    reader = StreamReader(chat=True)
    await connection.request(raw, on_body=reader)
    reader.failure() or "".join(reader.pieces)
    text, reason = whole_answer(body, chat=False)
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import orjson

__all__ = ["MAX_ANSWER_READ", "MAX_ERROR_BODY", "MAX_EVENT_BYTES", "AnswerReader",
           "StreamReader", "finished_text", "whole_answer"]

MAX_EVENT_BYTES = 1 << 20  # one server-sent event; a longer one fails the answer
MAX_ERROR_BODY = 1 << 16  # of an error answer, the part kept to say why
MAX_ANSWER_READ = 16 << 20  # an AnswerReader's answer; a longer one gives no text
_NORMAL_ENDS = ("stop", "length")


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


def whole_answer(body: bytes, chat: bool) -> tuple[str, str | None]:
    """The text and finish reason of a whole (not streamed) answer's first choice;
    ValueError when ``body`` is not such an answer."""
    try:
        doc = orjson.loads(body)
        choice = doc["choices"][0]
        text = choice["message"]["content"] if chat else choice["text"]
        reason = choice.get("finish_reason")
        if isinstance(text, str) and (reason is None or isinstance(reason, str)):
            return text, reason
    except (orjson.JSONDecodeError, KeyError, IndexError, TypeError):
        pass
    raise ValueError(f"not an OpenAI {'chat ' if chat else ''}completion: {body[:80]!r}")


def finished_text(body: bytes, chat: bool) -> str:
    """The text of a whole answer that ended normally (stop or length); ValueError,
    saying why, when ``body`` is not an answer or ended otherwise."""
    text, reason = whole_answer(body, chat)
    if reason not in _NORMAL_ENDS:
        raise ValueError(f"the answer ended by {reason!r}, not stop or length")
    return text


class AnswerReader:
    """A 200 answer's bytes as they pass (``reader(chunk)``), whole (``streamed`` False)
    or server-sent events: :meth:`text` once it has ended."""

    def __init__(self, chat: bool, streamed: bool) -> None:
        self.chat = chat
        self._events = StreamReader(chat=chat) if streamed else None
        self._chunks: list[bytes] = []  # a whole answer's (kept, not copied)
        self.received = 0
        self.over = False  # more than MAX_ANSWER_READ bytes: no text

    def __call__(self, chunk: bytes) -> None:
        self.received += len(chunk)
        if self.over:
            return
        if self.received > MAX_ANSWER_READ:
            self.over = True
            self._chunks.clear()
            self._events = None
        elif self._events is not None:
            self._events(200, chunk)
        else:
            self._chunks.append(chunk)

    def text(self) -> str | None:
        """The answer's text when it ended normally (stop or length); None when it did
        not, or was not an answer (CPU work: a large one's is read off the loop)."""
        if self.over:
            return None
        events = self._events
        if events is not None:
            if events.failure() is not None or events.finish_reason not in _NORMAL_ENDS:
                return None
            return "".join(events.pieces)
        try:
            return finished_text(b"".join(self._chunks), self.chat)
        except ValueError:
            return None
