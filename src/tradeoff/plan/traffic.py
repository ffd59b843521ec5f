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
import hashlib
import math
from array import array
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import orjson

from tradeoff.errors import InvalidValue, local_resource, shown
from tradeoff.repository.router import class_name_problem
from tradeoff.stats.popularity import first_sight_ratio, lru_hit_ratio, zipf_probabilities

__all__ = ["ARRIVALS", "MAX_TRACE_LINE_BYTES", "MAX_TRACE_REQUESTS", "MAX_TRACE_SPAN_S",
           "Traffic", "check_classes", "fit_zipf"]

ARRIVALS = ("poisson", "constant")
MAX_TRACE_REQUESTS = 5_000_000  # about 2.8 hours at 500 requests/s
MAX_TRACE_LINE_BYTES = 1 << 20  # one JSON line: its input is digested, not kept
MAX_TRACE_SPAN_S = 31 * 86400
MAX_TOKENS = 2**31 - 1  # a line's prompt_tokens or output_tokens
_TIME_KEYS = ("timestamp", "time", "t")
_LENGTH_KEYS = ("prompt_tokens", "output_tokens")


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
    # where a trace's inputs come from: "bench" (a bench --records CSV: the bench's own
    # input set, which says nothing of users' requests) or "trace" (each request's own)
    inputs_from: str | None = None

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
        check_classes(shares, "--class-share")
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
            if path.suffix == ".csv":
                times, inputs, classes = _read_records(path)
                lengths: dict[str, float] = {}
            else:
                times, inputs, classes, lengths = _read_json_lines(path)
        return replace(cls.measured(times, inputs, classes, str(path)),
                       prompt_tokens=lengths.get("prompt_tokens"),
                       output_tokens=lengths.get("output_tokens"),
                       inputs_from=None if inputs is None else
                       "bench" if path.suffix == ".csv" else "trace")

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
        if not duration <= MAX_TRACE_SPAN_S:
            raise InvalidValue(f"{source}: the trace spans {duration:.3g} s, more than "
                               f"{MAX_TRACE_SPAN_S / 86400:g} days, the most a trace may "
                               "span: give a part of it, or check its time unit (seconds)")
        rate = (offsets.size - 1) / duration
        gaps = np.diff(offsets)
        burstiness = float(gaps.std() / gaps.mean())
        if duration >= 2:
            _, per_second = np.unique(offsets.astype(np.int64), return_counts=True)
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
            per_request = np.asarray(classes, dtype=object)[order]
            seen = Counter(per_request.tolist())
            check_classes(seen, source)
            shares = {name: seen[name] / offsets.size for name in sorted(seen)}
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
                "inputs_from": self.inputs_from, "classes": self.classes,
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
    if used.size < 2:  # one input, asked every time: every exponent puts all on it
        return 0.0
    ranks = np.arange(1, used.size + 1, dtype=np.float64)
    slope = np.polyfit(np.log(ranks), np.log(used), 1)[0]
    return float(max(0.0, -slope))


