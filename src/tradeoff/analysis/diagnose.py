"""``tradeoff diagnose``: documented rules that read results and say what they show.

Each rule looks at one kind of evidence and returns findings with a severity, the numbers
behind them and what to do. The thresholds are module constants and docs/diagnose.md
states every rule. Results may be bench (``tradeoff.bench/1``), sweep, soak or compare
documents; a sweep is judged on its curve and on the point at its knee (or its best point).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from tradeoff.bench.result import client_lags_ms, endpoint_p50_ms, waited_for_connections
from tradeoff.bench.sweep import point_summary
from tradeoff.results import (
    BenchResult,
    CompareResult,
    OptimizeResult,
    PlanResult,
    Replayed,
    ResultDocument,
    SoakResult,
    SweepResult,
)
from tradeoff.stats.knee import find_knee

__all__ = [
    "BATCHED_RATIO",
    "BENCH_RULES",
    "CACHE_HIT_RATIO",
    "COLD_START_FACTOR",
    "DECODE_SLOWDOWN",
    "ERROR_PERCENT",
    "FEW_IN_FLIGHT",
    "FIRST_TOKEN_SHARE",
    "GOODPUT_SHARE",
    "LINEAR_LATENCY",
    "LONG_TAIL_CRITICAL",
    "LONG_TAIL_WARN",
    "OVERHEAD_SHARE",
    "PREDICTION_OFF",
    "SATURATION_DROP",
    "SEVERITY_ORDER",
    "SPIKE_FACTOR",
    "Finding",
    "cached_answers",
    "client_bound",
    "cold_start",
    "decode_slowdown",
    "diagnose",
    "diagnose_bench",
    "diagnose_plan",
    "diagnose_sweep",
    "errors",
    "first_token",
    "long_tail",
    "no_batching",
    "output_length",
    "saturation",
    "server_bound",
    "slo_misses",
    "unstable",
]

LONG_TAIL_WARN = 3.0          # p99 / p50
LONG_TAIL_CRITICAL = 10.0
SPIKE_FACTOR = 2.0            # a window whose p99 is this far above the median window p99
COLD_START_FACTOR = 10.0      # first request vs steady p50
OVERHEAD_SHARE = 0.5          # client latency not spent in the server
FEW_IN_FLIGHT = 4             # no batching: the knee comes at or below this concurrency ...
LINEAR_LATENCY = 0.7          # ... and past it p50 grows at least 0.7x as fast as the load
BATCHED_RATIO = 0.95          # executions / requests at or above this: nothing shared a batch
CACHE_HIT_RATIO = 0.5         # server cache hits over lookups: the figures measure the cache
SATURATION_DROP = 0.10        # throughput this far below the sweep's best
ERROR_PERCENT = 1.0
FIRST_TOKEN_SHARE = 0.5       # generations: TTFT p50 / end-to-end p50 at or above this
GOODPUT_SHARE = 0.9           # goodput below this share of throughput: SLO misses
DECODE_SLOWDOWN = 2.0         # TPOT p50 at the sweep's highest load / at its lowest

SEVERITY_ORDER = {"critical": 0, "warning": 1, "info": 2}


@dataclass
class Finding:
    """One diagnosis: what, how bad, the numbers, what to do."""

    rule: str
    severity: str  # critical | warning | info
    title: str
    evidence: dict[str, Any]
    action: str
    subject: str = ""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _latency(result: BenchResult) -> dict[str, float]:
    return result.summary.latency_ms or {}


# ----------------------------------------------------------------- one bench result

def long_tail(result: BenchResult) -> list[Finding]:
    if result.summary.generation:
        return []  # generations: output lengths spread end-to-end latency; see first_token
    lat = _latency(result)
    out = []
    if lat.get("p50") and lat.get("p99"):
        ratio = lat["p99"] / lat["p50"]
        if ratio >= LONG_TAIL_WARN:
            out.append(Finding(
                "long_tail", "critical" if ratio >= LONG_TAIL_CRITICAL else "warning",
                f"long tail: p99 is {ratio:.1f}x p50",
                {"p50_ms": lat["p50"], "p99_ms": lat["p99"], "p999_ms": lat.get("p999"),
                 "ratio": ratio},
                "look for queueing behind large batches (lower max_queue_delay or "
                "preferred_batch_size), GC or CPU contention on the server, and retries; "
                "compare p99 at lower load"))
    windows = [w for w in result.windows if w.p99_ms == w.p99_ms]
    if len(windows) >= 4:
        p99s = np.array([w.p99_ms for w in windows], dtype=float)
        median = float(np.median(p99s))
        # positions, not window indexes: merged rounds repeat the indexes
        spikes = [i for i, v in enumerate(p99s) if v > SPIKE_FACTOR * median]
        if len(spikes) >= 2:
            gaps = np.diff(spikes)
            periodic = len(spikes) >= 3 and bool(np.all(gaps == gaps[0]))
            out.append(Finding(
                "latency_spikes", "warning",
                f"p99 spikes in {len(spikes)} of {len(windows)} windows"
                + (f", every {gaps[0]} windows" if periodic else ""),
                {"windows": spikes, "median_window_p99_ms": median,
                 "max_window_p99_ms": float(p99s.max()), "periodic": periodic},
                "periodic spikes point at something scheduled on the server (GC, log "
                "rotation, checkpointing, autoscaling); line the windows up with server logs"))
    return out


def server_bound(result: BenchResult) -> list[Finding]:
    """Queue-bound vs compute-bound, and overhead-bound, from the server breakdown."""
    server = result.summary.server_ms
    lat = _latency(result)
    if not server or not lat.get("mean"):
        return []
    mean = {part: (server.get(part) or {}).get("mean") for part in
            ("queue", "compute_input", "compute_infer", "compute_output", "server_total",
             "overhead")}
    if mean["queue"] is None or mean["compute_infer"] is None:
        return []
    compute = sum(mean[p] or 0.0 for p in ("compute_input", "compute_infer", "compute_output"))
    total = mean["server_total"] or (mean["queue"] + compute)
    out = []
    evidence = {"latency_mean_ms": lat["mean"], "queue_ms": mean["queue"],
                "compute_ms": compute, "server_total_ms": total}
    counts = result.summary.server_counts
    # answers mostly from the cache: neither the queue nor compute was what was measured
    cached = counts is not None and (counts.cache_hit_ratio or 0.0) >= 0.5
    measured = not cached and mean["queue"] + compute > 0
    if measured and mean["queue"] > compute:
        out.append(Finding(
            "queue_bound", "warning",
            f"queue-bound: requests wait {mean['queue']:.2f} ms in the queue for "
            f"{compute:.2f} ms of compute", evidence,
            "add model instances (instance_group count) or replicas, or shorten "
            "max_queue_delay_microseconds; the model itself is not the bottleneck"))
    elif measured:
        out.append(Finding(
            "compute_bound", "info",
            f"compute-bound: {compute:.2f} ms of compute vs {mean['queue']:.2f} ms queued",
            evidence,
            "faster hardware, a smaller or quantized model, or larger batches "
            "(dynamic batching) buy throughput here"))
    overhead = lat["mean"] - total
    if overhead > OVERHEAD_SHARE * lat["mean"]:
        out.append(Finding(
            "overhead_bound", "warning",
            f"overhead-bound: {overhead:.2f} of {lat['mean']:.2f} ms per request is spent "
            "outside the server's queue and compute",
            {**evidence, "overhead_ms": overhead, "share": overhead / lat["mean"]},
            "the time goes to the network, HTTP and (de)serialization: use binary tensors "
            "or gRPC, larger requests (--batch-size), keep-alive, or a client closer to "
            "the server"))
    return out


def client_bound(result: BenchResult) -> list[Finding]:
    """The runner's self-check (bench/result.py ``client_check``): critical when the
    client was busy or its lag, above what the loop shows at rest, is a material share of
    what it measured; the lag alone, small next to the endpoint's own time, is noted."""
    client = result.client
    if not client.reasons:
        return []
    waited = waited_for_connections(client.notes)
    lag = max(client_lags_ms(client.send_lag_ms, client.loop_lag_ms, client.notes))
    own = endpoint_p50_ms(result.summary)
    evidence = {"reasons": client.reasons, "cpu_percent": client.cpu_percent,
                "client_lag_p99_ms": lag, "endpoint_p50_ms": own,
                "waited_for_connections": waited}
    if client.client_bound:
        return [Finding("client_bound", "critical", "client-bound: the load generator could "
                        "not keep up, so the figures understate the endpoint", evidence,
                        "rerun with --workers N, on a less loaded or separate client "
                        "machine")]
    against = f"the endpoint's p50 of {own:,.1f} ms" if own is not None else \
        "no answer (none succeeded)"
    return [Finding("client_lag", "info",
                    f"the client lagged (p99 {lag:.1f} ms), little next to {against}: "
                    "the endpoint's slowness, not the client's, sets these figures"
                    + ("; requests waited for a free connection" if waited else ""),
                    evidence,
                    "nothing to do on the client; "
                    + ("a higher --max-connections, or less load, if the endpoint is to "
                       "be measured unsaturated" if waited else
                       "a separate client machine would remove even this"))]


