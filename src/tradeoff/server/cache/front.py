"""The response cache's front: lookups and insertions for every model, counted, over
one store, with identical misses in flight computed once (``get_or_compute``).

    cache = ResponseCache.from_spec(CacheSpec.parse("local,size=256MB"))
    answer, how, lookup_ns = await cache.get_or_compute(key, group, expected, compute,
                                                        counts)
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from tradeoff.protocol.v2 import TensorOutput
from tradeoff.server.cache.keys import CHECK_BYTES, MAC_BYTES, CacheKey, Keys
from tradeoff.server.cache.spec import CacheSpec
from tradeoff.server.cache.stores import LocalStore, RedisStore
from tradeoff.server.cache.values import (
    Expected,
    decode_generation,
    decode_outputs,
    encode_generation,
    encode_outputs,
)

__all__ = [
    "CacheCounts",
    "ResponseCache",
]

log = logging.getLogger("tradeoff.server")


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
