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

With ``serve --workers`` the engine process is the supervisor's
(:func:`run_shared_engine`), and every front end dials it: each front end's requests
go under ids of the core's, and each turn's outputs go back split by front end. A front
end that drains or leaves ends its own generations only.
"""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import multiprocessing.connection
import os
import pickle
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

import msgspec

from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.errors import ModelLoadError
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.engine_core import EngineCore
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
)
from tradeoff.generate.generation_stats import StatsSnapshot

__all__ = ["ProcessCore", "ready_or_failed", "run_shared_engine"]

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


def _load_core(conn: multiprocessing.connection.Connection, name: str, version: int,
               loader: Loader) -> tuple[EngineCore, Tokenizer] | None:
    """The model loaded into a core; None, the failure said on ``conn``, when it fails."""
    try:
        config, decoder, tokenizer = loader()
        return EngineCore(name, version, config, decoder), tokenizer
    except Exception as exc:
        conn.send_bytes(_encode(_LoadFailed(f"{type(exc).__name__}: {exc}")))
        return None


def _child(conn: multiprocessing.connection.Connection, name: str, version: int,
           loader: Loader) -> None:
    """The child's main: load, answer Ready, then relay the pipe to the core and the
    core's messages to the pipe until told to stop or the pipe closes."""
    loaded = _load_core(conn, name, version, loader)
    if loaded is None:
        return
    core, tokenizer = loaded
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
    """An engine core in another process, behind the same calls as :class:`EngineCore`:
    a child of this server's (:meth:`spawn`), or one the front ends of ``serve
    --workers`` share (:meth:`dial`). Making one loads the model there (blocking: call
    it off the event loop)."""

    def __init__(self, name: str, conn: multiprocessing.connection.Connection,
                 process: BaseProcess | None, pid: int | None, start_timeout_s: float
                 ) -> None:
        self.name = name
        self._conn = conn
        self._process = process  # None: a shared core, not this server's to reap
        self.pid = pid if process is None else process.pid
        first = ready_or_failed(conn, name, start_timeout_s, process)
        self.info = first.info
        self.tokenizer: Tokenizer = pickle.loads(first.tokenizer)
        self._sending = threading.Lock()
        self._asked = 0  # snapshots asked for, and the number of the last answered
        self._answered = 0
        self._answer = threading.Condition()
        self._last = (StatsSnapshot(name, 1), EngineLoad())
        self._ended = False
        self._publish: Callable[[Outbound], None] = lambda message: None
        self._reader = threading.Thread(target=self._read, name=f"engine-pipe-{name}",
                                        daemon=True)

    @classmethod
    def spawn(cls, name: str, version: int, loader: Loader, start_timeout_s: float
              ) -> ProcessCore:
        """A child process of this server's that loads the model and steps it."""
        context = multiprocessing.get_context("spawn")
        conn, child = context.Pipe()
        process = context.Process(target=_child, args=(child, name, version, loader),
                                  name=f"engine-{name}", daemon=True)
        process.start()
        child.close()
        return cls(name, conn, process, None, start_timeout_s)

    @classmethod
    def dial(cls, name: str, address: str, authkey: bytes, pid: int,
             start_timeout_s: float) -> ProcessCore:
        """The engine process at ``address`` that ``serve --workers``' front ends share
        (:func:`run_shared_engine`)."""
        conn = multiprocessing.connection.Client(address, "AF_UNIX", authkey=authkey)
        return cls(name, conn, None, pid, start_timeout_s)

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
        if self._reader.is_alive() or self._reader.ident is not None:
            self._reader.join(timeout_s)
        if self._process is not None:
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
            if self._process is not None:
                self._process.join(1)
            code = self._process.exitcode if self._process is not None else None
            log.error("model %s: its engine process ended (exit code %s)", self.name, code)
            self._publish(CoreEnded(f"its engine process ended (exit code {code})"))
        with self._answer:
            self._ended = True
            self._answer.notify_all()

    def _kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()
            self._process.join(5)



# ------------------------------------------------------------ shared by front ends

