"""The response cache: answers of deterministic requests kept in memory or in Redis.

A model opts in with ``response_cache { enable: true }`` (``response_cache: true`` in a
generative model's ``generate.yaml``), the server with ``--cache``; a request opts out
with the parameter ``"cache": false``.

Keys are built so a wrong answer cannot be served: the model name and resolved version,
every input's name, datatype, shape and bytes, the outputs asked for (and whether each
is binary), and every request parameter that may change the answer, hashed with BLAKE2b.
A second, longer BLAKE2b digest of the same material is stored with the value and
compared on every hit, so a key collision is a miss, never someone else's answer.

    cache = ResponseCache.from_spec(CacheSpec.parse("local,size=256MB"))
    key = tensor_key("mlp", 1, inputs, wanted, parameters)
    outputs = await cache.lookup(key)          # None: a miss
    cache.keep(key, outputs)                   # after a successful inference only
"""

from __future__ import annotations

import asyncio
import hashlib
import importlib.util
import logging
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from tradeoff import dtypes
from tradeoff.protocol.v2 import TensorOutput, decode_bytes_elements, encode_bytes_elements

log = logging.getLogger("tradeoff.server")

KEY_BYTES = 16     # the lookup key: BLAKE2b-128
CHECK_BYTES = 32   # stored with the value: BLAKE2b-256 of the same material
# Request parameters that cannot change an answer: scheduling, and the opt-out itself.
# Everything else a request carries is part of the key.
NEUTRAL_PARAMETERS = frozenset({"priority", "timeout", "cache", "binary_data_output",
                                "class"})
ENTRY_OVERHEAD = 96  # bytes a local entry costs beyond its key and value (dict, node)
REDIS_PREFIX = b"tradeoff:cache:1:"
_U32 = struct.Struct("<I")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
          "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12,
          "tib": 1 << 40}


# ---------------------------------------------------------------- configuration


def parse_size(text: str, what: str) -> int:
    """``256MB``, ``1GiB``, ``4096`` as bytes; ValueError naming ``what`` otherwise."""
    match = _SIZE.match(text)
    if not match or (match.group(2) or "").lower() not in _UNITS:
        raise ValueError(f"{what}={text!r}: give bytes such as 256MB, 1GiB or 65536")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


@dataclass(frozen=True)
class CacheSpec:
    """What ``--cache`` asked for: ``local[,size=256MB]`` or
    ``redis://HOST:PORT/DB[,ttl=3600]``, both with ``max_item=1MB`` (larger answers are
    not cached)."""

    kind: str  # "local" | "redis"
    size_bytes: int = 256 * 10**6
    url: str = ""
    ttl_s: int | None = 3600
    max_item_bytes: int = 1 << 20

    @classmethod
    def parse(cls, text: str) -> CacheSpec:
        head, *options = [part.strip() for part in text.split(",")]
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or not value:
                raise ValueError(f"--cache option {option!r}: write NAME=VALUE, e.g. "
                                 "size=256MB")
            values[name.strip()] = value.strip()
        if head == "local":
            allowed = {"size", "max_item"}
        elif head.startswith(("redis://", "rediss://", "unix://")):
            allowed = {"ttl", "max_item"}
        else:
            raise ValueError(f"--cache {text!r}: use local[,size=256MB] or "
                             "redis://HOST:PORT/DB[,ttl=3600]")
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ValueError(f"--cache {head}: unknown option {unknown[0]!r}; it takes "
                             f"{', '.join(sorted(allowed))}")
        max_item = parse_size(values.get("max_item", "1MiB"), "max_item")
        if head == "local":
            size = parse_size(values.get("size", "256MB"), "size")
            if size < 1:
                raise ValueError("--cache local: size must be at least 1 byte")
            return cls("local", size_bytes=size, max_item_bytes=max_item)
        if importlib.util.find_spec("redis") is None:
            raise ValueError("--cache redis:// needs the redis package: pip install "
                             "'tradeoff[cache]'")
        ttl_text = values.get("ttl", "3600")
        if not (ttl_text.isascii() and ttl_text.isdigit()):
            raise ValueError(f"--cache ttl={ttl_text!r}: give whole seconds (0: no expiry)")
        ttl = int(ttl_text)
        return cls("redis", url=head, ttl_s=ttl or None, max_item_bytes=max_item)

    def describe(self) -> str:
        if self.kind == "local":
            return (f"local LRU of {self.size_bytes / 1e6:,.0f} MB, answers up to "
                    f"{self.max_item_bytes:,} bytes")
        ttl = f"ttl {self.ttl_s} s" if self.ttl_s else "no expiry"
        return f"Redis at {self.url} ({ttl}), answers up to {self.max_item_bytes:,} bytes"


