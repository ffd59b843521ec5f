"""Per-request records, kept raw so every statistic is exact and workers merge exactly.

One record per request, as numpy columns (no Python object per request once a run ends):
scheduled and actual send time, end time, outcome, bytes, batch rows and the server's own
timings when it sent them (``Server-Timing``). A streamed generation adds the time of its
first text, its token counts and its inter-token gaps (one flat column for all requests).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from tradeoff.errors import MissingDependency, local_resource
from tradeoff.protocol.http_client import ResponseTooLarge

__all__ = ["OUTCOME_NAMES", "SERVER_PARTS", "Generated", "RecordBuffer", "Records", "classify"]

# Outcome classes. 0 is success; HTTP error statuses are kept in ``status``. STREAM: a
# streamed answer that began (200) but failed or broke off before its end. TOO_LARGE: an
# answer past --max-response-size (said by its Content-Length, or counted as it came).
OK, HTTP_ERROR, TIMEOUT, REFUSED, RESET, OTHER, STREAM, TOO_LARGE = range(8)
OUTCOME_NAMES = {OK: "ok", HTTP_ERROR: "http", TIMEOUT: "timeout", REFUSED: "refused",
                 RESET: "reset", OTHER: "other", STREAM: "stream", TOO_LARGE: "too_large"}
SERVER_PARTS = ("queue", "compute_input", "compute_infer", "compute_output")


def classify(exc: BaseException) -> int:
    """The outcome class of a failed request."""
    if isinstance(exc, ResponseTooLarge):  # a ConnectionError, yet no fault of the link
        return TOO_LARGE
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
    first_ns: list[int] = field(default_factory=list)
    out_tokens: list[int] = field(default_factory=list)
    in_tokens: list[int] = field(default_factory=list)
    asked_tokens: list[int] = field(default_factory=list)
    usage_tokens: list[bool] = field(default_factory=list)
    gap_count: list[int] = field(default_factory=list)
    gaps_ns: list[int] = field(default_factory=list)
    request: list[int] = field(default_factory=list)

    def add(self, scheduled: int, sent: int, end: int, outcome: int, status: int,
            sent_bytes: int, received_bytes: int, rows: int,
            server: tuple[float, float, float, float] | None,
            generation: Generated | None = None, request: int = -1) -> None:
        self.scheduled_ns.append(scheduled)
        self.sent_ns.append(sent)
        self.end_ns.append(end)
        self.outcome.append(outcome)
        self.status.append(status)
        self.bytes_sent.append(sent_bytes)
        self.bytes_received.append(received_bytes)
        self.rows.append(rows)
        self.server_ms.append(server or _NO_SERVER)
        g = generation or _NOT_GENERATED
        self.first_ns.append(g.first_ns)
        self.out_tokens.append(g.output_tokens)
        self.in_tokens.append(g.input_tokens)
        self.asked_tokens.append(g.asked_tokens)
        self.usage_tokens.append(g.from_usage)
        self.gap_count.append(len(g.gaps_ns))
        self.gaps_ns.extend(g.gaps_ns)
        self.request.append(request)

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
            first_ns=np.asarray(self.first_ns, np.int64),
            out_tokens=np.asarray(self.out_tokens, np.int32),
            in_tokens=np.asarray(self.in_tokens, np.int32),
            asked_tokens=np.asarray(self.asked_tokens, np.int32),
            usage_tokens=np.asarray(self.usage_tokens, bool),
            gap_count=np.asarray(self.gap_count, np.int32),
            gaps_ns=np.asarray(self.gaps_ns, np.int64),
            request=np.asarray(self.request, np.int32),
        )


@dataclass(frozen=True)
class Generated:
    """What a streamed generation adds to its record: the first text's time (0: none),
    output tokens (from usage, else counted events: ``from_usage`` False), prompt tokens
    (-1: not reported), the output length asked for (-1: none) and the gaps between
    consecutive text events."""

    first_ns: int = 0
    output_tokens: int = -1
    input_tokens: int = -1
    asked_tokens: int = -1
    from_usage: bool = False
    gaps_ns: tuple[int, ...] = ()


_NO_SERVER = (np.nan, np.nan, np.nan, np.nan)
_NOT_GENERATED = Generated()


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
    first_ns: np.ndarray  # first text of a streamed generation (0: none)
    out_tokens: np.ndarray  # -1 where the request generated nothing countable
    in_tokens: np.ndarray
    asked_tokens: np.ndarray
    usage_tokens: np.ndarray
    gap_count: np.ndarray  # inter-token gaps of each request, in order, in ``gaps_ns``
    gaps_ns: np.ndarray  # flat: not one entry per request
    request: np.ndarray  # which prepared request was sent (-1: unknown)

    def __len__(self) -> int:
        return int(self.scheduled_ns.size)

    @property
    def generated(self) -> bool:
        """Whether these are streamed generations (an OpenAI-compatible endpoint)."""
        return bool((self.out_tokens >= 0).any())

    @property
    def ttft_ms(self) -> np.ndarray:
        """Scheduled send -> first text (NaN without text)."""
        return np.where(self.first_ns > 0, (self.first_ns - self.scheduled_ns) / 1e6, np.nan)

    @property
    def tpot_ms(self) -> np.ndarray:
        """(latency - TTFT) / (output tokens - 1); NaN below two tokens."""
        tokens = self.out_tokens.astype(np.float64)
        with np.errstate(invalid="ignore", divide="ignore"):
            tpot = (self.end_ns - self.first_ns) / 1e6 / (tokens - 1)
        return np.where((tokens >= 2) & (self.first_ns > 0), tpot, np.nan)

    def text_events(self, mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Arrival times (ns) of every text event of the requests ``mask`` selects, and
        the tokens each stands for (the answer's output tokens / its events)."""
        picked = self.select(mask & (self.first_ns > 0))
        if not len(picked):
            return np.empty(0, np.int64), np.empty(0)
        events = picked.gap_count.astype(np.int64) + 1
        owner = np.repeat(np.arange(len(picked)), events)
        steps = np.zeros(int(events.sum()), np.int64)
        starts = np.concatenate(([0], np.cumsum(events)[:-1])).astype(np.int64)
        first = np.zeros(steps.size, bool)
        first[starts] = True
        steps[~first] = picked.gaps_ns
        running = np.cumsum(steps)
        times = picked.first_ns[owner] + running - running[starts][owner]
        weights = (picked.out_tokens.clip(0) / events)[owner]
        return times, weights

    def gaps_of(self, mask: np.ndarray) -> np.ndarray:
        """The inter-token gaps (ns) of the requests ``mask`` selects."""
        return self.gaps_ns[np.repeat(mask, self.gap_count)]

    @property
    def latency_ms(self) -> np.ndarray:
        """From the scheduled send time: waiting for a connection or a turn counts."""
        return (self.end_ns - self.scheduled_ns) / 1e6

    @property
    def send_lag_ms(self) -> np.ndarray:
        return (self.sent_ns - self.scheduled_ns) / 1e6

    def select(self, mask: np.ndarray) -> Records:
        """The requests ``mask`` (booleans or indices) picks, in its order."""
        index = np.arange(len(self))[mask]
        starts = np.concatenate(([0], np.cumsum(self.gap_count)[:-1])).astype(np.int64)
        counts = self.gap_count[index].astype(np.int64)
        # positions of each picked request's gaps in the flat column, request by request
        shift = np.repeat(starts[index] - np.concatenate(([0], np.cumsum(counts)[:-1])), counts)
        gaps = self.gaps_ns[shift + np.arange(int(counts.sum()))]
        return Records(**{f.name: gaps if f.name == "gaps_ns" else getattr(self, f.name)[index]
                          for f in fields(self)})

    @staticmethod
    def merge(parts: list[Records], offsets_ns: list[int] | None = None) -> Records:
        """Concatenate records of several workers (clocks shifted by ``offsets_ns``)."""
        offsets_ns = offsets_ns or [0] * len(parts)
        merged = {}
        for f in fields(Records):
            columns = []
            for part, offset in zip(parts, offsets_ns, strict=True):
                column = getattr(part, f.name)
                if f.name == "first_ns":
                    column = np.where(column > 0, column + offset, 0)
                elif f.name.endswith("_ns") and f.name != "gaps_ns":
                    column = column + offset
                columns.append(column)
            merged[f.name] = np.concatenate(columns) if columns else np.empty(0)
        records = Records(**merged)
        order = np.argsort(records.scheduled_ns, kind="stable")
        return records.select(order)

    def write(self, path: Path, start_ns: int = 0, measure_start_ns: int | None = None
              ) -> None:
        """CSV (or Parquet when the name ends in .parquet and pyarrow is installed). With
        ``measure_start_ns``, a ``phase`` column: ``warmup`` for the requests scheduled
        before it (which the result leaves out), ``measured`` for the rest."""
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
            "request": self.request,
            **{f"server_{p}_ms": self.server_ms[:, i] for i, p in enumerate(SERVER_PARTS)},
        }
        if self.generated:
            columns.update({"ttft_ms": self.ttft_ms, "tpot_ms": self.tpot_ms,
                            "output_tokens": self.out_tokens, "input_tokens": self.in_tokens,
                            "asked_tokens": self.asked_tokens,
                            "tokens_from_usage": self.usage_tokens,
                            "token_gaps": self.gap_count})
        if measure_start_ns is not None:
            columns["phase"] = np.where(self.scheduled_ns >= measure_start_ns, "measured",
                                        "warmup").tolist()
        if path.suffix == ".parquet":
            try:
                import pyarrow as pa
                import pyarrow.parquet as pq
            except ImportError:
                raise MissingDependency("--records as Parquet (or name the file .csv)",
                                        "pyarrow", "parquet") from None
            with local_resource(f"--records: cannot write {path}"):
                pq.write_table(pa.table({k: list(v) if isinstance(v, list) else v
                                         for k, v in columns.items()}), path)
            return
        with local_resource(f"--records: cannot write {path}"), \
                path.open("w", newline="") as handle:
            writer = csv.writer(handle)
            writer.writerow(columns)
            writer.writerows(zip(*(list(np.asarray(v).tolist()) if not isinstance(v, list)
                                   else v for v in columns.values()), strict=True))
