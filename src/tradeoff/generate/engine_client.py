"""The engine client: a generative model version as the event loop sees it. It queues
generations on an engine core (``generate/engine_core.py``) by message and turns the
core's messages back into each generation's events, on the loop.

It reads nothing of the engine: admission counts what the core last reported waiting
plus what was sent since, and ``/metrics`` reads the core's snapshot. The tokenizer is
the client's: the front end tokenizes the prompts, and makes each answer's text from the
token ids the core sends (:class:`TextStream`); when a stop string completes, the answer
ends here at once and the core is told (:class:`Finish`).

    client = EngineClient.in_process("llm", 1, config, decoder, tokenizer, loop)
    handle = client.submit(token_ids, SamplingParams(max_tokens=8))
    while isinstance(event := await handle.events.get(), Token):
        ...
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.errors import Unavailable
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.engine_core import EngineCore
from tradeoff.generate.engine_messages import (
    Abort,
    Add,
    CoreEnded,
    Drain,
    EngineInfo,
    EngineLoad,
    Finish,
    Inbound,
    Outbound,
    StepOutputs,
    as_error,
)
from tradeoff.generate.events import Done, Event, Failed, Token
from tradeoff.generate.generation_stats import StatsSnapshot
from tradeoff.generate.sampling_params import SamplingParams
from tradeoff.generate.text_stream import TextStream, full_text
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority

__all__ = ["Core", "EngineClient", "GenerationStatistics", "Handle"]


class Core(Protocol):
    """What a client needs of its engine core, wherever the core runs."""

    info: EngineInfo

    def start(self, publish: Callable[[Outbound], None]) -> None: ...

    def send(self, message: Inbound) -> None: ...

    def stop(self) -> None: ...

    def join(self, timeout_s: float) -> None: ...

    def snapshot(self) -> tuple[StatsSnapshot, EngineLoad]: ...


@dataclass
class Handle:
    """One generation, loop side: its events (generate/events.py) arrive on ``events``
    in order, a Token each, then Done or Failed."""

    prompt: list[int]
    params: SamplingParams
    priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    request_id: int = -1  # the core's name for it (-1: never sent, a replayed answer)
    aborted: bool = False  # the client left
    ended: bool = False  # its last event was delivered, or the client left
    cached_tokens: int = 0  # of the prompt, found in the prefix cache (known at the end)
    cache_key: Any = None  # set when the answer is to be kept in the response cache
    cache: str = ""  # the response cache's verdict (hit, miss); "" when not asked
    cache_ns: int = 0  # how long the lookup took
    shadow: Any = None  # the router a generation came through (it may want a shadow copy)
    route: str = ""  # the model a router sent this request to
    text: TextStream | None = None  # the answer's text so far (None: a replayed answer)

    @classmethod
    def replay(cls, prompt: list[int], params: SamplingParams, tokens: list[int],
               reason: str, decode: Callable[[Sequence[int]], str]) -> Handle:
        """A handle whose events are a cached (whole) answer: its tokens, the last with
        the answer's text (made as the engine makes it), then done."""
        handle = cls(prompt, params, ended=True, cache="hit")
        now = time.perf_counter()
        text, _ = full_text(decode, tokens, params.stop)
        for index, token in enumerate(tokens):
            handle.events.put_nowait(Token(token, now, text if index == len(tokens) - 1 else ""))
        handle.events.put_nowait(Done(reason))
        return handle


@dataclass(frozen=True)
class GenerationStatistics:
    """The engine's statistics with the front end's response-cache counts."""

    engine: StatsSnapshot
    load: EngineLoad
    cache_hit: tuple[int, int]  # count, lookup ns
    cache_miss: tuple[int, int]

    def to_dict(self) -> dict[str, Any]:
        """Triton's ``model_stats`` entry (:meth:`StatsSnapshot.to_dict`)."""
        return self.engine.to_dict(self.cache_hit, self.cache_miss)