# ------------------------------------------------------------------------- keys


@dataclass(frozen=True, slots=True)
class CacheKey:
    """Where an answer is stored (``key``) and the digest its value must carry
    (``check``)."""

    key: bytes
    check: bytes


class _Material:
    """Feeds length-prefixed parts to both digests, so no two different sequences of
    parts hash alike by shifting bytes between parts."""

    __slots__ = ("long", "short")

    def __init__(self, kind: bytes) -> None:
        self.short = hashlib.blake2b(digest_size=KEY_BYTES, person=b"tradeoff-key")
        self.long = hashlib.blake2b(digest_size=CHECK_BYTES, person=b"tradeoff-check")
        self.add(kind)

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

    def done(self) -> CacheKey:
        return CacheKey(self.short.digest(), self.long.digest())


def answer_parameters(parameters: dict[str, Any]) -> bytes:
    """The request parameters that may change the answer, canonically encoded."""
    kept = {k: v for k, v in parameters.items() if k not in NEUTRAL_PARAMETERS}
    return orjson.dumps(kept, option=orjson.OPT_SORT_KEYS) if kept else b""


def tensor_key(model: str, version: int, inputs: Iterable[tuple[str, str, np.ndarray]],
               wanted: Sequence[tuple[str, bool]], parameters: dict[str, Any]) -> CacheKey:
    """The key of a tensor request: ``inputs`` as (name, datatype, array), ``wanted`` the
    outputs returned in order with whether each is binary."""
    material = _Material(b"tensor")
    material.text(model)
    material.text(str(version))
    for name, datatype, array in sorted(inputs, key=lambda item: item[0]):
        material.text(name)
        material.array(datatype, array)
    material.add(orjson.dumps(wanted))
    material.add(answer_parameters(parameters))
    return material.done()


def generation_key(model: str, version: int, prompt: Sequence[int], params: Any) -> CacheKey:
    """The key of a generation: the prompt's token ids (after the chat template) and
    every sampling parameter."""
    material = _Material(b"generation")
    material.text(model)
    material.text(str(version))
    material.add(np.asarray(prompt, dtype=np.int64).data)
    fields = {name: getattr(params, name) for name in sorted(params.__dataclass_fields__)}
    material.add(orjson.dumps(fields, option=orjson.OPT_SORT_KEYS))
    return material.done()


# ---------------------------------------------------------------- stored values


def encode_outputs(outputs: Sequence[TensorOutput]) -> bytes:
    """Outputs as one value: a JSON header of names, datatypes, shapes and sizes, then
    the raw tensor bytes."""
    blobs = [encode_bytes_elements(o.array) if o.datatype == "BYTES"
             else np.ascontiguousarray(o.array).tobytes() for o in outputs]
    header = orjson.dumps([[o.name, o.datatype, list(o.array.shape), o.binary, len(b)]
                           for o, b in zip(outputs, blobs, strict=True)])
    return b"".join([_U32.pack(len(header)), header, *blobs])


def decode_outputs(value: bytes | memoryview) -> list[TensorOutput]:
    """The outputs :func:`encode_outputs` stored (numeric tensors are views, no copy)."""
    view = memoryview(value)
    (length,) = _U32.unpack_from(view, 0)
    offset = 4 + length
    outputs = []
    for name, datatype, shape, binary, size in orjson.loads(view[4:offset]):
        raw = view[offset:offset + size]
        if len(raw) != size:
            raise ValueError("stored answer is truncated")
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


