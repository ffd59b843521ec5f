"""The result documents, typed: bench, sweep, soak, compare, optimize, tune and plan.

    doc = load_result("sweep.json")        # BenchResult | SweepResult | SoakResult | ...
    doc.knee.load if doc.knee else None
    write_json(doc, "copy.json")            # the same JSON again

Each document is versioned by its ``schema`` field (``tradeoff.bench/1``,
``tradeoff.sweep/1``, ``tradeoff.soak/1``, ``tradeoff.compare/1``, ``tradeoff.optimize/1``,
``tradeoff.tune/1``: a batch-size search or a serving-config search, told apart by
``search``; ``tradeoff.plan/1``).
:func:`load_result` is the one reader: it dispatches on the schema and names the file
and the field when one is missing or the schema is unknown. ``to_dict()`` and
:func:`write_json` are the one writer: a document read from a file writes back the same
JSON. Every type here is a :class:`~tradeoff.records.Record`, whose ``to_dict()`` and
``read()`` come from its fields in that one generic place; a field written otherwise than
plainly says how in its ``written(...)`` metadata. Distributions (``latency_ms`` and the
like) stay ``{"min", "mean", "stddev", "p50", ..., "max"}`` dicts, and open-ended
descriptions (the endpoint, the load spec, the environment) stay dicts; every figure the
tools read is an attribute. This module sits at the bottom of the package: the builders in
``tradeoff.bench``, ``tradeoff.analysis`` and ``tradeoff.optimize`` fill it in, the readers
in ``analysis`` and ``report`` read it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import socket
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar, Union

import numpy as np

from tradeoff.errors import ResultFormatError, local_resource, shown
from tradeoff.records import Fields, Record, written

__all__ = [
    "BENCH_SCHEMA",
    "COMPARE_SCHEMA",
    "OPTIMIZE_SCHEMA",
    "PLAN_SCHEMA",
    "READERS",
    "SOAK_SCHEMA",
    "SWEEP_SCHEMA",
    "TUNE_SCHEMA",
    "BatchPoint",
    "BatchSizeTune",
    "BenchResult",
    "ClassReplayed",
    "ClassSummary",
    "ClientReport",
    "CompareEntry",
    "CompareResult",
    "Distribution",
    "Fairness",
    "FairnessCheck",
    "Generation",
    "InputTokens",
    "Knee",
    "Memory",
    "MemoryEstimate",
    "OptimizeResult",
    "OutputAccuracy",
    "OutputLength",
    "OutputTokens",
    "PlanCandidate",
    "PlanLever",
    "PlanPool",
    "PlanResult",
    "PlanVersion",
    "Prediction",
    "Ratio",
    "Ratios",
    "Recommendation",
    "Replayed",
    "ResultDocument",
    "RowTokens",
    "ServeTune",
    "ServerCounts",
    "SlaAnswer",
    "SoakResult",
    "Summary",
    "SweepResult",
    "SweepRow",
    "Trial",
    "Verdict",
    "VersionReport",
    "Warmup",
    "Window",
    "environment",
    "load_as",
    "load_result",
    "write_json",
]

BENCH_SCHEMA = "tradeoff.bench/1"
SWEEP_SCHEMA = "tradeoff.sweep/1"
SOAK_SCHEMA = "tradeoff.soak/1"
COMPARE_SCHEMA = "tradeoff.compare/1"
OPTIMIZE_SCHEMA = "tradeoff.optimize/1"
TUNE_SCHEMA = "tradeoff.tune/1"
PLAN_SCHEMA = "tradeoff.plan/1"

Distribution = dict[str, float]
"""min, mean, stddev, p50, p90, p95, p99, p999, max of raw samples (some only ``mean``)."""


def environment() -> dict[str, Any]:
    """The machine a result was measured on (every document records it)."""
    from tradeoff.version import __version__

    cpu = platform.processor() or ""
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle
                        if line.startswith("model name")), cpu)
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"client_host": socket.gethostname(), "cpu": cpu, "cores_available": cores,
            "cores_total": os.cpu_count(), "platform": platform.platform(),
            "python": sys.version.split()[0], "tradeoff": __version__,
            "numpy": np.__version__}


# ------------------------------------------------------------------------ bench


@dataclass(frozen=True)
class Window(Record):
    """One measurement window: the requests that ended in it."""

    index: int
    duration_s: float
    completed: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    # mean ms per part, when snapshots bracket the window
    server_ms: dict[str, float] | None = field(default=None, metadata=written(omit_none=True))
    server_executions: int | None = field(
        default=None, metadata=written(when=lambda w: w.server_ms is not None))
    # merged compare rounds: which round it came from
    round: int | None = field(default=None, metadata=written(omit_none=True))


@dataclass(frozen=True)
class Warmup(Record):
    requests: int
    latency_ms: Distribution | None


@dataclass(frozen=True)
class ClientReport(Record):
    """How the load generator itself fared; ``client_bound`` when it could not keep up."""

    workers: int
    cpu_percent: float
    send_lag_ms: Distribution | None
    loop_lag_ms: Distribution | None
    client_bound: bool
    reasons: list[str]
    notes: list[str]
    # Ray workers: per worker its node, requests and clock offset from this host's
    # clock; and how far apart their starts may have been (the offsets' uncertainty)
    hosts: list[dict[str, Any]] = field(default_factory=list,
                                        metadata=written(when=lambda c: bool(c.hosts)))
    start_skew_ms: float | None = field(default=None,
                                        metadata=written(when=lambda c: bool(c.hosts)))


_WITH_CACHE = written(when=lambda counts: counts.cache_hits is not None)


@dataclass(frozen=True)
class ServerCounts(Record):
    """Requests and model executions the server counted over the measurement, and its
    response cache's hits and misses when it has one in use."""

    requests: int
    executions: int
    cache_hits: int | None = field(default=None, metadata=written(omit_none=True))
    cache_misses: int | None = field(default=None, metadata=_WITH_CACHE)
    # hits over lookups; None when the server looked nothing up
    cache_hit_ratio: float | None = field(init=False, metadata=_WITH_CACHE)

    def __post_init__(self) -> None:
        lookups = (self.cache_hits or 0) + (self.cache_misses or 0)
        ratio = self.cache_hits / lookups if self.cache_hits is not None and \
            self.cache_misses is not None and lookups else None
        object.__setattr__(self, "cache_hit_ratio", ratio)

    @property
    def computed(self) -> int:
        """Requests the model ran for (not answered from the cache)."""
        return self.requests - (self.cache_hits or 0)


