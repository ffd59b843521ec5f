"""The thread that steps a generation engine, and its bridge to the event loop.

Each generative model version runs its :class:`GenerationEngine` on a thread of its
own; requests reach it through an inbox and hear back token by token on the event loop.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.errors import InferenceFailed, TradeoffError, Unavailable
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.events import Done, Event, Failed, Token
from tradeoff.generate.loader import new_engine
from tradeoff.generate.text_stream import full_text
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority

__all__ = ["TOKEN_BUCKETS_S", "GenerationStats", "GenerativeModel", "Handle"]

log = logging.getLogger("tradeoff.server")
# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")


@dataclass
class Handle:
    """One request's link to the engine: its events (generate/events.py) arrive on
    ``events`` in order, a Token each, then Done or Failed."""

    prompt: list[int]
    params: Any
    priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    seq: Any = None
    aborted: bool = False
    ended: bool = False  # its last event was delivered, or the client left
    cache_key: Any = None  # set when the answer is to be kept in the response cache
    cache: str = ""  # the response cache's verdict (hit, miss); "" when not asked
    cache_ns: int = 0  # how long the lookup took
    shadow: Any = None  # the router a generation came through (it may want a shadow copy)
    route: str = ""  # the model a router sent this request to

    @classmethod
    def replay(cls, prompt: list[int], params: Any, tokens: list[int], reason: str,
               decode: Callable[[Sequence[int]], str]) -> Handle:
        """A handle whose events are a cached (whole) answer: its tokens, the last with
        the answer's text (made as the engine makes it), then done."""
        handle = cls(prompt, params, ended=True, cache="hit")
        now = time.perf_counter()
        text, _ = full_text(decode, tokens, params.stop)
        for index, token in enumerate(tokens):
            handle.events.put_nowait(Token(token, now, text if index == len(tokens) - 1 else ""))
        handle.events.put_nowait(Done(reason))
        return handle


