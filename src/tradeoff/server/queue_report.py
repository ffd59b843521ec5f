"""Each replica's own count of the requests waiting in its queue, read from the
Prometheus metrics it serves: what other clients and other gateways put there, which a
gateway's own counts of what it sent cannot see.

    reader = QueueReader(pool_config.queue, replicas, timeout_s=1.0)
    reader.start()                      # every interval: replica.report_queue(...)
    ...
    await reader.stop()

Presets in ``router.yaml`` (``queue: triton``) name the gauge of each kind of server:
ours (``tradeoff_inference_queue_depth``, or ``tradeoff_generation_requests_waiting``
behind an OpenAI pool), Triton's ``nv_inference_pending_request_count`` on its metrics
port 8002, vLLM's ``vllm:num_requests_waiting``. Only the lines of that gauge are read,
with a scan of the text, not a whole parse, so a reading costs little on the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import re
from collections.abc import Sequence
from typing import Protocol
from urllib.parse import urlsplit

from tradeoff.errors import failure_text
from tradeoff.protocol.http_client import Connection, build_request
from tradeoff.repository.router import QueueReport, ReplicaConfig

__all__ = ["MAX_METRICS_BYTES", "QueueReader", "Reporting", "gauge_sum"]

log = logging.getLogger("tradeoff.server")

MAX_METRICS_BYTES = 8 << 20  # one reading of a replica's /metrics
_LABEL = re.compile(rb'([A-Za-z_][A-Za-z0-9_]*)\s*=\s*"((?:[^"\\\n]|\\.)*)"')


def gauge_sum(text: bytes, metric: str, labels: Sequence[tuple[str, str]]) -> float | None:
    """The sum of the samples of ``metric`` in Prometheus text whose labels include
    ``labels`` (Triton reports one per version), or None when there is none. A sample
    that is no count of requests (NaN, infinite, negative) is left out, so a replica
    cannot draw every request to itself by reporting one."""
    line = re.compile(rb"^" + re.escape(metric.encode()) +
                      rb"(\{[^\n]*\})?[ \t]+([^ \t\r\n]+)", re.MULTILINE)
    wanted = {(k.encode(), v) for k, v in labels}
    total = None
    for match in line.finditer(text):
        found = {(name, _unescape(value))
                 for name, value in _LABEL.findall(match.group(1) or b"")}
        if not wanted <= found:
            continue
        try:
            value = float(match.group(2))
        except ValueError:
            continue
        if math.isfinite(value) and value >= 0:  # NaN, infinities, negatives: no count
            total = (total or 0.0) + value
    return total


def _unescape(value: bytes) -> str:
    return value.decode(errors="replace").replace('\\"', '"').replace(
        "\\n", "\n").replace("\\\\", "\\")


class Reporting(Protocol):
    """What the reader needs of a replica (:class:`~tradeoff.server.replica_pool.Replica`)."""

    config: ReplicaConfig
    index: int

    @property
    def name(self) -> str: ...

    def report_queue(self, waiting: float | None) -> None: ...


class QueueReader:
    """Reads ``report``'s gauge from every replica every ``report.interval_s`` and hands
    each reading to :meth:`Replica.report_queue` (None when it failed)."""

    def __init__(self, report: QueueReport, replicas: Sequence[Reporting],
                 timeout_s: float) -> None:
        self.report = report
        self.replicas = replicas
        self.timeout_s = timeout_s
        self._where = {r.index: self._metrics_of(r) for r in replicas}
        self._connections: dict[int, Connection] = {}
        self._silent: set[int] = set()  # replicas whose last reading failed (said once)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._read_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for connection in self._connections.values():
            connection.close()
        self._connections.clear()

    async def read_all(self) -> None:
        """One reading of every replica."""
        await asyncio.gather(*(self._read(r) for r in self.replicas))

    async def _read_forever(self) -> None:
        while True:  # until stop cancels it
            await self.read_all()
            await asyncio.sleep(self.report.interval_s)

    def _metrics_of(self, replica: Reporting) -> tuple[str, int, str, bool]:
        """Host, port, path and TLS of ``replica``'s metrics: its own ``metrics`` URL,
        else the pool's port and path on the replica's host."""
        if replica.config.metrics is not None:
            parts = urlsplit(replica.config.metrics)
            assert parts.hostname is not None  # checked when the file was read
            tls = parts.scheme == "https"
            return (parts.hostname, parts.port or (443 if tls else 80), parts.path or
                    self.report.path, tls)
        return (replica.config.host, self.report.port or replica.config.port,
                self.report.path, replica.config.scheme == "https")

    async def _read(self, replica: Reporting) -> None:
        host, port, path, tls = self._where[replica.index]
        connection = self._connections.get(replica.index)
        if connection is None:
            connection = self._connections[replica.index] = Connection(
                host, port, timeout=self.timeout_s, tls=tls, max_bytes=MAX_METRICS_BYTES)
        why = None
        try:
            response = await connection.request(
                build_request("GET", f"{host}:{port}", path), timeout=self.timeout_s)
        except (OSError, TimeoutError, ConnectionError) as exc:
            why = failure_text(exc)
            connection.close()
            self._connections.pop(replica.index, None)
        else:
            report = self.report
            if response.status != 200:
                why = f"{host}:{port}{path} answered {response.status}"
            else:
                waiting = gauge_sum(response.body, report.metric, report.labels)
                if waiting is None:
                    labels = ",".join(f'{k}="{v}"' for k, v in report.labels)
                    why = f"{host}:{port}{path} has no {report.metric}{{{labels}}}"
                else:
                    replica.report_queue(waiting)
                    self._silent.discard(replica.index)
                    return
        replica.report_queue(None)
        if replica.index not in self._silent:
            self._silent.add(replica.index)
            log.warning("replica %s: its queue is not counted (%s)", replica.name, why)
