"""What makes two requests the same answer: their keys, and the MAC that binds a stored
value to its key.

Every part that may change the answer (model, version, inputs, outputs asked for, the
parameters not in NEUTRAL_PARAMETERS and, unless entries are shared, the API key) is fed
length-prefixed to two BLAKE2b digests keyed by the server's secret: the lookup key and a
second digest bound into the MAC of a value kept where others can write.

    keys = Keys(secret, scope="key")
    key = keys.tensor_key(tenant, "mlp", 1, inputs, wanted, parameters)
    stored = keys.seal(key, value)      # keys.open(key, stored) -> value, or None
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tradeoff.protocol.v2 import encode_bytes_elements

__all__ = [
    "CHECK_BYTES",
    "KEY_BYTES",
    "MAC_BYTES",
    "NEUTRAL_PARAMETERS",
    "CacheKey",
    "Keys",
    "answer_parameters",
]

KEY_BYTES = 16     # the lookup key: keyed BLAKE2b-128
CHECK_BYTES = 32   # a second digest of the same material, bound into the MAC
MAC_BYTES = 32     # stored before the value: keyed BLAKE2b-256 of check + value
# Request parameters that cannot change an answer: scheduling, and the opt-out itself.
# Everything else a request carries is part of the key.
NEUTRAL_PARAMETERS = frozenset({"priority", "timeout", "cache", "binary_data_output",
                                "class"})
_U32 = struct.Struct("<I")


@dataclass(frozen=True, slots=True)
class CacheKey:
    """Where an answer is stored (``key``), a second digest of the same material
    (``check``: bound into the MAC in Redis, stored before the value locally) and the API
    key whose share it is charged to (``tenant``; empty when keys are off)."""

    key: bytes
    check: bytes
    tenant: bytes = b""


class _Material:
    """Feeds length-prefixed parts to both keyed digests, so no two different sequences
    of parts hash alike by shifting bytes between parts."""

    __slots__ = ("long", "short")

    def __init__(self, secret: bytes, kind: bytes, scope: bytes) -> None:
        self.short = hashlib.blake2b(digest_size=KEY_BYTES, key=secret, person=b"tradeoff-key")
        self.long = hashlib.blake2b(digest_size=CHECK_BYTES, key=secret,
                                    person=b"tradeoff-check")
        self.add(kind)
        self.add(scope)

    def add(self, data: bytes | memoryview) -> None:
        length = _U32.pack(len(data)) if len(data) < 1 << 32 else struct.pack("<Q", len(data))
        for digest in (self.short, self.long):
            digest.update(length)
            digest.update(data)

    def text(self, value: str) -> None:
        self.add(value.encode())

    def array(self, datatype: str, array: np.ndarray) -> None:
        self.text(datatype)
        self.add(orjson.dumps(list(array.shape)))
        if datatype == "BYTES":
            self.add(encode_bytes_elements(array))
        else:
            self.add(np.ascontiguousarray(array).reshape(-1).view(np.uint8).data)

    def done(self, tenant: bytes) -> CacheKey:
        return CacheKey(self.short.digest(), self.long.digest(), tenant)


def answer_parameters(parameters: dict[str, Any]) -> bytes:
    """The request parameters that may change the answer, canonically encoded."""
    kept = {k: v for k, v in parameters.items() if k not in NEUTRAL_PARAMETERS}
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS) if kept else b""


class Keys:
    """Keys, tenant tags and MACs under one server secret (derived to 32 bytes)."""

    def __init__(self, secret: bytes, scope: str = "key") -> None:
        self.secret = hashlib.blake2b(secret, digest_size=32, person=b"tradeoff-secret").digest()
        self.scope = scope

    def _material(self, kind: bytes, tenant: bytes) -> _Material:
        return _Material(self.secret, kind, tenant if self.scope == "key" else b"")

    def tensor_key(self, tenant: bytes, model: str, version: int,
                   inputs: Iterable[tuple[str, str, np.ndarray]],
                   wanted: Sequence[tuple[str, bool]], parameters: dict[str, Any]) -> CacheKey:
        """The key of a tensor request: ``inputs`` as (name, datatype, array), ``wanted``
        the outputs returned in order with whether each is binary."""
        material = self._material(b"tensor", tenant)
        material.text(model)
        material.text(str(version))
        for name, datatype, array in sorted(inputs, key=lambda item: item[0]):
            material.text(name)
            material.array(datatype, array)
        material.add(orjson.dumps(wanted))
        material.add(answer_parameters(parameters))
        return material.done(tenant)

    def generation_key(self, tenant: bytes, model: str, version: int, prompt: Sequence[int],
                       params: Any) -> CacheKey:
        """The key of a generation: the prompt's token ids (after the chat template) and
        every sampling parameter."""
        material = self._material(b"generation", tenant)
        material.text(model)
        material.text(str(version))
        material.add(np.asarray(prompt, dtype=np.int64).data)
        fields = {name: getattr(params, name) for name in sorted(params.__dataclass_fields__)}
        material.add(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
        return material.done(tenant)

    def _mac(self, check: bytes, value: bytes | memoryview) -> bytes:
        mac = hashlib.blake2b(digest_size=MAC_BYTES, key=self.secret, person=b"tradeoff-mac")
        mac.update(check)
        mac.update(value)
        return mac.digest()

    def seal(self, key: CacheKey, value: bytes) -> bytes:
        """The stored form of ``value``: its MAC, then the value."""
        return self._mac(key.check, value) + value

    def open(self, key: CacheKey, stored: bytes) -> memoryview | None:
        """The value of a stored entry, or None when its MAC is not this key's."""
        view = memoryview(stored)
        value = view[MAC_BYTES:]
        if len(stored) < MAC_BYTES or not hmac.compare_digest(
                self._mac(key.check, value), view[:MAC_BYTES]):
            return None
        return value

    def tag(self, tenant: bytes) -> bytes:
        """A tenant's name in the store: says nothing of its API key."""
        return hashlib.blake2b(tenant, digest_size=12, key=self.secret,
                               person=b"tradeoff-tenant").hexdigest().encode()
