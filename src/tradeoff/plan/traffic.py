"""The traffic a plan is made for: an arrival law, or a recorded trace measured.

    traffic = Traffic.law(rate=200, arrival="poisson", distinct_inputs=1000, zipf=1.0)
    traffic = Traffic.read("records.csv")     # `tradeoff bench --records`, or JSON lines
    traffic.rate_rps, traffic.peak_rps, traffic.burstiness, traffic.hit_ratio(500)

A trace is a ``tradeoff bench --records`` CSV (``scheduled_ms``, ``request``: which input
each request sent) or JSON lines, one request per line::

    {"timestamp": 1733300000.125, "input": "any JSON: requests with equal input repeat",
     "class": "latency", "prompt_tokens": 180, "output_tokens": 64}

``traffic.part("latency")`` is one class's traffic alone, for a pool of its own.

``timestamp`` (seconds; ``time`` or ``t`` also read) is required, the rest optional. From
it come the rate, the peak (the busiest second), the burstiness (coefficient of variation
of the gaps: 0 for a constant rate, 1 for Poisson arrivals), the repetition of inputs
(each input's share, and the Zipf exponent that fits them), the share of each class, and
for a generative model the mean prompt and answer lengths.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from tradeoff.bench.mix import first_sight_ratio, lru_hit_ratio, zipf_probabilities
from tradeoff.errors import InvalidValue, local_resource

__all__ = ["ARRIVALS", "Traffic", "fit_zipf"]

ARRIVALS = ("poisson", "constant")
_TIME_KEYS = ("timestamp", "time", "t")


@dataclass(frozen=True)
class Traffic:
    """Arrivals and inputs: a law (``offsets_s`` None) or a trace (its send times)."""

    source: str  # how it was given: "poisson at 200/s" or the trace's path
    rate_rps: float
    peak_rps: float  # the busiest second of a trace; a law's rate
    arrival: str  # poisson | constant | trace
    burstiness: float  # coefficient of variation of the gaps
    duration_s: float | None = None  # a trace's length
    offsets_s: np.ndarray | None = field(default=None, repr=False)
    inputs: np.ndarray | None = field(default=None, repr=False)  # input id per request
    distinct_inputs: int | None = None  # None: every request's input differs
    zipf: float | None = None  # given, or fitted to a trace's repetition
    classes: dict[str, float] = field(default_factory=dict)  # share per class
    request_classes: np.ndarray | None = field(default=None, repr=False)  # a trace's
    # a trace's mean prompt and answer lengths in tokens (generative models), when given
    prompt_tokens: float | None = None
    output_tokens: float | None = None

    @classmethod
    def law(cls, rate: float, arrival: str = "poisson", distinct_inputs: int | None = None,
            zipf: float | None = None, classes: dict[str, float] | None = None) -> Traffic:
        """Arrivals at ``rate`` by ``arrival``; inputs drawn from ``distinct_inputs`` by
        Zipf ``zipf`` (1.0 when only the count is given), or all different; ``classes``:
        each request class's share (normalised to sum to 1)."""
        if not rate > 0:
            raise InvalidValue(f"--rate must be > 0 requests/s, got {rate}")
        if arrival not in ARRIVALS:
            raise InvalidValue(f"--arrival {arrival!r}: use {' or '.join(ARRIVALS)}")
        if distinct_inputs is not None and distinct_inputs < 1:
            raise InvalidValue("--distinct-inputs must be at least 1")
        if zipf is not None and distinct_inputs is None:
            raise InvalidValue("--zipf draws from --distinct-inputs: give both")
        shares = dict(classes or {})
        if any(not (share > 0 and math.isfinite(share)) for share in shares.values()):
            raise InvalidValue("a class's share must be a positive number")
        total = sum(shares.values())
        return cls(f"{arrival} at {rate:g}/s", float(rate), float(rate), arrival,
                   1.0 if arrival == "poisson" else 0.0, distinct_inputs=distinct_inputs,
                   zipf=(1.0 if zipf is None else zipf) if distinct_inputs else None,
                   classes={name: share / total for name, share in shares.items()})

    @classmethod
    def read(cls, path: Path) -> Traffic:
        """A trace: a ``bench --records`` CSV or JSON lines (see the module docstring)."""
        path = Path(path)
        with local_resource(f"cannot read the trace {path}"):
            text = path.read_text()
        if path.suffix == ".csv":
            times, inputs, classes = _read_records(text, path)
            return cls.measured(times, inputs, classes, str(path))
        times, inputs, classes, lengths = _read_json_lines(text, path)
        return replace(cls.measured(times, inputs, classes, str(path)),
                       prompt_tokens=lengths.get("prompt_tokens"),
                       output_tokens=lengths.get("output_tokens"))

    @classmethod
    def measured(cls, times_s: np.ndarray, inputs: np.ndarray | None,
                 classes: np.ndarray | None, source: str) -> Traffic:
        """The figures of a trace: send times in seconds (any origin), the input id and
        class of each request when known."""
        order = np.argsort(times_s, kind="stable")
        offsets = np.asarray(times_s, dtype=np.float64)[order]
        offsets = offsets - offsets[0]
        if offsets.size < 2 or offsets[-1] <= 0:
            raise InvalidValue(f"{source}: a trace needs at least two requests at "
                               "different times")
        duration = float(offsets[-1])
        rate = (offsets.size - 1) / duration
        gaps = np.diff(offsets)
        burstiness = float(gaps.std() / gaps.mean())
        if duration >= 2:
            per_second = np.bincount(offsets.astype(np.int64))
            peak = float(per_second[:-1].max()) if per_second.size > 1 else rate
        else:
            peak = rate
        ids = None
        distinct = zipf = None
        if inputs is not None:
            _, ids = np.unique(np.asarray(inputs)[order], return_inverse=True)
            counts = np.bincount(ids)
            distinct = int(counts.size)
            zipf = fit_zipf(counts) if distinct < ids.size else None
        shares: dict[str, float] = {}
        per_request = None
        if classes is not None:
            per_request = np.asarray(classes, dtype=object)[order].astype(str)
            names, counts = np.unique(per_request, return_counts=True)
            shares = {str(n): float(c / offsets.size) for n, c in zip(names, counts,
                                                                     strict=True)}
        return cls(source, rate, max(peak, rate), "trace", burstiness, duration, offsets,
                   ids, distinct, zipf, shares, per_request)

    def part(self, request_class: str) -> Traffic:
        """The traffic of one class alone: a trace's requests of that class, or the law
        thinned to the class's share of the rate (Poisson arrivals thinned stay Poisson)."""
        share = self.classes[request_class]
        if self.offsets_s is None or self.request_classes is None:
            return replace(self, source=f"{self.source}, class {request_class}",
                           rate_rps=self.rate_rps * share, peak_rps=self.peak_rps * share,
                           classes={request_class: 1.0})
        mine = self.request_classes == request_class
        if int(mine.sum()) < 2:
            raise InvalidValue(f"{self.source}: class {request_class!r} has fewer than two "
                               "requests; a plan per class needs more")
        inputs = self.inputs[mine] if self.inputs is not None else None
        return Traffic.measured(self.offsets_s[mine], inputs,
                                self.request_classes[mine], f"{self.source}, class "
                                f"{request_class}")

    @property
    def repeats(self) -> bool:
        """Whether any input comes more than once."""
        if self.inputs is not None:
            return bool(self.distinct_inputs is not None and
                        self.distinct_inputs < self.inputs.size)
        return self.distinct_inputs is not None

    def probabilities(self) -> np.ndarray | None:
        """Each input's share of the requests, most asked first (None: no repetition)."""
        if not self.repeats:
            return None
        if self.inputs is not None:
            counts = np.sort(np.bincount(self.inputs))[::-1]
            return counts / counts.sum()
        assert self.distinct_inputs is not None
        return zipf_probabilities(self.distinct_inputs, self.zipf or 1.0)

    def hit_ratio(self, capacity: int, requests: int | None = None) -> float:
        """The share of requests an LRU cache of ``capacity`` answers answers: Che's
        approximation for the steady state, less the first sight of each input among
        ``requests`` (default: a trace's length; a law's steady state has none)."""
        p = self.probabilities()
        if p is None:
            return 0.0
        steady = lru_hit_ratio(p, capacity)
        draws = requests if requests is not None else \
            (self.inputs.size if self.inputs is not None else 0)
        return max(0.0, steady - first_sight_ratio(p, draws)) if draws else steady

    def arrivals(self, count: int, seed: int = 0, rate: float | None = None) -> np.ndarray:
        """Send times (s) of ``count`` requests: a trace's own (repeated end to end when it
        is shorter), or the law's at ``rate`` (default: its own)."""
        if self.offsets_s is not None and rate is None:
            laps = -(-count // self.offsets_s.size)
            span = float(self.offsets_s[-1]) + 1 / self.rate_rps
            times = (self.offsets_s[None, :] + span * np.arange(laps)[:, None]).ravel()
            return times[:count]
        rate = rate or self.rate_rps
        if self.arrival == "constant":
            return np.arange(count) / rate
        rng = np.random.default_rng([seed, 0x7A1F])
        return np.cumsum(rng.exponential(1 / rate, count)) - 1 / rate

    def class_sequence(self) -> tuple[int, ...]:
        """A trace's class of each request in send order, as indices of ``classes``
        (empty for a law, or a trace of one class): what a replay sends in turn."""
        if self.request_classes is None or len(self.classes) < 2:
            return ()
        index = {name: i for i, name in enumerate(self.classes)}
        return tuple(index[str(c)] for c in self.request_classes)

    def classes_of(self, count: int, seed: int = 0) -> np.ndarray:
        """The class of each of the first ``count`` requests :meth:`arrivals` sends: a
        trace's own (repeated as its send times are), or drawn by the classes' shares."""
        if self.request_classes is not None and self.offsets_s is not None:
            return np.resize(self.request_classes, count)
        names = list(self.classes) or [""]
        shares = np.array([self.classes.get(n, 1.0) for n in names])
        rng = np.random.default_rng([seed, 0xC1A55])
        return np.asarray(names, dtype=object)[rng.choice(len(names), size=count,
                                                          p=shares / shares.sum())]

    def describe(self) -> dict[str, Any]:
        """What the plan document records of the traffic."""
        return {"source": self.source, "arrival": self.arrival, "rate_rps": self.rate_rps,
                "peak_rps": self.peak_rps, "burstiness": self.burstiness,
                "duration_s": self.duration_s,
                "requests": None if self.offsets_s is None else int(self.offsets_s.size),
                "distinct_inputs": self.distinct_inputs, "zipf": self.zipf,
                "classes": self.classes,
                **({"trace_prompt_tokens": self.prompt_tokens}
                   if self.prompt_tokens is not None else {}),
                **({"trace_output_tokens": self.output_tokens}
                   if self.output_tokens is not None else {})}


def fit_zipf(counts: np.ndarray) -> float:
    """The Zipf exponent s whose law best fits these counts of each input: least squares
    of log count over log rank, over the inputs seen more than once (at least two)."""
    ranked = np.sort(np.asarray(counts, dtype=np.float64))[::-1]
    used = ranked[ranked > 1]
    if used.size < 2:
        used = ranked[:2]
    ranks = np.arange(1, used.size + 1, dtype=np.float64)
    slope = np.polyfit(np.log(ranks), np.log(used), 1)[0]
    return float(max(0.0, -slope))


def _read_records(text: str, path: Path
                  ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    rows = list(csv.reader(text.splitlines()))
    if not rows or "scheduled_ms" not in rows[0]:
        raise InvalidValue(f"{path}: not a `tradeoff bench --records` CSV (no scheduled_ms "
                           "column); a JSON lines trace ends in .jsonl")
    header = rows[0]
    table = np.array(rows[1:], dtype=object)
    if table.size == 0:
        raise InvalidValue(f"{path}: the trace holds no requests")
    try:
        times = table[:, header.index("scheduled_ms")].astype(np.float64) / 1e3
        inputs = table[:, header.index("request")].astype(np.int64) \
            if "request" in header else None
    except ValueError as exc:
        raise InvalidValue(f"{path}: a value is not a number ({exc})") from None
    return times, inputs, None


def _read_json_lines(text: str, path: Path) -> tuple[
        np.ndarray, np.ndarray | None, np.ndarray | None, dict[str, float]]:
    times: list[float] = []
    inputs: list[bytes] = []
    classes: list[str] = []
    lengths: dict[str, list[int]] = {"prompt_tokens": [], "output_tokens": []}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise InvalidValue(f"{path}:{number}: not JSON ({exc})") from None
        if not isinstance(entry, dict):
            raise InvalidValue(f"{path}:{number}: expected an object per line")
        stamp = next((entry[k] for k in _TIME_KEYS if k in entry), None)
        if not isinstance(stamp, int | float) or isinstance(stamp, bool):
            raise InvalidValue(f"{path}:{number}: needs a numeric 'timestamp' (seconds)")
        times.append(float(stamp))
        if "input" in entry:
            inputs.append(orjson.dumps(entry["input"], option=orjson.OPT_SORT_KEYS))
        if "class" in entry:
            classes.append(str(entry["class"]))
        for key, values in lengths.items():
            if key in entry:
                value = entry[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise InvalidValue(f"{path}:{number}: '{key}' must be a whole number "
                                       ">= 1")
                values.append(value)
    if not times:
        raise InvalidValue(f"{path}: the trace holds no requests")
    named: list[tuple[str, list[Any]]] = [("input", inputs), ("class", classes),
                                           *lengths.items()]
    for what, values in named:
        if values and len(values) != len(times):
            raise InvalidValue(f"{path}: '{what}' is on some lines only; give it on every "
                               "line or none")
    return (np.array(times), np.array(inputs, dtype=object) if inputs else None,
            np.array(classes, dtype=object) if classes else None,
            {key: float(np.mean(values)) for key, values in lengths.items() if values})