@dataclass(frozen=True)
class InputTokens(Record):
    total: int
    per_request: Distribution | None


@dataclass(frozen=True)
class OutputTokens(Record):
    """Generated tokens: from the server's usage, or counted as text events without it."""

    total: int
    per_request: Distribution | None
    from_usage: int
    counted_events: int


@dataclass(frozen=True)
class OutputLength(Record):
    """Answers as long as the max_tokens asked, shorter or longer."""

    asked: int
    exact: int
    shorter: int
    longer: int
    ignore_eos: bool
    honoured: bool


@dataclass(frozen=True)
class Generation(Record):
    """The figures of streamed generations (OpenAI-compatible endpoints)."""

    ttft_ms: Distribution | None
    itl_ms: Distribution | None
    tpot_ms: Distribution | None
    output_tokens_per_s: float
    input_tokens: InputTokens | None
    output_tokens: OutputTokens
    output_length: OutputLength
    slo: dict[str, float] | None
    goodput_rps: float | None


@dataclass(frozen=True)
class Summary(Record):
    """The figures of the measurement (see docs/bench.md for every definition)."""

    requests: int
    successes: int
    errors: int
    errors_by_class: dict[str, int]
    throughput_rps: float
    inferences_per_s: float
    latency_ms: Distribution | None
    server_ms: dict[str, Any] | None  # "source" and one distribution per server part
    server_counts: ServerCounts | None
    bytes_sent: int
    bytes_received: int
    asked_rate_rps: float | None
    achieved_rate_rps: float | None
    duration_s: float
    generation: Generation | None = field(default=None, metadata=written(flat="ttft_ms"))
    # the successful latencies at QUANTILES, from the records: the report's CDF
    latency_quantiles_ms: list[float] | None = field(default=None,
                                                     metadata=written(omit_none=True))
    # the measurement over time (bench/result.py timeline): bin_s, throughput_rps, p50_ms,
    # p99_ms per bin
    timeline: dict[str, Any] | None = field(default=None, metadata=written(omit_none=True))

    @property
    def error_percent(self) -> float:
        return 100 * self.errors / self.requests if self.requests else 0.0

    def latency(self, key: str) -> float | None:
        """One figure of the latency distribution (``p50``, ``p99``, ``mean`` ...)."""
        return (self.latency_ms or {}).get(key)


