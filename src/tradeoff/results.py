"""The result documents, typed: bench, sweep, soak, compare, optimize and tune.

    doc = load_result("sweep.json")        # BenchResult | SweepResult | SoakResult | ...
    doc.knee.load if doc.knee else None
    write_json(doc, "copy.json")            # the same JSON again

Each document is versioned by its ``schema`` field (``tradeoff.bench/1``,
``tradeoff.sweep/1``, ``tradeoff.soak/1``, ``tradeoff.compare/1``, ``tradeoff.optimize/1``,
``tradeoff.tune/1``: a batch-size search or a serving-config search, told apart by
``search``).
:func:`load_result` is the one reader: it dispatches on the schema and names the file
and the field when one is missing or the schema is unknown. ``to_dict()`` and
:func:`write_json` are the one writer: a document read from a file writes back the same
JSON. Distributions (``latency_ms`` and the like) stay ``{"min", "mean", "stddev", "p50",
..., "max"}`` dicts, and open-ended descriptions (the endpoint, the load spec, the
environment) stay dicts; every figure the tools read is an attribute. This module sits at
the bottom of the package: the builders in ``tradeoff.bench``, ``tradeoff.analysis`` and
``tradeoff.optimize`` fill it in, the readers in ``analysis`` and ``report`` read it.
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

from tradeoff.errors import ResultFormatError

__all__ = [
    "BENCH_SCHEMA",
    "COMPARE_SCHEMA",
    "OPTIMIZE_SCHEMA",
    "READERS",
    "SOAK_SCHEMA",
    "SWEEP_SCHEMA",
    "TUNE_SCHEMA",
    "BatchPoint",
    "BatchSizeTune",
    "BenchResult",
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
    "Ratio",
    "Ratios",
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

Distribution = dict[str, float]
"""min, mean, stddev, p50, p90, p95, p99, p999, max of raw samples (some only ``mean``)."""


class _Fields:
    """Reads the fields of one JSON object, naming where a missing one was expected."""

    def __init__(self, data: Any, where: str) -> None:
        if not isinstance(data, Mapping):
            raise ResultFormatError(f"{where}: expected an object, got {type(data).__name__}")
        self.data = data
        self.where = where

    def __call__(self, key: str) -> Any:
        try:
            return self.data[key]
        except KeyError:
            raise ResultFormatError(f"{self.where}: field {key!r} is missing") from None

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def has(self, key: str) -> bool:
        return key in self.data

    def sub(self, key: str) -> _Fields:
        return _Fields(self(key), f"{self.where}.{key}")

    def items(self, key: str) -> list[_Fields]:
        values = self(key)
        if not isinstance(values, list):
            raise ResultFormatError(f"{self.where}.{key}: expected a list")
        return [_Fields(v, f"{self.where}.{key}[{i}]") for i, v in enumerate(values)]


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


def _optional(value: Any, reader: Any, where: str) -> Any:
    return None if value is None else reader(_Fields(value, where))


# ------------------------------------------------------------------------ bench


@dataclass(frozen=True)
class Window:
    """One measurement window: the requests that ended in it."""

    index: int
    duration_s: float
    completed: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    server_ms: dict[str, float] | None = None  # mean ms per part, when snapshots bracket it
    server_executions: int | None = None
    round: int | None = None  # merged compare rounds: which round it came from

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index, "duration_s": self.duration_s, "completed": self.completed,
            "errors": self.errors, "throughput_rps": self.throughput_rps,
            "p50_ms": self.p50_ms, "p99_ms": self.p99_ms}
        if self.server_ms is not None:
            out["server_ms"] = self.server_ms
            out["server_executions"] = self.server_executions
        if self.round is not None:
            out["round"] = self.round
        return out

    @classmethod
    def read(cls, f: _Fields) -> Window:
        return cls(f("index"), f("duration_s"), f("completed"), f("errors"),
                   f("throughput_rps"), f("p50_ms"), f("p99_ms"), f.get("server_ms"),
                   f.get("server_executions"), f.get("round"))


@dataclass(frozen=True)
class Warmup:
    requests: int
    latency_ms: Distribution | None

    def to_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "latency_ms": self.latency_ms}

    @classmethod
    def read(cls, f: _Fields) -> Warmup:
        return cls(f("requests"), f("latency_ms"))


@dataclass(frozen=True)
class ClientReport:
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
    hosts: list[dict[str, Any]] = field(default_factory=list)
    start_skew_ms: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "workers": self.workers, "cpu_percent": self.cpu_percent,
            "send_lag_ms": self.send_lag_ms, "loop_lag_ms": self.loop_lag_ms,
            "client_bound": self.client_bound, "reasons": list(self.reasons),
            "notes": list(self.notes)}
        if self.hosts:  # only when the load came from Ray workers
            out.update(hosts=[dict(h) for h in self.hosts], start_skew_ms=self.start_skew_ms)
        return out

    @classmethod
    def read(cls, f: _Fields) -> ClientReport:
        return cls(f("workers"), f("cpu_percent"), f("send_lag_ms"), f("loop_lag_ms"),
                   f("client_bound"), list(f("reasons")), list(f("notes")),
                   list(f.get("hosts") or []), f.get("start_skew_ms"))


@dataclass(frozen=True)
class ServerCounts:
    """Requests and model executions the server counted over the measurement, and its
    response cache's hits and misses when it has one in use."""

    requests: int
    executions: int
    cache_hits: int | None = None
    cache_misses: int | None = None

    @property
    def cache_hit_ratio(self) -> float | None:
        """Hits over lookups; None when the server looked nothing up."""
        if self.cache_hits is None or self.cache_misses is None:
            return None
        lookups = self.cache_hits + self.cache_misses
        return self.cache_hits / lookups if lookups else None

    @property
    def computed(self) -> int:
        """Requests the model ran for (not answered from the cache)."""
        return self.requests - (self.cache_hits or 0)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"requests": self.requests, "executions": self.executions}
        if self.cache_hits is not None:
            out.update(cache_hits=self.cache_hits, cache_misses=self.cache_misses,
                       cache_hit_ratio=self.cache_hit_ratio)
        return out

    @classmethod
    def read(cls, f: _Fields) -> ServerCounts:
        return cls(f("requests"), f("executions"), f.get("cache_hits"), f.get("cache_misses"))