def decode_generation(value: bytes | memoryview) -> tuple[list[int], str]:
    doc = orjson.loads(value)
    tokens, reason = doc["tokens"], doc["finish_reason"]
    if not isinstance(reason, str) or not all(isinstance(t, int) for t in tokens):
        raise ValueError("stored generation is malformed")
    return tokens, reason


# ---------------------------------------------------------------------- stores


class LocalStore:
    """An in-process LRU bounded in bytes (keys, values and per-entry overhead)."""

    kind = "local"

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity = capacity_bytes
        self.entries: OrderedDict[bytes, bytes] = OrderedDict()
        self.bytes = 0
        self.evictions = 0

    @staticmethod
    def cost(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    def get(self, key: bytes) -> bytes | None:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
        return value

    def put(self, key: bytes, value: bytes) -> bool:
        cost = self.cost(key, value)
        if cost > self.capacity:
            return False
        old = self.entries.pop(key, None)
        if old is not None:
            self.bytes -= self.cost(key, old)
        while self.entries and self.bytes + cost > self.capacity:
            evicted_key, evicted = self.entries.popitem(last=False)
            self.bytes -= self.cost(evicted_key, evicted)
            self.evictions += 1
        self.entries[key] = value
        self.bytes += cost
        return True

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0


class RedisStore:
    """Redis shared by several servers. A failed call counts an error, logs at most once
    per ``log_interval_s``, and keeps the cache out of the way for ``retry_s`` before
    trying again; the request it served goes on as a miss."""

    kind = "redis"

    def __init__(self, url: str, ttl_s: int | None, timeout_s: float = 0.25,
                 retry_s: float = 1.0, log_interval_s: float = 30.0) -> None:
        import redis.asyncio as aioredis

        self.url = url
        self.ttl_s = ttl_s
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s,
                                              socket_connect_timeout=timeout_s,
                                              retry_on_timeout=False)
        self.retry_s = retry_s
        self.log_interval_s = log_interval_s
        self.errors = 0
        self.evictions = 0  # Redis evicts by its own policy; not seen from here
        self.bytes = 0
        self._down_until = 0.0
        self._logged_at = -float("inf")
        self._errors_since_log = 0

    @property
    def available(self) -> bool:
        return time.monotonic() >= self._down_until

    def _failed(self, exc: Exception) -> None:
        self.errors += 1
        self._errors_since_log += 1
        now = time.monotonic()
        self._down_until = now + self.retry_s
        if now - self._logged_at >= self.log_interval_s:
            log.warning("response cache: Redis at %s failed (%s: %s; %d error(s) since the "
                        "last report); serving without it, retrying every %.0f s", self.url,
                        type(exc).__name__, exc, self._errors_since_log, self.retry_s)
            self._logged_at = now
            self._errors_since_log = 0

    async def get(self, key: bytes) -> bytes | None:
        if not self.available:
            return None
        try:
            value = await self.client.get(REDIS_PREFIX + key)
        except Exception as exc:  # any failure of the cache is a miss, never an error
            self._failed(exc)
            return None
        return value if isinstance(value, bytes) else None

    async def put(self, key: bytes, value: bytes) -> bool:
        if not self.available:
            return False
        try:
            await self.client.set(REDIS_PREFIX + key, value, ex=self.ttl_s)
        except Exception as exc:
            self._failed(exc)
            return False
        return True

    async def close(self) -> None:
        try:
            await self.client.aclose()
        except Exception as exc:  # closing a dead connection: nothing left to do
            log.debug("closing the Redis client: %s", exc)


# ----------------------------------------------------------------------- front


