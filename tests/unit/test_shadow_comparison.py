"""How a shadow copy's answer is compared with the primary's: generations from other
servers as text (the share of the primary's characters matched before the first
difference), and an OpenAI answer's text read back whole or streamed."""

from __future__ import annotations

import orjson
import pytest

from tradeoff.protocol.openai_answers import (
    MAX_ANSWER_READ,
    AnswerReader,
    StreamReader,
    finished_text,
    whole_answer,
)
from tradeoff.server.router import ShadowStats, common_prefix, merge_router_stats


def test_texts_are_compared_up_to_their_first_difference() -> None:
    stats = ShadowStats()
    stats.compare_text("the capital is Paris", "the capital is Paris")
    stats.compare_text("abcdefghij", "abcXefghij")   # 3 of 10 before the difference
    stats.compare_text("short", "short and more")    # the primary's 5, all matched
    stats.compare_text("", "anything")               # nothing to match: not identical
    shares = stats.to_dict()
    assert (stats.texts_compared, stats.texts_identical, stats.compared) == (4, 1, 4)
    assert (stats.text_prefix_chars, stats.text_chars) == (20 + 3 + 5, 20 + 10 + 5)
    assert shares["text_identical"] == 0.25
    assert shares["text_prefix_agreement"] == pytest.approx(28 / 35)
    assert shares["token_agreement"] is None  # no generation compared token by token


def test_text_counts_merge_across_front_ends() -> None:
    one, two = ShadowStats(), ShadowStats()
    one.compare_text("abcd", "abcd")
    two.compare_text("abcd", "abXX")
    entries = [{"routes": [], "fallbacks": {}, "shadow": s.to_dict()} for s in (one, two)]
    merged = merge_router_stats(entries)["shadow"]
    assert (merged["texts_compared"], merged["texts_identical"]) == (2, 1)
    assert merged["text_prefix_agreement"] == 6 / 8


def test_a_whole_answer_gives_its_text_and_reason() -> None:
    completion = {"choices": [{"index": 0, "text": "Paris.", "finish_reason": "stop"}]}
    chat = {"choices": [{"index": 0, "finish_reason": "length",
                         "message": {"role": "assistant", "content": "Par"}}]}
    assert whole_answer(orjson.dumps(completion), chat=False) == ("Paris.", "stop")
    assert whole_answer(orjson.dumps(chat), chat=True) == ("Par", "length")
    for body in (b"not json", b"[]", b'{"choices": []}', orjson.dumps(completion)):
        with pytest.raises(ValueError, match="not an OpenAI chat completion"):
            whole_answer(body, chat=True)
    with pytest.raises(ValueError):
        whole_answer(orjson.dumps({"choices": [{"text": 3}]}), chat=False)
    assert finished_text(orjson.dumps(completion), chat=False) == "Paris."
    aborted = {"choices": [{"index": 0, "text": "Pa", "finish_reason": "abort"}]}
    with pytest.raises(ValueError, match="ended by 'abort', not stop or length"):
        finished_text(orjson.dumps(aborted), chat=False)


def test_a_streamed_answer_gives_the_same_text() -> None:
    reader = StreamReader(chat=True)
    events = [{"choices": [{"delta": {"role": "assistant"}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "Par"}, "finish_reason": None}]},
              {"choices": [{"delta": {"content": "is."}, "finish_reason": None}]},
              {"choices": [{"delta": {}, "finish_reason": "stop"}]}]
    body = b"".join(b"data: " + orjson.dumps(e) + b"\n\n" for e in events)
    reader(200, body + b"data: [DONE]\n\n")
    assert reader.failure() is None
    assert ("".join(reader.pieces), reader.finish_reason) == ("Paris.", "stop")


def test_an_answer_read_as_it_passes_gives_text_only_when_it_ended_normally() -> None:
    def streamed(*events: dict, done: bool = True) -> AnswerReader:
        reader = AnswerReader(chat=False, streamed=True)
        for event in events:  # one event a chunk, as a replica sends them
            reader(b"data: " + orjson.dumps(event) + b"\n\n")
        if done:
            reader(b"data: [DONE]\n\n")
        return reader

    def piece(text: str, reason: str | None = None) -> dict:
        return {"choices": [{"index": 0, "text": text, "finish_reason": reason}]}

    assert streamed(piece("Par"), piece("is", "length")).text() == "Paris"
    assert streamed(piece("Par"), piece("is", "stop"), done=False).text() is None  # cut
    assert streamed(piece("Par"), {"error": {"message": "broke off"}}).text() is None
    assert streamed(piece("Par"), piece("", "abort")).text() is None  # not a normal end

    whole = AnswerReader(chat=False, streamed=False)
    body = orjson.dumps(piece("Paris.", "stop"))
    whole(body[:7])
    whole(body[7:])
    assert whole.text() == "Paris." and whole.received == len(body)
    broken = AnswerReader(chat=False, streamed=False)
    broken(body[:7])
    assert broken.text() is None


def test_an_overlong_answer_gives_no_text_and_keeps_nothing() -> None:
    reader = AnswerReader(chat=False, streamed=False)
    chunk = b" " * (1 << 20)
    for _ in range(MAX_ANSWER_READ // len(chunk) + 1):
        reader(chunk)
    reader(orjson.dumps({"choices": [{"text": "late", "finish_reason": "stop"}]}))
    assert reader.over and reader.text() is None
    assert reader.received > MAX_ANSWER_READ


def test_the_common_prefix_of_long_texts() -> None:
    text = "ab" * 10_000
    assert common_prefix(text, text) == len(text)
    assert common_prefix(text, text[:5000]) == 5000
    for at in (0, 1, 4095, 4096, 4097, 12_345, len(text) - 1):
        changed = text[:at] + "x" + text[at + 1:]
        assert common_prefix(text, changed) == at
        assert common_prefix(changed, text, block=7) == at
    assert common_prefix("", "abc") == common_prefix("abc", "") == 0
