"""The response cache: answers of deterministic requests kept in memory or in Redis.

A model opts in with ``response_cache { enable: true }`` (``response_cache: true`` in a
generative model's ``generate.yaml``), the server with ``--cache``; a request opts out
with the parameter ``"cache": false``.

Keys are built so a wrong answer cannot be served: the model name and resolved version,
every input's name, datatype, shape and bytes, the outputs asked for (and whether each
is binary), every request parameter that may change the answer and, unless the operator
shares entries across tenants, the API key that asked. All of it is hashed with BLAKE2b
keyed by the server's secret, so nobody without the secret can compute where an answer
lives. A value in Redis carries a MAC (keyed BLAKE2b over a second digest of the key
material and the value): a value a foreign writer planted or moved fails it and is a
miss, never an answer. In the process's own LRU, which nothing else writes, the second
digest alone is stored and compared (a key collision is a miss). A decoded value is
checked against the model (token ids in the vocabulary, tensors as the config declares)
before it is used.

    cache = ResponseCache.from_spec(CacheSpec.parse("local,size=256MB"))
    key = cache.tensor_key(tenant, "mlp", 1, inputs, wanted, parameters)
    outputs = await cache.lookup(key, expected)     # None: a miss
    cache.keep(key, outputs)        # after a successful inference only (key.tenant pays)
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import importlib.util
import logging
import os
import re
import struct
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import orjson

from tradeoff import dtypes
from tradeoff.errors import InvalidValue
from tradeoff.protocol.v2 import TensorOutput, decode_bytes_elements, encode_bytes_elements

__all__ = [
    "CHECK_BYTES",
    "ENTRY_OVERHEAD",
    "FINISH_REASONS",
    "KEY_BYTES",
    "MAC_BYTES",
    "MIN_SECRET_BYTES",
    "NEUTRAL_PARAMETERS",
    "REDIS_PREFIX",
    "SCOPES",
    "SECRET_ENV",
    "CacheCounts",
    "CacheKey",
    "CacheSpec",
    "Expected",
    "Keys",
    "LocalStore",
    "RedisStore",
    "ResponseCache",
    "answer_parameters",
    "decode_generation",
    "decode_outputs",
    "encode_generation",
    "encode_outputs",
    "parse_size",
    "redacted",
]

log = logging.getLogger("tradeoff.server")

KEY_BYTES = 16     # the lookup key: keyed BLAKE2b-128
CHECK_BYTES = 32   # a second digest of the same material, bound into the MAC
MAC_BYTES = 32     # stored before the value: keyed BLAKE2b-256 of check + value
SECRET_ENV = "TRADEOFF_CACHE_SECRET"
MIN_SECRET_BYTES = 16
# Request parameters that cannot change an answer: scheduling, and the opt-out itself.
# Everything else a request carries is part of the key.
NEUTRAL_PARAMETERS = frozenset({"priority", "timeout", "cache", "binary_data_output",
                                "class"})
ENTRY_OVERHEAD = 96  # bytes a local entry costs beyond its key and value (dict, node)
REDIS_PREFIX = b"tradeoff:cache:2:"
SCOPES = ("key", "global")
FINISH_REASONS = frozenset({"stop", "length"})
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
        raise InvalidValue(f"{what}={text!r}: give bytes such as 256MB, 1GiB or 65536")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def redacted(url: str) -> str:
    """A Redis URL without its password, for logs and banners."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=user + host))


def _tenant_size(values: dict[str, str], default: str) -> int:
    """``tenant_size`` of a --cache spec in bytes (at least 1)."""
    share = parse_size(values.get("tenant_size", default), "tenant_size")
    if share < 1:
        raise InvalidValue("--cache tenant_size must be at least 1 byte")
    return share


