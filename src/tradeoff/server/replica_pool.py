"""A pool of replicas on other servers: which one takes the next request, whether each
is healthy, and the connections kept to each. What goes over those connections is
:mod:`tradeoff.server.gateway`'s.

    pool = ReplicaPool(config)                        # config: a router.yaml pool
    await pool.start()                                # first checks, then every interval
    replica = pool.choose(tried=set(), prefix=blocks, session=None)
    connection = await replica.acquire()              # at most `connections` at once
    ...
    replica.release(connection, kept=True)
    replica.finished(ok=True, seconds=0.004)
    await pool.stop(timeout_s=30)                     # waits for requests in flight

Health: every ``health.interval_s`` each replica's readiness path is asked (200 is
ready). A replica that fails ``eject_after`` requests in a row (a refused connection, a
timeout, a 5xx) is ejected at once and stays out for at least ``eject_s``, until a check
passes. A draining replica takes no new requests. Retries are bounded by a budget: at
most ``retry_budget`` of the requests in flight (and at least 3) may be retries.

Load: a replica's load is the requests this gateway has in flight there, plus, for a
pool with ``queue``, the requests its last report says wait in its own queue (what other
clients and gateways sent it; :mod:`tradeoff.server.queue_report`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any

from tradeoff.errors import ModelLoadError, failure_text
from tradeoff.protocol.http_client import Connection, build_request
from tradeoff.repository.router import PoolConfig, ReplicaConfig
from tradeoff.server.grpc_replica import GrpcLink
from tradeoff.server.prefix_index import PrefixIndex
from tradeoff.server.queue_report import QueueReader

__all__ = ["MIN_RETRIES", "Replica", "ReplicaPool", "ReplicaStats"]

log = logging.getLogger("tradeoff.server")

MIN_RETRIES = 3  # retries in flight a pool always allows, whatever its budget
LATENCY_WEIGHT = 0.2  # of each answer in a replica's recent answer time
LATENCY_MEMORY_S = 5.0  # a replica unheard from for this long is tried again
LOAD_MEMORY_S = 1.0  # the time constant of a replica's average requests in flight
BALANCE_SLACK = 0.05  # requests in flight a replica may be over balance x the mean (an
# idle pool: every average near 0)
HEALTH_PATHS = {"v2": "/v2/health/ready", "openai": "/models"}


@dataclass
class ReplicaStats:
    """What one replica was sent and how it went."""

    requests: int = 0
    errors: int = 0        # failed: refused connection, timeout, 5xx, broken answer
    refused: int = 0       # answered 429 or 503 (busy or stopping): tried elsewhere
    retries: int = 0       # requests it got after another replica failed them
    ejections: int = 0
    latency_s: float = 0.0  # of its successful answers, summed
    answered: int = 0
    prefix_blocks_matched: int = 0  # prefix policy: blocks it was known to hold ...
    prefix_blocks: int = 0          # ... of the blocks of the prompts it was sent


class Replica:
    """One server of a pool, its state and its kept connections."""

    def __init__(self, config: ReplicaConfig, index: int, connections: int,
                 timeout_s: float, api_key: str | None = None, grpc: bool = False,
                 report_life_s: float = 1.0) -> None:
        self.config = config
        self._key = None if api_key is None else f"Bearer {api_key}"
        self.grpc = GrpcLink(config, api_key) if grpc else None  # v2-grpc pools
        self.index = index
        self.in_flight = 0
        self.ready = False       # the last check passed (and no ejection since)
        self.checked = False     # a check has run
        self.ejected_until = 0.0
        self.failures = 0        # in a row
        self._latency: float | None = None
        self._latency_at = 0.0
        self._load = 0.0
        self._load_at = time.monotonic()
        self.draining = config.drain
        self.reported_queue: float | None = None  # its own count of waiting requests
        self._reported_at = 0.0
        self._report_life_s = report_life_s  # a report older counts for nothing
        self.stats = ReplicaStats()
        self._timeout_s = timeout_s
        self._idle: list[Connection] = []
        self._closed = False  # its pool stopped: a connection given back is closed
        self._slots = asyncio.Semaphore(connections)
        self._connections = connections
        self.waiting = 0  # requests waiting for a connection: at most `connections`

    @property
    def name(self) -> str:
        return self.config.name

    def available(self, now: float) -> bool:
        """Whether it takes a request now: ready, not ejected or draining, and fewer
        requests waiting for its connections than it has connections."""
        return self.ready and not self.draining and now >= self.ejected_until and \
            self.waiting < self._connections

    def path(self, path: str) -> str:
        return self.config.prefix + path

    def request(self, method: str, path: str, body: bytes = b"",
                headers: dict[str, str] | None = None) -> bytes:
        """The bytes of a request to this replica, with the pool's own key unless the
        headers carry the client's."""
        if self._key is not None and not any(k.lower() == "authorization"
                                             for k in headers or {}):
            headers = {**(headers or {}), "Authorization": self._key}
        return build_request(method, f"{self.config.host}:{self.config.port}",
                             self.path(path), body, headers)

    async def take_slot(self) -> None:
        """One of its ``connections`` request slots (waiting when all are taken); give
        it back with :meth:`give_slot`."""
        self.waiting += 1
        try:
            await self._slots.acquire()
        finally:
            self.waiting -= 1

    def give_slot(self) -> None:
        self._slots.release()

    async def acquire(self) -> Connection:
        """A kept connection (a new one when none is idle); at most ``connections`` are
        out at once, and a caller past that waits. Give it back with :meth:`release`."""
        await self.take_slot()
        if self._idle:
            return self._idle.pop()
        return Connection(self.config.host, self.config.port, timeout=self._timeout_s,
                          tls=self.config.scheme == "https")

    def release(self, connection: Connection, kept: bool) -> None:
        """Give a connection back: kept for the next request, or closed (it failed, its
        answer was left unread, or the pool has stopped)."""
        if kept and not self._closed:
            self._idle.append(connection)
        else:
            connection.close()
        self.give_slot()

    def close(self) -> None:
        """Close its kept connections, and each one given back from now on."""
        self._closed = True
        for connection in self._idle:
            connection.close()
        self._idle.clear()

    def latency(self, now: float) -> float | None:
        """Its recent answer time (an average that weighs the last answers most), or None
        when it has not answered for LATENCY_MEMORY_S: then it is tried again as if
        average."""
        if self._latency is None or now - self._latency_at > LATENCY_MEMORY_S:
            return None
        return self._latency

    def average_load(self, now: float) -> float:
        """Its requests in flight averaged over about the last LOAD_MEMORY_S (the count
        taken as held since the last reading)."""
        weight = 1 - math.exp(-max(now - self._load_at, 0.0) / LOAD_MEMORY_S)
        self._load += (self.in_flight - self._load) * weight
        self._load_at = max(now, self._load_at)
        return self._load

    def report_queue(self, waiting: float | None) -> None:
        """Its own count of waiting requests, just read (None: the reading failed)."""
        self.reported_queue = waiting
        self._reported_at = time.monotonic()

    def queued(self, now: float) -> float:
        """The requests waiting in its queue by its last report, if that is recent; 0
        without one."""
        if self.reported_queue is None or now - self._reported_at > self._report_life_s:
            return 0.0
        return self.reported_queue

    def take_over(self, before: Replica) -> None:
        """Take what ``before`` (the same server in this pool before a reload) learnt:
        its counts, answer time, load, reported queue and ejection."""
        self.stats = before.stats
        self._latency, self._latency_at = before._latency, before._latency_at
        self._load, self._load_at = before._load, before._load_at
        self.reported_queue, self._reported_at = before.reported_queue, before._reported_at
        self.ejected_until, self.failures = before.ejected_until, before.failures

    def observe(self, seconds: float) -> None:
        """An answer's time (a stream's: to its first bytes)."""
        self._latency = seconds if self._latency is None else \
            (1 - LATENCY_WEIGHT) * self._latency + LATENCY_WEIGHT * seconds
        self._latency_at = time.monotonic()

    def finished(self, ok: bool, seconds: float = 0.0, timed: bool = True) -> None:
        """A request's outcome here: a success ends a run of failures. ``timed``: its
        time is its answer time (not a stream's, timed at its first bytes)."""
        if ok:
            self.failures = 0
            self.stats.answered += 1
            self.stats.latency_s += seconds
            if timed:
                self.observe(seconds)
        else:
            self.failures += 1
            self.stats.errors += 1

    def eject(self, now: float, seconds: float, why: str) -> None:
        if not self.ready:
            return
        self.ready = False
        self.ejected_until = now + seconds
        self.failures = 0
        self.stats.ejections += 1
        log.warning("replica %s ejected: %s", self.name, why)

    def snapshot(self) -> dict[str, Any]:
        """Its state and counts, for the statistics extension and /metrics."""
        return {"replica": self.name, "url": self.config.url, "ready": self.ready,
                "draining": self.draining, "ejected": not self.ready and self.checked,
                "in_flight": self.in_flight, "reported_queue": self.reported_queue,
                **asdict(self.stats)}


