"""What load to offer: closed loop, open loop (constant or Poisson), or a replayed trace.

Open-loop send times are fixed in advance from the spec, so a slow server cannot slow the
offered load down; latency counts from these scheduled times.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class LoadSpec:
    """The offered load and how long to measure it."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = "constant"  # constant | poisson
    intervals: tuple[float, ...] | None = None  # seconds from the start of measurement
    duration_s: float | None = None
    requests: int | None = None
    warmup_s: float = 0.0
    window_s: float | None = None
    stability_percent: float = 10.0
    max_windows: int = 10
    timeout_s: float = 30.0
    max_connections: int = 1024
    seed: int = 0
    offset_s: float = 0.0  # shifts the open-loop schedule (a worker's share of the rate)

    def __post_init__(self) -> None:
        modes = [self.concurrency is not None, self.rate is not None,
                 self.intervals is not None]
        if sum(modes) != 1:
            raise ValueError("give exactly one of --concurrency, --rate or --intervals")
        if self.concurrency is not None and self.concurrency < 1:
            raise ValueError(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0 requests/s, got {self.rate}")
        if self.arrival not in ("constant", "poisson"):
            raise ValueError(f"--arrival must be constant or poisson, got {self.arrival!r}")
        if self.duration_s is not None and self.requests is not None:
            raise ValueError("give --duration or --requests, not both")
        if self.window_s is not None and not self.window_s > 0:
            raise ValueError(f"--window must be > 0 seconds, got {self.window_s}")
        if not 0 < self.stability_percent < 100:
            raise ValueError("--stability-percent must be between 0 and 100")

    @property
    def mode(self) -> str:
        if self.concurrency is not None:
            return "closed"
        return "open" if self.rate is not None else "trace"

    @property
    def fixed_length(self) -> bool:
        """Runs for --duration/--requests (or a trace's end), else until stable."""
        return self.duration_s is not None or self.requests is not None or \
            self.intervals is not None

    def to_dict(self) -> dict:
        return {"mode": self.mode, "concurrency": self.concurrency, "rate": self.rate,
                "arrival": self.arrival if self.rate is not None else None,
                "intervals": len(self.intervals) if self.intervals is not None else None,
                "duration_s": self.duration_s, "requests": self.requests,
                "warmup_s": self.warmup_s, "window_s": self.window_s,
                "stability_percent": self.stability_percent, "max_windows": self.max_windows,
                "timeout_s": self.timeout_s, "seed": self.seed}


def read_intervals(path: Path) -> tuple[float, ...]:
    """A trace file, one number per line in microseconds: the gap before each request
    (perf_analyzer's --request-intervals), or offsets from the start when the first line
    is ``# offsets``. Returns offsets in seconds."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ValueError(f"--intervals {path}: {exc.strerror}") from None
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    as_offsets = bool(lines) and lines[0].lower().startswith("# offsets")
    try:
        values = np.array([float(line) for line in lines if not line.startswith("#")])
    except ValueError as exc:
        raise ValueError(f"--intervals {path}: {exc}") from None
    if values.size == 0:
        raise ValueError(f"--intervals {path}: no intervals in the file")
    if (values < 0).any():
        raise ValueError(f"--intervals {path}: values must not be negative")
    seconds = values / 1e6
    if as_offsets:
        if (np.diff(seconds) < 0).any():
            raise ValueError(f"--intervals {path}: offsets must not decrease")
        return tuple(seconds.tolist())
    return tuple((np.cumsum(seconds) - seconds[0]).tolist())


def arrival_offsets_ns(spec: LoadSpec) -> Iterator[int]:
    """Scheduled send offsets (ns from the start), endless for rates."""
    if spec.intervals is not None:
        # played once, or looped when a --duration is given (as perf_analyzer does)
        offsets = spec.intervals
        period = offsets[-1] + (offsets[-1] - offsets[0]) / max(len(offsets) - 1, 1)
        base = 0.0
        while True:
            for offset in offsets:
                yield int((base + offset) * 1e9)
            if spec.duration_s is None or period <= 0:
                return
            base += period
    assert spec.rate is not None
    gap_ns = 1e9 / spec.rate
    shift = spec.offset_s * 1e9
    if spec.arrival == "constant":
        i = 0
        while True:
            yield int(shift + i * gap_ns)
            i += 1
    rng = np.random.default_rng(spec.seed)
    at = shift
    while True:
        for gap in rng.exponential(gap_ns, size=4096):
            yield int(at)
            at += gap
