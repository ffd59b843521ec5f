"""The stored form of an answer: tensor outputs or a generation as one value, and the
checks a decoded value must pass (the outputs the model declares; token ids in its
vocabulary, a normal end) before it is used.

    value = encode_outputs(outputs)
    outputs = decode_outputs(value, expected)   # ValueError: not the expected outputs
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import orjson

from tradeoff import dtypes
from tradeoff.errors import InvalidValue
from tradeoff.protocol.v2 import TensorOutput, decode_bytes_elements, encode_bytes_elements

__all__ = [
    "FINISH_REASONS",
    "Expected",
    "decode_generation",
    "decode_outputs",
    "encode_generation",
    "encode_outputs",
]

FINISH_REASONS = frozenset({"stop", "length"})
_U32 = struct.Struct("<I")


def encode_outputs(outputs: Sequence[TensorOutput]) -> bytes:
    """Outputs as one value: a JSON header of names, datatypes, shapes and sizes, then
    the raw tensor bytes."""
    blobs = [encode_bytes_elements(o.array) if o.datatype == "BYTES"
             else np.ascontiguousarray(o.array).tobytes() for o in outputs]
    header = orjson.dumps([[o.name, o.datatype, list(o.array.shape), o.binary, len(b)]
                           for o, b in zip(outputs, blobs, strict=True)])
    return b"".join([_U32.pack(len(header)), header, *blobs])


# What a model declares for each output asked for: name, datatype, binary, and the shape
# (-1 where any size is allowed).
Expected = Sequence[tuple[str, str, bool, Sequence[int]]]


def decode_outputs(value: bytes | memoryview, expected: Expected) -> list[TensorOutput]:
    """The outputs :func:`encode_outputs` stored (numeric tensors are views, no copy),
    or ValueError when they are not the ``expected`` outputs."""
    view = memoryview(value)
    (length,) = _U32.unpack_from(view, 0)
    offset = 4 + length
    outputs = []
    header = orjson.loads(view[4:offset])
    if not isinstance(header, list) or len(header) != len(expected):
        raise InvalidValue("stored answer has other outputs than the request asks for")
    for (name, datatype, shape, binary, size), want in zip(header, expected, strict=True):
        want_name, want_datatype, want_binary, want_shape = want
        if (name, datatype, binary) != (want_name, want_datatype, want_binary) or \
                not isinstance(shape, list) or len(shape) != len(want_shape) or \
                any(not isinstance(d, int) or d < 0 or (w >= 0 and d != w)
                    for d, w in zip(shape, want_shape, strict=True)):
            raise InvalidValue(f"stored output {name!r} is not what the model declares")
        raw = view[offset:offset + size]
        if len(raw) != size:
            raise InvalidValue("stored answer is truncated")
        offset += size
        if datatype == "BYTES":
            count = int(np.prod(shape)) if shape else 1
            array = decode_bytes_elements(raw, count, name, max_element=len(raw)).reshape(shape)
        else:
            array = np.frombuffer(raw, dtype=dtypes.numpy_dtype(datatype)).reshape(shape)
        outputs.append(TensorOutput(name, array, datatype, binary))
    return outputs


def encode_generation(tokens: Sequence[int], reason: str) -> bytes:
    return orjson.dumps({"tokens": list(tokens), "finish_reason": reason})


def decode_generation(value: bytes | memoryview, vocab_size: int,
                      max_tokens: int) -> tuple[list[int], str]:
    """A stored generation, or ValueError unless it is one this model could have made:
    at most ``max_tokens`` token ids in its vocabulary, and a normal end."""
    doc = orjson.loads(value)
    tokens, reason = doc["tokens"], doc["finish_reason"]
    if reason not in FINISH_REASONS or not isinstance(tokens, list) or \
            len(tokens) > max_tokens or \
            not all(type(t) is int and 0 <= t < vocab_size for t in tokens):
        raise InvalidValue("stored generation is not one this model could have made")
    return tokens, reason