def cold_start(result: BenchResult) -> list[Finding]:
    cold, p50 = result.cold_start_ms, _latency(result).get("p50")
    if not cold or not p50 or cold < COLD_START_FACTOR * p50:
        return []
    return [Finding("cold_start", "warning",
                    f"cold start: the first request took {cold:.1f} ms, {cold / p50:.0f}x "
                    "the steady p50", {"cold_start_ms": cold, "p50_ms": p50},
                    "warm the model up at load time (model_warmup), keep instances loaded, "
                    "and exclude a warmup from measurements (--warmup)")]


def cached_answers(result: BenchResult) -> list[Finding]:
    """Most answers came from the server's response cache: the figures measure the cache,
    and how often the inputs repeat decides them."""
    counts = result.summary.server_counts
    ratio = counts.cache_hit_ratio if counts is not None else None
    if ratio is None or ratio < CACHE_HIT_RATIO:
        return []
    mix = result.endpoint.get("input_mix") or {}
    repeated = mix.get("draw") == "round-robin"
    assert counts is not None
    evidence = {"cache_hit_ratio": ratio, "cache_hits": counts.cache_hits,
                "cache_misses": counts.cache_misses, "input_mix": mix or None}
    action = ("send the repetition real traffic has (--distinct-inputs N --zipf S), or "
              "measure the model itself with the request parameter \"cache\": false")
    return [Finding("cached_answers", "warning" if repeated else "info",
                    f"{ratio:.0%} of the answers came from the server's response cache"
                    + (f" (the same {mix.get('distinct_inputs')} inputs sent round-robin)"
                       if repeated else ""), evidence, action)]


