"""Per-request records, kept raw so every statistic is exact and workers merge exactly.

One record per request, as numpy columns (no Python object per request once a run ends):
scheduled and actual send time, end time, outcome, bytes, batch rows and the server's own
timings when it sent them (``Server-Timing``).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

# Outcome classes. 0 is success; HTTP error statuses are kept in ``status``.
OK, HTTP_ERROR, TIMEOUT, REFUSED, RESET, OTHER = range(6)
OUTCOME_NAMES = {OK: "ok", HTTP_ERROR: "http", TIMEOUT: "timeout", REFUSED: "refused",
                 RESET: "reset", OTHER: "other"}
SERVER_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def classify(exc: BaseException) -> int:
    """The outcome class of a failed request."""
    if isinstance(exc, TimeoutError):
        return TIMEOUT
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, (ConnectionResetError, ConnectionAbortedError, BrokenPipeError,
                        EOFError)):
        return RESET
    return OTHER


@dataclass
class RecordBuffer:
    """Append-only columns while a run is going; ``freeze()`` gives the numpy Records."""

    scheduled_ns: list[int] = field(default_factory=list)
    sent_ns: list[int] = field(default_factory=list)
    end_ns: list[int] = field(default_factory=list)
    outcome: list[int] = field(default_factory=list)
    status: list[int] = field(default_factory=list)
    bytes_sent: list[int] = field(default_factory=list)
    bytes_received: list[int] = field(default_factory=list)
    rows: list[int] = field(default_factory=list)
    server_ms: list[tuple[float, float, float, float]] = field(default_factory=list)

    def add(self, scheduled: int, sent: int, end: int, outcome: int, status: int,
            sent_bytes: int, received_bytes: int, rows: int,
            server: tuple[float, float, float, float] | None) -> None:
        self.scheduled_ns.append(scheduled)
        self.sent_ns.append(sent)
        self.end_ns.append(end)
        self.outcome.append(outcome)
        self.status.append(status)
        self.bytes_sent.append(sent_bytes)
        self.bytes_received.append(received_bytes)
        self.rows.append(rows)
        self.server_ms.append(server or _NO_SERVER)

    def freeze(self) -> Records:
        server = np.asarray(self.server_ms, dtype=np.float64).reshape(-1, 4)
        return Records(
            scheduled_ns=np.asarray(self.scheduled_ns, np.int64),
            sent_ns=np.asarray(self.sent_ns, np.int64),
            end_ns=np.asarray(self.end_ns, np.int64),
            outcome=np.asarray(self.outcome, np.int8),
            status=np.asarray(self.status, np.int16),
            bytes_sent=np.asarray(self.bytes_sent, np.int64),
            bytes_received=np.asarray(self.bytes_received, np.int64),
            rows=np.asarray(self.rows, np.int32),
            server_ms=server,
        )


_NO_SERVER = (np.nan, np.nan, np.nan, np.nan)


@dataclass
class Records:
    """Columns of every request of a run (times from ``time.perf_counter_ns``)."""

    scheduled_ns: np.ndarray
    sent_ns: np.ndarray
    end_ns: np.ndarray
    outcome: np.ndarray
    status: np.ndarray
    bytes_sent: np.ndarray
    bytes_received: np.ndarray
    rows: np.ndarray
    server_ms: np.ndarray  # (n, 4): queue, compute_input, compute_infer, compute_output

    def __len__(self) -> int:
        return int(self.scheduled_ns.size)

    @property
    def latency_ms(self) -> np.ndarray:
        """From the scheduled send time: waiting for a connection or a turn counts."""
        return (self.end_ns - self.scheduled_ns) / 1e6

    @property
    def send_lag_ms(self) -> np.ndarray:
        return (self.sent_ns - self.scheduled_ns) / 1e6

    def select(self, mask: np.ndarray) -> Records:
        return Records(**{f.name: getattr(self, f.name)[mask] for f in fields(self)})

    @staticmethod
    def merge(parts: list[Records], offsets_ns: list[int] | None = None) -> Records:
        """Concatenate records of several workers (clocks shifted by ``offsets_ns``)."""
        offsets_ns = offsets_ns or [0] * len(parts)
        merged = {}
        for f in fields(Records):
            columns = []
            for part, offset in zip(parts, offsets_ns):
                column = getattr(part, f.name)
                if f.name.endswith("_ns"):
                    column = column + offset
                columns.append(column)
            merged[f.name] = np.concatenate(columns) if columns else np.empty(0)
        records = Records(**merged)
        order = np.argsort(records.scheduled_ns, kind="stable")
        return records.select(order)

    def write(self, path: Path, start_ns: int = 0) -> None:
        """CSV (or Parquet when the name ends in .parquet and pyarrow is installed)."""
        columns = {
            "scheduled_ms": (self.scheduled_ns - start_ns) / 1e6,
            "sent_ms": (self.sent_ns - start_ns) / 1e6,
            "end_ms": (self.end_ns - start_ns) / 1e6,
            "latency_ms": self.latency_ms,
            "outcome": [OUTCOME_NAMES[int(o)] for o in self.outcome],
            "status": self.status,
            "bytes_sent": self.bytes_sent,
            "bytes_received": self.bytes_received,
            "rows": self.rows,
            **{f"server_{p}_ms": self.server_ms[:, i] for i, p in enumerate(SERVER_PARTS)},
        }
        if path.suffix == ".parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise RuntimeError("writing Parquet needs pyarrow: pip install pyarrow, "
                                   "or name the file .csv") from None
            pq.write_table(pa.table({k: list(v) if isinstance(v, list) else v
                                     for k, v in columns.items()}), path)
            return
        with path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            writer.writerows(zip(*(list(np.asarray(v).tolist()) if not isinstance(v, list)
                                   else v for v in columns.values())))
