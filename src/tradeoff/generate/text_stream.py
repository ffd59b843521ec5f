"""An answer's text as its tokens arrive: incremental detokenization and stop strings,
in one place.

Decoding the whole answer for every new token costs time that grows with its length
(quadratic over the answer). :class:`TextStream` decodes a short window instead: the
tokens since the last piece of text it let out, with the token before them for context
(a tokenizer may drop a word's leading space at the start of what it decodes), and lets
out the new characters once they no longer end in a split UTF-8 character. Put
together, the pieces are the text that decoding every token at once gives.

Stop strings are looked for in the new text together with the last characters before
it, enough to hold any stop string, so a stop that spans several tokens is found when it
completes. Text that could be the start of a stop string is held back until it is known
not to be one: a streamed answer never shows part of a stop string.

    stream = TextStream(tokenizer.decode, stop=("\\n\\n",))
    for token in tokens:
        piece = stream.push(token)   # text to send now ("" while a character is split)
        if stream.stopped:
            break
    rest = stream.finish()           # what was held back, at the end
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["REPLACEMENT", "TextStream", "full_text"]

REPLACEMENT = "\ufffd"  # what a tokenizer decodes a split UTF-8 character to


class TextStream:
    """The text of one answer, piece by piece; ``text`` holds everything let out."""

    def __init__(self, decode: Callable[[Sequence[int]], str],
                 stop: Sequence[str] = ()) -> None:
        self._decode = decode
        self._stop = tuple(stop)
        self._hold = max(map(len, self._stop), default=1) - 1  # a stop's prefix, at most
        self._ids: list[int] = []
        self._prefix = 0  # the window starts here: context for the first new token
        self._read = 0    # tokens before this one have been let out as text
        self._pending = ""  # decoded, not let out: may start a stop string
        self.text = ""
        self.stopped = False

    def push(self, token: int) -> str:
        """Take the next token; returns the text that can be sent now."""
        if self.stopped:
            return ""
        self._ids.append(token)
        before, now = self._window()
        if len(now) <= len(before) or now.endswith(REPLACEMENT):
            return ""  # nothing new, or a character still split across tokens
        self._prefix, self._read = self._read, len(self._ids)
        return self._let_out(now[len(before):], final=False)

    def finish(self) -> str:
        """The answer ended: the text still held back (a split character's replacement
        included, as a whole decode would give it)."""
        if self.stopped:
            return ""
        rest = ""
        if self._read < len(self._ids):
            before, now = self._window()
            rest = now[len(before):]
            self._read = len(self._ids)
        return self._let_out(rest, final=True)

    def _window(self) -> tuple[str, str]:
        """The window's text before the tokens not yet let out, and with them."""
        window = self._ids[self._prefix:]
        before = self._decode(window[:self._read - self._prefix]) if \
            self._read > self._prefix else ""
        return before, self._decode(window)

    def _let_out(self, new: str, final: bool) -> str:
        pending = self._pending + new
        if self._stop:
            # a stop that ends in the new text starts at most _hold characters before it
            cut = min((i for i in (pending.find(s) for s in self._stop) if i >= 0),
                      default=-1)
            if cut >= 0:
                self.stopped = True
                self._pending = ""
                self.text += pending[:cut]
                return pending[:cut]
            if not final:
                keep = _stop_prefix_length(pending, self._stop, self._hold)
                self._pending = pending[len(pending) - keep:] if keep else ""
                pending = pending[:len(pending) - keep]
        else:
            self._pending = ""
        self.text += pending
        return pending


def _stop_prefix_length(text: str, stops: Sequence[str], longest: int) -> int:
    """The length of the longest end of ``text`` that begins some stop string."""
    best = 0
    for stop in stops:
        start = max(len(text) - min(longest, len(stop) - 1), 0)
        at = text.find(stop[0], start)  # jump between the stop's first character
        while at >= 0:
            if stop.startswith(text[at:]):
                best = max(best, len(text) - at)
                break
            at = text.find(stop[0], at + 1)
    return best


def full_text(decode: Callable[[Sequence[int]], str], tokens: Sequence[int],
              stop: Sequence[str] = ()) -> tuple[str, bool]:
    """The text of a whole answer through a :class:`TextStream` (a cached answer's replay
    gets the same text as the stream that made it); and whether a stop string ended it."""
    stream = TextStream(decode, stop)
    for token in tokens:
        stream.push(token)
        if stream.stopped:
            break
    stream.finish()
    return stream.text, stream.stopped