def unstable(result: BenchResult) -> list[Finding]:
    if result.stable is not False:
        return []
    return [Finding("unstable_measurement", "warning",
                    "unstable measurement: the last windows disagree",
                    {"stop_reason": result.stop_reason,
                     "windows": [{"throughput_rps": w.throughput_rps, "p99_ms": w.p99_ms}
                                 for w in result.windows[-3:]]},
                    "measure longer (--window, --max-windows), add --warmup, and check for "
                    "other load on the client and server machines")]


def errors(result: BenchResult) -> list[Finding]:
    s = result.summary
    if not s.requests:
        return []
    percent = s.error_percent
    if percent <= ERROR_PERCENT:
        return []
    return [Finding("errors", "critical", f"{percent:.1f}% of requests failed",
                    {"errors_by_class": s.errors_by_class, "requests": s.requests},
                    "503/429 mean the server refused load (queue full): lower the load or "
                    "add capacity; timeouts and resets point at overload or crashes")]


def first_token(result: BenchResult) -> list[Finding]:
    """Generations: most of the time passes before the first token, or TTFT has a long
    tail: requests wait to be admitted."""
    generation = result.summary.generation
    if generation is None:
        return []
    ttft, lat = generation.ttft_ms or {}, _latency(result)
    if not ttft.get("p50") or not lat.get("p50"):
        return []
    out = []
    share = ttft["p50"] / lat["p50"]
    evidence = {"ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
                "e2e_p50_ms": lat["p50"], "tpot_p50_ms": (generation.tpot_ms or {}).get("p50"),
                "share": share}
    if share >= FIRST_TOKEN_SHARE:
        out.append(Finding(
            "waiting_for_first_token", "warning",
            f"{share:.0%} of a request's time (p50) passes before its first token",
            evidence,
            "requests wait to be admitted: a batch that runs until all its sequences end "
            "(static batching) or a full running batch holds them; continuous batching admits "
            "at every step; raise max_num_seqs or KV cache blocks if the batch is full, "
            "shorten prompts if prefill is the cost"))
    elif ttft["p99"] / ttft["p50"] >= LONG_TAIL_WARN:
        out.append(Finding(
            "first_token_tail", "warning",
            f"TTFT tail: p99 is {ttft['p99'] / ttft['p50']:.1f}x p50", evidence,
            "some requests queue before admission: look at requests waiting and KV cache "
            "usage on the server; lower the load or raise max_num_seqs"))
    return out