@dataclass(frozen=True)
class InputTokens:
    total: int
    per_request: Distribution | None

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "per_request": self.per_request}

    @classmethod
    def read(cls, f: _Fields) -> InputTokens:
        return cls(f("total"), f("per_request"))


@dataclass(frozen=True)
class OutputTokens:
    """Generated tokens: from the server's usage, or counted as text events without it."""

    total: int
    per_request: Distribution | None
    from_usage: int
    counted_events: int

    def to_dict(self) -> dict[str, Any]:
        return {"total": self.total, "per_request": self.per_request,
                "from_usage": self.from_usage, "counted_events": self.counted_events}

    @classmethod
    def read(cls, f: _Fields) -> OutputTokens:
        return cls(f("total"), f("per_request"), f("from_usage"), f("counted_events"))


@dataclass(frozen=True)
class OutputLength:
    """Answers as long as the max_tokens asked, shorter or longer."""

    asked: int
    exact: int
    shorter: int
    longer: int
    ignore_eos: bool
    honoured: bool

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, f: _Fields) -> OutputLength:
        return cls(f("asked"), f("exact"), f("shorter"), f("longer"), f("ignore_eos"),
                   f("honoured"))


@dataclass(frozen=True)
class Generation:
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

    def to_dict(self) -> dict[str, Any]:
        return {"ttft_ms": self.ttft_ms, "itl_ms": self.itl_ms, "tpot_ms": self.tpot_ms,
                "output_tokens_per_s": self.output_tokens_per_s,
                "input_tokens": self.input_tokens.to_dict() if self.input_tokens else None,
                "output_tokens": self.output_tokens.to_dict(),
                "output_length": self.output_length.to_dict(),
                "slo": self.slo, "goodput_rps": self.goodput_rps}

    @classmethod
    def read(cls, f: _Fields) -> Generation:
        return cls(f("ttft_ms"), f("itl_ms"), f("tpot_ms"), f("output_tokens_per_s"),
                   _optional(f("input_tokens"), InputTokens.read, f"{f.where}.input_tokens"),
                   OutputTokens.read(f.sub("output_tokens")),
                   OutputLength.read(f.sub("output_length")), f("slo"), f("goodput_rps"))