class _Peer:
    """A front end of a shared engine core: its pipe, and its requests by its own ids."""

    def __init__(self, conn: multiprocessing.connection.Connection) -> None:
        self.conn = conn
        self.ids: dict[int, int] = {}  # the front end's request id -> the core's
        self.closed = False
        self._sending = threading.Lock()

    def send(self, message: _FromChild) -> None:
        data = _encode(message)
        with self._sending:
            if self.closed:
                return
            try:
                self.conn.send_bytes(data)
            except OSError:
                self.closed = True


class _Hub:
    """The front ends of one engine core (``serve --workers``): each request under an id
    of the core's, each turn's outputs sent to the front ends whose requests they are."""

    def __init__(self, core: EngineCore, tokenizer: bytes) -> None:
        self.core = core
        self.ready = _Ready(core.info, tokenizer)
        self.lock = threading.Lock()
        self.peers: list[_Peer] = []
        self.owners: dict[int, tuple[_Peer, int]] = {}  # core's id -> front end, its id
        self.adds: deque[_Peer] = deque()  # whose Add the core takes next
        self.ids = itertools.count()
        self.done = threading.Event()  # the last front end left, or the core ended

    def join(self, conn: multiprocessing.connection.Connection) -> None:
        peer = _Peer(conn)
        with self.lock:
            self.peers.append(peer)
        peer.send(self.ready)
        threading.Thread(target=self._serve, args=(peer,), name="engine-peer",
                         daemon=True).start()

    def _serve(self, peer: _Peer) -> None:
        try:
            while True:
                message = _to_child.decode(peer.conn.recv_bytes())
                if isinstance(message, _Stop):  # it stops its client: the core, for it
                    peer.send(CoreEnded(None))
                    break
                if isinstance(message, _Ask):
                    stats, load = self.core.snapshot()
                    peer.send(_Snapshot(message.number, stats, load))
                elif isinstance(message, Add):
                    with self.lock:  # the core's inbox takes them in this order
                        number = next(self.ids)
                        self.owners[number] = (peer, message.request_id)
                        peer.ids[message.request_id] = number
                        self.adds.append(peer)
                        self.core.send(msgspec.structs.replace(message, request_id=number))
                elif isinstance(message, (Abort, Finish)):
                    with self.lock:
                        ours = peer.ids.pop(message.request_id, None)
                        if ours is not None:
                            self.owners.pop(ours, None)
                            self.core.send(msgspec.structs.replace(message, request_id=ours))
                elif isinstance(message, Drain):
                    self._drain(peer, message.seconds)
        except (EOFError, OSError):
            pass  # the front end is gone
        self._leave(peer)

    def _leave(self, peer: _Peer) -> None:
        """A front end left (stopped, or died): its generations stop; the last one to
        leave stops the core."""
        with self.lock:
            if peer in self.peers:
                self.peers.remove(peer)
            for number in peer.ids.values():
                self.owners.pop(number, None)
                self.core.send(Abort(number))
            peer.ids.clear()
            peer.closed = True
            last = not self.peers
        peer.conn.close()
        if last:
            self.done.set()

    def _drain(self, peer: _Peer, seconds: float) -> None:
        """One front end stops: its generations run ``seconds`` more, then end with an
        error; the others' go on (the core drains when the last one does)."""
        with self.lock:
            alone = self.peers == [peer]
        if alone:
            self.core.send(Drain(seconds))
            return
        timer = threading.Timer(seconds, self._end_drained, (peer,))
        timer.daemon = True
        timer.start()

    def _end_drained(self, peer: _Peer) -> None:
        with self.lock:
            errors = [ErrorOut(mine, "Unavailable", "the server stopped this generation: it "
                               "was still running when the drain ended")
                      for mine in peer.ids]
            for number in peer.ids.values():
                self.owners.pop(number, None)
                self.core.send(Abort(number))
            peer.ids.clear()
        if errors:
            peer.send(StepOutputs(time.perf_counter(), [], [], [], [], errors, 0,
                                  EngineLoad()))

    def publish(self, message: Outbound) -> None:
        """The core's message (on its thread), split among the front ends."""
        if isinstance(message, CoreEnded):
            with self.lock:
                peers = list(self.peers)
            for peer in peers:
                peer.send(message)
            self.done.set()
            return
        parts: dict[_Peer, _Part] = {}
        with self.lock:
            for _ in range(message.taken):
                if self.adds:
                    parts.setdefault(self.adds.popleft(), _Part()).taken += 1
            for number, token in zip(message.request_ids, message.tokens, strict=True):
                owner = self.owners.get(number)
                if owner is not None:
                    part = parts.setdefault(owner[0], _Part())
                    part.request_ids.append(owner[1])
                    part.tokens.append(token)
            for number, cached in message.cached:
                owner = self.owners.get(number)
                if owner is not None:
                    parts.setdefault(owner[0], _Part()).cached.append((owner[1], cached))
            for finished in message.finished:
                owner = self._forget(finished.request_id)
                if owner is not None:
                    parts.setdefault(owner[0], _Part()).finished.append(
                        FinishedOut(owner[1], finished.reason))
            for error in message.errors:
                owner = self._forget(error.request_id)
                if owner is not None:
                    parts.setdefault(owner[0], _Part()).errors.append(
                        ErrorOut(owner[1], error.kind, error.message))
        for peer, part in parts.items():
            peer.send(StepOutputs(message.at, part.request_ids, part.tokens, part.cached,
                                  part.finished, part.errors, part.taken, message.load))

    def _forget(self, number: int) -> tuple[_Peer, int] | None:
        owner = self.owners.pop(number, None)
        if owner is not None:
            owner[0].ids.pop(owner[1], None)
        return owner