@dataclass(frozen=True)
class ClassSummary(Record):
    """One request class of a ``--mix``: what it sent and how it fared, apart."""

    name: str
    weight: float
    parameters: dict[str, Any]
    requests: int
    errors: int
    throughput_rps: float
    latency_ms: Distribution | None
    # streamed generations: time to first token, and per output token after it
    ttft_ms: Distribution | None = field(default=None, metadata=written(omit_none=True))
    tpot_ms: Distribution | None = field(default=None, metadata=written(omit_none=True))

    def latency(self, key: str) -> float | None:
        return (self.latency_ms or {}).get(key)


def _label(endpoint: Mapping[str, Any]) -> str:
    return str(endpoint.get("name") or endpoint.get("model") or endpoint.get("url") or "")


@dataclass(frozen=True)
class BenchResult(Record):
    """One benchmark run (``tradeoff.bench/1``)."""

    endpoint: dict[str, Any]  # what the adapter describes: protocol, url, model, metadata
    load: dict[str, Any]  # the LoadSpec
    environment: dict[str, Any]
    cold_start_ms: float | None
    cold_start_ok: bool | None
    warmup: Warmup
    total_requests_sent: int
    windows: list[Window]
    stable: bool | None
    stop_reason: str
    client: ClientReport
    summary: Summary
    # compare: how many rounds were pooled into this one
    merged_rounds: int | None = field(default=None, metadata=written(omit_none=True))
    # --mix: every class apart
    classes: list[ClassSummary] | None = field(default=None, metadata=written(omit_none=True))

    schema = BENCH_SCHEMA

    @property
    def label(self) -> str:
        """What to call the endpoint: its name, model or URL."""
        return _label(self.endpoint)

    @property
    def offered_load(self) -> float:
        """The concurrency of a closed loop, else the rate."""
        return float(self.load["concurrency"] if self.load["mode"] == "closed"
                     else self.load["rate"])

    def named(self, name: str) -> BenchResult:
        """The same result with the endpoint called ``name``."""
        return dataclasses.replace(self, endpoint={**self.endpoint, "name": name})


# ------------------------------------------------------------------------ sweep


@dataclass(frozen=True)
class RowTokens(Record):
    """A sweep point's generation figures."""

    output_tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    goodput_rps: float | None


@dataclass(frozen=True)
class SweepRow(Record):
    """Load, throughput, latency and error rate of one sweep point."""

    load: float
    throughput_rps: float
    inferences_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    error_percent: float
    requests: int
    tokens: RowTokens | None = field(default=None,
                                     metadata=written(flat="output_tokens_per_s"))
    # cost_per_million is written only for a priced sweep
    priced: bool = field(default=False, metadata=written(
        never=True, reader=lambda f: f.has("cost_per_million")))
    cost_per_million: float | None = field(default=None,
                                           metadata=written(when=lambda row: row.priced))

    @property
    def work_rate(self) -> float:
        """What the knee is found on: output tokens/s for generations, else requests/s."""
        return float(self.tokens.output_tokens_per_s if self.tokens else self.throughput_rps)


@dataclass(frozen=True)
class Knee(SweepRow):
    """The sweep point where more load stopped paying, and the rule that found it."""

    rule: str = field(default="", metadata=written(required=True))