class ReplicaPool:
    """The replicas of one ``router.yaml`` pool, the policy that picks one, and their
    health checks."""

    def __init__(self, config: PoolConfig) -> None:
        self.config = config
        key = None
        if config.api_key_env is not None:
            key = os.environ.get(config.api_key_env)
            if not key:
                raise ModelLoadError(f"pool {config.name!r}: api_key_env names "
                                     f"${config.api_key_env}, which is not set")
        # three readings of a replica's queue may fail before the last is stale
        report_life_s = max(1.0, 3 * config.queue.interval_s) if config.queue else 1.0
        self.replicas = [Replica(r, i, config.connections, config.timeout_s, key,
                                 grpc=config.protocol == "v2-grpc",
                                 report_life_s=report_life_s)
                         for i, r in enumerate(config.replicas)]
        self.prefixes = PrefixIndex() if config.policy == "prefix" else None
        self.queues = None if config.queue is None else \
            QueueReader(config.queue, self.replicas, config.health.timeout_s)
        self.retries_in_flight = 0
        self._next = 0
        self._random = random.Random()
        self._checker: asyncio.Task[None] | None = None
        self._check_connections: dict[int, Connection] = {}

    @property
    def in_flight(self) -> int:
        return sum(r.in_flight for r in self.replicas)

    # ------------------------------------------------------------ choosing

    def choose(self, tried: set[int], prefix: list[int] | None = None,
               session: str | None = None) -> Replica | None:
        """The replica for a request by the pool's policy, among those available and not
        ``tried``; None when there is none. ``prefix``: the prompt's blocks (policy
        prefix); ``session``: the request's session key (policy session)."""
        now = time.monotonic()
        open_ = [r for r in self.replicas if r.index not in tried and r.available(now)]
        if not open_:
            return None
        policy = self.config.policy
        if len(open_) == 1 and policy != "prefix":  # (prefix counts what it holds)
            return open_[0]
        if policy == "round_robin":
            chosen = self._round_robin(open_)
        elif policy == "power_of_two" and len(open_) > 2:
            chosen = self._least_outstanding(self._random.sample(open_, 2))
        elif policy == "session" and session is not None:
            chosen = max(open_, key=lambda r: _rendezvous(session, r.config.url))
        elif policy == "prefix" and prefix:
            chosen = self._by_prefix(open_, prefix)
        else:
            chosen = self._least_outstanding(open_)
        return chosen

    def _round_robin(self, open_: list[Replica]) -> Replica:
        count = len(self.replicas)
        for step in range(count):
            index = (self._next + step) % count
            for replica in open_:
                if replica.index == index:
                    self._next = index + 1
                    return replica
        return open_[0]

    def _least_outstanding(self, open_: list[Replica]) -> Replica:
        """The least (requests in flight + requests its last report says wait there + 1)
        x recent answer time, as Linkerd's peak EWMA balancer weighs them: a slow replica
        takes a request only when the fast ones hold several. A replica with no recent
        answers counts the others' average time; exact ties go round."""
        now = time.monotonic()
        times = [r.latency(now) for r in open_]
        known = [t for t in times if t is not None]
        average = sum(known) / len(known) if known else 1.0
        costs = [(r.in_flight + r.queued(now) + 1) * (average if t is None else t)
                 for r, t in zip(open_, times, strict=True)]
        least = min(costs)
        return self._round_robin([r for r, c in zip(open_, costs, strict=True) if c == least])

    def _by_prefix(self, open_: list[Replica], prefix: list[int]) -> Replica:
        """The longest known prefix among the replicas whose load (requests in flight,
        averaged over the last second or so, and the queue each reports) is not over
        ``balance`` x the mean load (and a twentieth of a request, for a pool near
        idle); ties to the least loaded. The average, not the count now, so a burst does
        not send a prompt away from its cache, and a prompt that takes more than a
        replica's share spreads. A prompt no replica was sent goes to the least loaded,
        and among those to the one known to hold the fewest blocks, so new prompts are
        spread over the caches."""
        assert self.prefixes is not None
        now = time.monotonic()
        loads = {r.index: r.average_load(now) + r.queued(now) for r in self.replicas}
        mean = sum(loads[r.index] for r in open_) / len(open_)
        bound = self.config.balance * mean + BALANCE_SLACK
        fair = [r for r in open_ if loads[r.index] <= bound] or open_
        matched = self.prefixes.matches(prefix)
        best = max(matched.get(r.index, 0) for r in fair)
        candidates = [r for r in fair if matched.get(r.index, 0) == best]
        if best == 0:
            now_load = {r.index: r.in_flight + r.queued(now) for r in candidates}
            least = min(now_load.values())
            idle = [r for r in candidates if now_load[r.index] == least]
            fewest = min(self.prefixes.held(r.index) for r in idle)
            candidates = [r for r in idle if self.prefixes.held(r.index) == fewest]
        chosen = self._least_outstanding(candidates)
        chosen.stats.prefix_blocks_matched += best
        chosen.stats.prefix_blocks += len(prefix)
        self.prefixes.record(prefix, chosen.index)
        return chosen

    def has_idle_replica(self) -> bool:
        """Whether a replica is available with nothing in flight (a shadow copy's
        condition)."""
        now = time.monotonic()
        return any(r.available(now) and r.in_flight == 0 for r in self.replicas)

    def may_retry(self) -> bool:
        """Whether the retry budget allows one more retry now."""
        allowed = max(MIN_RETRIES, self.config.retry_budget * self.in_flight)
        return self.retries_in_flight < allowed

    def unavailable_reason(self) -> str:
        """Why no replica can take a request now."""
        states = []
        now = time.monotonic()
        for replica in self.replicas:
            state = "draining" if replica.draining else \
                "ejected" if now < replica.ejected_until else \
                "not ready" if not replica.ready else "tried"
            states.append(f"{replica.name} {state}")
        return f"pool {self.config.name!r}: no replica can take the request ({', '.join(states)})"

    def adopt(self, old: ReplicaPool) -> None:
        """Take over what ``old`` (this pool before a reload) learnt of the replicas it
        shares with this one (the same URL): their counts, answer times, loads, reported
        queues, ejections, and the prefixes they were sent. Requests in flight stay
        with ``old``."""
        if (old.config.protocol, old.config.model) != (self.config.protocol,
                                                         self.config.model):
            return
        by_url = {r.config.url: r for r in old.replicas}
        numbers = {}
        for replica in self.replicas:
            before = by_url.get(replica.config.url)
            if before is None:
                continue
            numbers[before.index] = replica.index
            replica.take_over(before)
        if self.prefixes is not None and old.prefixes is not None:
            self.prefixes = old.prefixes.renumbered(numbers)

    # ------------------------------------------------------------ health

    async def start(self) -> None:
        """Check every replica once, then keep checking every interval."""
        await self._check_all()
        self._checker = asyncio.ensure_future(self._check_forever())
        if self.queues is not None:
            self.queues.start()

    async def _check_forever(self) -> None:
        interval = self.config.health.interval_s
        while True:  # until stop cancels it
            await asyncio.sleep(interval)
            await self._check_all()

    async def _check_all(self) -> None:
        await asyncio.gather(*(self._check(r) for r in self.replicas))

    async def _probe(self, replica: Replica) -> tuple[bool, str]:
        """One readiness check: its path answers 200 (HTTP), or the model is ready
        (gRPC's ModelReady); and why not."""
        health = self.config.health
        if replica.grpc is not None:
            return await replica.grpc.ready(self.config.model, health.timeout_s)
        path = health.path or HEALTH_PATHS[self.config.protocol]
        connection = self._check_connections.get(replica.index)
        if connection is None:
            connection = self._check_connections[replica.index] = Connection(
                replica.config.host, replica.config.port, timeout=health.timeout_s,
                tls=replica.config.scheme == "https", max_bytes=1 << 20)
        try:
            response = await connection.request(replica.request("GET", path),
                                                timeout=health.timeout_s)
        except (OSError, TimeoutError, ConnectionError) as exc:
            return False, f"its readiness check failed: {failure_text(exc)}"
        return response.status == 200, f"its readiness check answered {response.status}"

    async def _check(self, replica: Replica) -> None:
        health = self.config.health
        ok, why = await self._probe(replica)
        now = time.monotonic()
        first = not replica.checked
        replica.checked = True
        if ok and not replica.ready and now >= replica.ejected_until:
            replica.ready = True
            replica.failures = 0
            if self.prefixes is not None and not first:
                self.prefixes.forget(replica.index)  # it may have restarted: cache gone
            if not first:
                log.info("replica %s of pool %s ready again", replica.name, self.config.name)
        elif not ok and replica.ready:
            replica.eject(now, health.eject_s, why)
        elif not ok and first:
            log.warning("replica %s of pool %s: %s", replica.name, self.config.name, why)

    def request_failed(self, replica: Replica, why: str) -> None:
        """A request failed at ``replica``: ejected after ``eject_after`` in a row."""
        replica.finished(False)
        if replica.failures >= self.config.health.eject_after:
            replica.eject(time.monotonic(), self.config.health.eject_s,
                          f"{replica.failures} requests in a row failed ({why})")

    # ------------------------------------------------------------ lifecycle

    async def stop(self, timeout_s: float | None = None) -> None:
        """Stop checking; wait (up to ``timeout_s``) for requests in flight, then close
        the connections."""
        if self._checker is not None:
            self._checker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._checker
        if self.queues is not None:
            await self.queues.stop()
        deadline = time.monotonic() + (timeout_s if timeout_s is not None else 60.0)
        # the counts move on every request: polled here, at unload, not signalled there
        while self.in_flight and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        for replica in self.replicas:
            replica.close()
            if replica.grpc is not None:
                await replica.grpc.close()
        for connection in self._check_connections.values():
            connection.close()

    def snapshot(self) -> dict[str, Any]:
        """The pool's replicas and counts (the statistics extension's ``pools``)."""
        return {"pool": self.config.name, "protocol": self.config.protocol,
                "model": self.config.model, "policy": self.config.policy,
                "replicas": [r.snapshot() for r in self.replicas]}


def _rendezvous(key: str, url: str) -> int:
    """Highest-random-weight hashing: a key stays on its replica while that one is
    available, and only its keys move when it leaves."""
    digest = hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")
