"""Reading server-sent events as they arrive, and the timing definitions built on them."""

from __future__ import annotations

import orjson
import pytest

from tradeoff.bench.openai_stream import GenerationTiming, generation_body
from tradeoff.protocol.openai_answers import StreamReader


def event(doc: object) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def text_chunk(text: str, reason: str | None = None) -> dict:
    return {"choices": [{"index": 0, "text": text, "finish_reason": reason}]}


def test_events_split_anywhere_are_read_whole() -> None:
    stream = (event(text_chunk("Hel")) + b": keep-alive\n\n" + event(text_chunk("lo"))
              + event(text_chunk("", "length"))
              + event({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 2}})
              + b"data: [DONE]\n\n")
    for size in (1, 3, 7, len(stream)):
        reader = StreamReader(chat=False)
        for i in range(0, len(stream), size):
            reader(200, stream[i:i + size])
        assert reader.pieces == ["Hel", "lo"] and len(reader.text_ns) == 2
        assert reader.finish_reason == "length" and reader.done
        assert reader.usage == {"prompt_tokens": 3, "completion_tokens": 2}
        assert reader.failure() is None


def test_chat_deltas_and_crlf_framing() -> None:
    reader = StreamReader(chat=True)
    role = {"choices": [{"delta": {"role": "assistant", "content": ""}, "finish_reason": None}]}
    word = {"choices": [{"delta": {"content": "Paris"}, "finish_reason": "stop"}]}
    reader(200, (event(role) + event(word) + b"data: [DONE]\n\n").replace(b"\n", b"\r\n"))
    assert reader.pieces == ["Paris"]  # the role-only chunk carries no text: not a token
    assert reader.finish_reason == "stop" and reader.done


def test_crlf_split_between_its_bytes_and_events_of_several_lines() -> None:
    two_lines = (b'data: {"choices": [{"index": 0,\n'
                 b'data: "text": "b c", "finish_reason": null}]}\n\n')
    stream = (event(text_chunk("a")) + two_lines + event(text_chunk("d", "length"))
              + b"data: [DONE]\n\n").replace(b"\n", b"\r\n")
    for size in (1, 2, 5, len(stream)):
        reader = StreamReader(chat=False)
        for i in range(0, len(stream), size):
            reader(200, stream[i:i + size])
        assert reader.pieces == ["a", "b c", "d"] and reader.done, size
        assert reader.failure() is None and reader.received == len(stream)


def test_many_events_in_one_piece_are_all_read() -> None:
    reader = StreamReader(chat=False)
    reader(200, b"".join(event(text_chunk(str(i))) for i in range(1000)) + b"data: [DO")
    reader(200, b"NE]\n\n")
    assert reader.pieces == [str(i) for i in range(1000)] and reader.done
    assert len(set(reader.text_ns)) == 1  # one arrival time: they came together


def test_failures_are_named() -> None:
    refused = StreamReader(chat=False)
    refused(503, b'{"error": {"message": "queue full", "type": "service_unavailable"}}')
    assert refused.failure() == "HTTP 503: queue full"
    midway = StreamReader(chat=False)
    midway(200, event(text_chunk("a")) + event({"error": {"message": "engine died"}}))
    assert midway.failure() == "engine died"
    cut = StreamReader(chat=False)
    cut(200, event(text_chunk("a")))
    assert cut.failure() == "the stream ended before data: [DONE]"
    garbled = StreamReader(chat=False)
    garbled(200, b"data: {nope\n\n")
    assert garbled.failure().startswith("malformed event")


def test_timing_definitions() -> None:
    reader = StreamReader(chat=False, status=200, done=True,
                          usage={"prompt_tokens": 5, "completion_tokens": 5})
    reader.text_ns = [100_000_000, 110_000_000, 130_000_000]  # 3 events, 5 tokens
    timing = GenerationTiming.of(reader, start_ns=0, end_ns=140_000_000)
    assert timing.ttft_s == pytest.approx(0.1)
    assert timing.itl_s == pytest.approx([0.01, 0.02])
    assert timing.tpot_s == pytest.approx((0.14 - 0.1) / 4)  # (latency - TTFT) / (tokens - 1)
    assert timing.output_tokens == 5 and timing.tokens_from_usage
    reader.usage = None
    fallback = GenerationTiming.of(reader, 0, 140_000_000)
    assert fallback.output_tokens == 3 and not fallback.tokens_from_usage


def test_request_body() -> None:
    doc = orjson.loads(generation_body("m", prompt="hi", max_tokens=7, ignore_eos=True))
    assert doc == {"model": "m", "prompt": "hi", "max_tokens": 7, "temperature": 0.0,
                   "stream": True, "stream_options": {"include_usage": True},
                   "ignore_eos": True}
    chat = orjson.loads(generation_body("m", messages=[{"role": "user", "content": "q"}],
                                        stream=False))
    assert "prompt" not in chat and "stream_options" not in chat