@dataclass(frozen=True)
class SlaAnswer(Record):
    """The highest load whose p99 and error rate met the SLA (``best`` None: none did)."""

    p99_ms: float
    max_error_percent: float
    best_load: float | None
    best: SweepRow | None


@dataclass(frozen=True)
class SweepResult(Record):
    """One full benchmark per load level (``tradeoff.sweep/1``); ``ranking`` holds the
    candidates of :func:`tradeoff.stats.cost.rank` when the sweep was priced."""

    endpoint: dict[str, Any]
    mode: str  # concurrency | rate
    plan: dict[str, Any]
    environment: dict[str, Any]
    points: list[BenchResult]
    rows: list[SweepRow]
    knee: Knee | None
    stop_reason: str
    sla: SlaAnswer | None
    price: dict[str, Any] | None
    ranking: list[dict[str, Any]] | None
    score: dict[str, Any]

    schema = SWEEP_SCHEMA

    @property
    def label(self) -> str:
        return _label(self.endpoint)

    def point_at(self, load: float) -> BenchResult | None:
        """The bench result at ``load`` (None when it was not measured)."""
        return next((p for p in self.points if p.offered_load == load), None)

    def named(self, name: str) -> SweepResult:
        return dataclasses.replace(self, endpoint={**self.endpoint, "name": name})


# ------------------------------------------------------------------------- soak


@dataclass(frozen=True)
class Verdict(Record):
    """Whether a soak run was stable, why not, and the trends behind it."""

    stable: bool
    reasons: list[dict[str, Any]]  # kind, severity, text, evidence, action
    notes: list[str]
    trends: dict[str, Any]  # p99, throughput, memory: Mann-Kendall figures


@dataclass(frozen=True)
class Memory(Record):
    """The server's resident memory over the run: (seconds, bytes) samples."""

    source: str | None
    samples: list[tuple[float, float]] = field(default_factory=list)


@dataclass(frozen=True)
class SoakResult(Record):
    """Sustained load watched for drift, error bursts and memory growth
    (``tradeoff.soak/1``)."""

    endpoint: dict[str, Any]
    plan: dict[str, Any]
    environment: dict[str, Any]
    max_rate: dict[str, Any]  # rps, source (given | measured) and the probe sweep's rows
    rate_rps: float
    result: BenchResult
    summary: SweepRow
    memory: Memory
    verdict: Verdict

    schema = SOAK_SCHEMA

    @property
    def label(self) -> str:
        return _label(self.endpoint)


# ---------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Ratio(Record):
    """A ratio to the baseline and its 95% bootstrap interval (None: not known)."""

    ratio: float | None
    ci95: list[float] | None


@dataclass(frozen=True)
class Ratios(Record):
    """One endpoint's ratios to the baseline: throughput, p50, p99 and, for generations,
    output_tokens_per_s, ttft_p50, ttft_p99, tpot_p50."""

    name: str
    metrics: dict[str, Ratio]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{k: v.to_dict() for k, v in self.metrics.items()}}

    @classmethod
    def read(cls, f: Fields) -> Ratios:
        return cls(f.typed("name", str), {k: Ratio.read(f.sub(k)) for k in f.data
                                          if k != "name"})


@dataclass(frozen=True)
class FairnessCheck(Record):
    check: str
    ok: bool | None  # None: not known
    detail: str


@dataclass(frozen=True)
class Fairness(Record):
    """Whether the endpoints were measured alike: inputs, load, client, interleaving."""

    ok: bool
    checks: list[FairnessCheck]

    @property
    def interleaved(self) -> bool:
        return any(c.check == "interleaved" and c.ok for c in self.checks)


@dataclass(frozen=True)
class CompareEntry(Record):
    """One endpoint of a comparison: its pooled result and each round's summary."""

    name: str
    input_fingerprint: str | None
    profile: dict[str, Any]
    rounds: list[Summary]
    result: BenchResult


