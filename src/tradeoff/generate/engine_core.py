"""The engine core: a generative model's :class:`GenerationEngine` stepped on a thread
of its own, reached only by messages (``generate/engine_messages.py``).

It takes :class:`Add`, :class:`Abort`, :class:`Finish` and :class:`Drain` from its inbox
and publishes a :class:`StepOutputs` per turn that changed anything, then
:class:`CoreEnded`. It shares no mutable object with its client: the client
(``generate/engine_client.py``) knows a generation by its request id, and makes its text.
Steps overlap the host work around them (scheduling, inputs, messages) on the engine's
worker: step N+1 is scheduled on step N's outcome before it is known and queued behind
it, then step N is collected and its message sent while N+1 runs.

    core = EngineCore("llm", 1, config, decoder)
    core.start(publish)          # publish(message) is called on the core's thread
    core.send(Add(1, [1, 2, 3], SamplingParams(max_tokens=4), 0))
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from tradeoff.backends.decoding import Decoder
from tradeoff.errors import InferenceFailed, TradeoffError, Unavailable
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.engine_messages import (
    Abort,
    Add,
    CoreEnded,
    Drain,
    EngineInfo,
    EngineLoad,
    ErrorOut,
    Finish,
    FinishedOut,
    Inbound,
    Outbound,
    StepOutputs,
    error_out,
)
from tradeoff.generate.generation_stats import GenerationStats, StatsSnapshot
from tradeoff.generate.loader import new_engine
from tradeoff.scheduling.priority import GenerationPriority

__all__ = ["EngineCore"]

log = logging.getLogger("tradeoff.server")
# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")


class EngineCore:
    """One generative model version's engine and the thread that steps it."""

    def __init__(self, name: str, version: int, config: GenerativeConfig, decoder: Decoder
                 ) -> None:
        self.name = name
        self.engine = new_engine(config, decoder)
        self.overlap = config.overlap
        self.info = EngineInfo(int(decoder.config.vocab_size),
                               int(decoder.config.max_position))
        self.stats = GenerationStats(name, version)
        self._inbox: queue.SimpleQueue[Inbound] = queue.SimpleQueue()
        self._wake = threading.Event()
        self._stop = False
        self._deadline: float | None = None  # time.monotonic() when the drain ends
        self._sequences: dict[int, Any] = {}  # request id -> its engine sequence
        self._requests: dict[int, int] = {}  # engine sequence id -> request id
        self._taken = 0  # adds taken since the last message
        self._errors: list[ErrorOut] = []  # refusals to send with the next message
        self._publish: Callable[[Outbound], None] = lambda message: None
        self._thread = threading.Thread(target=self._run, name=f"generate-{name}",
                                        daemon=True)

    # ------------------------------------------------------------ the client's side

    def start(self, publish: Callable[[Outbound], None]) -> None:
        """Start stepping; ``publish`` gets every outbound message, on the core's
        thread, in order."""
        self._publish = publish
        self._thread.start()

    def send(self, message: Inbound) -> None:
        self._inbox.put(message)
        self._wake.set()

    def stop(self) -> None:
        """Stop after the current turn: what still runs fails as the server shutting
        down."""
        self._stop = True
        self._wake.set()

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def snapshot(self) -> tuple[StatsSnapshot, EngineLoad]:
        """A copy of the statistics and the load now."""
        return self.stats.snapshot(), self._load()

    # ------------------------------------------------------------ the core's thread

    def _load(self) -> EngineLoad:
        engine = self.engine
        return EngineLoad(len(engine.scheduler.running), len(engine.scheduler.waiting),
                          engine.blocks.usage, engine.blocks.query_tokens,
                          engine.blocks.hit_tokens)

    def _take_inbox(self) -> None:
        messages: list[Inbound] = []
        while True:
            try:
                messages.append(self._inbox.get_nowait())
            except queue.Empty:
                break
        # a request that left before the core took it is never queued
        left = {m.request_id for m in messages if isinstance(m, Abort)}
        for message in messages:
            if isinstance(message, Add):
                self._taken += 1
                if message.request_id not in left:
                    self._add(message)
            elif isinstance(message, Abort):
                self._abort(message.request_id)
            elif isinstance(message, Finish):
                self._finish(message)
            else:
                self._drain(message)

    def _add(self, message: Add) -> None:
        try:
            seq = self.engine.add(message.prompt, message.params,
                                  GenerationPriority(message.priority))
        except Exception as exc:  # this request's own failure: it alone hears it
            if not isinstance(exc, TradeoffError):
                request_log.exception("model %s: a request could not be queued", self.name)
            self._errors.append(error_out(message.request_id, exc))
            return
        self._sequences[message.request_id] = seq
        self._requests[seq.seq_id] = message.request_id
        self.stats.arrived(seq.seq_id, len(message.prompt))

    def _abort(self, request_id: int) -> None:
        seq = self._sequences.pop(request_id, None)
        if seq is not None:
            self.engine.abort(seq)
            self._requests.pop(seq.seq_id, None)
            self.stats.forget(seq.seq_id)

    def _finish(self, message: Finish) -> None:
        seq = self._sequences.pop(message.request_id, None)
        if seq is not None:  # else it ended on this core's side first
            self.engine.finish(seq)
            self._requests.pop(seq.seq_id, None)
            self.stats.stopped(seq.seq_id, message.at)

    def _drain(self, message: Drain) -> None:
        deadline = time.monotonic() + message.seconds
        self._deadline = deadline if self._deadline is None else min(self._deadline, deadline)

    def _run(self) -> None:
        failed = None
        try:
            self._serve()
        except Exception as exc:  # a bug: fail what is in flight, refuse what comes
            log.exception("model %s: the engine thread stopped", self.name)
            failed = f"the engine stopped ({type(exc).__name__}: {exc})"
        finally:
            ending = Unavailable(failed or "the server is shutting down")
            self._fail_all(ending)
            self._take_inbox()  # requests that arrived while it stopped hear it too
            self._fail_all(ending)
            self._send_turn(None)
            self.engine.close()
            self._publish(CoreEnded(failed))

    def _serve(self) -> None:
        """Each turn: launch step N+1 scheduled on step N's outcome (overlap
        scheduling: the worker runs it as soon as N ends), collect step N, then make
        its message while N+1 runs. Without overlap (``overlap: false``), launch a step
        and collect it in the same turn: a request that arrives while a step runs is in
        the next one, not the one after."""
        running: Any = None  # a launched step not collected yet
        while not self._stop:
            self._take_inbox()
            if self._deadline is not None and self._sequences and \
                    time.monotonic() >= self._deadline:
                self._fail_all(Unavailable("the server stopped this generation: it was still "
                                           "running at the end of the shutdown drain"))
            launched = None
            if self.engine.has_work():
                try:
                    launched = self.engine.launch(running)
                except Exception as exc:  # the model failed: every running request hears it
                    log.exception("model %s: generation step failed", self.name)
                    self._fail_all(exc)
            if not self.overlap:  # collect the step just launched (nothing else runs)
                running, launched = launched, None
            report = None
            if running is not None:
                try:
                    report = self.engine.collect(running)
                except Exception as exc:  # the model failed: every running request hears it
                    log.exception("model %s: generation step failed", self.name)
                    self._fail_all(exc)
            self._send_turn(report)
            running = launched
            if running is None and not self.engine.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
        if running is not None:
            try:
                self._send_turn(self.engine.collect(running))
            except Exception:
                log.exception("model %s: generation step failed", self.name)

    def _send_turn(self, report: Any) -> None:
        """One message for the turn: a collected step's tokens and endings, the
        refusals and failures since the last message, and the load; none when nothing
        changed."""
        if report is None and not self._taken and not self._errors:
            return
        request_ids: list[int] = []
        tokens: list[int] = []
        cached: list[tuple[int, int]] = []
        finished: list[FinishedOut] = []
        now = time.perf_counter()
        if report is not None:
            self.stats.step(report, now)
            requests = self._requests
            for seq, token in zip(report.decoded, report.tokens, strict=True):
                request_id = requests.get(seq.seq_id)
                if request_id is not None:
                    request_ids.append(request_id)
                    tokens.append(token)
                    # its first token (the next one's place is added when that step
                    # launches, after this message): its prompt's prefix-cache hits
                    if len(seq.output) == 1:
                        cached.append((request_id, seq.cached_tokens))
            for seq in report.finished:
                request_id = requests.pop(seq.seq_id, None)
                if request_id is not None:
                    self._sequences.pop(request_id, None)
                    finished.append(FinishedOut(request_id, seq.finish_reason))
            failed = []
            for seq, error in report.failed:  # this request alone hears it
                request_log.error("model %s: request %d failed: %s", self.name, seq.seq_id,
                                  error)
                failed.append(seq.seq_id)
                request_id = requests.pop(seq.seq_id, None)
                if request_id is not None:
                    self._sequences.pop(request_id, None)
                    self._errors.append(error_out(request_id, InferenceFailed(
                        f"generation failed: {error}")))
            self.stats.failed(failed)
        message = StepOutputs(now, request_ids, tokens, cached, finished, self._errors,
                              self._taken, self._load())
        self._taken, self._errors = 0, []
        self._publish(message)

    def _fail_all(self, error: Exception) -> None:
        self.stats.failed([seq.seq_id for seq in self._sequences.values()])
        for request_id, seq in self._sequences.items():
            self.engine.abort(seq)
            self._errors.append(error_out(request_id, error))
        self._sequences.clear()
        self._requests.clear()