def _read_secret_file(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes().strip()
    except OSError as exc:
        raise InvalidValue(f"--cache {what}={path}: cannot read it ({exc.strerror})") from None


@dataclass(frozen=True)
class CacheSpec:
    """What ``--cache`` asked for: ``local[,size=256MB]`` or
    ``redis://HOST:PORT/DB[,ttl=3600]`` (a secret shared by the servers is required:
    ``secret_file=PATH`` or ``$TRADEOFF_CACHE_SECRET``; ``password_file=PATH`` for Redis's
    password), both with ``max_item=1MB`` (larger answers are not kept),
    ``scope=key|global`` (who may be answered with an entry: the API key that asked it,
    or anyone) and ``tenant_size=SIZE`` (the most one API key's answers may take)."""

    kind: str  # "local" | "redis"
    size_bytes: int = 256 * 10**6
    url: str = ""
    ttl_s: int | None = 3600
    max_item_bytes: int = 1 << 20
    scope: str = "key"
    tenant_bytes: int = 64 << 20
    secret: bytes = b""   # as given; empty: a local cache makes its own
    password: str | None = None

    @classmethod
    def parse(cls, text: str, env: Mapping[str, str] | None = None) -> CacheSpec:
        env = os.environ if env is None else env
        head, *options = [part.strip() for part in text.split(",")]
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or not value:
                raise InvalidValue(f"--cache option {option!r}: write NAME=VALUE, e.g. "
                                   "size=256MB")
            values[name.strip()] = value.strip()
        common = {"max_item", "scope", "tenant_size", "secret_file"}
        if head == "local":
            allowed = common | {"size"}
        elif head.startswith(("redis://", "rediss://", "unix://")):
            allowed = common | {"ttl", "password_file"}
        else:
            raise InvalidValue(f"--cache {text!r}: use local[,size=256MB] or "
                               "redis://HOST:PORT/DB[,ttl=3600]")
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise InvalidValue(f"--cache {head}: unknown option {unknown[0]!r}; it takes "
                               f"{', '.join(sorted(allowed))}")
        max_item = parse_size(values.get("max_item", "1MiB"), "max_item")
        scope = values.get("scope", "key")
        if scope not in SCOPES:
            raise InvalidValue(f"--cache scope={scope!r}: use scope=key (each API key sees "
                               "only its own answers) or scope=global (shared by everyone)")
        secret = _read_secret_file(values["secret_file"], "secret_file") \
            if "secret_file" in values else env.get(SECRET_ENV, "").strip().encode()
        if secret and len(secret) < MIN_SECRET_BYTES:
            raise InvalidValue(f"the cache secret must be at least {MIN_SECRET_BYTES} bytes "
                               "(e.g. the output of: openssl rand -hex 32)")
        if head == "local":
            size = parse_size(values.get("size", "256MB"), "size")
            if size < 1:
                raise InvalidValue("--cache local: size must be at least 1 byte")
            return cls("local", size_bytes=size, max_item_bytes=max_item, scope=scope,
                       tenant_bytes=_tenant_size(values, str(max(size // 4, 1))),
                       secret=secret)
        if importlib.util.find_spec("redis") is None:
            raise InvalidValue("--cache redis:// needs the redis package: pip install "
                               "'tradeoff[cache]'")
        if not secret:
            raise InvalidValue(f"--cache {redacted(head)}: the servers that share it need one "
                               f"secret: secret_file=PATH or ${SECRET_ENV} (at least "
                               f"{MIN_SECRET_BYTES} bytes, e.g. openssl rand -hex 32)")
        ttl_text = values.get("ttl", "3600")
        if not (ttl_text.isascii() and ttl_text.isdigit()):
            raise InvalidValue(f"--cache ttl={ttl_text!r}: give whole seconds (0: no expiry)")
        ttl = int(ttl_text)
        password = _read_secret_file(values["password_file"], "password_file").decode() \
            if "password_file" in values else None
        return cls("redis", url=head, ttl_s=ttl or None, max_item_bytes=max_item,
                   scope=scope, tenant_bytes=_tenant_size(values, "256MB"),
                   secret=secret, password=password)

    def describe(self) -> str:
        shared = "shared by every API key" if self.scope == "global" else \
            "entries per API key"
        share = f"at most {self.tenant_bytes / 1e6:,.0f} MB per API key"
        if self.kind == "local":
            return (f"local LRU of {self.size_bytes / 1e6:,.0f} MB, answers up to "
                    f"{self.max_item_bytes:,} bytes, {shared}, {share}")
        ttl = f"ttl {self.ttl_s} s" if self.ttl_s else "no expiry"
        return (f"Redis at {redacted(self.url)} ({ttl}), answers up to "
                f"{self.max_item_bytes:,} bytes, {shared}, {share}")


# ------------------------------------------------------------------------- keys


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


# ---------------------------------------------------------------- stored values


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


# ---------------------------------------------------------------------- stores


class LocalStore:
    """An in-process LRU bounded in bytes (keys, values and per-entry overhead), and for
    each tenant (an API key) to ``tenant_capacity``: a tenant over its share evicts its own
    least recent entries, not everyone's."""

    kind = "local"

    def __init__(self, capacity_bytes: int, tenant_capacity: int | None = None) -> None:
        self.capacity = capacity_bytes
        self.tenant_capacity = capacity_bytes if tenant_capacity is None else tenant_capacity
        self.entries: OrderedDict[bytes, bytes] = OrderedDict()
        self.owner: dict[bytes, bytes] = {}                      # key -> tenant (keys on)
        self.owned: dict[bytes, OrderedDict[bytes, None]] = {}   # tenant -> its keys, LRU
        self.tenant_bytes: dict[bytes, int] = {}
        self.bytes = 0
        self.evictions = 0

    @staticmethod
    def cost(key: bytes, value: bytes) -> int:
        return len(key) + len(value) + ENTRY_OVERHEAD

    def get(self, key: bytes) -> bytes | None:
        value = self.entries.get(key)
        if value is not None:
            self.entries.move_to_end(key)
            tenant = self.owner.get(key)
            if tenant is not None:
                self.owned[tenant].move_to_end(key)
        return value

    def _remove(self, key: bytes) -> None:
        value = self.entries.pop(key)
        cost = self.cost(key, value)
        self.bytes -= cost
        tenant = self.owner.pop(key, None)
        if tenant is not None:
            own = self.owned[tenant]
            del own[key]
            self.tenant_bytes[tenant] -= cost
            if not own:
                del self.owned[tenant], self.tenant_bytes[tenant]

    def put(self, key: bytes, value: bytes, tenant: bytes = b"") -> bool:
        cost = self.cost(key, value)
        if cost > self.capacity or (tenant and cost > self.tenant_capacity):
            return False
        if key in self.entries:
            self._remove(key)
        if tenant:
            own = self.owned.get(tenant)
            while own and self.tenant_bytes[tenant] + cost > self.tenant_capacity:
                self._remove(next(iter(own)))
                self.evictions += 1
        while self.entries and self.bytes + cost > self.capacity:
            self._remove(next(iter(self.entries)))
            self.evictions += 1
        self.entries[key] = value
        self.bytes += cost
        if tenant:
            self.owner[key] = tenant
            self.owned.setdefault(tenant, OrderedDict())[key] = None
            self.tenant_bytes[tenant] = self.tenant_bytes.get(tenant, 0) + cost
        return True

    def clear(self) -> None:
        self.entries.clear()
        self.owner.clear()
        self.owned.clear()
        self.tenant_bytes.clear()
        self.bytes = 0


# One tenant's entries in Redis: a sorted set of its keys by insertion time, a hash of
# their sizes and a byte count. Writing an entry trims the oldest until the tenant's
# bytes fit its share; entries Redis has expired leave the index as their time passes.
# KEYS: entry, index, sizes, total; ARGV: value, ttl s (0: none), now ms, share bytes
_TENANT_PUT = """
local size = string.len(ARGV[1])
local ttl = tonumber(ARGV[2])
local now = tonumber(ARGV[3])
if ttl > 0 then
  redis.call('SET', KEYS[1], ARGV[1], 'EX', ttl)
  local gone = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now - ttl * 1000)
  for _, k in ipairs(gone) do
    redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[3], k) or '0'))
    redis.call('HDEL', KEYS[3], k)
    redis.call('ZREM', KEYS[2], k)
  end
else
  redis.call('SET', KEYS[1], ARGV[1])
end
local old = redis.call('HGET', KEYS[3], KEYS[1])
if old then redis.call('DECRBY', KEYS[4], tonumber(old)) end
redis.call('ZADD', KEYS[2], now, KEYS[1])
redis.call('HSET', KEYS[3], KEYS[1], size)
local total = redis.call('INCRBY', KEYS[4], size)
local evicted = 0
while total > tonumber(ARGV[4]) do
  local oldest = redis.call('ZPOPMIN', KEYS[2])
  if #oldest == 0 then break end
  local k = oldest[1]
  total = redis.call('DECRBY', KEYS[4], tonumber(redis.call('HGET', KEYS[3], k) or '0'))
  redis.call('HDEL', KEYS[3], k)
  redis.call('DEL', k)
  evicted = evicted + 1
end
if ttl > 0 then
  for i = 2, 4 do redis.call('EXPIRE', KEYS[i], ttl) end
end
return evicted
"""


class RedisStore:
    """Redis shared by several servers. A failed call counts an error, logs at most once
    per ``log_interval_s``, and keeps the cache out of the way for ``retry_s`` before
    trying again; the request it served goes on as a miss."""

    kind = "redis"

    def __init__(self, url: str, ttl_s: int | None, password: str | None = None,
                 tenant_capacity: int = 256 << 20, timeout_s: float = 0.25,
                 retry_s: float = 1.0, log_interval_s: float = 30.0) -> None:
        import redis.asyncio as aioredis

        self.url = redacted(url)
        self.ttl_s = ttl_s
        self.tenant_capacity = tenant_capacity
        extra: dict[str, Any] = {"password": password} if password is not None else {}
        self.client = aioredis.Redis.from_url(url, socket_timeout=timeout_s,
                                              socket_connect_timeout=timeout_s,
                                              retry_on_timeout=False, **extra)
        self._tenant_put = self.client.register_script(_TENANT_PUT)
        self.retry_s = retry_s
        self.log_interval_s = log_interval_s
        self.errors = 0
        self.evictions = 0  # tenants' entries trimmed for their share (Redis's own: not seen)
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

    async def check(self) -> bool:
        """Ping Redis; a failure is counted and logged like any other (the server serves
        without the cache until Redis answers)."""
        try:
            await self.client.ping()
        except Exception as exc:
            self._failed(exc)
            return False
        return True

    async def put(self, key: bytes, value: bytes, tenant: bytes = b"") -> bool:
        """Write an entry; a tenant's (its name from :meth:`Keys.tag`) within its share."""
        if not self.available:
            return False
        try:
            if not tenant:
                await self.client.set(REDIS_PREFIX + key, value, ex=self.ttl_s)
                return True
            if len(value) > self.tenant_capacity:
                return False
            base = REDIS_PREFIX + b"tenant:" + tenant
            # wall-clock milliseconds: the index is shared by servers on other machines
            self.evictions += int(await self._tenant_put(
                keys=[REDIS_PREFIX + key, base + b":index", base + b":sizes",
                      base + b":bytes"],
                args=[value, self.ttl_s or 0, int(time.time() * 1000),
                      self.tenant_capacity]))
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


class CacheCounts(Protocol):
    """Where a model's cache outcomes are counted (its ModelStats)."""

    def record_cache_hit(self, lookup_ns: int, total_ns: int) -> None: ...

    def record_cache_miss(self, lookup_ns: int) -> None: ...

    def record_cache_insert(self, insert_ns: int) -> None: ...


class ResponseCache:
    """Lookups and insertions for every model, counted; identical misses in flight are
    computed once (:meth:`get_or_compute`)."""

    def __init__(self, store: LocalStore | RedisStore, spec: CacheSpec,
                 secret: bytes | None = None) -> None:
        self.store = store
        self.spec = spec
        self.keys = Keys(secret or spec.secret or os.urandom(32), spec.scope)
        self.max_item_bytes = spec.max_item_bytes
        self.insertions = 0
        self.rejected = 0       # a stored value not this key's: a failed MAC (Redis), or a
        # stored digest that differs (a key collision, local)
        self.too_large = 0      # answers over max_item, not stored
        self.unreadable = 0     # a stored value that could not be decoded, or not this model's
        self.coalesced = 0      # requests answered by an identical request in flight
        self.flights: dict[bytes, asyncio.Future] = {}
        self._writes: set[asyncio.Task] = set()

    @classmethod
    def from_spec(cls, spec: CacheSpec) -> ResponseCache:
        store: LocalStore | RedisStore = \
            LocalStore(spec.size_bytes, spec.tenant_bytes) if spec.kind == "local" \
            else RedisStore(spec.url, spec.ttl_s, spec.password, spec.tenant_bytes)
        return cls(store, spec)

    def tensor_key(self, tenant: bytes, model: str, version: int,
                   inputs: Iterable[tuple[str, str, np.ndarray]],
                   wanted: Sequence[tuple[str, bool]], parameters: dict[str, Any]) -> CacheKey:
        """:meth:`Keys.tensor_key` under this cache's secret and scope."""
        return self.keys.tensor_key(tenant, model, version, inputs, wanted, parameters)

    def generation_key(self, tenant: bytes, model: str, version: int, prompt: Sequence[int],
                       params: Any) -> CacheKey:
        """:meth:`Keys.generation_key` under this cache's secret and scope."""
        return self.keys.generation_key(tenant, model, version, prompt, params)

    async def _get(self, key: CacheKey) -> memoryview | None:
        """The value under ``key`` if it is this key's: in Redis, which others can write,
        its MAC must hold; in this process's own LRU, the check digest stored before it
        must match (a key collision; hashing the value would cost 1 µs per KiB)."""
        store = self.store
        if isinstance(store, LocalStore):
            raw = store.get(key.key)
            if raw is None:
                return None
            if raw[:CHECK_BYTES] == key.check:
                return memoryview(raw)[CHECK_BYTES:]
            self.rejected += 1
            return None
        raw = await store.get(key.key)
        if raw is None:
            return None
        value = self.keys.open(key, raw)
        if value is None:
            self.rejected += 1
            log.warning("response cache: a stored answer failed its MAC (written by a "
                        "server with another secret, or by something else); treated as "
                        "a miss")
        return value

    async def check(self) -> bool:
        """Whether the store answers now (a local one always does)."""
        return True if isinstance(self.store, LocalStore) else await self.store.check()

    async def lookup(self, key: CacheKey, expected: Expected) -> list[TensorOutput] | None:
        """The stored answer, if it is authentic and the outputs ``expected``."""
        value = await self._get(key)
        if value is None:
            return None
        try:
            return decode_outputs(value, expected)
        except Exception:  # whatever a stored value holds, it is a miss, never a 500
            self.unreadable += 1
            return None

    async def get_or_compute(self, key: CacheKey, group: bytes, expected: Expected,
                             compute: Callable[[], Awaitable[list[TensorOutput]]],
                             counts: CacheCounts) -> tuple[list[TensorOutput], str, int]:
        """The answer for ``key``: the stored one, or that of an identical request of the
        same ``group`` (a priority: a low-priority request in flight must not hold back a
        high-priority one) already computing, waited for; else ``compute()``'s, kept.
        Returns the outputs, how they came (hit, coalesced, miss) and the nanoseconds of
        the lookup (of the wait, when coalesced)."""
        started = time.perf_counter_ns()
        flight_key = key.key + group
        while (flight := self.flights.get(flight_key)) is not None:
            # shielded: this request leaving must not cancel the one it waits for
            answer = await asyncio.shield(flight)
            if answer is not None:
                waited = time.perf_counter_ns() - started
                self.coalesced += 1
                counts.record_cache_hit(waited, waited)
                return answer, "coalesced", waited
            # the request it waited for failed or was cancelled: try again, alone
        flight = asyncio.get_running_loop().create_future()
        self.flights[flight_key] = flight
        answer = None
        try:
            answer = await self.lookup(key, expected)
            lookup_ns = time.perf_counter_ns() - started
            if answer is not None:
                counts.record_cache_hit(lookup_ns, lookup_ns)
                return answer, "hit", lookup_ns
            counts.record_cache_miss(lookup_ns)
            answer = await compute()
            self.keep(key, answer, counts.record_cache_insert)
            return answer, "miss", lookup_ns
        finally:
            del self.flights[flight_key]
            flight.set_result(answer)

    async def lookup_generation(self, key: CacheKey, vocab_size: int,
                                max_tokens: int) -> tuple[list[int], str] | None:
        """The stored generation, if it is authentic and one the model could have made."""
        value = await self._get(key)
        if value is None:
            return None
        try:
            return decode_generation(value, vocab_size, max_tokens)
        except Exception:
            self.unreadable += 1
            return None

    def keep_value(self, key: CacheKey, value: bytes,
                   done: Callable[[int], None] | None = None) -> None:
        """Keep ``value`` under ``key`` unless it is over ``max_item``; the write to Redis
        runs in the background (the answer does not wait for it); ``done(ns)`` hears how
        long the write took."""
        if len(value) + max(MAC_BYTES, CHECK_BYTES) > self.max_item_bytes:
            self.too_large += 1
            return
        if isinstance(self.store, LocalStore):
            started = time.perf_counter_ns()
            if self.store.put(key.key, key.check + value, key.tenant):
                self.insertions += 1
            if done is not None:
                done(time.perf_counter_ns() - started)
            return
        tenant = self.keys.tag(key.tenant) if key.tenant else b""
        task = asyncio.ensure_future(self._put(key, self.keys.seal(key, value), tenant, done))
        if not task.done():
            self._writes.add(task)
            task.add_done_callback(self._writes.discard)

    async def _put(self, key: CacheKey, value: bytes, tenant: bytes,
                   done: Callable[[int], None] | None) -> None:
        assert isinstance(self.store, RedisStore)
        started = time.perf_counter_ns()
        if await self.store.put(key.key, value, tenant):
            self.insertions += 1
        if done is not None:
            done(time.perf_counter_ns() - started)

    def keep(self, key: CacheKey, outputs: Sequence[TensorOutput],
             done: Callable[[int], None] | None = None) -> None:
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