class EngineClient:
    """One version of a generative model, loop side. ``active`` counts the generations
    submitted and not yet ended; ``pending`` those sent that the core has not yet taken."""

    def __init__(self, name: str, version: int, config: GenerativeConfig,
                 tokenizer: Tokenizer, core: Core, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.version = version
        self.config = config
        self.tokenizer = tokenizer
        self.info = core.info
        self.loop = loop
        self.created = int(time.time())
        self.pending = 0
        self.active = 0
        self.load = EngineLoad()  # as the core last reported it
        self.accepting = True  # False once this version is being stopped
        self.failed: str | None = None  # why the core stopped on its own
        # called once (on the loop) when the core stops on its own, with the cause
        self.on_dead: Callable[[str], None] | None = None
        self._core = core
        self._ids = itertools.count()
        self._handles: dict[int, Handle] = {}
        self._idle = asyncio.Event()  # set while no generation is active
        self._idle.set()
        # the response cache's lookups of this model's answers: [count, lookup ns]
        self.cache_hit = [0, 0]
        self.cache_miss = [0, 0]
        core.start(self._from_core)

    @classmethod
    def in_process(cls, name: str, version: int, config: GenerativeConfig, decoder: Decoder,
                   tokenizer: Tokenizer, loop: asyncio.AbstractEventLoop) -> EngineClient:
        """A client whose core steps on a thread of this process."""
        return cls(name, version, config, tokenizer,
                   EngineCore(name, version, config, decoder), loop)

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata: a generative model takes text, not tensors."""
        return {"name": self.name, "versions": versions,
                "platform": f"generative_{self.config.format}", "inputs": [], "outputs": []}

    def model_config(self) -> dict[str, Any]:
        """generate.yaml as the model configuration extension's parameters."""
        return {"name": self.name, "backend": "generate", "parameters": {
            key: {"string_value": str(value)}
            for key, value in dataclasses.asdict(self.config).items()}}

    @property
    def core_pid(self) -> int | None:
        """The process the core runs in, when not this one's."""
        pid = getattr(self._core, "pid", None)
        return pid if isinstance(pid, int) else None

    @property
    def waiting(self) -> int:
        """Generations queued and not yet running: the core's last count and those it
        has not taken yet."""
        return self.load.waiting + self.pending

    @property
    def stats(self) -> GenerationStatistics:
        engine, load = self._core.snapshot()
        return GenerationStatistics(engine, load, (self.cache_hit[0], self.cache_hit[1]),
                                    (self.cache_miss[0], self.cache_miss[1]))

    def count_cache(self, hit: bool, lookup_ns: int) -> None:
        """One response-cache lookup of this model's answers."""
        counts = self.cache_hit if hit else self.cache_miss
        counts[0] += 1
        counts[1] += lookup_ns

    def check_accepting(self) -> None:
        """Unavailable (503) when a request would be refused now: the queue is full, or
        this version is stopping (unloaded, replaced, the server stops) or broken."""
        if self.failed is not None:
            raise Unavailable(f"model {self.name!r} is not serving: {self.failed}; load it "
                              "again")
        if not self.accepting:
            raise Unavailable(f"model {self.name!r} version {self.version} is stopping; "
                              "retry after a short wait")
        waiting = self.waiting
        if waiting >= self.config.max_num_queued_requests:
            raise Unavailable(f"model {self.name!r}: {waiting} requests already wait "
                              f"(max_num_queued_requests {self.config.max_num_queued_requests});"
                              " retry later")

    def submit(self, prompt: list[int], params: SamplingParams,
               priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY) -> Handle:
        """Queue a generation (:meth:`check_accepting` first)."""
        self.check_accepting()
        handle = Handle(prompt, params, priority, request_id=next(self._ids),
                        text=TextStream(self.tokenizer.decode, params.stop))
        self._handles[handle.request_id] = handle
        self.pending += 1
        self.active += 1
        self._idle.clear()
        self._core.send(Add(handle.request_id, prompt, params, int(priority)))
        return handle

    def abort(self, handle: Handle) -> None:
        """The client left: stop generating for it."""
        self._end(handle)
        handle.aborted = True
        self._core.send(Abort(handle.request_id))

    def begin_drain(self, timeout_s: float) -> None:
        """The server stops: take no new requests; let the generations in flight run for
        up to ``timeout_s`` more seconds, then end each one still running with an error
        event saying why."""
        self.accepting = False
        self._core.send(Drain(timeout_s))

    async def stop(self, timeout_s: float | None = None) -> None:
        """Take no new requests, let those accepted finish (with ``timeout_s``: drain as
        :meth:`begin_drain` says), then stop the core."""
        self.accepting = False
        if timeout_s is not None:
            self.begin_drain(timeout_s)
        # past a deadline the core ends what still runs; give it a moment
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(),
                                   None if timeout_s is None else timeout_s + 5.0)
        self._core.stop()
        await asyncio.to_thread(self._core.join, 30)

    def _end(self, handle: Handle) -> None:
        if not handle.ended:
            handle.ended = True
            self._handles.pop(handle.request_id, None)
            self.active -= 1
            if not self.active:
                self._idle.set()

    def _from_core(self, message: Outbound) -> None:
        """Called on the core's side: hand the message to the loop."""
        self.loop.call_soon_threadsafe(self._receive, message)

    def _receive(self, message: Outbound) -> None:
        if isinstance(message, CoreEnded):
            # sent after the core's last look at its inbox: nothing will answer them
            ending = Unavailable(message.failed or "the server is shutting down")
            for handle in list(self._handles.values()):
                self._end(handle)
                handle.events.put_nowait(Failed(ending))
            if message.failed is not None:
                self.failed = message.failed
                if self.on_dead is not None:
                    self.on_dead(message.failed)
            return
        self._step(message)

    def _step(self, message: StepOutputs) -> None:
        self.pending -= message.taken
        self.load = message.load
        handles = self._handles
        at = message.at
        for request_id, cached in message.cached:
            handle = handles.get(request_id)
            if handle is not None:
                handle.cached_tokens = cached
        ending = {f.request_id for f in message.finished} if message.finished else ()
        for request_id, token in zip(message.request_ids, message.tokens, strict=True):
            handle = handles.get(request_id)
            if handle is None:
                continue  # ended here already (a stop string, the client left)
            stream = handle.text
            assert stream is not None
            text = stream.push(token)
            if stream.stopped:
                self._end(handle)
                handle.events.put_nowait(Token(token, at, text))
                handle.events.put_nowait(Done("stop"))
                self._core.send(Finish(request_id, at))
                continue
            if request_id in ending:
                text += stream.finish()  # what was held back for a stop string
            handle.events.put_nowait(Token(token, at, text))
        for finished in message.finished:
            handle = handles.get(finished.request_id)
            if handle is not None:
                self._end(handle)
                handle.events.put_nowait(Done(finished.reason))
        for error in message.errors:
            handle = handles.get(error.request_id)
            if handle is not None:
                self._end(handle)
                handle.events.put_nowait(Failed(as_error(error)))
