"""The messages between the server and an executor process (``serve --executors
process``), msgpack on a pipe. Tensor bytes do not travel in them: each names where
its bytes lie in a shared arena (``server/shared_arena.py``); only BYTES tensors (numpy
object arrays) go inline. Each side sends what one turn of its event loop produced as
one list: one write on the pipe for many requests.

To the executor: load a model, its requests, cancels, drains, unloads, and the output
blocks the server has copied out. From it: a load's versions, one :class:`Answered` per
batch (its answers, what its statistics recorded, the queue after it), cancelled requests
let go, and models whose instances all died.
"""

from __future__ import annotations

from typing import Any

import msgspec
import numpy as np

from tradeoff.scheduling.executor import ExecutorLoad
from tradeoff.server.build import BuildLimits
from tradeoff.server.shared_arena import SharedArena

__all__ = ["Answer", "Answered", "BatchRecord", "Cancel", "CancelLoad", "Drain", "Failure",
           "FromExecutor", "Hello", "Infer", "LoadFailed", "LoadModel", "Loaded", "ModelDied",
           "Release", "Released", "TensorRef", "ToExecutor", "Unload", "Unloaded",
           "decode_from_executor", "decode_to_executor", "encode", "read_tensor",
           "write_tensor", "write_tensors"]


class TensorRef(msgspec.Struct, array_like=True, frozen=True):
    """A tensor: in a shared arena at ``start`` (``items`` None), or, BYTES, inline."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int = -1
    items: list[Any] | None = None  # bytes, or str


def write_tensor(arena: SharedArena, name: str, array: np.ndarray) -> TensorRef | None:
    """``array`` copied into ``arena`` (None when it is full); BYTES inline."""
    if array.dtype == object:  # bytes, or str as a runtime's string outputs are
        return TensorRef(name, "O", array.shape, items=array.ravel().tolist())
    start = arena.put(array)
    return None if start is None else TensorRef(name, array.dtype.str, array.shape, start)


def write_tensors(arena: SharedArena, arrays: dict[str, np.ndarray]
                  ) -> list[TensorRef] | None:
    """Every array of a request or an answer copied into ``arena``; None (and nothing
    held) when one does not fit."""
    refs: list[TensorRef] = []
    for name, array in arrays.items():
        ref = write_tensor(arena, name, array)
        if ref is None:
            for written in refs:
                if written.items is None:
                    arena.free(written.start)
            return None
        refs.append(ref)
    return refs


def read_tensor(arena: SharedArena, ref: TensorRef, copy: bool) -> np.ndarray:
    """The tensor ``ref`` names: a view of the arena, or (``copy``) an array of its own."""
    if ref.items is not None:
        out = np.empty(len(ref.items), dtype=object)
        out[:] = ref.items
        return out.reshape(ref.shape)
    view = arena.view(ref.start, ref.dtype, ref.shape)
    return view.copy() if copy else view


class Hello(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A front end's first message to a shared executor: its arenas, requests in and
    answers out (each created by the front end)."""

    inputs: str
    outputs: str


class LoadModel(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Build a model's versions from the repository at ``root`` (as a server load does).
    Front ends that load the same model, config and ``share`` (one repository change,
    named alike in every front end) hold one build."""

    load: int
    root: str
    name: str
    config_override: dict[str, Any] | None
    limits: BuildLimits
    inline_limit_ns: int
    share: str


class CancelLoad(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Stop the load's warmups at their next run: the load fails."""

    load: int


class Infer(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A request to the executor ``model`` (as :class:`Loaded` numbered it)."""

    model: int
    request: int
    inputs: list[TensorRef]
    rows: int
    shape_key: list[tuple[str, tuple[int, ...]]]
    priority: int
    timeout_us: int | None


class Cancel(msgspec.Struct, tag=True, array_like=True, frozen=True):
    model: int
    request: int


class Drain(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Refuse new requests to ``model`` and run what is queued now."""

    model: int


class Unload(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Answer ``model``'s accepted requests, then release its instances."""

    model: int


class Release(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Output blocks the server has copied out: free again."""

    starts: list[int]


ToExecutor = Hello | LoadModel | CancelLoad | Infer | Cancel | Drain | Unload | Release


class Loaded(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """The load's versions, each with the executor number its requests name."""

    load: int
    models: dict[int, int]  # version -> executor number


class LoadFailed(msgspec.Struct, tag=True, array_like=True, frozen=True):
    load: int
    error: str  # the error's class name (errors.py)
    message: str


class Failure(msgspec.Struct, array_like=True, frozen=True):
    """A request answered with an error: its class name (errors.py) and message."""

    error: str
    message: str


class Answer(msgspec.Struct, array_like=True, frozen=True):
    """One request's answer: its timings (``Timings``' fields) and outputs, or why not."""

    request: int
    timings: tuple[int, int, int, int, int]
    outputs: list[TensorRef] | None = None
    failure: Failure | None = None


class BatchRecord(msgspec.Struct, array_like=True, frozen=True):
    """What the executor's statistics recorded, for the server's to record the same:
    executions (rows, input, infer and output ns), successes (each request's total and
    queue ns, with the batch's timings), failures (total ns, reason)."""

    executions: list[tuple[int, int, int, int]]
    successes: list[tuple[list[int], list[int], tuple[int, int, int, int]]]
    failures: list[tuple[int, str]]


class Answered(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """Answers that left the executor together (a batch's), the statistics they
    recorded, and the executor's queue after them."""

    model: int
    answers: list[Answer]
    record: BatchRecord
    load: ExecutorLoad


class Released(msgspec.Struct, tag=True, array_like=True, frozen=True):
    """A cancelled request the executor no longer reads (its input blocks are free)."""

    model: int
    request: int
    record: BatchRecord


class ModelDied(msgspec.Struct, tag=True, array_like=True, frozen=True):
    model: int
    cause: str


class Unloaded(msgspec.Struct, tag=True, array_like=True, frozen=True):
    model: int
    record: BatchRecord


FromExecutor = Loaded | LoadFailed | Answered | Released | ModelDied | Unloaded

encode = msgspec.msgpack.Encoder().encode
# each side sends what one turn of its event loop produced as one list
decode_to_executor = msgspec.msgpack.Decoder(list[ToExecutor]).decode
decode_from_executor = msgspec.msgpack.Decoder(list[FromExecutor]).decode
