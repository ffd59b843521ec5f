"""One generation as a transport sees it: typed outputs, whatever the wire format.

:meth:`DataPlane.generate` returns a :class:`Generation`; the transport only formats what
it yields. Detokenizing and stop strings are the engine's, keeping a whole answer in the
response cache and its shadow copy the data plane's (they happen here, when the answer
ends), aborting on a departed client this object's:

    generation = await dataplane.generate(name, prompt, params)
    async with generation:                 # an answer cut short stops generating
        if not await generation.begin():   # a refusal raises here, before anything is sent
            return                         # the client left while it waited
        async for output in generation:    # TextDelta ..., then Finished
            ...
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from tradeoff.errors import RequestError
from tradeoff.generate.engine_client import EngineClient, Handle
from tradeoff.generate.events import Done, Event, Failed, Token

__all__ = ["Finished", "Generation", "Output", "TextDelta", "Usage"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    """One generated token and the text it adds to the answer (often "" while a word's
    characters, or a possible stop string, are still incomplete)."""

    text: str
    token: int


@dataclass(frozen=True, slots=True)
class Usage:
    """The tokens of one generation: the prompt's (``cached``: of them, found in the
    prefix cache) and the answer's."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class Finished:
    """The answer is complete: ``stop`` (end of sequence or a stop string) or ``length``
    (max_tokens)."""

    reason: str
    usage: Usage


Output = TextDelta | Finished


class Generation:
    """One queued generation: its events from the engine turned into :data:`Output`."""

    def __init__(self, model: EngineClient, handle: Handle, prompt_tokens: int,
                 on_whole: Callable[[Handle, list[int], str], None]) -> None:
        self.model = model
        self.handle = handle
        self.prompt_tokens = prompt_tokens
        self.tokens: list[int] = []  # the answer's, so far
        self._on_whole = on_whole  # the data plane's: cache and shadow a whole answer
        self._first: Event | None = None
        self._ended = False

    @property
    def name(self) -> str:
        return self.model.name

    @property
    def route(self) -> str:
        """The model a router sent this generation to ("" when not routed)."""
        return self.handle.route

    @property
    def cache(self) -> str:
        """The response cache's verdict (hit, miss); "" when not asked."""
        return self.handle.cache

    @property
    def cache_ns(self) -> int:
        return self.handle.cache_ns

    def usage(self) -> Usage:
        return Usage(self.prompt_tokens, len(self.tokens), self.handle.cached_tokens)

    async def begin(self) -> bool:
        """Wait for the generation to start: raises its refusal (a RequestError, before
        anything was sent); False when the client left while it waited."""
        first = await self.handle.events.get()
        if isinstance(first, Failed):
            self._ended = True
            raise _request_error(first.error)
        if isinstance(first, Done) and first.reason == "abort":
            self._ended = True
            return False
        self._first = first
        return True

    def __aiter__(self) -> AsyncIterator[Output]:
        return self._outputs()

    async def _outputs(self) -> AsyncIterator[Output]:
        event = self._first or await self.handle.events.get()
        self._first = None
        while True:
            if isinstance(event, Token):
                self.tokens.append(event.token)
                yield TextDelta(event.text, event.token)
            elif isinstance(event, Done):
                self._ended = True
                if event.reason == "abort":
                    return  # the client left: nobody to answer
                self._on_whole(self.handle, self.tokens, event.reason)
                yield Finished(event.reason, self.usage())
                return
            else:
                self._ended = True
                raise _request_error(event.error)
            event = await self.handle.events.get()

    def abort(self) -> None:
        """The client left: stop generating, and end the outputs."""
        if not self._ended:
            self._ended = True
            self.model.abort(self.handle)
            self.handle.events.put_nowait(Done("abort"))

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if not self._ended:  # whatever ended the answer early: stop generating
            self._ended = True
            self.model.abort(self.handle)


def _request_error(error: BaseException) -> RequestError:
    return error if isinstance(error, RequestError) else \
        RequestError(f"generation failed: {error}")
