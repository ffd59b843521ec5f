"""Builds the versioned result of a benchmark run (:class:`tradeoff.results.BenchResult`).

Every figure comes from the raw records: percentiles are exact (numpy over every sample),
throughput counts the successful requests that ended inside the measurement, and latency
counts from each request's scheduled send time. See docs/bench.md for each definition.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import OK, OUTCOME_NAMES, SERVER_PARTS, Records
from tradeoff.bench.runner import CONNECTION_WAIT, RunOutcome
from tradeoff.results import (
    BenchResult,
    ClassSummary,
    ClientReport,
    Generation,
    InputTokens,
    OutputLength,
    OutputTokens,
    ServerCounts,
    Summary,
    Warmup,
    Window,
    environment,
)
from tradeoff.stats.distribution import distribution, quantiles

__all__ = [
    "CLIENT_LAG_SHARE",
    "CPU_LIMIT_PERCENT",
    "LOOP_LAG_LIMIT_MS",
    "MAX_TIMELINE_BINS",
    "SEND_LAG_LIMIT_MS",
    "build_result",
    "client_check",
    "client_lags_ms",
    "endpoint_p50_ms",
    "meets_slo",
    "server_counts",
    "stats_extension_means",
    "timeline",
    "waited_for_connections",
]

SEND_LAG_LIMIT_MS = 1.0      # above the loop's lag at rest
LOOP_LAG_LIMIT_MS = 5.0
CPU_LIMIT_PERCENT = 90.0
# the client's lag p99 over the endpoint's own p50 time from which it shows in the figures
CLIENT_LAG_SHARE = 0.1


def endpoint_p50_ms(summary: Summary) -> float | None:
    """The shortest time a run measures of the endpoint, at p50: the gap between tokens of
    a generation (else its first token), or a request's latency."""
    generation = summary.generation
    if generation is not None:
        for figures in (generation.itl_ms, generation.ttft_ms):
            if figures and figures.get("p50"):
                return float(figures["p50"])
    return summary.latency("p50") or None


def waited_for_connections(notes: list[str]) -> bool:
    """Open-loop requests waited for a free connection: the endpoint held them all."""
    return any(CONNECTION_WAIT in note for note in notes)


def client_lags_ms(send_lag: dict[str, float] | None, loop_lag: dict[str, float] | None,
                   notes: list[str], at_rest_ms: float = 0.0) -> tuple[float, float]:
    """The client's send and event-loop lag p99 above ``at_rest_ms``; the send lag counts
    nothing when requests waited for a free connection (the endpoint's doing)."""
    send = max(send_lag["p99"] - at_rest_ms, 0.0) \
        if send_lag and not waited_for_connections(notes) else 0.0
    loop = max(loop_lag["p99"] - at_rest_ms, 0.0) if loop_lag else 0.0
    return send, loop


def client_check(outcome: RunOutcome, summary: Summary, send_lag: dict[str, float] | None,
                 loop_lag: dict[str, float] | None) -> tuple[bool, list[str]]:
    """Whether the client was the bottleneck, and the reasons to look at. Lags count above
    what the loop shows at rest on this machine (measured before the load). The run is
    client-bound when the client was CPU-busy, or when its lag is a material share
    (CLIENT_LAG_SHARE) of what it measured: a late reader in front of an endpoint that
    takes 1 s changes nothing; in front of a 1 ms one it inflates every figure. Waiting
    for a free connection is the endpoint's doing, not the client's."""
    idle = outcome.idle_lag_ms
    send, loop = client_lags_ms(send_lag, loop_lag, outcome.notes, idle)
    reasons = []
    at_rest = f" ({idle:.1f} ms at rest)"
    if send > SEND_LAG_LIMIT_MS:
        reasons.append(f"send lag p99 {send + idle:.2f} ms{at_rest} > {SEND_LAG_LIMIT_MS} ms")
    if loop > LOOP_LAG_LIMIT_MS:
        reasons.append(f"client event-loop lag p99 {loop + idle:.1f} ms{at_rest} > "
                       f"{LOOP_LAG_LIMIT_MS:g} ms")
    busy = outcome.client_cpu_percent > CPU_LIMIT_PERCENT
    if busy:
        reasons.append(f"client CPU {outcome.client_cpu_percent:.0f}% > "
                       f"{CPU_LIMIT_PERCENT:.0f}%")
    own = endpoint_p50_ms(summary)
    lag = max(send, loop)
    material = bool(reasons) and (own is None or lag >= CLIENT_LAG_SHARE * own)
    return busy or material, reasons