class GenerativeModel:
    """One version of a generative model: decoder, tokenizer, engine, and the thread that
    steps it. ``active`` counts the requests submitted and not yet ended (loop side)."""

    def __init__(self, name: str, version: int, config: GenerativeConfig, decoder: Decoder,
                 tokenizer: Tokenizer, loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.version = version
        self.config = config
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.loop = loop
        self.created = int(time.time())
        self.engine = new_engine(config, decoder, tokenizer)
        self.inbox: queue.SimpleQueue[tuple[str, Handle]] = queue.SimpleQueue()
        self.pending = 0  # submitted, not yet taken by the engine thread
        self.active = 0
        self._idle = asyncio.Event()  # set while no request is active
        self._idle.set()
        self.handles: dict[int, Handle] = {}
        self.stats = GenerationStats(name, version)
        self._wake = threading.Event()
        self._stop = False
        self.accepting = True  # False once this version is being stopped
        self.failed: str | None = None  # why the engine thread stopped on its own
        self._deadline: float | None = None  # time.monotonic() when the drain ends
        self._thread = threading.Thread(target=self._run, name=f"generate-{name}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- event loop side

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata: a generative model takes text, not tensors."""
        return {"name": self.name, "versions": versions,
                "platform": f"generative_{self.config.format}", "inputs": [], "outputs": []}

    def model_config(self) -> dict[str, Any]:
        """generate.yaml as the model configuration extension's parameters."""
        return {"name": self.name, "backend": "generate", "parameters": {
            key: {"string_value": str(value)}
            for key, value in dataclasses.asdict(self.config).items()}}

    def check_accepting(self) -> None:
        """Unavailable (503) when a request would be refused now: the queue is full, or
        this version is stopping (unloaded, replaced, the server stops) or broken."""
        if self.failed is not None:
            raise Unavailable(f"model {self.name!r} is not serving: {self.failed}; load it "
                              "again")
        if not self.accepting:
            raise Unavailable(f"model {self.name!r} version {self.version} is stopping; "
                              "retry after a short wait")
        waiting = len(self.engine.scheduler.waiting) + self.pending
        if waiting >= self.config.max_num_queued_requests:
            raise Unavailable(f"model {self.name!r}: {waiting} requests already wait "
                              f"(max_num_queued_requests {self.config.max_num_queued_requests});"
                              " retry later")

    def submit(self, prompt: list[int], params: Any,
               priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY) -> Handle:
        """Queue a request (:meth:`check_accepting` first)."""
        self.check_accepting()
        handle = Handle(prompt, params, priority)
        self.pending += 1
        self.active += 1
        self._idle.clear()
        self.inbox.put(("add", handle))
        self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        """The client left: stop generating for it."""
        self._end(handle)
        handle.aborted = True
        self.inbox.put(("abort", handle))
        self._wake.set()

    def begin_drain(self, timeout_s: float) -> None:
        """The server stops: take no new requests; let the generations in flight run for
        up to ``timeout_s`` more seconds, then end each one still running with an error
        event saying why."""
        self.accepting = False
        deadline = time.monotonic() + timeout_s
        self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)
        self._wake.set()

    async def stop(self, timeout_s: float | None = None) -> None:
        """Take no new requests, let those accepted finish (with ``timeout_s``: drain as
        :meth:`begin_drain` says), then stop the engine thread."""
        self.accepting = False
        if timeout_s is not None:
            self.begin_drain(timeout_s)
        # past a deadline the engine thread ends what still runs; give it a moment
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._idle.wait(),
                                   None if timeout_s is None else timeout_s + 5.0)
        self._stop = True
        self._wake.set()
        await asyncio.to_thread(self._thread.join, 30)

    def _end(self, handle: Handle) -> None:
        if not handle.ended:
            handle.ended = True
            self.active -= 1
            if not self.active:
                self._idle.set()

    def _deliver(self, handle: Handle, event: Event) -> None:
        if event.__class__ is not Token:
            self._end(handle)
        handle.events.put_nowait(event)

    def _deliver_all(self, events: list[tuple[Handle, Event]]) -> None:
        for handle, event in events:
            self._deliver(handle, event)

    # ---------------------------------------------------------------- engine thread

    def _emit(self, handle: Handle, event: Event) -> None:
        self.loop.call_soon_threadsafe(self._deliver, handle, event)

    def _take_inbox(self) -> None:
        while True:
            try:
                kind, handle = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self.loop.call_soon_threadsafe(self._taken)
                if handle.aborted:
                    continue
                try:
                    handle.seq = self.engine.add(handle.prompt, handle.params, handle.priority)
                except Exception as exc:  # this request's own failure: it alone hears it
                    if not isinstance(exc, TradeoffError):
                        request_log.exception("model %s: a request could not be queued", self.name)
                    self._emit(handle, Failed(exc))
                    continue
                self.handles[handle.seq.seq_id] = handle
                self.stats.arrived(handle.seq.seq_id, len(handle.prompt))
            elif handle.seq is not None and handle.seq.seq_id in self.handles:
                self.engine.abort(handle.seq)
                self.handles.pop(handle.seq.seq_id, None)
                self.stats.forget(handle.seq.seq_id)

    def _taken(self) -> None:
        self.pending -= 1

    def _run(self) -> None:
        try:
            self._serve()
        except Exception as exc:  # a bug: fail what is in flight, refuse what comes
            log.exception("model %s: the engine thread stopped", self.name)
            self.failed = f"the engine stopped ({type(exc).__name__}: {exc})"
        finally:
            ending = Unavailable(self.failed or "the server is shutting down")
            self._fail_all(ending)
            self._take_inbox()  # requests that arrived while it stopped hear it too
            self._fail_all(ending)
            self.engine.close()

    def _serve(self) -> None:
        """Step the engine until stopped. Each step's texts and events are made while
        the next step runs on the engine's worker (a GPU's step, say): launch step N+1,
        publish step N, collect step N+1."""
        pending: Any = None  # a collected step whose texts and events are still to make
        while not self._stop:
            self._take_inbox()
            if self._deadline is not None and self.handles and \
                    time.monotonic() >= self._deadline:
                self._fail_all(Unavailable("the server stopped this generation: it was still "
                                           "running at the end of the shutdown drain"))
            launched = None
            if self.engine.has_work():
                try:
                    launched = self.engine.launch()
                except Exception as exc:  # the model failed: every running request hears it
                    log.exception("model %s: generation step failed", self.name)
                    self._fail_all(exc)
            if pending is not None:
                self._publish(pending)
                pending = None
            if launched is None:
                if not self.engine.has_work():
                    self._wake.wait(0.5)
                    self._wake.clear()
                continue
            try:
                pending = self.engine.collect(launched)
            except Exception as exc:  # the model failed: every running request hears it
                log.exception("model %s: generation step failed", self.name)
                self._fail_all(exc)
        if pending is not None:
            self._publish(pending)

    def _publish(self, report: Any) -> None:
        """A collected step's texts, statistics and events (one hand-over to the loop)."""
        self.engine.make_texts(report)
        now = time.perf_counter()
        self.stats.step(report, now, self.engine.blocks.usage)
        events: list[tuple[Handle, Event]] = []
        handles = self.handles
        for seq, token, text in zip(report.decoded, report.tokens, report.texts, strict=True):
            handle = handles.get(seq.seq_id)
            if handle is not None:
                events.append((handle, Token(token, now, text)))
        for seq in report.finished:
            handle = handles.pop(seq.seq_id, None)
            if handle is not None:
                events.append((handle, Done(seq.finish_reason)))
        for seq, error in report.failed:  # this request alone hears it
            request_log.error("model %s: request %d failed: %s", self.name, seq.seq_id, error)
            self.stats.requests_failed += 1
            self.stats.forget(seq.seq_id)
            handle = handles.pop(seq.seq_id, None)
            if handle is not None:
                events.append((handle, Failed(InferenceFailed(f"generation failed: {error}"))))
        if events:
            self.loop.call_soon_threadsafe(self._deliver_all, events)

    def _fail_all(self, error: Exception) -> None:
        self.stats.requests_failed += len(self.handles)
        for handle in list(self.handles.values()):
            if handle.seq is not None:
                self.engine.abort(handle.seq)
                self.stats.forget(handle.seq.seq_id)
            self._emit(handle, Failed(error))
        self.handles.clear()