class ResponseCache:
    """Lookups and insertions for every model, counted; identical misses in flight are
    computed once (:meth:`flight`)."""

    def __init__(self, store: LocalStore | RedisStore, spec: CacheSpec) -> None:
        self.store = store
        self.spec = spec
        self.max_item_bytes = spec.max_item_bytes
        self.insertions = 0
        self.collisions = 0     # a stored value whose check digest did not match
        self.too_large = 0      # answers over max_item, not stored
        self.unreadable = 0     # a stored value that could not be decoded
        self.coalesced = 0      # requests answered by an identical request in flight
        self.flights: dict[bytes, asyncio.Future] = {}
        self._writes: set[asyncio.Task] = set()

    @classmethod
    def from_spec(cls, spec: CacheSpec) -> ResponseCache:
        store: LocalStore | RedisStore = LocalStore(spec.size_bytes) if spec.kind == "local" \
            else RedisStore(spec.url, spec.ttl_s)
        return cls(store, spec)

    async def _get(self, key: CacheKey) -> memoryview | None:
        store = self.store
        raw = store.get(key.key) if isinstance(store, LocalStore) else await store.get(key.key)
        if raw is None:
            return None
        if raw[:CHECK_BYTES] != key.check:
            self.collisions += 1
            log.warning("response cache: a stored answer's digest does not match its key "
                        "(a collision, or another writer); treated as a miss")
            return None
        return memoryview(raw)[CHECK_BYTES:]

    async def lookup(self, key: CacheKey) -> list[TensorOutput] | None:
        value = await self._get(key)
        if value is None:
            return None
        try:
            return decode_outputs(value)
        except (ValueError, KeyError, TypeError, struct.error, orjson.JSONDecodeError):
            self.unreadable += 1
            return None

    async def lookup_generation(self, key: CacheKey) -> tuple[list[int], str] | None:
        value = await self._get(key)
        if value is None:
            return None
        try:
            return decode_generation(value)
        except (ValueError, KeyError, TypeError, orjson.JSONDecodeError):
            self.unreadable += 1
            return None

    def keep_value(self, key: CacheKey, value: bytes,
                    done: Any = None) -> None:
        """Keep ``value`` under ``key`` unless it is over ``max_item``; the write to Redis
        runs in the background (the answer does not wait for it); ``done(ns)`` hears how
        long the write took."""
        if len(value) + CHECK_BYTES > self.max_item_bytes:
            self.too_large += 1
            return
        if isinstance(self.store, LocalStore):
            started = time.perf_counter_ns()
            if self.store.put(key.key, key.check + value):
                self.insertions += 1
            if done is not None:
                done(time.perf_counter_ns() - started)
            return
        task = asyncio.ensure_future(self._put(key, key.check + value, done))
        if not task.done():
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _put(self, key: CacheKey, value: bytes, done: Any) -> None:
        assert isinstance(self.store, RedisStore)
        started = time.perf_counter_ns()
        if await self.store.put(key.key, value):
            self.insertions += 1
        if done is not None:
            done(time.perf_counter_ns() - started)

    def keep(self, key: CacheKey, outputs: Sequence[TensorOutput], done: Any = None) -> None:
        """Keep a tensor answer (see :meth:`keep_value`)."""
        if sum(o.array.nbytes for o in outputs if o.datatype != "BYTES") > self.max_item_bytes:
            self.too_large += 1  # refused before the bytes are copied
            return
        self.keep_value(key, encode_outputs(outputs), done)

    def keep_generation(self, key: CacheKey, tokens: Sequence[int], reason: str) -> None:
        self.keep_value(key, encode_generation(tokens, reason))

    @property
    def bytes(self) -> int:
        return self.store.bytes

    @property
    def entries(self) -> int | None:
        return len(self.store.entries) if isinstance(self.store, LocalStore) else None

    @property
    def errors(self) -> int:
        return getattr(self.store, "errors", 0)

    @property
    def evictions(self) -> int:
        return self.store.evictions

    async def close(self) -> None:
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        if isinstance(self.store, LocalStore):
            self.store.clear()
        else:
            await self.store.close()