@dataclass(frozen=True)
class CompareResult(Record):
    """The same load against several endpoints (``tradeoff.compare/1``); ``ranking`` holds
    the candidates of :func:`tradeoff.stats.cost.rank`."""

    baseline: str
    rounds: int
    environment: dict[str, Any]
    endpoints: list[CompareEntry]
    ratios: list[Ratios]
    fairness: Fairness
    ranking: list[dict[str, Any]]
    score: dict[str, Any]

    schema = COMPARE_SCHEMA

    @property
    def label(self) -> str:
        return self.baseline

    def ratios_of(self, name: str) -> Ratios:
        return next(r for r in self.ratios if r.name == name)


# ------------------------------------------------------------------------ optimize


@dataclass(frozen=True)
class OutputAccuracy(Record):
    """One output of an optimised version against the original, on the same inputs."""

    output: str
    kind: str  # embedding | classifier | tensor: how it was graded
    samples: int
    metrics: dict[str, float]
    drop: float  # what was lost, 0 = nothing; compared with --max-drop


@dataclass(frozen=True)
class VersionReport(Record):
    """One version of the model: how it was made, its speed in process, what it lost."""

    version: int
    precision: str
    method: str
    size_bytes: int
    latency_ms: Distribution  # batch 1, in process
    throughput_by_batch: dict[int, float]  # samples per second at each batch size
    best_batch: int = field(init=False)
    best_throughput: float = field(init=False)
    accuracy: list[OutputAccuracy]  # empty for the original
    drop: float = field(init=False)  # the most any output lost
    created: bool  # made by this run (not a version that was already there)
    model: str | None = None  # served under another name (an LLM's precision: a sibling)
    # an LLM's: ms of one step that prefills a prompt chunk of each size (no decodes)
    prefill_ms: dict[int, float] | None = field(default=None,
                                                metadata=written(omit_none=True))

    def __post_init__(self) -> None:
        best = max(self.throughput_by_batch, key=lambda b: self.throughput_by_batch[b])
        object.__setattr__(self, "best_batch", best)
        object.__setattr__(self, "best_throughput", self.throughput_by_batch[best])
        object.__setattr__(self, "drop", max((a.drop for a in self.accuracy), default=0.0))


@dataclass(frozen=True)
class OptimizeResult(Record):
    """``tradeoff optimize``: the original and each optimised version, side by side."""

    model: str
    repository: str
    source_version: int
    validation: dict[str, Any]  # {"source": where the samples came from, "samples": N}
    calibration: dict[str, Any] | None
    max_drop: float
    environment: dict[str, Any]
    versions: list[VersionReport]
    schema = OPTIMIZE_SCHEMA

    @property
    def original(self) -> VersionReport:
        return next(v for v in self.versions if v.version == self.source_version)

    def over_max_drop(self, version: VersionReport) -> bool:
        return version.drop > self.max_drop

    def speedup(self, version: VersionReport) -> tuple[float, float]:
        """(batch-1 latency ratio, best-throughput ratio) against the original; >1 is
        faster."""
        base = self.original
        return (base.latency_ms["p50"] / version.latency_ms["p50"],
                version.best_throughput / base.best_throughput)

    def to_dict(self) -> dict[str, Any]:
        """Each version also says, against this run's original and --max-drop, whether it
        lost too much and how much faster it is (read back from the versions)."""
        out = super().to_dict()
        out["versions"] = [{**written_version, "over_max_drop": self.over_max_drop(v),
                            "speedup_batch1": self.speedup(v)[0],
                            "speedup_throughput": self.speedup(v)[1]}
                           for v, written_version in zip(self.versions, out["versions"],
                                                             strict=True)]
        return out


# ------------------------------------------------------------------------ tune


@dataclass(frozen=True)
class BatchPoint(Record):
    """One batch size of ``tradeoff tune batch-size``, measured in process."""

    batch_size: int
    # doubling: a step of the search; back-off: the recommendation; memory: one run past
    # the knee, to find the largest batch within --max-memory
    role: str
    samples_per_s: float | None  # None when the batch could not run
    latency_ms: Distribution | None  # of one batch
    memory_bytes: int | None  # the most held above what the process held before the model
    fits: bool  # within --max-memory (True without one)
    error: str | None = None