class _Columns:
    """A trace's columns as its lines are read, a few bytes per request: send times, a
    64-bit digest of each input, the index of each class."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.times = array("d")
        self.inputs = array("q")
        self.classes = array("q")
        self.class_names: dict[str, int] = {}
        self.lengths = {key: array("q") for key in _LENGTH_KEYS}

    def fail(self, number: int, problem: str) -> NoReturn:
        raise InvalidValue(f"{self.path}:{number}: {problem}")

    def time(self, number: int, seconds: float) -> None:
        if not math.isfinite(seconds):
            self.fail(number, f"the time must be a finite number of seconds, got {seconds}")
        if len(self.times) >= MAX_TRACE_REQUESTS:
            raise InvalidValue(f"{self.path}: more than {MAX_TRACE_REQUESTS:,} requests, the "
                               "most a trace may hold: give a part of it")
        self.times.append(seconds)

    def input(self, encoded: bytes) -> None:
        digest = hashlib.blake2b(encoded, digest_size=8).digest()
        self.inputs.append(int.from_bytes(digest, "little", signed=True))

    def request_class(self, number: int, name: object) -> None:
        index = self.class_names.get(name) if isinstance(name, str) else None
        if index is None:
            if problem := class_name_problem(name):
                self.fail(number, problem)
            assert isinstance(name, str)
            index = self.class_names[name] = len(self.class_names)
        self.classes.append(index)

    def length(self, number: int, key: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or \
                not 1 <= value <= MAX_TOKENS:
            self.fail(number, f"'{key}' must be a whole number from 1 to {MAX_TOKENS:,}")
        self.lengths[key].append(value)

    def columns(self) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None,
                               dict[str, float]]:
        """Times, input digests, classes (shared name objects) and mean lengths, each
        checked to be on every line or none."""
        count = len(self.times)
        if not count:
            raise InvalidValue(f"{self.path}: the trace holds no requests")
        named = [("input", self.inputs), ("class", self.classes), *self.lengths.items()]
        for what, values in named:
            if values and len(values) != count:
                raise InvalidValue(f"{self.path}: '{what}' is on some lines only; give it "
                                   "on every line or none")
        classes = None
        if self.classes:
            classes = np.asarray(list(self.class_names), dtype=object)[
                np.frombuffer(self.classes, dtype=np.int64)]
        return (np.frombuffer(self.times, dtype=np.float64),
                np.frombuffer(self.inputs, dtype=np.int64) if self.inputs else None,
                classes,
                {key: float(np.mean(values)) for key, values in self.lengths.items()
                 if values})


def check_classes(names: Iterable[str], source: str) -> None:
    """InvalidValue unless every class name is a plain one (``CLASS_PATTERN``) and no two
    name the same pool (they differ in letter case only: one folder on some file
    systems)."""
    folded: dict[str, str] = {}
    for name in names:
        if problem := class_name_problem(name):
            raise InvalidValue(f"{source}: {problem}")
        other = folded.setdefault(name.casefold(), name)
        if other != name:
            raise InvalidValue(f"{source}: classes {other!r} and {name!r} differ only in "
                               "letter case and would share a pool's folder: rename one")


def _read_records(path: Path) -> tuple[np.ndarray, np.ndarray | None, None]:
    columns = _Columns(path)
    with path.open(newline="") as file:
        rows = csv.reader(file)
        try:
            header = next(rows, [])
            if "scheduled_ms" not in header:
                raise InvalidValue(f"{path}: not a `tradeoff bench --records` CSV (no "
                                   "scheduled_ms column); a JSON lines trace ends in .jsonl")
            at = header.index("scheduled_ms")
            request = header.index("request") if "request" in header else None
            for row in rows:
                number = rows.line_num
                if len(row) != len(header):
                    columns.fail(number, f"{len(row)} fields where the header has "
                                 f"{len(header)}")
                columns.time(number, _number(row[at], float, number, columns) / 1e3)
                if request is not None:
                    value = _number(row[request], int, number, columns)
                    if not 0 <= value < 2**63:
                        columns.fail(number, f"'request' {shown(value)} is not a whole "
                                     "number from 0 to 2**63 - 1")
                    columns.inputs.append(value)
        except (csv.Error, UnicodeDecodeError) as exc:
            columns.fail(rows.line_num + 1, f"not CSV text ({exc})")
    times, inputs, _, _ = columns.columns()
    return times, inputs, None


def _number(text: str, kind: type[int] | type[float], number: int,
            columns: _Columns) -> Any:
    try:
        return kind(text)
    except ValueError:
        columns.fail(number, f"{shown(text)} is not a "
                     f"{'whole number' if kind is int else 'number'}")


def _read_json_lines(path: Path) -> tuple[
        np.ndarray, np.ndarray | None, np.ndarray | None, dict[str, float]]:
    columns = _Columns(path)
    with path.open("rb") as file:
        number = 0
        while line := file.readline(MAX_TRACE_LINE_BYTES + 1):
            number += 1
            if len(line) > MAX_TRACE_LINE_BYTES:
                columns.fail(number, f"a line is longer than {MAX_TRACE_LINE_BYTES:,} "
                             "bytes, the most a trace's line may hold")
            if not line.strip():
                continue
            try:
                entry = orjson.loads(line)
            except orjson.JSONDecodeError as exc:
                columns.fail(number, f"not JSON ({exc})")
            if not isinstance(entry, dict):
                columns.fail(number, "expected an object per line")
            stamp = next((entry[k] for k in _TIME_KEYS if k in entry), None)
            if not isinstance(stamp, int | float) or isinstance(stamp, bool):
                columns.fail(number, "needs a numeric 'timestamp' (seconds)")
            columns.time(number, float(stamp))
            if "input" in entry:
                columns.input(orjson.dumps(entry["input"], option=orjson.OPT_SORT_KEYS))
            if "class" in entry:
                columns.request_class(number, entry["class"])
            for key in _LENGTH_KEYS:
                if key in entry:
                    columns.length(number, key, entry[key])
    return columns.columns()