def _server_breakdown(measured: Records, ok: np.ndarray, outcome: RunOutcome
                      ) -> dict[str, Any] | None:
    """Per request from Server-Timing when every answer had it; else the statistics
    extension's counters before and after the measurement, as means."""
    latency = measured.latency_ms[ok]
    server = measured.server_ms[ok]
    if latency.size and np.isfinite(server).all():
        total = server.sum(axis=1)
        per_request = {p: distribution(server[:, i]) for i, p in enumerate(SERVER_PARTS)}
        return {"source": "server-timing", **per_request,
                "server_total": distribution(total), "overhead": distribution(latency - total)}
    before, after = outcome.server_before, outcome.server_after
    if not before or not after:
        return None
    means = stats_extension_means(before, after)
    if means is None:
        return None
    parts, count, executions = means
    total = sum(v["mean"] for v in parts.values())
    return {"source": "statistics extension", **parts, "server_total": {"mean": total},
            "overhead": {"mean": float(latency.mean()) - total if latency.size else None},
            "server_requests": count, "server_executions": executions}


def stats_extension_means(before: dict[str, Any], after: dict[str, Any]
                          ) -> tuple[dict[str, dict[str, float]], int, int] | None:
    """Mean ms per request of each part between two statistics-extension snapshots."""
    try:
        stats_before, stats_after = before["inference_stats"], after["inference_stats"]
        # int(): the gRPC statistics arrive as JSON, where uint64 values are strings
        count = int(stats_after["success"]["count"]) - int(stats_before["success"]["count"])
        if count <= 0:
            return None
        parts = {p: {"mean": (int(stats_after[p]["ns"]) - int(stats_before[p]["ns"]))
                     / count / 1e6} for p in SERVER_PARTS}
        executions = int(after["execution_count"]) - int(before["execution_count"])
    except (KeyError, TypeError):
        return None
    return parts, count, executions


def _server_counts(outcome: RunOutcome) -> ServerCounts | None:
    """Requests and model executions the server counted over the measurement (statistics
    extension); fewer executions than requests means requests shared batches."""
    return server_counts(outcome.server_before, outcome.server_after)


def server_counts(before: dict[str, Any] | None, after: dict[str, Any] | None
                  ) -> ServerCounts | None:
    """Requests, executions and cache hits and misses between two statistics-extension
    snapshots of one model; None when either is missing or counted nothing."""
    if not before or not after:
        return None
    means = stats_extension_means(before, after)
    if means is None:
        return None
    return ServerCounts(means[1], means[2], *_cache_counts(before, after))


def _cache_counts(before: dict[str, Any], after: dict[str, Any]
                  ) -> tuple[int | None, int | None]:
    """Response cache hits and misses between two statistics snapshots (Triton's
    cache_hit and cache_miss); (None, None) when the server looked nothing up."""
    try:
        hits, misses = (int(after["inference_stats"][k]["count"])
                        - int(before["inference_stats"][k]["count"])
                        for k in ("cache_hit", "cache_miss"))
    except (KeyError, TypeError, ValueError):
        return None, None
    return (hits, misses) if hits + misses > 0 else (None, None)


MAX_TIMELINE_BINS = 300