def output_length(result: BenchResult) -> list[Finding]:
    """Generations: answers not as long as asked, or counted without the server's usage."""
    generation = result.summary.generation
    if generation is None:
        return []
    length, tokens = generation.output_length, generation.output_tokens
    out = []
    if not length.honoured:
        out.append(Finding(
            "output_length_not_honoured", "warning",
            f"output length not honoured: {length.shorter} of {length.asked} answers "
            f"shorter and {length.longer} longer than the max_tokens asked"
            + (" despite ignore_eos" if length.ignore_eos else ""), length.to_dict(),
            "tokens/s and latency compare unequal work between endpoints; use --ignore-eos "
            "where the server supports it, or compare per output token (TPOT)"))
    if tokens.counted_events:
        out.append(Finding(
            "tokens_counted_from_events", "info",
            f"{tokens.counted_events} answers had no usage: their tokens were counted as "
            "text events", tokens.to_dict(),
            "a server that sends several tokens per event is undercounted; ask for usage "
            "(stream_options.include_usage) if the server supports it"))
    return out


def slo_misses(result: BenchResult) -> list[Finding]:
    s, generation = result.summary, result.summary.generation
    if generation is None or generation.goodput_rps is None or not s.throughput_rps:
        return []
    share = generation.goodput_rps / s.throughput_rps
    if share >= GOODPUT_SHARE:
        return []
    bounds = generation.slo or {}
    evidence = {"goodput_rps": generation.goodput_rps, "throughput_rps": s.throughput_rps,
                "slo": bounds, "ttft_p99_ms": (generation.ttft_ms or {}).get("p99"),
                "tpot_p99_ms": (generation.tpot_ms or {}).get("p99")}
    return [Finding("slo_misses", "critical" if share < 0.5 else "warning",
                    f"{1 - share:.0%} of answered requests miss the SLO "
                    f"({', '.join(f'{k} <= {v:g}' for k, v in bounds.items())})", evidence,
                    "lower the load (a sweep finds where goodput peaks); a TTFT miss is "
                    "admission or prefill, a TPOT miss is a batch too large for the decode "
                    "step")]


BENCH_RULES = (errors, client_bound, unstable, cached_answers, long_tail, first_token,
               output_length, slo_misses, server_bound, cold_start)


