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

from tradeoff.analysis.knee import find_knee
from tradeoff.bench.result import endpoint_label
from tradeoff.bench.sweep import point_summary

LONG_TAIL_WARN = 3.0          # p99 / p50
LONG_TAIL_CRITICAL = 10.0
SPIKE_FACTOR = 2.0            # a window whose p99 is this far above the median window p99
COLD_START_FACTOR = 10.0      # first request vs steady p50
OVERHEAD_SHARE = 0.5          # client latency not spent in the server
FEW_IN_FLIGHT = 4             # no batching: the knee comes at or below this concurrency ...
LINEAR_LATENCY = 0.7          # ... and past it p50 grows at least 0.7x as fast as the load
BATCHED_RATIO = 0.95          # executions / requests at or above this: nothing shared a batch
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


def _latency(result: dict[str, Any]) -> dict[str, float]:
    return result["summary"].get("latency_ms") or {}


# ----------------------------------------------------------------- one bench result

def long_tail(result: dict[str, Any]) -> list[Finding]:
    if "ttft_ms" in result["summary"]:
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
    windows = [w for w in result.get("windows", []) if w.get("p99_ms") == w.get("p99_ms")]
    if len(windows) >= 4:
        p99s = np.array([w["p99_ms"] for w in windows], dtype=float)
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


def server_bound(result: dict[str, Any]) -> list[Finding]:
    """Queue-bound vs compute-bound, and overhead-bound, from the server breakdown."""
    server = result["summary"].get("server_ms")
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
    if mean["queue"] > compute:
        out.append(Finding(
            "queue_bound", "warning",
            f"queue-bound: requests wait {mean['queue']:.2f} ms in the queue for "
            f"{compute:.2f} ms of compute", evidence,
            "add model instances (instance_group count) or replicas, or shorten "
            "max_queue_delay_microseconds; the model itself is not the bottleneck"))
    else:
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


def client_bound(result: dict[str, Any]) -> list[Finding]:
    client = result.get("client") or {}
    if not client.get("client_bound"):
        return []
    return [Finding("client_bound", "critical", "client-bound: the load generator could not "
                    "keep up, so the figures understate the endpoint",
                    {"reasons": client.get("reasons", []),
                     "cpu_percent": client.get("cpu_percent")},
                    "rerun with --workers N, on a less loaded or separate client machine")]


def cold_start(result: dict[str, Any]) -> list[Finding]:
    cold, p50 = result.get("cold_start_ms"), _latency(result).get("p50")
    if not cold or not p50 or cold < COLD_START_FACTOR * p50:
        return []
    return [Finding("cold_start", "warning",
                    f"cold start: the first request took {cold:.1f} ms, {cold / p50:.0f}x "
                    "the steady p50", {"cold_start_ms": cold, "p50_ms": p50},
                    "warm the model up at load time (model_warmup), keep instances loaded, "
                    "and exclude a warmup from measurements (--warmup)")]


def unstable(result: dict[str, Any]) -> list[Finding]:
    if result.get("stable") is not False:
        return []
    return [Finding("unstable_measurement", "warning",
                    "unstable measurement: the last windows disagree",
                    {"stop_reason": result.get("stop_reason"),
                     "windows": [{k: w.get(k) for k in ("throughput_rps", "p99_ms")}
                                 for w in result.get("windows", [])[-3:]]},
                    "measure longer (--window, --max-windows), add --warmup, and check for "
                    "other load on the client and server machines")]


def errors(result: dict[str, Any]) -> list[Finding]:
    s = result["summary"]
    if not s["requests"]:
        return []
    percent = 100 * s["errors"] / s["requests"]
    if percent <= ERROR_PERCENT:
        return []
    return [Finding("errors", "critical", f"{percent:.1f}% of requests failed",
                    {"errors_by_class": s["errors_by_class"], "requests": s["requests"]},
                    "503/429 mean the server refused load (queue full): lower the load or "
                    "add capacity; timeouts and resets point at overload or crashes")]


