"""One streamed generation from an OpenAI-compatible API, timed piece by piece.

The body of a ``stream: true`` answer is server-sent events;
:class:`tradeoff.protocol.openai_answers.StreamReader` reads them as they arrive
(``Connection.request(raw, on_body=reader)``) and stamps every event that carries
generated text. From those stamps:

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
from dataclasses import dataclass
from typing import Any

import orjson

from tradeoff.protocol.http_client import Connection, build_request
from tradeoff.protocol.openai_answers import StreamReader

__all__ = [
    "GenerationTiming",
    "generation_body",
    "generation_request",
    "stream_once",
]


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