@dataclass(frozen=True)
class Summary:
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
    generation: Generation | None = None  # written flat into the summary
    # the successful latencies at QUANTILES, from the records: the report's CDF
    latency_quantiles_ms: list[float] | None = None
    # the measurement over time (bench/result.py timeline): bin_s, throughput_rps, p50_ms,
    # p99_ms per bin
    timeline: dict[str, Any] | None = None

    @property
    def error_percent(self) -> float:
        return 100 * self.errors / self.requests if self.requests else 0.0

    def latency(self, key: str) -> float | None:
        """One figure of the latency distribution (``p50``, ``p99``, ``mean`` ...)."""
        return (self.latency_ms or {}).get(key)

    def to_dict(self) -> dict[str, Any]:
        out = {"requests": self.requests, "successes": self.successes, "errors": self.errors,
               "errors_by_class": dict(self.errors_by_class),
               "throughput_rps": self.throughput_rps,
               "inferences_per_s": self.inferences_per_s, "latency_ms": self.latency_ms,
               "server_ms": self.server_ms,
               "server_counts": self.server_counts.to_dict() if self.server_counts else None,
               "bytes_sent": self.bytes_sent, "bytes_received": self.bytes_received,
               "asked_rate_rps": self.asked_rate_rps,
               "achieved_rate_rps": self.achieved_rate_rps, "duration_s": self.duration_s}
        if self.generation is not None:
            out.update(self.generation.to_dict())
        if self.latency_quantiles_ms is not None:
            out["latency_quantiles_ms"] = self.latency_quantiles_ms
        if self.timeline is not None:
            out["timeline"] = self.timeline
        return out

    @classmethod
    def read(cls, f: _Fields) -> Summary:
        return cls(f("requests"), f("successes"), f("errors"), dict(f("errors_by_class")),
                   f("throughput_rps"), f("inferences_per_s"), f("latency_ms"), f("server_ms"),
                   _optional(f("server_counts"), ServerCounts.read, f"{f.where}.server_counts"),
                   f("bytes_sent"), f("bytes_received"), f("asked_rate_rps"),
                   f("achieved_rate_rps"), f("duration_s"),
                   Generation.read(f) if f.has("ttft_ms") else None,
                   f.get("latency_quantiles_ms"), f.get("timeline"))


@dataclass(frozen=True)
class ClassSummary:
    """One request class of a ``--mix``: what it sent and how it fared, apart."""

    name: str
    weight: float
    parameters: dict[str, Any]
    requests: int
    errors: int
    throughput_rps: float
    latency_ms: Distribution | None

    def latency(self, key: str) -> float | None:
        return (self.latency_ms or {}).get(key)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight, "parameters": self.parameters,
                "requests": self.requests, "errors": self.errors,
                "throughput_rps": self.throughput_rps, "latency_ms": self.latency_ms}

    @classmethod
    def read(cls, f: _Fields) -> ClassSummary:
        return cls(f("name"), f("weight"), dict(f("parameters")), f("requests"), f("errors"),
                   f("throughput_rps"), f("latency_ms"))