@dataclass
class _Part:
    """One front end's share of a turn's outputs."""

    request_ids: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    cached: list[tuple[int, int]] = field(default_factory=list)
    finished: list[FinishedOut] = field(default_factory=list)
    errors: list[ErrorOut] = field(default_factory=list)
    taken: int = 0


def ready_or_failed(conn: multiprocessing.connection.Connection, name: str,
                    timeout_s: float, process: BaseProcess | None = None) -> _Ready:
    """An engine process's first message once it has loaded its model; ModelLoadError
    saying why when it does not (``process``, where this side started it, is then
    reaped, or killed when it takes too long). Blocking."""
    if not conn.poll(timeout_s):
        if process is not None and process.is_alive():
            process.kill()
            process.join(5)
        raise ModelLoadError(f"model {name!r}: its engine process did not load it within "
                             f"{timeout_s:g} s")
    try:
        first = _from_child.decode(conn.recv_bytes())
    except (EOFError, OSError):
        if process is not None:
            process.join(5)
        raise ModelLoadError(f"model {name!r}: its engine process exited while loading "
                             f"(exit code {process.exitcode if process else None})"
                             ) from None
    if isinstance(first, _LoadFailed):
        if process is not None:
            process.join(5)
        raise ModelLoadError(f"model {name!r}: {first.reason}")
    assert isinstance(first, _Ready)
    return first


def run_shared_engine(control: multiprocessing.connection.Connection, address: str,
                      authkey: bytes, name: str, version: int, loader: Loader) -> None:
    """An engine process ``serve --workers``' front ends share: it loads the model, says
    so on ``control`` (its supervisor's pipe), then serves the front ends that dial
    ``address``. It ends when the last front end leaves, the core stops on its own, or
    the supervisor goes."""
    loaded = _load_core(control, name, version, loader)
    if loaded is None:
        return
    core, tokenizer = loaded
    if os.path.exists(address):
        os.unlink(address)
    listener = multiprocessing.connection.Listener(address, "AF_UNIX", authkey=authkey)
    hub = _Hub(core, pickle.dumps(tokenizer))
    core.start(hub.publish)

    def accept() -> None:  # the handshake blocks: a thread of its own
        while not hub.done.is_set():
            try:
                hub.join(listener.accept())
            except (OSError, multiprocessing.AuthenticationError, EOFError):
                continue

    def supervised() -> None:
        try:
            control.recv_bytes()
        except (EOFError, OSError):
            pass
        hub.done.set()  # the supervisor is gone, or says stop

    threading.Thread(target=accept, name="engine-accept", daemon=True).start()
    threading.Thread(target=supervised, name="engine-control", daemon=True).start()
    control.send_bytes(_encode(hub.ready))
    hub.done.wait()
    listener.close()
    core.stop()
    core.join(60)