def diagnose_bench(result: BenchResult) -> list[Finding]:
    out = [f for rule in BENCH_RULES for f in rule(result)]
    for finding in out:
        finding.subject = finding.subject or result.label
    return out


# ------------------------------------------------------------------------ a sweep

def no_batching(sweep: SweepResult) -> list[Finding]:
    """Throughput stops growing after a handful of requests in flight while latency grows
    with the concurrency; where the server counts executions, every request ran alone."""
    if sweep.mode != "concurrency":
        return []
    points = [p for p in sweep.points if p.summary.successes]
    rows = [point_summary(p) for p in points]
    if len(rows) < 3 or rows[-1].load < 4 * rows[0].load:
        return []
    knee = find_knee([r.load for r in rows], [r.throughput_rps for r in rows])
    ratios = [c.executions / c.computed for p in points[1:]
              if (c := p.summary.server_counts) and c.computed > 0]
    never_batched = bool(ratios) and min(ratios) >= BATCHED_RATIO
    if ratios and not never_batched:
        return []  # requests did share executions: a flat curve is saturation, not this
    evidence: dict[str, Any] = {
        "loads": [r.load for r in rows], "throughput_rps": [r.throughput_rps for r in rows],
        "p50_ms": [r.p50_ms for r in rows], "executions_per_request": ratios or None,
        "knee_load": rows[knee].load if knee is not None else None}
    action = ("enable dynamic batching (dynamic_batching { max_queue_delay_microseconds ... } "
              "with max_batch_size > 0) or add instances; requests are served one at a time")
    if knee is None:
        if never_batched:
            return [Finding("no_batching", "info",
                            "requests never shared an execution, yet throughput kept growing "
                            "(several instances?)", evidence,
                            "dynamic batching could still raise throughput per instance")]
        return []
    knee_row, last = rows[knee], rows[-1]
    load_growth = last.load / knee_row.load
    latency_growth = (last.p50_ms or 0) / (knee_row.p50_ms or 1)
    evidence.update(load_growth_past_knee=load_growth, p50_growth_past_knee=latency_growth)
    if never_batched:
        return [Finding("no_batching", "critical",
                        f"no batching: every request ran its own execution and throughput "
                        f"stopped growing at concurrency {knee_row.load:g} "
                        f"({knee_row.throughput_rps:,.0f} req/s)", evidence, action)]
    if knee_row.load <= FEW_IN_FLIGHT and knee < len(rows) - 1 and \
            latency_growth >= LINEAR_LATENCY * load_growth:
        return [Finding("no_batching", "critical",
                        f"no batching: throughput is flat from concurrency {knee_row.load:g}"
                        f" while p50 grew {latency_growth:.1f}x over {load_growth:.0f}x the "
                        "concurrency, as when requests are served one at a time", evidence,
                        action)]
    return []


def saturation(sweep: SweepResult) -> list[Finding]:
    rows = [point_summary(p) for p in sweep.points]
    if len(rows) < 2:
        return []
    best = max(range(len(rows)), key=lambda i: rows[i].throughput_rps)
    last, top = rows[-1], rows[best]
    drop = 1 - last.throughput_rps / top.throughput_rps if top.throughput_rps else 0.0
    rising_errors = last.error_percent > max(ERROR_PERCENT,
                                             min(r.error_percent for r in rows))
    if drop < SATURATION_DROP and not rising_errors:
        return []
    return [Finding("saturation", "critical" if rising_errors else "warning",
                    f"saturation: past {sweep.mode} {top.load:g} throughput "
                    f"fell {drop:.0%}" + (f" and errors rose to {last.error_percent:.1f}%"
                                          if rising_errors else ""),
                    {"best_load": top.load, "best_throughput_rps": top.throughput_rps,
                     "last_load": last.load, "last_throughput_rps": last.throughput_rps,
                     "last_error_percent": last.error_percent},
                    f"keep the load under {sweep.mode} {top.load:g}: cap it with "
                    "max_queue_size or a rate limit, or add capacity")]