def _label(endpoint: Mapping[str, Any]) -> str:
    return str(endpoint.get("name") or endpoint.get("model") or endpoint.get("url") or "")


@dataclass(frozen=True)
class BenchResult:
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
    merged_rounds: int | None = None  # compare: how many rounds were pooled into this one
    classes: list[ClassSummary] | None = None  # --mix: every class apart

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

    def to_dict(self) -> dict[str, Any]:
        out = {"schema": self.schema, "endpoint": self.endpoint, "load": self.load,
               "environment": self.environment, "cold_start_ms": self.cold_start_ms,
               "cold_start_ok": self.cold_start_ok, "warmup": self.warmup.to_dict(),
               "total_requests_sent": self.total_requests_sent,
               "windows": [w.to_dict() for w in self.windows], "stable": self.stable,
               "stop_reason": self.stop_reason, "client": self.client.to_dict(),
               "summary": self.summary.to_dict()}
        if self.merged_rounds is not None:
            out["merged_rounds"] = self.merged_rounds
        if self.classes is not None:
            out["classes"] = [c.to_dict() for c in self.classes]
        return out

    @classmethod
    def read(cls, f: _Fields) -> BenchResult:
        return cls(dict(f("endpoint")), dict(f("load")), dict(f("environment")),
                   f("cold_start_ms"), f("cold_start_ok"), Warmup.read(f.sub("warmup")),
                   f("total_requests_sent"), [Window.read(w) for w in f.items("windows")],
                   f("stable"), f("stop_reason"), ClientReport.read(f.sub("client")),
                   Summary.read(f.sub("summary")), f.get("merged_rounds"),
                   [ClassSummary.read(c) for c in f.items("classes")]
                   if f.get("classes") is not None else None)


# ------------------------------------------------------------------------ sweep


@dataclass(frozen=True)
class RowTokens:
    """A sweep point's generation figures."""

    output_tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    goodput_rps: float | None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, f: _Fields) -> RowTokens:
        return cls(f("output_tokens_per_s"), f("ttft_p50_ms"), f("ttft_p99_ms"),
                   f("tpot_p50_ms"), f("tpot_p99_ms"), f("goodput_rps"))


@dataclass(frozen=True)
class SweepRow:
    """Load, throughput, latency and error rate of one sweep point."""

    load: float
    throughput_rps: float
    inferences_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    error_percent: float
    requests: int
    tokens: RowTokens | None = None  # written flat into the row
    priced: bool = False  # cost_per_million is written only for a priced sweep
    cost_per_million: float | None = None

    @property
    def work_rate(self) -> float:
        """What the knee is found on: output tokens/s for generations, else requests/s."""
        return float(self.tokens.output_tokens_per_s if self.tokens else self.throughput_rps)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "load": self.load, "throughput_rps": self.throughput_rps,
            "inferences_per_s": self.inferences_per_s, "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms, "error_percent": self.error_percent,
            "requests": self.requests}
        if self.tokens is not None:
            out.update(self.tokens.to_dict())
        if self.priced:
            out["cost_per_million"] = self.cost_per_million
        return out

    @classmethod
    def read(cls, f: _Fields) -> SweepRow:
        return cls(**cls._fields(f))

    @staticmethod
    def _fields(f: _Fields) -> dict[str, Any]:
        return {"load": f("load"), "throughput_rps": f("throughput_rps"),
                "inferences_per_s": f("inferences_per_s"), "p50_ms": f("p50_ms"),
                "p99_ms": f("p99_ms"), "error_percent": f("error_percent"),
                "requests": f("requests"),
                "tokens": RowTokens.read(f) if f.has("output_tokens_per_s") else None,
                "priced": f.has("cost_per_million"),
                "cost_per_million": f.get("cost_per_million")}


@dataclass(frozen=True)
class Knee(SweepRow):
    """The sweep point where more load stopped paying, and the rule that found it."""

    rule: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {**super().to_dict(), "rule": self.rule}

    @classmethod
    def read(cls, f: _Fields) -> Knee:
        return cls(**cls._fields(f), rule=f("rule"))