TOKEN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class GenerationStats:
    """Counters and latency samples for ``/metrics`` and the statistics extension
    (updated on the engine thread, read at scrape time)."""

    def __init__(self, name: str = "", version: int = 1) -> None:
        self.name = name
        self.version = version
        self.steps = 0
        self.requests_failed = 0
        self.last_inference_ms = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.preemptions = 0
        self.kv_usage = 0.0
        self.running = 0
        self.waiting = 0
        self.cache_hit = [0, 0]   # answered from the response cache: count, lookup ns
        self.cache_miss = [0, 0]  # looked up, then generated: count, lookup ns
        self.batches: dict[int, list[int]] = {}  # sequences in a step: [steps, ns]
        # per histogram: observations per bucket (the last one past every bound) and sum
        self.histograms = {kind: ([0] * (len(TOKEN_BUCKETS_S) + 1), [0.0])
                           for kind in ("ttft", "itl", "e2e")}
        self._arrival: dict[int, float] = {}
        self._last: dict[int, float] = {}

    def observe(self, kind: str, seconds: float) -> None:
        counts, total = self.histograms[kind]
        counts[bisect.bisect_left(TOKEN_BUCKETS_S, seconds)] += 1
        total[0] += seconds

    def arrived(self, seq_id: int, prompt_tokens: int) -> None:
        self._arrival[seq_id] = time.perf_counter()
        self.prompt_tokens += prompt_tokens

    def forget(self, seq_id: int) -> None:
        self._arrival.pop(seq_id, None)
        self._last.pop(seq_id, None)

    def to_dict(self) -> dict[str, Any]:
        """Triton's ``model_stats`` entry: a request is one generation (success time is
        arrival to last token), an execution one engine step; ``batch_stats`` has the steps
        and their compute time per number of sequences they ran."""
        e2e_total = self.histograms["e2e"][1][0]
        zero = {"count": 0, "ns": 0}
        hits, hit_ns = self.cache_hit
        return {
            "name": self.name, "version": str(self.version),
            "last_inference": self.last_inference_ms,
            "inference_count": self.requests_finished, "execution_count": self.steps,
            "inference_stats": {
                "success": {"count": self.requests_finished + hits,
                            "ns": int(e2e_total * 1e9) + hit_ns},
                "fail": {"count": self.requests_failed, "ns": 0},
                **{part: zero for part in ("queue", "compute_input", "compute_infer",
                                           "compute_output")},
                "cache_hit": {"count": hits, "ns": hit_ns},
                "cache_miss": {"count": self.cache_miss[0], "ns": self.cache_miss[1]}},
            "batch_stats": [{"batch_size": size, "compute_input": zero,
                             "compute_infer": {"count": count, "ns": ns},
                             "compute_output": zero}
                            for size, (count, ns) in sorted(self.batches.items())]}

    def step(self, report: Any, now: float, kv_usage: float) -> None:
        self.steps += 1
        if report.sequences:
            batch = self.batches.setdefault(report.sequences, [0, 0])
            batch[0] += 1
            batch[1] += int(report.seconds * 1e9)
        if report.finished:
            self.last_inference_ms = int(time.time() * 1000)  # Triton reports epoch ms
        self.preemptions += report.preempted
        self.kv_usage = kv_usage
        for seq in report.decoded:
            self.generation_tokens += 1
            last = self._last.get(seq.seq_id)
            if last is None:
                self.observe("ttft", now - self._arrival.get(seq.seq_id, now))
            else:
                self.observe("itl", now - last)
            self._last[seq.seq_id] = now
        for seq in report.finished:
            self.requests_finished += 1
            self.observe("e2e", now - self._arrival.get(seq.seq_id, now))
            self.forget(seq.seq_id)