@dataclass(frozen=True)
class MemoryEstimate(Record):
    """What memory says about the largest batch: the formula next to the measurement."""

    source: str  # how memory was measured
    weights_bytes: int  # held once the model was loaded, before any batch
    per_sample_bytes: float | None  # slope of memory over batch size (None: not measurable)
    max_memory_bytes: int | None  # --max-memory
    estimated_max_batch: int | None  # (max_memory - weights) / per_sample
    largest_fit: int | None  # the largest batch measured that stayed within max_memory


@dataclass(frozen=True)
class BatchSizeTune(Record):
    """``tradeoff tune batch-size``: the doubling search and the batch size it recommends."""

    model: str
    repository: str
    device: str
    plan: dict[str, Any]
    environment: dict[str, Any]
    points: list[BatchPoint]
    knee: int | None  # the batch size where doubling stopped paying
    recommended: int
    why: str
    stop_reason: str
    memory: MemoryEstimate
    schema = TUNE_SCHEMA
    search = "batch-size"

    @property
    def doubling(self) -> list[BatchPoint]:
        return [p for p in self.points if p.role == "doubling"]

    def point(self, batch_size: int) -> BatchPoint | None:
        return next((p for p in self.points if p.batch_size == batch_size), None)


@dataclass(frozen=True)
class Trial(Record):
    """One serving configuration ``tradeoff tune serve`` tried on the live server."""

    name: str
    knobs: dict[str, Any]  # max_batch_size, max_queue_delay_us, preferred_batch_size, ...
    status: str  # measured | refused (the server would not load it) | failed
    reason: str | None
    throughput_rps: float | None = None
    p50_ms: float | None = None
    p99_ms: float | None = None
    error_percent: float | None = None
    cost_per_million: float | None = None
    meets_sla: bool = False
    pareto: bool = False
    seconds: float = 0.0  # search time it took
    # each measurement (throughput_rps, p50_ms, p99_ms, error_percent); the figures above
    # are their medians (a configuration in the final round was measured more than once)
    measurements: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class Recommendation(Record):
    """The rate ``tune serve`` recommends for its winner (max throughput): the lowest of
    its measurements less a headroom for the spread between them, replayed there."""

    rate_rps: float
    headroom: float  # the share taken off the lowest measured rate
    spread: float | None  # (highest - lowest) / median of the winner's measured rates
    measurements: int
    replay_p99_ms: float | None
    replay_error_percent: float | None
    holds: bool | None  # the replay met the SLA; None: not replayed (no time left)


_OMITTED_WHEN_NONE = written(omit_none=True)  # ServeTune has a field named `written`


@dataclass(frozen=True)
class ServeTune(Record):
    """``tradeoff tune serve``: every configuration tried, the Pareto front, the winner."""

    endpoint: dict[str, Any]
    model: str
    goal: dict[str, Any]  # sla_p99_ms, rate or max-throughput, price, budget_s, strategy
    environment: dict[str, Any]
    trials: list[Trial]
    baseline: str  # name of the configuration the server had
    winner: str | None
    stop_reason: str
    elapsed_s: float
    grid_size: int
    written: str | None  # where the winner's config.pbtxt went
    recommended: Recommendation | None = field(default=None, metadata=_OMITTED_WHEN_NONE)
    schema = TUNE_SCHEMA
    search = "serve"

    def trial(self, name: str | None) -> Trial | None:
        return next((t for t in self.trials if t.name == name), None)


class _TuneDocuments:
    """Reads a ``tradeoff.tune/1`` document as the search it records."""

    @staticmethod
    def read(f: Fields) -> BatchSizeTune | ServeTune:
        search = f.typed("search", str)
        kinds: dict[str, Any] = {"batch-size": BatchSizeTune, "serve": ServeTune}
        if search not in kinds:
            raise ResultFormatError(f"{f.where}.search: {shown(search)} is not a tune search "
                                    f"this version reads ({', '.join(kinds)})")
        document: BatchSizeTune | ServeTune = kinds[search].read(f)
        return document


# ------------------------------------------------------------------------ plan


