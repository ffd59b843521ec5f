"""What one generation hears from the engine thread, in order, typed: a :class:`Token`
per generated token, then :class:`Done` or :class:`Failed`.

    while isinstance(event := await handle.events.get(), Token):
        text.append(event.text)
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Done", "Event", "Failed", "Token"]


@dataclass(frozen=True, slots=True)
class Token:
    """One generated token and the text it adds to the answer (the engine detokenizes
    and holds back what a stop string may still claim: joined, the texts are the
    answer). ``at``: time.perf_counter() when its step was published."""

    token: int
    at: float
    text: str


@dataclass(frozen=True, slots=True)
class Done:
    """The generation ended: ``stop`` (end of sequence or a stop string), ``length``
    (max_tokens) or ``abort`` (the client left)."""

    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The generation failed, or was refused before it began (a RequestError says
    which status)."""

    error: BaseException


Event = Token | Done | Failed