@dataclass(frozen=True)
class SlaAnswer:
    """The highest load whose p99 and error rate met the SLA (``best`` None: none did)."""

    p99_ms: float
    max_error_percent: float
    best_load: float | None
    best: SweepRow | None

    def to_dict(self) -> dict[str, Any]:
        return {"p99_ms": self.p99_ms, "max_error_percent": self.max_error_percent,
                "best_load": self.best_load, "best": self.best.to_dict() if self.best else None}

    @classmethod
    def read(cls, f: _Fields) -> SlaAnswer:
        return cls(f("p99_ms"), f("max_error_percent"), f("best_load"),
                   _optional(f("best"), SweepRow.read, f"{f.where}.best"))


@dataclass(frozen=True)
class SweepResult:
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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "endpoint": self.endpoint, "mode": self.mode,
                "plan": self.plan, "environment": self.environment,
                "points": [p.to_dict() for p in self.points],
                "rows": [r.to_dict() for r in self.rows],
                "knee": self.knee.to_dict() if self.knee else None,
                "stop_reason": self.stop_reason,
                "sla": self.sla.to_dict() if self.sla else None, "price": self.price,
                "ranking": self.ranking, "score": self.score}

    @classmethod
    def read(cls, f: _Fields) -> SweepResult:
        return cls(dict(f("endpoint")), f("mode"), dict(f("plan")), dict(f("environment")),
                   [BenchResult.read(p) for p in f.items("points")],
                   [SweepRow.read(r) for r in f.items("rows")],
                   _optional(f("knee"), Knee.read, f"{f.where}.knee"), f("stop_reason"),
                   _optional(f("sla"), SlaAnswer.read, f"{f.where}.sla"), f("price"),
                   f("ranking"), dict(f("score")))


# ------------------------------------------------------------------------- soak


@dataclass(frozen=True)
class Verdict:
    """Whether a soak run was stable, why not, and the trends behind it."""

    stable: bool
    reasons: list[dict[str, Any]]  # kind, severity, text, evidence, action
    notes: list[str]
    trends: dict[str, Any]  # p99, throughput, memory: Mann-Kendall figures

    def to_dict(self) -> dict[str, Any]:
        return {"stable": self.stable, "reasons": self.reasons, "notes": self.notes,
                "trends": self.trends}

    @classmethod
    def read(cls, f: _Fields) -> Verdict:
        return cls(f("stable"), list(f("reasons")), list(f("notes")), dict(f("trends")))


@dataclass(frozen=True)
class Memory:
    """The server's resident memory over the run: (seconds, bytes) samples."""

    source: str | None
    samples: list[tuple[float, float]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "samples": [list(s) for s in self.samples]}

    @classmethod
    def read(cls, f: _Fields) -> Memory:
        return cls(f("source"), [(t, rss) for t, rss in f("samples")])


@dataclass(frozen=True)
class SoakResult:
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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "endpoint": self.endpoint, "plan": self.plan,
                "environment": self.environment, "max_rate": self.max_rate,
                "rate_rps": self.rate_rps, "result": self.result.to_dict(),
                "summary": self.summary.to_dict(), "memory": self.memory.to_dict(),
                "verdict": self.verdict.to_dict()}

    @classmethod
    def read(cls, f: _Fields) -> SoakResult:
        return cls(dict(f("endpoint")), dict(f("plan")), dict(f("environment")),
                   dict(f("max_rate")), f("rate_rps"), BenchResult.read(f.sub("result")),
                   SweepRow.read(f.sub("summary")), Memory.read(f.sub("memory")),
                   Verdict.read(f.sub("verdict")))


# ---------------------------------------------------------------------- compare