def decode_slowdown(sweep: SweepResult) -> list[Finding]:
    """Generations: each decode step slows as more sequences share it."""
    rows = [(r.load, r.tokens) for r in (point_summary(p) for p in sweep.points)
            if r.tokens and r.tokens.tpot_p50_ms]
    if len(rows) < 2:
        return []
    first, last = rows[0][1].tpot_p50_ms or 0.0, rows[-1][1].tpot_p50_ms or 0.0
    if first <= 0:
        return []
    growth = last / first
    if growth < DECODE_SLOWDOWN:
        return []
    return [Finding("decode_slowdown", "info",
                    f"TPOT p50 grew {growth:.1f}x from {sweep.mode} {rows[0][0]:g} to "
                    f"{rows[-1][0]:g}: decode steps slow down as batches grow",
                    {"loads": [load for load, _ in rows],
                     "tpot_p50_ms": [t.tpot_p50_ms for _, t in rows],
                     "output_tokens_per_s": [t.output_tokens_per_s for _, t in rows]},
                    "the decode step is compute-bound at these batch sizes; a TPOT SLO caps "
                    "the useful batch (max_num_seqs), faster hardware or a smaller model "
                    "lowers the step")]


def diagnose_sweep(sweep: SweepResult) -> list[Finding]:
    out = no_batching(sweep) + saturation(sweep) + decode_slowdown(sweep)
    rows = [point_summary(p) for p in sweep.points]
    if rows:
        knee = sweep.knee
        index = next((i for i, r in enumerate(rows) if knee and r.load == knee.load),
                     max(range(len(rows)), key=lambda i: rows[i].throughput_rps))
        focus = sweep.points[index]
        out += [f for rule in (client_bound, long_tail, server_bound, unstable, first_token,
                               output_length, slo_misses)
                for f in rule(focus)]
        out += cold_start(sweep.points[0])
    for finding in out:
        finding.subject = finding.subject or sweep.label
    return out


def diagnose(result: ResultDocument) -> list[Finding]:
    """Findings for any result document, most severe first.

        findings = diagnose(load_result("sweep.json"))
    """
    if isinstance(result, BenchResult):
        out = diagnose_bench(result)
    elif isinstance(result, SweepResult):
        out = diagnose_sweep(result)
    elif isinstance(result, SoakResult):
        out = [Finding(f"soak_{r['kind']}", r["severity"], r["text"], r.get("evidence", {}),
                       r["action"], result.label) for r in result.verdict.reasons]
    elif isinstance(result, OptimizeResult):
        out = _diagnose_optimize(result)
    elif isinstance(result, CompareResult):
        out = _diagnose_compare(result)
    elif isinstance(result, PlanResult):
        out = diagnose_plan(result)
    else:  # a tune result states its own recommendation and why
        out = []
    return sorted(out, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))


PREDICTION_OFF = 2.0  # a replay this many times over (or under) its prediction


def diagnose_plan(result: PlanResult) -> list[Finding]:
    """A plan whose replay missed its SLA, one never replayed, and a prediction the
    replay disagrees with: every replay round outside the range its calibration
    supports, or (a prediction without one) more than PREDICTION_OFF times off."""
    subject = f"plan of {result.model}"
    if not result.proof:
        return [Finding("plan_not_replayed", "warning", "no deployment was replayed: the "
                        "plan proves nothing", {"stop_reason": result.stop_reason},
                        "give the plan a longer --budget, or a looser SLA", subject)]
    plan = result.proof[-1]
    out = []
    if not plan.meets_sla:
        out.append(Finding(
            "plan_missed_sla", "critical", "the deployment written missed its SLA on "
            "replay", {"verdict": result.verdict, "p99_ms": plan.p99_ms,
                       "sla_p99_ms": result.goal.get("sla_p99_ms")},
            "no deployment met the SLA here: loosen the SLA, lower the rate, or plan with "
            "more cores or another precision; its serve.sh is marked as missing it",
            subject))
    off = _prediction_off(plan)
    if off is not None:
        out.append(Finding(
            "plan_prediction_off", "warning", off, {
                "predicted_p99_ms": plan.predicted.p99_ms,
                "predicted_p99_range_ms": plan.predicted.p99_range_ms,
                "replayed_p99_ms": plan.p99_ms, "replayed_rounds_ms": plan.p99_rounds_ms,
                "calibration": result.calibration},
            "the machine's load moved between calibration and replay, or the model's cost "
            "is not what was measured: replay again on a quiet machine before trusting "
            "the choice", subject))
    return out