@dataclass(frozen=True)
class PlanVersion(Record):
    """One version of the model a plan weighed: what it lost, whether it was kept, and
    the measured time of one batch at each size (what the predictions run on)."""

    version: int
    precision: str
    method: str
    drop: float
    kept: bool
    why: str
    batch_ms: dict[int, float]


@dataclass(frozen=True)
class Prediction(Record):
    """What the batcher simulation says a deployment does to the traffic."""

    p50_ms: float  # a generative model's: time to first token
    p99_ms: float
    mean_batch: float  # a generative model's: sequences in a step
    hit_ratio: float  # of the response cache (0 without one); the prefix cache's
    utilisation: float  # the rate the model sees over the most it can serve
    tpot_p50_ms: float | None = field(default=None, metadata=written(omit_none=True))
    tpot_p99_ms: float | None = field(default=None, metadata=written(omit_none=True))
    # the p99 (a generative model's TTFT p99) the calibration supports: least, most
    p99_range_ms: list[float] | None = field(default=None, metadata=written(omit_none=True))


@dataclass(frozen=True)
class PlanCandidate(Record):
    """One deployment the plan predicted: a version, its serving knobs, a cache."""

    name: str
    version: int
    precision: str
    drop: float
    knobs: dict[str, Any]  # max_batch_size, max_queue_delay_us, instances, threads
    cache_bytes: int  # 0: no response cache
    cores: int
    predicted: Prediction
    cost_per_million: float | None
    meets_sla: bool
    changes: int  # levers moved from the starting deployment (version, knobs, cache)
    pareto: bool = False
    # a pool per request class behind a router: then the fields above are the pool of the
    # strictest class, but cores, cost and meets_sla are the whole deployment's
    pools: list[PlanPool] = field(default_factory=list,
                                  metadata=written(when=lambda c: bool(c.pools)))
    # a generative engine serving several classes: each class's own prediction
    class_predicted: dict[str, Prediction] = field(
        default_factory=dict, metadata=written(when=lambda c: bool(c.class_predicted)))

    @property
    def cost(self) -> float:
        """What the plan ranks it by: the cost per 1M requests, or the cores it takes
        without a price."""
        return self.cost_per_million if self.cost_per_million is not None \
            else float(self.cores)


@dataclass(frozen=True)
class PlanPool(Record):
    """One request class's own pool in a deployment with a pool per class: its share of
    the traffic, its SLA, and the deployment predicted for its part of the traffic."""

    request_class: str
    share: float
    sla_p99_ms: float
    candidate: PlanCandidate


@dataclass(frozen=True)
class ClassReplayed(Record):
    """One request class of a replay: its p99 measured, against its SLA and the
    prediction."""

    request_class: str
    sla_p99_ms: float  # a generative model's: TTFT
    p99_ms: float | None
    predicted: Prediction  # its pool's, or the one pool's that serves every class
    error_percent: float
    meets_sla: bool
    sla_tpot_ms: float | None = field(default=None, metadata=written(omit_none=True))
    tpot_p99_ms: float | None = field(default=None, metadata=written(omit_none=True))


@dataclass(frozen=True)
class Replayed(Record):
    """A deployment served and the traffic replayed against it: measured next to
    predicted."""

    name: str
    role: str  # baseline | plan
    p50_ms: float | None
    p99_ms: float | None
    throughput_rps: float
    error_percent: float
    hit_ratio: float | None  # the server's cache counts
    mean_batch: float | None  # requests the model ran over its executions
    predicted: Prediction
    meets_sla: bool  # with classes: every class met its own
    cost_per_million: float | None  # requests, or a generative model's output tokens
    classes: list[ClassReplayed] = field(default_factory=list,
                                         metadata=written(when=lambda r: bool(r.classes)))
    # a generative model's: p50_ms and p99_ms are its time to first token
    tpot_p99_ms: float | None = field(default=None, metadata=written(omit_none=True))
    output_tokens_per_s: float | None = field(default=None, metadata=written(omit_none=True))
    # requests per second that met both TTFT and TPOT bounds
    goodput_rps: float | None = field(default=None, metadata=written(omit_none=True))
    # each replay round's p99 (a generative model's TTFT): their spread is the noise
    p99_rounds_ms: list[float | None] = field(
        default_factory=list, metadata=written(when=lambda r: bool(r.p99_rounds_ms)))


