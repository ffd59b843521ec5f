"""What an engine client and its engine core say to each other: small typed messages and
nothing shared. In one process they are handed over as objects; between processes the
same structs go through msgspec's msgpack codec (``encode`` / ``decode_outbound``).

In (client to core): :class:`Add`, :class:`Abort`, :class:`Finish`, :class:`Drain`.
Out (core to client): a :class:`StepOutputs` per turn of the core's loop that changed
anything (the step's token ids, the generations that ended, how many adds it took, its
load), and one :class:`CoreEnded` when it stops. Texts are the client's: it detokenizes
and finds the stop strings (a stop string found is a :class:`Finish`).

    core.send(Add(7, [1, 2, 3], SamplingParams(max_tokens=8), 0))
    # ... the client's receive() gets StepOutputs(request_ids=[7], tokens=[42], ...)
"""

from __future__ import annotations

import msgspec

from tradeoff.errors import InferenceFailed, InvalidInput, RequestError, Unavailable
from tradeoff.generate.sampling_params import SamplingParams

__all__ = [
    "Abort",
    "Add",
    "CoreEnded",
    "Drain",
    "EngineInfo",
    "EngineLoad",
    "ErrorOut",
    "Finish",
    "FinishedOut",
    "Inbound",
    "Outbound",
    "StepOutputs",
    "as_error",
    "decode_inbound",
    "decode_outbound",
    "encode",
    "error_out",
]


class Add(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Queue a generation: its prompt's token ids, sampling settings and priority
    (lower first)."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    priority: int


class Abort(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The client left: stop generating for this request (if it still runs)."""

    request_id: int


class Finish(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A stop string ended the answer's text (the client found it): end the generation
    as finished ("stop"); ``at`` (time.perf_counter) is when its last token was
    published, the end of its end-to-end time. Tokens the core made for it meanwhile are
    counted as generated, never sent."""

    request_id: int
    at: float


class Drain(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The server stops: the generations in flight may run ``seconds`` more, then each
    still running ends with an error saying why."""

    seconds: float


Inbound = Add | Abort | Finish | Drain


class EngineInfo(msgspec.Struct, frozen=True):
    """What the front end checks a prompt against before queueing it."""

    vocab: int  # token ids are 0 .. vocab - 1
    max_position: int  # prompt + answer tokens at most


class EngineLoad(msgspec.Struct, array_like=True, frozen=True):
    """The core's queues and caches after a turn (``/metrics``, admission)."""

    running: int = 0
    waiting: int = 0
    kv_usage: float = 0.0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache, ever
    prefix_hits: int = 0  # of them, found


class FinishedOut(msgspec.Struct, array_like=True, frozen=True):
    """A generation ended: ``stop`` (end of sequence) or ``length``."""

    request_id: int
    reason: str


class ErrorOut(msgspec.Struct, array_like=True, frozen=True):
    """A generation failed or was refused; ``kind`` names the error class the client
    raises (:func:`as_error`)."""

    request_id: int
    kind: str
    message: str


class StepOutputs(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """One turn of the core: ``at`` (time.perf_counter) when it was published; the
    step's tokens in columns (``request_ids[i]`` got ``tokens[i]``); ``cached``: for
    each generation this step gave its first token, (request id, its prompt's tokens
    found in the prefix cache); the generations that ended; ``taken``: how many Add
    messages the core took since its last message; its load after the turn."""

    at: float
    request_ids: list[int]
    tokens: list[int]
    cached: list[tuple[int, int]]
    finished: list[FinishedOut]
    errors: list[ErrorOut]
    taken: int
    load: EngineLoad


class CoreEnded(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The core stopped; ``failed``: why, when it stopped on its own (a bug, a lost
    device), None when it was told to stop."""

    failed: str | None


Outbound = StepOutputs | CoreEnded

_ERRORS: dict[str, type[RequestError]] = {
    cls.__name__: cls for cls in (InvalidInput, Unavailable, InferenceFailed)}


def error_out(request_id: int, error: BaseException) -> ErrorOut:
    """An error as a message: a request error keeps its class (or the nearest one the
    client knows, with the same status); anything else is a failed generation."""
    if not isinstance(error, RequestError):
        return ErrorOut(request_id, "RequestError", f"generation failed: {error}")
    kind = next((c.__name__ for c in type(error).__mro__ if c.__name__ in _ERRORS),
                "RequestError")
    return ErrorOut(request_id, kind, str(error))


def as_error(message: ErrorOut) -> RequestError:
    """The request error a client raises for an :class:`ErrorOut`."""
    return _ERRORS.get(message.kind, RequestError)(message.message)


_encoder = msgspec.msgpack.Encoder()
_inbound = msgspec.msgpack.Decoder(Inbound)
_outbound = msgspec.msgpack.Decoder(Outbound)


def encode(message: Inbound | Outbound) -> bytes:
    return _encoder.encode(message)


def decode_inbound(data: bytes) -> Inbound:
    return _inbound.decode(data)


def decode_outbound(data: bytes) -> Outbound:
    return _outbound.decode(data)