def first_token(result: dict[str, Any]) -> list[Finding]:
    """Generations: most of the time passes before the first token, or TTFT has a long
    tail: requests wait to be admitted."""
    s = result["summary"]
    ttft, lat = s.get("ttft_ms") or {}, s.get("latency_ms") or {}
    if not ttft.get("p50") or not lat.get("p50"):
        return []
    out = []
    share = ttft["p50"] / lat["p50"]
    evidence = {"ttft_p50_ms": ttft["p50"], "ttft_p99_ms": ttft["p99"],
                "e2e_p50_ms": lat["p50"], "tpot_p50_ms": (s.get("tpot_ms") or {}).get("p50"),
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


def output_length(result: dict[str, Any]) -> list[Finding]:
    """Generations: answers not as long as asked, or counted without the server's usage."""
    s = result["summary"]
    length, tokens = s.get("output_length"), s.get("output_tokens")
    out = []
    if length and not length["honoured"]:
        out.append(Finding(
            "output_length_not_honoured", "warning",
            f"output length not honoured: {length['shorter']} of {length['asked']} answers "
            f"shorter and {length['longer']} longer than the max_tokens asked"
            + (" despite ignore_eos" if length["ignore_eos"] else ""), length,
            "tokens/s and latency compare unequal work between endpoints; use --ignore-eos "
            "where the server supports it, or compare per output token (TPOT)"))
    if tokens and tokens["counted_events"]:
        out.append(Finding(
            "tokens_counted_from_events", "info",
            f"{tokens['counted_events']} answers had no usage: their tokens were counted as "
            "text events", tokens,
            "a server that sends several tokens per event is undercounted; ask for usage "
            "(stream_options.include_usage) if the server supports it"))
    return out


def slo_misses(result: dict[str, Any]) -> list[Finding]:
    s = result["summary"]
    if s.get("goodput_rps") is None or not s["throughput_rps"]:
        return []
    share = s["goodput_rps"] / s["throughput_rps"]
    if share >= GOODPUT_SHARE:
        return []
    bounds = s["slo"]
    evidence = {"goodput_rps": s["goodput_rps"], "throughput_rps": s["throughput_rps"],
                "slo": bounds,
                **{f"{k[:-3]}_p99_ms": (s.get(k) or {}).get("p99") for k in ("ttft_ms",
                                                                              "tpot_ms")}}
    return [Finding("slo_misses", "critical" if share < 0.5 else "warning",
                    f"{1 - share:.0%} of answered requests miss the SLO "
                    f"({', '.join(f'{k} <= {v:g}' for k, v in bounds.items())})", evidence,
                    "lower the load (a sweep finds where goodput peaks); a TTFT miss is "
                    "admission or prefill, a TPOT miss is a batch too large for the decode "
                    "step")]


BENCH_RULES = (errors, client_bound, unstable, long_tail, first_token, output_length,
               slo_misses, server_bound, cold_start)


def diagnose_bench(result: dict[str, Any]) -> list[Finding]:
    out = [f for rule in BENCH_RULES for f in rule(result)]
    for finding in out:
        finding.subject = finding.subject or endpoint_label(result)
    return out


# ------------------------------------------------------------------------ a sweep

def no_batching(sweep: dict[str, Any]) -> list[Finding]:
    """Throughput stops growing after a handful of requests in flight while latency grows
    with the concurrency; where the server counts executions, every request ran alone."""
    if sweep.get("mode") != "concurrency":
        return []
    points = [p for p in sweep["points"] if p["summary"]["successes"]]
    rows = [point_summary(p) for p in points]
    if len(rows) < 3 or rows[-1]["load"] < 4 * rows[0]["load"]:
        return []
    knee = find_knee([r["load"] for r in rows], [r["throughput_rps"] for r in rows])
    ratios = [c["executions"] / c["requests"] for p in points[1:]
              if (c := p["summary"].get("server_counts")) and c["requests"]]
    never_batched = bool(ratios) and min(ratios) >= BATCHED_RATIO
    if ratios and not never_batched:
        return []  # requests did share executions: a flat curve is saturation, not this
    evidence: dict[str, Any] = {
        "loads": [r["load"] for r in rows], "throughput_rps": [r["throughput_rps"] for r in rows],
        "p50_ms": [r["p50_ms"] for r in rows], "executions_per_request": ratios or None,
        "knee_load": rows[knee]["load"] if knee is not None else None}
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
    load_growth = last["load"] / knee_row["load"]
    latency_growth = (last["p50_ms"] or 0) / (knee_row["p50_ms"] or 1)
    evidence.update(load_growth_past_knee=load_growth, p50_growth_past_knee=latency_growth)
    if never_batched:
        return [Finding("no_batching", "critical",
                        f"no batching: every request ran its own execution and throughput "
                        f"stopped growing at concurrency {knee_row['load']:g} "
                        f"({knee_row['throughput_rps']:,.0f} req/s)", evidence, action)]
    if knee_row["load"] <= FEW_IN_FLIGHT and knee < len(rows) - 1 and \
            latency_growth >= LINEAR_LATENCY * load_growth:
        return [Finding("no_batching", "critical",
                        f"no batching: throughput is flat from concurrency {knee_row['load']:g}"
                        f" while p50 grew {latency_growth:.1f}x over {load_growth:.0f}x the "
                        "concurrency, as when requests are served one at a time", evidence,
                        action)]
    return []


def saturation(sweep: dict[str, Any]) -> list[Finding]:
    rows = [point_summary(p) for p in sweep["points"]]
    if len(rows) < 2:
        return []
    best = max(range(len(rows)), key=lambda i: rows[i]["throughput_rps"])
    last = rows[-1]
    drop = 1 - last["throughput_rps"] / rows[best]["throughput_rps"] if \
        rows[best]["throughput_rps"] else 0.0
    rising_errors = last["error_percent"] > max(ERROR_PERCENT,
                                                min(r["error_percent"] for r in rows))
    if drop < SATURATION_DROP and not rising_errors:
        return []
    return [Finding("saturation", "critical" if rising_errors else "warning",
                    f"saturation: past {sweep['mode']} {rows[best]['load']:g} throughput "
                    f"fell {drop:.0%}" + (f" and errors rose to {last['error_percent']:.1f}%"
                                          if rising_errors else ""),
                    {"best_load": rows[best]["load"],
                     "best_throughput_rps": rows[best]["throughput_rps"],
                     "last_load": last["load"], "last_throughput_rps": last["throughput_rps"],
                     "last_error_percent": last["error_percent"]},
                    f"keep the load under {sweep['mode']} {rows[best]['load']:g}: cap it with "
                    "max_queue_size or a rate limit, or add capacity")]


def decode_slowdown(sweep: dict[str, Any]) -> list[Finding]:
    """Generations: each decode step slows as more sequences share it."""
    rows = [r for r in (point_summary(p) for p in sweep["points"])
            if r.get("tpot_p50_ms")]
    if len(rows) < 2 or rows[0]["tpot_p50_ms"] <= 0:
        return []
    growth = rows[-1]["tpot_p50_ms"] / rows[0]["tpot_p50_ms"]
    if growth < DECODE_SLOWDOWN:
        return []
    return [Finding("decode_slowdown", "info",
                    f"TPOT p50 grew {growth:.1f}x from {sweep['mode']} {rows[0]['load']:g} to "
                    f"{rows[-1]['load']:g}: decode steps slow down as batches grow",
                    {"loads": [r["load"] for r in rows],
                     "tpot_p50_ms": [r["tpot_p50_ms"] for r in rows],
                     "output_tokens_per_s": [r["output_tokens_per_s"] for r in rows]},
                    "the decode step is compute-bound at these batch sizes; a TPOT SLO caps "
                    "the useful batch (max_num_seqs), faster hardware or a smaller model "
                    "lowers the step")]


def diagnose_sweep(sweep: dict[str, Any]) -> list[Finding]:
    out = no_batching(sweep) + saturation(sweep) + decode_slowdown(sweep)
    rows = [point_summary(p) for p in sweep["points"]]
    if rows:
        knee = sweep.get("knee")
        index = next((i for i, r in enumerate(rows) if knee and r["load"] == knee["load"]),
                     max(range(len(rows)), key=lambda i: rows[i]["throughput_rps"]))
        focus = sweep["points"][index]
        out += [f for rule in (client_bound, long_tail, server_bound, unstable, first_token,
                               output_length, slo_misses)
                for f in rule(focus)]
        out += cold_start(sweep["points"][0])
    subject = endpoint_label(sweep)
    for finding in out:
        finding.subject = finding.subject or subject
    return out


def diagnose(document: dict[str, Any]) -> list[Finding]:
    """Findings for any result document, most severe first."""
    schema = str(document.get("schema", ""))
    if schema.startswith("tradeoff.bench/"):
        out = diagnose_bench(document)
    elif schema.startswith("tradeoff.sweep/"):
        out = diagnose_sweep(document)
    elif schema.startswith("tradeoff.soak/"):
        out = [Finding(f"soak_{r['kind']}", r["severity"], r["text"], r.get("evidence", {}),
                       r["action"], endpoint_label(document)) for r in document["verdict"]["reasons"]]
    elif schema.startswith("tradeoff.compare/"):
        out = []
        for entry in document["endpoints"]:
            for finding in diagnose(entry["result"]):
                finding.subject = entry["name"]
                out.append(finding)
    else:
        raise ValueError(f"not a tradeoff result (schema {schema or 'missing'})")
    return sorted(out, key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
