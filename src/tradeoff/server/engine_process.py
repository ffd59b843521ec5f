"""A generative model's engine core in a process of its own (``generate.yaml``:
``process: true``): its host work (scheduling, sampling's bookkeeping, detokenizing)
runs beside the server's request work, not under the same GIL.

The server's :class:`EngineClient` drives a :class:`ProcessCore` exactly as it drives
an in-process :class:`EngineCore`: the core's messages (``generate/engine_messages.py``)
cross a pipe as msgpack, one per step. The child loads the model itself and hands the
front end its tokenizer at start.

A child that dies (killed, out of memory) ends with :class:`CoreEnded`: every request
in flight fails with 503 at once and the model refuses new ones until it is loaded
again. A child whose server goes away sees its pipe close and stops.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import pickle
import threading
from collections.abc import Callable

import msgspec

from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.errors import ModelLoadError
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.engine_core import EngineCore
from tradeoff.generate.engine_messages import (
    CoreEnded,
    EngineInfo,
    EngineLoad,
    Inbound,
    Outbound,
    StepOutputs,
)
from tradeoff.generate.generation_stats import StatsSnapshot

__all__ = ["ProcessCore"]

log = logging.getLogger("tradeoff.server")

SNAPSHOT_WAIT_S = 2.0  # a snapshot not answered by then: the last one is shown


class _Stop(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Stop stepping; the core's last messages follow, then the child exits."""


class _Ask(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Send a snapshot of the statistics and load, numbered ``number``."""

    number: int


class _Ready(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The model is loaded: what the front end checks prompts against, and its
    tokenizer (pickled: this server's own code on both ends)."""

    info: EngineInfo
    tokenizer: bytes


class _LoadFailed(msgspec.Struct, tag=True, array_like=True, frozen=True):
    reason: str


class _Snapshot(msgspec.Struct, tag=True, array_like=True, frozen=True):
    number: int
    stats: StatsSnapshot
    load: EngineLoad


_ToChild = Inbound | _Stop | _Ask
_FromChild = Outbound | _Ready | _LoadFailed | _Snapshot
Loader = Callable[[], tuple[GenerativeConfig, Decoder, Tokenizer]]

_encode = msgspec.msgpack.Encoder().encode
_to_child = msgspec.msgpack.Decoder(_ToChild)
_from_child = msgspec.msgpack.Decoder(_FromChild)


def _child(conn: multiprocessing.connection.Connection, name: str, version: int,
           loader: Loader) -> None:
    """The child's main: load, answer Ready, then relay the pipe to the core and the
    core's messages to the pipe until told to stop or the pipe closes."""
    try:
        config, decoder, tokenizer = loader()
        core = EngineCore(name, version, config, decoder, tokenizer)
    except Exception as exc:
        conn.send_bytes(_encode(_LoadFailed(f"{type(exc).__name__}: {exc}")))
        return
    sending = threading.Lock()

    def send(message: _FromChild) -> None:
        data = _encode(message)
        with sending:
            conn.send_bytes(data)

    send(_Ready(core.info, pickle.dumps(tokenizer)))
    core.start(send)
    try:
        while True:
            message = _to_child.decode(conn.recv_bytes())
            if isinstance(message, _Stop):
                break
            if isinstance(message, _Ask):
                stats, load = core.snapshot()
                send(_Snapshot(message.number, stats, load))
            else:
                core.send(message)
    except (EOFError, OSError):
        pass  # the server is gone: stop
    core.stop()
    core.join(60)


class ProcessCore:
    """An engine core in a child process, behind the same calls as :class:`EngineCore`.
    Starting it loads the model in the child (blocking: call it off the event loop)."""

    def __init__(self, name: str, version: int, loader: Loader, start_timeout_s: float
                 ) -> None:
        self.name = name
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_child, args=(child, name, version, loader),
                                        name=f"engine-{name}", daemon=True)
        self._process.start()
        child.close()
        if not self._conn.poll(start_timeout_s):
            self._kill()
            raise ModelLoadError(f"model {name!r}: its engine process did not load it "
                                 f"within {start_timeout_s:g} s")
        try:
            first = _from_child.decode(self._conn.recv_bytes())
        except (EOFError, OSError):
            self._process.join(5)
            raise ModelLoadError(f"model {name!r}: its engine process exited while loading "
                                 f"(exit code {self._process.exitcode})") from None
        if isinstance(first, _LoadFailed):
            self._process.join(5)
            raise ModelLoadError(f"model {name!r}: {first.reason}")
        assert isinstance(first, _Ready)
        self.info = first.info
        self.tokenizer: Tokenizer = pickle.loads(first.tokenizer)
        self._sending = threading.Lock()
        self._asked = 0  # snapshots asked for, and the number of the last answered
        self._answered = 0
        self._answer = threading.Condition()
        self._last = (StatsSnapshot(name, version), EngineLoad())
        self._ended = False
        self._publish: Callable[[Outbound], None] = lambda message: None
        self._reader = threading.Thread(target=self._read, name=f"engine-pipe-{name}",
                                        daemon=True)

    def start(self, publish: Callable[[Outbound], None]) -> None:
        self._publish = publish
        self._reader.start()

    def send(self, message: Inbound | _Stop | _Ask) -> None:
        data = _encode(message)
        try:
            with self._sending:
                self._conn.send_bytes(data)
        except OSError:
            pass  # the child is gone: its end is reported by the reader

    def stop(self) -> None:
        self.send(_Stop())

    def join(self, timeout_s: float) -> None:
        self._reader.join(timeout_s)
        self._process.join(timeout_s)
        if self._process.is_alive():
            self._kill()
        self._conn.close()

    def snapshot(self) -> tuple[StatsSnapshot, EngineLoad]:
        """The child's statistics and load now (the last known ones if it does not
        answer within SNAPSHOT_WAIT_S)."""
        with self._answer:
            if self._ended:
                return self._last
            self._asked += 1
            number = self._asked
            self.send(_Ask(number))
            self._answer.wait_for(lambda: self._ended or self._answered >= number,
                                  SNAPSHOT_WAIT_S)
            return self._last

    def _read(self) -> None:
        try:
            while True:
                message = _from_child.decode(self._conn.recv_bytes())
                if isinstance(message, _Snapshot):
                    with self._answer:
                        self._last = (message.stats, message.load)
                        self._answered = message.number
                        self._answer.notify_all()
                    continue
                if isinstance(message, (StepOutputs, CoreEnded)):
                    self._publish(message)
                if isinstance(message, CoreEnded):
                    break
        except (EOFError, OSError):
            self._process.join(1)
            code = self._process.exitcode
            log.error("model %s: its engine process ended (exit code %s)", self.name, code)
            self._publish(CoreEnded(f"its engine process ended (exit code {code})"))
        with self._answer:
            self._ended = True
            self._answer.notify_all()

    def _kill(self) -> None:
        if self._process.is_alive():
            self._process.kill()
            self._process.join(5)