@dataclass(frozen=True)
class Ratio:
    """A ratio to the baseline and its 95% bootstrap interval (None: not known)."""

    ratio: float | None
    ci95: list[float] | None

    def to_dict(self) -> dict[str, Any]:
        return {"ratio": self.ratio, "ci95": self.ci95}

    @classmethod
    def read(cls, f: _Fields) -> Ratio:
        return cls(f("ratio"), f("ci95"))


@dataclass(frozen=True)
class Ratios:
    """One endpoint's ratios to the baseline: throughput, p50, p99 and, for generations,
    output_tokens_per_s, ttft_p50, ttft_p99, tpot_p50."""

    name: str
    metrics: dict[str, Ratio]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **{k: v.to_dict() for k, v in self.metrics.items()}}

    @classmethod
    def read(cls, f: _Fields) -> Ratios:
        return cls(f("name"), {k: Ratio.read(_Fields(v, f"{f.where}.{k}"))
                               for k, v in f.data.items() if k != "name"})


@dataclass(frozen=True)
class FairnessCheck:
    check: str
    ok: bool | None  # None: not known
    detail: str

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "ok": self.ok, "detail": self.detail}

    @classmethod
    def read(cls, f: _Fields) -> FairnessCheck:
        return cls(f("check"), f("ok"), f("detail"))


@dataclass(frozen=True)
class Fairness:
    """Whether the endpoints were measured alike: inputs, load, client, interleaving."""

    ok: bool
    checks: list[FairnessCheck]

    @property
    def interleaved(self) -> bool:
        return any(c.check == "interleaved" and c.ok for c in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "checks": [c.to_dict() for c in self.checks]}

    @classmethod
    def read(cls, f: _Fields) -> Fairness:
        return cls(f("ok"), [FairnessCheck.read(c) for c in f.items("checks")])


@dataclass(frozen=True)
class CompareEntry:
    """One endpoint of a comparison: its pooled result and each round's summary."""

    name: str
    input_fingerprint: str | None
    profile: dict[str, Any]
    rounds: list[Summary]
    result: BenchResult

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "input_fingerprint": self.input_fingerprint,
                "profile": self.profile, "rounds": [r.to_dict() for r in self.rounds],
                "result": self.result.to_dict()}

    @classmethod
    def read(cls, f: _Fields) -> CompareEntry:
        return cls(f("name"), f("input_fingerprint"), dict(f("profile")),
                   [Summary.read(r) for r in f.items("rounds")],
                   BenchResult.read(f.sub("result")))


@dataclass(frozen=True)
class CompareResult:
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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "baseline": self.baseline, "rounds": self.rounds,
                "environment": self.environment,
                "endpoints": [e.to_dict() for e in self.endpoints],
                "ratios": [r.to_dict() for r in self.ratios],
                "fairness": self.fairness.to_dict(), "ranking": self.ranking,
                "score": self.score}

    @classmethod
    def read(cls, f: _Fields) -> CompareResult:
        return cls(f("baseline"), f("rounds"), dict(f("environment")),
                   [CompareEntry.read(e) for e in f.items("endpoints")],
                   [Ratios.read(r) for r in f.items("ratios")],
                   Fairness.read(f.sub("fairness")), list(f("ranking")), dict(f("score")))


# ------------------------------------------------------------------------ optimize


@dataclass(frozen=True)
class OutputAccuracy:
    """One output of an optimised version against the original, on the same inputs."""

    output: str
    kind: str  # embedding | classifier | tensor: how it was graded
    samples: int
    metrics: dict[str, float]
    drop: float  # what was lost, 0 = nothing; compared with --max-drop

    def to_dict(self) -> dict[str, Any]:
        return {"output": self.output, "kind": self.kind, "samples": self.samples,
                "metrics": dict(self.metrics), "drop": self.drop}

    @classmethod
    def read(cls, f: _Fields) -> OutputAccuracy:
        return cls(f("output"), f("kind"), f("samples"), dict(f("metrics")), f("drop"))