def _prediction_off(plan: Replayed) -> str | None:
    """How far the replay is from its prediction, in one line, where it disagrees."""
    predicted, replayed = plan.predicted.p99_ms, plan.p99_ms
    if replayed is None or not 0 < predicted < float("inf"):
        return None
    span = plan.predicted.p99_range_ms
    rounds = [x for x in plan.p99_rounds_ms if x is not None] or [replayed]
    what = "p99" if plan.tpot_p99_ms is None else "TTFT p99"  # a generation's first token
    if span is not None:
        low, high = span
        shown = (f"rounds {min(rounds):.2f}-{max(rounds):.2f} ms" if len(rounds) > 1
                 else f"{replayed:.2f} ms")
        if min(rounds) > high:
            return (f"the replayed {what} ({shown}) is {min(rounds) - high:.2f} ms above "
                    f"the range its calibration supports ({low:.2f}-{high:.2f} ms)")
        if max(rounds) < low:
            return (f"the replayed {what} ({shown}) is {low - max(rounds):.2f} ms below "
                    f"the range its calibration supports ({low:.2f}-{high:.2f} ms)")
        return None
    if replayed > 0 and max(replayed / predicted, predicted / replayed) > PREDICTION_OFF:
        return (f"the replayed {what} is {replayed / predicted:.1f}x the predicted one "
                f"({replayed:.2f} against {predicted:.2f} ms)")
    return None


def _diagnose_optimize(result: OptimizeResult) -> list[Finding]:
    """A version that lost more than the threshold, or that is no faster than the
    original it replaces."""
    out = []
    for v in result.versions:
        if v.version == result.source_version:
            continue
        subject = f"{result.model} v{v.version} ({v.precision})"
        latency_ratio, throughput_ratio = result.speedup(v)
        if result.over_max_drop(v):
            worst = max(v.accuracy, key=lambda a: a.drop)
            out.append(Finding(
                "optimize_accuracy_drop", "warning",
                f"output {worst.output!r} lost {worst.drop:.4f} ({worst.kind}), more than "
                f"the max drop {result.max_drop:g}",
                {"metrics": worst.metrics, "drop": worst.drop, "max_drop": result.max_drop},
                "try --per-channel, leave sensitive nodes in FP32 (--exclude-node), or "
                "validate on your own data (--validation) before serving it", subject))
        if latency_ratio < 1.0 and throughput_ratio < 1.0:
            out.append(Finding(
                "optimize_not_faster", "info",
                f"no faster than v{result.source_version} here: {latency_ratio:.2f}x at "
                f"batch 1, {throughput_ratio:.2f}x at the best batch",
                {"speedup_batch1": latency_ratio, "speedup_throughput": throughput_ratio},
                "FP16 pays off on GPU providers; on a CPU keep FP32 or use INT8"
                if v.precision == "fp16" else "keep the original on this hardware", subject))
    return out


def _diagnose_compare(compare: CompareResult) -> list[Finding]:
    out = []
    for entry in compare.endpoints:
        for finding in diagnose(entry.result):
            finding.subject = entry.name
            out.append(finding)
    return out