def timeline(records: Records, start_ns: int, end_ns: int) -> dict[str, Any] | None:
    """The run over time, from its requests: completions per second and the p50 and p99
    latency of the requests that ended in each bin (one second, or longer so a run has at
    most MAX_TIMELINE_BINS). Bins without an answer have None latencies."""
    seconds = (end_ns - start_ns) / 1e9
    ok = (records.outcome == OK) & (records.end_ns >= start_ns) & (records.end_ns <= end_ns)
    if seconds <= 0 or not ok.any():
        return None
    bin_s = max(1.0, float(np.ceil(seconds / MAX_TIMELINE_BINS)))
    bins = int(np.ceil(seconds / bin_s))
    index = np.minimum(((records.end_ns[ok] - start_ns) / 1e9 // bin_s).astype(np.int64),
                       bins - 1)
    latency = records.latency_ms[ok]
    order = np.argsort(index, kind="stable")
    index, latency = index[order], latency[order]
    edges = np.searchsorted(index, np.arange(bins + 1))
    p50: list[float | None] = []
    p99: list[float | None] = []
    for lo, hi in itertools.pairwise(edges):  # one per bin, not per request
        part = latency[lo:hi]
        p50.append(round(float(np.percentile(part, 50)), 4) if part.size else None)
        p99.append(round(float(np.percentile(part, 99)), 4) if part.size else None)
    counts = np.diff(edges)
    last = seconds - (bins - 1) * bin_s  # the last bin may be short
    widths = np.full(bins, bin_s)
    widths[-1] = max(last, 1e-9)
    return {"bin_s": bin_s,
            "throughput_rps": [round(float(c), 3) for c in counts / widths],
            "p50_ms": p50, "p99_ms": p99}


def _windows(outcome: RunOutcome) -> list[Window]:
    """Windows, each with the server's means over it when snapshots bracket it."""
    at = dict(outcome.server_snapshots)
    out = []
    for window in outcome.windows:
        before, after = at.get(window.start_ns), at.get(window.end_ns)
        means = stats_extension_means(before, after) if before and after else None
        out.append(Window(window.index, (window.end_ns - window.start_ns) / 1e9,
                          window.completed, window.errors, window.throughput_rps,
                          window.p50_ms, window.p99_ms,
                          {p: v["mean"] for p, v in means[0].items()} if means else None,
                          means[2] if means else None))
    return out


def meets_slo(records: Records, slo: dict[str, float]) -> np.ndarray:
    """Which requests meet every bound of ``slo`` (ttft_ms, tpot_ms, e2e_ms)."""
    meets = np.ones(len(records), bool)
    with np.errstate(invalid="ignore"):
        if "ttft_ms" in slo:
            meets &= records.ttft_ms <= slo["ttft_ms"]
        if "tpot_ms" in slo:  # a one-token answer has no TPOT: nothing to miss
            meets &= ~(records.tpot_ms > slo["tpot_ms"])
        if "e2e_ms" in slo:
            meets &= records.latency_ms <= slo["e2e_ms"]
    return meets


def _generation_summary(adapter: Adapter, measured: Records, ok: np.ndarray,
                        ended: Records, outcome: RunOutcome, seconds: float
                        ) -> Generation:
    """TTFT, ITL, TPOT, token counts, tokens/s and goodput of streamed generations
    (``ended``: the successes that ended inside the measurement). Tokens/s counts the
    tokens generated inside the measurement: the text events stamped inside it, of every
    successful answer, each worth its answer's tokens / events."""
    records = outcome.records
    times, weights = records.text_events(records.outcome == OK)
    inside = (times >= outcome.measure_start_ns) & (times <= outcome.measure_end_ns)
    per_s = (lambda n: float(n / seconds)) if seconds > 0 else (lambda n: 0.0)
    counted = ok & (measured.out_tokens >= 0)
    inputs = measured.in_tokens[ok & (measured.in_tokens >= 0)]
    outputs = measured.out_tokens[counted]
    asked = ok & (measured.asked_tokens >= 0)
    got, wanted = measured.out_tokens[asked], measured.asked_tokens[asked]
    ignore_eos = bool(getattr(adapter, "ignore_eos", False))
    shorter, longer = int((got < wanted).sum()), int((got > wanted).sum())
    slo = getattr(adapter, "slo", None) or {}
    from_usage = int(measured.usage_tokens[counted].sum())
    return Generation(
        ttft_ms=distribution(measured.ttft_ms[ok]),
        itl_ms=distribution(measured.gaps_of(ok) / 1e6),
        tpot_ms=distribution(measured.tpot_ms[ok]),
        output_tokens_per_s=per_s(float(weights[inside].sum())),
        input_tokens=InputTokens(int(inputs.sum()), distribution(inputs.astype(np.float64)))
        if inputs.size else None,
        output_tokens=OutputTokens(int(outputs.sum()), distribution(outputs.astype(np.float64)),
                                   from_usage, int(counted.sum()) - from_usage),
        # with ignore_eos every answer should be exactly as long as asked; without it,
        # stopping early at EOS is allowed
        output_length=OutputLength(int(asked.sum()), int((got == wanted).sum()), shorter,
                                   longer, ignore_eos,
                                   longer == 0 and (shorter == 0 or not ignore_eos)),
        slo=slo or None,
        goodput_rps=per_s(int(meets_slo(ended, slo).sum())) if slo else None,
    )


def build_result(adapter: Adapter, spec: LoadSpec, outcome: RunOutcome,
                 workers: int = 1) -> BenchResult:
    """The result of one run, every figure from its raw records."""
    records = outcome.records
    measured_mask = records.scheduled_ns >= outcome.measure_start_ns
    measured = records.select(measured_mask)
    warmup = records.select(~measured_mask)
    ok = measured.outcome == OK
    seconds = (outcome.measure_end_ns - outcome.measure_start_ns) / 1e9
    # completions inside the measurement, whenever they were sent: a request sent during
    # warmup that ends inside counts, one sent inside that ends after does not, so
    # requests as long as the measurement (LLM answers) are not undercounted
    ended = (records.outcome == OK) & (records.end_ns >= outcome.measure_start_ns) & \
        (records.end_ns <= outcome.measure_end_ns)
    throughput = float(ended.sum() / seconds) if seconds > 0 else 0.0
    rows = float(measured.rows[ok].mean()) if ok.any() else float(adapter.rows_per_request)
    errors: dict[str, int] = {}
    for code, name in OUTCOME_NAMES.items():
        if code == OK:
            continue
        count = int((measured.outcome == code).sum())
        if count:
            errors[name] = count
    for status in np.unique(measured.status[measured.outcome != OK]):
        if status and not 200 <= status < 300:  # a stream can fail after a 200
            errors[f"http_{int(status)}"] = int((measured.status == status).sum())

    send_lag = distribution(measured.send_lag_ms) if spec.mode != "closed" else None
    loop_lag = distribution(outcome.loop_lag_ms)
    asked = spec.rate if spec.rate is not None else (
        len(spec.intervals) / (spec.intervals[-1] or 1) if spec.intervals else None)
    achieved = float(len(measured) / seconds) if seconds > 0 else 0.0

    cold_ms = outcome.cold_start.latency_ms
    summary = Summary(
        requests=len(measured),
        successes=int(ok.sum()),
        errors=int((~ok).sum()),
        errors_by_class=errors,
        throughput_rps=throughput,
        inferences_per_s=throughput * rows,
        latency_ms=distribution(measured.latency_ms[ok]),
        latency_quantiles_ms=quantiles(measured.latency_ms[ok]),
        timeline=timeline(records, outcome.measure_start_ns, outcome.measure_end_ns),
        server_ms=_server_breakdown(measured, ok, outcome),
        server_counts=_server_counts(outcome),
        bytes_sent=int(measured.bytes_sent.sum()),
        bytes_received=int(measured.bytes_received.sum()),
        asked_rate_rps=asked,
        achieved_rate_rps=achieved if spec.mode != "closed" else None,
        duration_s=seconds,
        generation=_generation_summary(adapter, measured, ok, records.select(ended), outcome,
                                       seconds) if records.generated else None,
    )
    bound, reasons = client_check(outcome, summary, send_lag, loop_lag)
    return BenchResult(
        endpoint={**adapter.describe(),
                  "input_mix": adapter.mix.describe(adapter.input_count)},
        load=spec.to_dict(),
        environment=environment(),
        cold_start_ms=float(cold_ms[0]) if cold_ms.size else None,
        cold_start_ok=bool(outcome.cold_start.outcome[0] == OK) if cold_ms.size else None,
        warmup=Warmup(len(warmup), distribution(warmup.latency_ms[warmup.outcome == OK])),
        total_requests_sent=len(records) + len(outcome.cold_start),
        windows=_windows(outcome),
        stable=outcome.stable,
        stop_reason=outcome.stop_reason,
        client=ClientReport(workers, outcome.client_cpu_percent, send_lag, loop_lag,
                            bound, reasons, outcome.notes, outcome.hosts,
                            outcome.start_skew_ms),
        summary=summary,
        classes=_class_summaries(adapter, records, measured, ok, ended, seconds),
    )


def _class_summaries(adapter: Adapter, records: Records, measured: Records, ok: np.ndarray,
                     ended: np.ndarray, seconds: float) -> list[ClassSummary] | None:
    """Each ``--mix`` class apart: its requests are those whose prepared request lies in
    its block (mix.py lays the requests out class by class)."""
    classes = adapter.mix.classes
    if not classes:
        return None
    per = adapter.mix.inputs_of(adapter.input_count)
    measured_class = measured.request // per
    every_class = records.request // per
    out = []
    for index, request_class in enumerate(classes):
        mine = measured_class == index
        done = int((ended & (every_class == index)).sum())
        out.append(ClassSummary(request_class.name, request_class.weight,
                                request_class.parameters, int(mine.sum()),
                                int((mine & ~ok).sum()),
                                done / seconds if seconds > 0 else 0.0,
                                distribution(measured.latency_ms[mine & ok]),
                                *((distribution(measured.ttft_ms[mine & ok]),
                                   distribution(measured.tpot_ms[mine & ok]))
                                  if adapter.streaming else ())))
    return out