@dataclass(frozen=True)
class VersionReport:
    """One version of the model: how it was made, its speed in process, what it lost."""

    version: int
    precision: str
    method: str
    size_bytes: int
    latency_ms: Distribution  # batch 1, in process
    throughput_by_batch: dict[int, float]  # samples per second at each batch size
    accuracy: list[OutputAccuracy]  # empty for the original
    created: bool  # made by this run (not a version that was already there)
    model: str | None = None  # served under another name (an LLM's precision: a sibling)

    @property
    def best_batch(self) -> int:
        return max(self.throughput_by_batch, key=lambda b: self.throughput_by_batch[b])

    @property
    def best_throughput(self) -> float:
        return self.throughput_by_batch[self.best_batch]

    @property
    def drop(self) -> float:
        return max((a.drop for a in self.accuracy), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {"version": self.version, "precision": self.precision, "method": self.method,
                "size_bytes": self.size_bytes, "latency_ms": self.latency_ms,
                "throughput_by_batch": {str(b): v for b, v in self.throughput_by_batch.items()},
                "best_batch": self.best_batch, "best_throughput": self.best_throughput,
                "accuracy": [a.to_dict() for a in self.accuracy], "drop": self.drop,
                "created": self.created, "model": self.model}

    @classmethod
    def read(cls, f: _Fields) -> VersionReport:
        return cls(f("version"), f("precision"), f("method"), f("size_bytes"),
                   f("latency_ms"), {int(b): v for b, v in f("throughput_by_batch").items()},
                   [OutputAccuracy.read(a) for a in f.items("accuracy")], f("created"),
                   f.get("model"))


@dataclass(frozen=True)
class OptimizeResult:
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
        return {"schema": self.schema, "model": self.model, "repository": self.repository,
                "source_version": self.source_version, "validation": self.validation,
                "calibration": self.calibration, "max_drop": self.max_drop,
                "environment": self.environment,
                "versions": [{**v.to_dict(), "over_max_drop": self.over_max_drop(v),
                              "speedup_batch1": self.speedup(v)[0],
                              "speedup_throughput": self.speedup(v)[1]}
                             for v in self.versions]}

    @classmethod
    def read(cls, f: _Fields) -> OptimizeResult:
        return cls(f("model"), f("repository"), f("source_version"), dict(f("validation")),
                   f("calibration"), f("max_drop"), dict(f("environment")),
                   [VersionReport.read(v) for v in f.items("versions")])


# ------------------------------------------------------------------------ tune


@dataclass(frozen=True)
class BatchPoint:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, f: _Fields) -> BatchPoint:
        return cls(f("batch_size"), f("role"), f("samples_per_s"), f("latency_ms"),
                   f("memory_bytes"), f("fits"), f.get("error"))


@dataclass(frozen=True)
class MemoryEstimate:
    """What memory says about the largest batch: the formula next to the measurement."""

    source: str  # how memory was measured
    weights_bytes: int  # held once the model was loaded, before any batch
    per_sample_bytes: float | None  # slope of memory over batch size (None: not measurable)
    max_memory_bytes: int | None  # --max-memory
    estimated_max_batch: int | None  # (max_memory - weights) / per_sample
    largest_fit: int | None  # the largest batch measured that stayed within max_memory

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, f: _Fields) -> MemoryEstimate:
        return cls(**{field.name: f(field.name) for field in dataclasses.fields(cls)})


@dataclass(frozen=True)
class BatchSizeTune:
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

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "search": self.search, "model": self.model,
                "repository": self.repository, "device": self.device, "plan": self.plan,
                "environment": self.environment, "points": [p.to_dict() for p in self.points],
                "knee": self.knee, "recommended": self.recommended, "why": self.why,
                "stop_reason": self.stop_reason, "memory": self.memory.to_dict()}

    @classmethod
    def read(cls, f: _Fields) -> BatchSizeTune:
        return cls(f("model"), f("repository"), f("device"), dict(f("plan")),
                   dict(f("environment")), [BatchPoint.read(p) for p in f.items("points")],
                   f("knee"), f("recommended"), f("why"), f("stop_reason"),
                   MemoryEstimate.read(f.sub("memory")))