@dataclass(frozen=True)
class PlanLever(Record):
    """A lever the plan weighed (precision, batching, instances, cache, classes, engine):
    taken or left, and why."""

    lever: str
    taken: bool
    why: str


@dataclass(frozen=True)
class PlanResult(Record):
    """``tradeoff plan``: from a model, its traffic and an SLA to a deployment, replayed."""

    model: str
    repository: str
    output: str | None  # where the deployment was written
    goal: dict[str, Any]  # sla_p99_ms, max_drop, prices, cores, budget_s
    traffic: dict[str, Any]  # Traffic.describe()
    environment: dict[str, Any]
    calibration: dict[str, Any]  # the server's own cost per request, measured
    versions: list[PlanVersion]
    baseline: PlanCandidate  # the starting configuration, predicted alike
    candidates: list[PlanCandidate]  # the best ranked, the Pareto front and the chosen
    chosen: str | None
    levers: list[PlanLever]
    proof: list[Replayed]
    verdict: str
    stop_reason: str
    elapsed_s: float
    schema = PLAN_SCHEMA

    def candidate(self, name: str | None) -> PlanCandidate | None:
        return next((c for c in self.candidates if c.name == name), None)


# ------------------------------------------------------------ reader and writer

ResultDocument = Union[BenchResult, SweepResult, SoakResult, CompareResult, OptimizeResult,
                       BatchSizeTune, ServeTune, PlanResult]
READERS: dict[str, Any] = {BENCH_SCHEMA: BenchResult, SWEEP_SCHEMA: SweepResult,
                           SOAK_SCHEMA: SoakResult, COMPARE_SCHEMA: CompareResult,
                           OPTIMIZE_SCHEMA: OptimizeResult, TUNE_SCHEMA: _TuneDocuments,
                           PLAN_SCHEMA: PlanResult}
_Document = TypeVar("_Document", BenchResult, SweepResult, SoakResult, CompareResult,
                    OptimizeResult, BatchSizeTune, ServeTune, PlanResult)


def load_result(source: str | Path | Mapping[str, Any] | ResultDocument,
                name: str | None = None) -> ResultDocument:
    """A result document from a JSON file, its parsed dict, or a document (returned as is).

    Dispatches on ``schema``; a file that is not JSON, an unknown schema or a missing
    field raises :class:`ResultFormatError` naming the file (or ``name``) and the field.
    """
    if isinstance(source, (BenchResult, SweepResult, SoakResult, CompareResult,
                           OptimizeResult, BatchSizeTune, ServeTune, PlanResult)):
        return source
    if isinstance(source, (str, Path)):
        where = name or str(source)
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, ValueError) as exc:
            raise ResultFormatError(f"{where}: not a readable JSON result ({exc})") from None
    else:
        data, where = source, name or "result"
    f = Fields(data, where)
    schema = f.get("schema")
    reader = READERS.get(str(schema))
    if reader is None:
        known = ", ".join(READERS)
        raise ResultFormatError(f"{where}: not a tradeoff result this version reads (schema "
                                f"{shown(schema)}; known: {known})")
    document: ResultDocument = reader.read(f)
    return document


def load_as(kind: type[_Document], source: str | Path | Mapping[str, Any] | ResultDocument,
            name: str | None = None) -> _Document:
    """:func:`load_result`, refusing any other kind of document than ``kind``."""
    document = load_result(source, name)
    if not isinstance(document, kind):
        where = name or (str(source) if isinstance(source, (str, Path)) else "result")
        raise ResultFormatError(f"{where}: a {document.schema} document, not {kind.schema}")
    return document


def write_json(document: ResultDocument, path: str | Path) -> None:
    """Write ``document`` as JSON (parent folders made as needed)."""
    path = Path(path)
    text = json.dumps(document.to_dict(), indent=2, allow_nan=False)
    with local_resource(f"cannot write {path}"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
