"""Closed-loop load: N requests outstanding at all times, raw latencies kept.

    result = asyncio.run(run_closed_loop("127.0.0.1", 8000, raw_request, concurrency=16,
                                         duration_s=5))
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import numpy as np

from tradeoff.bench.http_client import Connection


@dataclass
class LoadResult:
    latencies_ns: np.ndarray
    errors: dict[str, int]
    elapsed_s: float
    rows_per_request: int = 1
    statuses: dict[int, int] = field(default_factory=dict)

    @property
    def requests(self) -> int:
        return int(self.latencies_ns.size)

    @property
    def throughput(self) -> float:
        return self.requests / self.elapsed_s if self.elapsed_s else 0.0

    def percentile_ms(self, q: float) -> float:
        if not self.latencies_ns.size:
            return float("nan")
        return float(np.percentile(self.latencies_ns, q)) / 1e6


async def run_closed_loop(host: str, port: int, raw_request: bytes, *, concurrency: int,
                          duration_s: float | None = None, requests: int | None = None,
                          warmup_s: float = 0.0, rows_per_request: int = 1,
                          timeout_s: float = 30.0) -> LoadResult:
    """Keep ``concurrency`` requests in flight for ``duration_s`` (or ``requests`` in all)."""
    if (duration_s is None) == (requests is None):
        raise ValueError("give exactly one of duration_s or requests")
    clock = time.perf_counter_ns
    latencies: list[int] = []
    errors: dict[str, int] = {}
    statuses: dict[int, int] = {}
    start_at = clock() + int(warmup_s * 1e9)
    stop_at = start_at + int(duration_s * 1e9) if duration_s is not None else None
    budget = [requests if requests is not None else -1]

    async def worker() -> None:
        connection = Connection(host, port, timeout_s)
        try:
            while True:
                if stop_at is not None and clock() >= stop_at:
                    return
                if budget[0] == 0:
                    return
                if budget[0] > 0:
                    budget[0] -= 1
                sent = clock()
                try:
                    response = await connection.request(raw_request)
                except (OSError, asyncio.TimeoutError) as exc:
                    kind = type(exc).__name__
                    errors[kind] = errors.get(kind, 0) + 1
                    continue
                done = clock()
                statuses[response.status] = statuses.get(response.status, 0) + 1
                if sent < start_at:
                    continue
                if 200 <= response.status < 300:
                    latencies.append(done - sent)
                else:
                    key = f"HTTP {response.status}"
                    errors[key] = errors.get(key, 0) + 1
        finally:
            connection.close()

    began = clock()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    ended = clock()
    measured_from = max(start_at, began)
    return LoadResult(np.asarray(latencies, dtype=np.int64), errors,
                      (ended - measured_from) / 1e9, rows_per_request, statuses)
