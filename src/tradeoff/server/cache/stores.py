"""Where answers are kept: an in-process LRU bounded in bytes, or Redis shared by
several servers, each bounding every tenant (an API key) to its share.

    store = LocalStore(256 * 10**6, tenant_capacity=64 << 20)
    store.put(key, value, tenant)       # False: larger than the store or the share
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from typing import Any

from tradeoff.server.cache.spec import redacted

__all__ = [
    "ENTRY_OVERHEAD",
    "REDIS_PREFIX",
    "LocalStore",
    "RedisStore",
]

log = logging.getLogger("tradeoff.server")

ENTRY_OVERHEAD = 96  # bytes a local entry costs beyond its key and value (dict, node)
REDIS_PREFIX = b"tradeoff:cache:2:"


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