@dataclass(frozen=True)
class Trial:
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def read(cls, f: _Fields) -> Trial:
        return cls(**{field.name: f(field.name) for field in dataclasses.fields(cls)})


@dataclass(frozen=True)
class ServeTune:
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
    schema = TUNE_SCHEMA
    search = "serve"

    def trial(self, name: str | None) -> Trial | None:
        return next((t for t in self.trials if t.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": self.schema, "search": self.search, "endpoint": self.endpoint,
                "model": self.model, "goal": self.goal, "environment": self.environment,
                "trials": [t.to_dict() for t in self.trials], "baseline": self.baseline,
                "winner": self.winner, "stop_reason": self.stop_reason,
                "elapsed_s": self.elapsed_s, "grid_size": self.grid_size,
                "written": self.written}

    @classmethod
    def read(cls, f: _Fields) -> ServeTune:
        return cls(dict(f("endpoint")), f("model"), dict(f("goal")), dict(f("environment")),
                   [Trial.read(t) for t in f.items("trials")], f("baseline"), f("winner"),
                   f("stop_reason"), f("elapsed_s"), f("grid_size"), f("written"))


class _TuneDocuments:
    """Reads a ``tradeoff.tune/1`` document as the search it records."""

    @staticmethod
    def read(f: _Fields) -> BatchSizeTune | ServeTune:
        search = f("search")
        kinds: dict[str, Any] = {"batch-size": BatchSizeTune, "serve": ServeTune}
        if search not in kinds:
            raise ResultFormatError(f"{f.where}.search: {search!r} is not a tune search this "
                                    f"version reads ({', '.join(kinds)})")
        document: BatchSizeTune | ServeTune = kinds[search].read(f)
        return document


# ------------------------------------------------------------ reader and writer

ResultDocument = Union[BenchResult, SweepResult, SoakResult, CompareResult, OptimizeResult,
                       BatchSizeTune, ServeTune]
READERS: dict[str, Any] = {BENCH_SCHEMA: BenchResult, SWEEP_SCHEMA: SweepResult,
                           SOAK_SCHEMA: SoakResult, COMPARE_SCHEMA: CompareResult,
                           OPTIMIZE_SCHEMA: OptimizeResult, TUNE_SCHEMA: _TuneDocuments}
_Document = TypeVar("_Document", BenchResult, SweepResult, SoakResult, CompareResult,
                    OptimizeResult, BatchSizeTune, ServeTune)


def load_result(source: str | Path | Mapping[str, Any] | ResultDocument,
                name: str | None = None) -> ResultDocument:
    """A result document from a JSON file, its parsed dict, or a document (returned as is).

    Dispatches on ``schema``; a file that is not JSON, an unknown schema or a missing
    field raises :class:`ResultFormatError` naming the file (or ``name``) and the field.
    """
    if isinstance(source, (BenchResult, SweepResult, SoakResult, CompareResult,
                           OptimizeResult, BatchSizeTune, ServeTune)):
        return source
    if isinstance(source, (str, Path)):
        where = name or str(source)
        try:
            data = json.loads(Path(source).read_text())
        except (OSError, ValueError) as exc:
            raise ResultFormatError(f"{where}: not a readable JSON result ({exc})") from None
    else:
        data, where = source, name or "result"
    f = _Fields(data, where)
    schema = f.get("schema")
    reader = READERS.get(str(schema))
    if reader is None:
        known = ", ".join(READERS)
        raise ResultFormatError(f"{where}: not a tradeoff result this version reads (schema "
                                f"{schema!r}; known: {known})")
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
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document.to_dict(), indent=2))
