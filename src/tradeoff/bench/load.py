"""What load to offer: closed loop, open loop (constant or Poisson), or a replayed trace.

Open-loop send times are fixed in advance from the spec, so a slow server cannot slow the
offered load down; latency counts from these scheduled times.

``LoadSpec.from_flags`` builds the spec from command-line values with the defaults of
``LOAD_DEFAULTS``, the same for every command; ``parse_duration`` reads every time flag:

    spec = LoadSpec.from_flags(concurrency=16, duration_s=parse_duration("5m"))
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tradeoff.errors import InvalidValue, shown
from tradeoff.protocol.http_client import DEFAULT_MAX_RESPONSE_BYTES

__all__ = [
    "DURATION_FORMS",
    "LOAD_DEFAULTS",
    "LoadDefaults",
    "LoadSpec",
    "arrival_offsets_ns",
    "parse_duration",
    "read_intervals",
]

_DURATION = re.compile(r"(?P<number>[-+]?(?:\d+\.?\d*|\.\d+))\s*(?P<unit>ms|s|m|h)?",
                       re.IGNORECASE)
_SECONDS_PER_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
DURATION_FORMS = "90 (seconds), 1.5, 500ms, 90s, 5m or 1h"
MAX_INTERVAL_US = 31 * 86400e6  # one gap or offset of an --intervals trace


def parse_duration(text: str | float, *, allow_zero: bool = False) -> float:
    """Seconds from ``90``, ``1.5``, ``500ms``, ``90s``, ``5m`` or ``1h``.

    A bare number is seconds. Zero is refused unless ``allow_zero`` (a warmup may be 0);
    negative, infinite and NaN values always are. The ValueError says what to write.

        parse_duration("5m") == 300.0
    """
    raw = str(text).strip()
    if isinstance(text, (int, float)):
        seconds = float(text)
    else:
        match = _DURATION.fullmatch(raw)
        if match is None:
            raise InvalidValue(f"{raw!r} is not a duration; write {DURATION_FORMS}")
        seconds = float(match["number"]) * _SECONDS_PER_UNIT[(match["unit"] or "s").lower()]
    if not math.isfinite(seconds):
        raise InvalidValue(f"{raw!r} is not a finite duration; write {DURATION_FORMS}")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "0 or more" if allow_zero else "more than 0"
        raise InvalidValue(f"{raw!r}: a duration must be {bound}, e.g. 90s or 5m")
    return seconds


@dataclass(frozen=True)
class LoadDefaults:
    """What the load flags mean when they are left out: one table for every command
    (``tradeoff bench``, ``sweep``, ``soak``, ``compare``; shown in docs/cli.md).

    ``--duration`` is the one flag whose default depends on the kind of run: a benchmark
    measures until stable, a sweep level or a comparison round needs a fixed length, and a
    soak is long by nature."""

    concurrency: int = 1  # when neither --rate nor --intervals is given (perf_analyzer's)
    arrival: str = "constant"  # perf_analyzer's; poisson for independent users (vLLM's)
    warmup_s: float = 0.0  # the cold-start request is sent alone and reported apart anyway
    timeout_s: float = 30.0
    stop_grace_s: float = 30.0  # in flight when a run stops: at most min(this, timeout_s)
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES  # one answer (--max-response-size)
    max_connections: int = 1024
    seed: int = 0
    stability_percent: float = 10.0
    max_windows: int = 10
    point_duration_s: float = 5.0  # one sweep level, one compare round
    soak_duration_s: float = 1800.0
    soak_window_s: float = 60.0


LOAD_DEFAULTS = LoadDefaults()


@dataclass(frozen=True)
class LoadSpec:
    """The offered load and how long to measure it."""

    concurrency: int | None = None
    rate: float | None = None
    arrival: str = LOAD_DEFAULTS.arrival  # constant | poisson
    intervals: tuple[float, ...] | None = None  # seconds from the start of measurement
    duration_s: float | None = None
    requests: int | None = None
    warmup_s: float = LOAD_DEFAULTS.warmup_s
    window_s: float | None = None
    stability_percent: float = LOAD_DEFAULTS.stability_percent
    max_windows: int = LOAD_DEFAULTS.max_windows
    timeout_s: float = LOAD_DEFAULTS.timeout_s
    stop_grace_s: float = LOAD_DEFAULTS.stop_grace_s  # see grace_s
    max_connections: int = LOAD_DEFAULTS.max_connections
    seed: int = LOAD_DEFAULTS.seed
    offset_s: float = 0.0  # shifts the open-loop schedule (a worker's share of the rate)
    # where the load comes from: this many load generators, merged exactly; processes
    # here, or Ray actors spread over the nodes of the cluster at ray_address
    workers: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        modes = [self.concurrency is not None, self.rate is not None,
                 self.intervals is not None]
        if sum(modes) != 1:
            raise InvalidValue("give exactly one of --concurrency, --rate or --intervals")
        if self.concurrency is not None and self.concurrency < 1:
            raise InvalidValue(f"--concurrency must be >= 1, got {self.concurrency}")
        if self.rate is not None and not self.rate > 0:
            raise InvalidValue(f"--rate must be > 0 requests/s, got {self.rate}")
        if self.arrival not in ("constant", "poisson"):
            raise InvalidValue(f"--arrival must be constant or poisson, got {self.arrival!r}")
        if self.duration_s is not None and self.requests is not None:
            raise InvalidValue("give --duration or --requests, not both")
        if self.window_s is not None and not self.window_s > 0:
            raise InvalidValue(f"--window must be > 0 seconds, got {self.window_s}")
        if not 0 < self.stability_percent < 100:
            raise InvalidValue("--stability-percent must be between 0 and 100")
        if self.workers < 1:
            raise InvalidValue(f"--workers must be >= 1, got {self.workers}")

    @property
    def mode(self) -> str:
        if self.concurrency is not None:
            return "closed"
        return "open" if self.rate is not None else "trace"

    @property
    def grace_s(self) -> float:
        """How long the requests in flight when the run stops have to end, before they
        are cut (and counted as timeouts): their timeout, at most ``stop_grace_s``."""
        return min(self.timeout_s, self.stop_grace_s)

    @property
    def fixed_length(self) -> bool:
        """Runs for --duration/--requests (or a trace's end), else until stable."""
        return self.duration_s is not None or self.requests is not None or \
            self.intervals is not None

    @classmethod
    def from_flags(cls, *, concurrency: int | None = None, rate: float | None = None,
                   arrival: str | None = None, intervals: tuple[float, ...] | None = None,
                   duration_s: float | None = None, requests: int | None = None,
                   warmup_s: float | None = None, window_s: float | None = None,
                   stability_percent: float | None = None, max_windows: int | None = None,
                   timeout_s: float | None = None, max_connections: int | None = None,
                   seed: int | None = None, default_duration_s: float | None = None,
                   workers: int | None = None, ray_address: str | None = None
                   ) -> LoadSpec:
        """The spec for command-line values, the one place every command builds it;
        ``None`` means "not given" and takes the value of ``LOAD_DEFAULTS``. Without
        --concurrency, --rate and --intervals the load is closed-loop at the default
        concurrency. Without --duration and --requests the run lasts
        ``default_duration_s`` (None: windows until stable).

            LoadSpec.from_flags(rate=500)  # constant arrivals, no warmup, until stable
            LoadSpec.from_flags(concurrency=8,
                                default_duration_s=LOAD_DEFAULTS.point_duration_s)
        """
        d = LOAD_DEFAULTS
        if concurrency is None and rate is None and intervals is None:
            concurrency = d.concurrency
        if duration_s is None and requests is None:
            duration_s = default_duration_s
        return cls(
            concurrency=concurrency, rate=rate, intervals=intervals,
            arrival=d.arrival if arrival is None else arrival,
            duration_s=duration_s, requests=requests,
            warmup_s=d.warmup_s if warmup_s is None else warmup_s, window_s=window_s,
            stability_percent=d.stability_percent if stability_percent is None
            else stability_percent,
            max_windows=d.max_windows if max_windows is None else max_windows,
            timeout_s=d.timeout_s if timeout_s is None else timeout_s,
            max_connections=d.max_connections if max_connections is None
            else max_connections,
            seed=d.seed if seed is None else seed, workers=workers or 1,
            ray_address=ray_address)

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
        raise InvalidValue(f"--intervals {path}: {exc.strerror}") from None
    lines = [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1)
             if line.strip()]
    as_offsets = bool(lines) and lines[0][1].lower().startswith("# offsets")
    numbered = [(number, line) for number, line in lines if not line.startswith("#")]
    values = np.empty(len(numbered))
    for index, (number, line) in enumerate(numbered):
        try:
            values[index] = float(line)
        except ValueError:
            values[index] = np.nan
        if not 0 <= values[index] < MAX_INTERVAL_US:
            raise InvalidValue(f"--intervals {path}:{number}: {shown(line)} is not a number "
                               "of microseconds from 0 to 31 days")
    if values.size == 0:
        raise InvalidValue(f"--intervals {path}: no intervals in the file")
    seconds = values / 1e6
    if as_offsets:
        if (np.diff(seconds) < 0).any():
            raise InvalidValue(f"--intervals {path}: offsets must not decrease")
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

