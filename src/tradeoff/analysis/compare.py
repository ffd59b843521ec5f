"""``tradeoff compare``: the same load and the same inputs against several endpoints.

Live runs interleave the endpoints round by round (A B C, A B C, ...) so that slow drift
of the machine falls on all of them alike, pool each endpoint's rounds, and give every
ratio to the baseline (the first endpoint) a 95% bootstrap confidence interval:
throughput from one-second bins of successful requests, p50 and p99 from the raw
latencies (at most ``BOOTSTRAP_SAMPLES`` per endpoint, drawn at random). Results read
from files get a throughput interval from their windows when each has at least
``MIN_FILE_WINDOWS``; their latency ratios have none (raw samples are not in the file).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console

from tradeoff.analysis.cost import Price, rank
from tradeoff.analysis.profile import build_profile, profile
from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import OK, Records
from tradeoff.bench.result import distribution, environment
from tradeoff.bench.session import run_benchmark

SCHEMA = "tradeoff.compare/1"
BOOTSTRAP_ROUNDS = 500
BOOTSTRAP_SAMPLES = 20_000
METRICS = ("throughput", "p50", "p99")
MIN_FILE_WINDOWS = 8  # fewer windows give too few distinct resamples for an interval


def _measured(records: Records, start_ns: int, spec: LoadSpec, duration_s: float
              ) -> dict[str, np.ndarray]:
    """Raw samples of the measured successes: latencies, successes per one-second bin and,
    for generations, TTFT, TPOT, inter-token gaps and output tokens per bin."""
    measure_start = start_ns + int(spec.warmup_s * 1e9)
    measured = records.select(records.scheduled_ns >= measure_start)
    ok = measured.outcome == OK
    bins = max(int(duration_s), 1)
    # completions per bin count whenever the request was sent, as the summary does
    done = records.outcome == OK
    ends = (records.end_ns[done] - measure_start) / 1e9
    inside = (ends >= 0) & (ends < bins)
    slot = ends[inside].astype(np.int64)
    samples = {"latency": measured.latency_ms[ok],
               "bins": np.bincount(slot, minlength=bins)[:bins].astype(float)}
    if measured.generated:  # tokens per bin: where their text events fell
        times, weights = records.text_events(done)
        at = (times - measure_start) / 1e9
        within = (at >= 0) & (at < bins)
        samples.update(ttft=measured.ttft_ms[ok], tpot=measured.tpot_ms[ok],
                       itl=measured.gaps_of(ok) / 1e6,
                       token_bins=np.bincount(at[within].astype(np.int64),
                                              weights=weights[within], minlength=bins)[:bins])
    return samples


def bootstrap_ratio(a: np.ndarray, b: np.ndarray, statistic: Callable[..., np.ndarray],
                    seed: int = 0) -> list[float] | None:
    """95% interval of statistic(b) / statistic(a), resampling each side independently.
    ``statistic(samples, axis=1)`` must reduce each row of a 2-D array."""
    if a.size < 2 or b.size < 2:
        return None
    rng = np.random.default_rng(seed)
    a = a if a.size <= BOOTSTRAP_SAMPLES else rng.choice(a, BOOTSTRAP_SAMPLES, replace=False)
    b = b if b.size <= BOOTSTRAP_SAMPLES else rng.choice(b, BOOTSTRAP_SAMPLES, replace=False)
    ratios = []
    chunk = max(1, 2_000_000 // max(a.size, b.size))
    for first in range(0, BOOTSTRAP_ROUNDS, chunk):
        n = min(chunk, BOOTSTRAP_ROUNDS - first)
        sa = statistic(a[rng.integers(0, a.size, (n, a.size), dtype=np.int32)], axis=1)
        sb = statistic(b[rng.integers(0, b.size, (n, b.size), dtype=np.int32)], axis=1)
        with np.errstate(invalid="ignore", divide="ignore"):  # 0/0: dropped below
            ratios.append(sb / sa)
    values = np.concatenate(ratios)
    values = values[np.isfinite(values)]
    if not values.size:
        return None
    return [float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))]


def _p50(x: np.ndarray, axis: int) -> np.ndarray:
    return np.percentile(x, 50, axis=axis)


def _p99(x: np.ndarray, axis: int) -> np.ndarray:
    return np.percentile(x, 99, axis=axis)


STATISTICS: dict[str, Callable[..., np.ndarray]] = {"throughput": np.mean, "p50": _p50,
                                                   "p99": _p99}
# generations: metric -> (summary key, statistic, sample source); a token rate is
# better when higher, the times when lower
GENERATION_METRICS: dict[str, tuple[str, str, str]] = {
    "output_tokens_per_s": ("output_tokens_per_s", "mean", "token_bins"),
    "ttft_p50": ("ttft_ms", "p50", "ttft"), "ttft_p99": ("ttft_ms", "p99", "ttft"),
    "tpot_p50": ("tpot_ms", "p50", "tpot")}
_STAT: dict[str, Callable[..., np.ndarray]] = {"mean": np.mean, "p50": _p50, "p99": _p99}


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def merge_rounds(rounds: list[dict[str, Any]], samples: dict[str, np.ndarray]
                 ) -> dict[str, Any]:
    """One bench result for an endpoint from its rounds: counts summed, throughput pooled
    over the measured time, latency percentiles over every round's samples (``samples``:
    the pooled raw samples of :func:`_measured`)."""
    merged = copy.deepcopy(rounds[0])
    s = merged["summary"]
    seconds = sum(r["summary"]["duration_s"] for r in rounds)
    successes = sum(r["summary"]["throughput_rps"] * r["summary"]["duration_s"] for r in rounds)
    inferences = sum(r["summary"]["inferences_per_s"] * r["summary"]["duration_s"]
                     for r in rounds)
    for key in ("requests", "successes", "errors", "bytes_sent", "bytes_received"):
        s[key] = sum(r["summary"][key] for r in rounds)
    errors: dict[str, int] = {}
    for r in rounds:
        for name, count in r["summary"]["errors_by_class"].items():
            errors[name] = errors.get(name, 0) + count
    s["errors_by_class"] = errors
    s["duration_s"] = seconds
    s["throughput_rps"] = successes / seconds if seconds else 0.0
    s["inferences_per_s"] = inferences / seconds if seconds else 0.0
    s["latency_ms"] = distribution(samples["latency"])
    if "ttft" in samples:
        _merge_generations(rounds, samples, s, seconds)
    counts = [r["summary"].get("server_counts") for r in rounds]
    if all(counts):
        s["server_counts"] = {k: sum(c[k] for c in counts if c) for k in ("requests",
                                                                           "executions")}
    median_round = sorted(rounds, key=lambda r: r["summary"]["throughput_rps"])[len(rounds) // 2]
    s["server_ms"] = median_round["summary"]["server_ms"]
    merged["windows"] = [{**w, "round": i} for i, r in enumerate(rounds) for w in r["windows"]]
    merged["stable"] = None if any(r["stable"] is None for r in rounds) else \
        all(r["stable"] for r in rounds)
    merged["client"]["client_bound"] = any(r["client"]["client_bound"] for r in rounds)
    merged["client"]["reasons"] = sorted({x for r in rounds for x in r["client"]["reasons"]})
    merged["merged_rounds"] = len(rounds)
    return merged


def _merge_generations(rounds: list[dict[str, Any]], samples: dict[str, np.ndarray],
                       s: dict[str, Any], seconds: float) -> None:
    """The generation figures of merged rounds: distributions from the pooled samples,
    rates pooled over the measured time, counts summed."""
    s["ttft_ms"] = distribution(samples["ttft"])
    s["tpot_ms"] = distribution(samples["tpot"])
    s["itl_ms"] = distribution(samples["itl"])
    for key in ("output_tokens_per_s", "goodput_rps"):
        if s.get(key) is not None:
            s[key] = sum(r["summary"][key] * r["summary"]["duration_s"] for r in rounds) \
                / seconds if seconds else 0.0
    for key in ("asked", "exact", "shorter", "longer"):
        s["output_length"][key] = sum(r["summary"]["output_length"][key] for r in rounds)
    s["output_length"]["honoured"] = all(r["summary"]["output_length"]["honoured"]
                                         for r in rounds)
    for part in ("output_tokens", "input_tokens"):
        if s.get(part):
            s[part]["total"] = sum((r["summary"][part] or {}).get("total", 0) for r in rounds)
    s["output_tokens"]["from_usage"] = sum(r["summary"]["output_tokens"]["from_usage"]
                                           for r in rounds)
    s["output_tokens"]["counted_events"] = sum(
        r["summary"]["output_tokens"]["counted_events"] for r in rounds)


def _fairness(entries: list[dict[str, Any]], interleaved: bool) -> dict[str, Any]:
    checks = []

    def check(name: str, values: list[Any], detail: str) -> None:
        same = all(v == values[0] for v in values)
        if same:
            text = detail
        elif all(isinstance(v, dict) for v in values):
            keys = sorted(k for k in set().union(*values)
                          if any(v.get(k) != values[0].get(k) for v in values))
            text = "differs in " + "; ".join(
                f"{k} (" + ", ".join(f"{e['name']}: {v.get(k)}" for e, v in zip(entries, values))
                + ")" for k in keys)
        else:
            text = "differs: " + "; ".join(f"{e['name']}: {v}" for e, v in zip(entries, values))
        checks.append({"check": name, "ok": same, "detail": text})

    fingerprints = [e.get("input_fingerprint") or "" for e in entries]
    if all(fingerprints):
        check("same inputs", [f[:12] for f in fingerprints],
              f"every endpoint got the same inputs (sha256 {fingerprints[0][:12]})")
    else:
        checks.append({"check": "same inputs", "ok": None,
                       "detail": "not known for results read from files"})
    shapes = [[(t["name"], t["datatype"], t["shape"]) for t in
               (e["result"]["endpoint"].get("inputs") or [])] for e in entries]
    check("same input names, datatypes and shapes", shapes, "model metadata inputs match")
    loads = [{k: v for k, v in e["result"]["load"].items()} for e in entries]
    check("same load and warmup", loads, "same load spec, warmup and timeout")
    batch = [e["result"]["endpoint"].get("batch_size") for e in entries]
    check("same rows per request", batch, f"batch size {batch[0]}")
    if all("output_length" in e["result"]["summary"] for e in entries):
        lengths = [e["result"]["summary"]["output_length"] for e in entries]
        bad = [f"{e['name']}: {n['shorter']} shorter, {n['longer']} longer of {n['asked']}"
               for e, n in zip(entries, lengths) if not n["honoured"]]
        checks.append({"check": "output lengths as asked", "ok": not bad,
                       "detail": "; ".join(bad) if bad else
                       "every endpoint generated the max_tokens asked"})
    hosts = [e["result"]["environment"]["client_host"] for e in entries]
    check("same client machine", hosts, f"all measured from {hosts[0]}")
    checks.append({"check": "interleaved", "ok": interleaved,
                   "detail": "rounds alternated between endpoints" if interleaved else
                   "results measured separately: machine drift does not cancel"})
    return {"ok": all(c["ok"] is not False for c in checks), "checks": checks}


def _ratios(entries: list[dict[str, Any]], samples: list[dict[str, np.ndarray]] | None
            ) -> list[dict[str, Any]]:
    base = entries[0]["result"]["summary"]
    out = []
    for index, entry in enumerate(entries):
        s = entry["result"]["summary"]
        values = {"throughput": (base["throughput_rps"], s["throughput_rps"]),
                  "p50": ((base["latency_ms"] or {}).get("p50"),
                          (s["latency_ms"] or {}).get("p50")),
                  "p99": ((base["latency_ms"] or {}).get("p99"),
                          (s["latency_ms"] or {}).get("p99"))}
        row: dict[str, Any] = {"name": entry["name"]}
        for metric, (a, b) in values.items():
            ratio = b / a if a and b is not None else None
            ci = None
            if index and samples is not None:
                source = "bins" if metric == "throughput" else "latency"
                ci = bootstrap_ratio(samples[0][source], samples[index][source],
                                     STATISTICS[metric], seed=index)
            elif index and metric == "throughput":
                # pooled throughput is the mean over equal windows; percentiles of the
                # pooled samples cannot be rebuilt from per-window percentiles
                wa, wb = (np.array([w["throughput_rps"] for w in e["result"]["windows"]], float)
                          for e in (entries[0], entry))
                wa, wb = wa[np.isfinite(wa)], wb[np.isfinite(wb)]
                if wa.size >= MIN_FILE_WINDOWS and wb.size >= MIN_FILE_WINDOWS:
                    ci = bootstrap_ratio(wa, wb, np.mean, seed=index)
            row[metric] = {"ratio": ratio, "ci95": ci}
        if "ttft_ms" in base and "ttft_ms" in s:
            for metric, (key, stat, source) in GENERATION_METRICS.items():
                a, b = ((x[key] or {}).get(stat) if stat != "mean" else x[key]
                        for x in (base, s))
                ci = None
                if index and samples is not None and source in samples[index]:
                    ci = bootstrap_ratio(_finite(samples[0][source]),
                                         _finite(samples[index][source]), _STAT[stat],
                                         seed=index)
                row[metric] = {"ratio": b / a if a and b is not None else None, "ci95": ci}
        out.append(row)
    return out


def _document(entries: list[dict[str, Any]], samples: list[dict[str, np.ndarray]] | None,
              rounds: int, prices: dict[str, Price], alpha: float,
              sla_p99_ms: float | None, max_error_percent: float) -> dict[str, Any]:
    candidates = []
    for entry in entries:
        s = entry["result"]["summary"]
        candidates.append({"name": entry["name"], "throughput_rps": s["throughput_rps"],
                           "p99_ms": (s["latency_ms"] or {}).get("p99"),
                           "error_percent": 100 * s["errors"] / s["requests"]
                           if s["requests"] else 0.0,
                           "price": prices.get(entry["name"])})
    return {
        "schema": SCHEMA,
        "baseline": entries[0]["name"],
        "rounds": rounds,
        "environment": environment(),
        "endpoints": entries,
        "ratios": _ratios(entries, samples),
        "fairness": _fairness(entries, interleaved=samples is not None),
        "ranking": rank(candidates, alpha, sla_p99_ms,
                        max_error_percent if sla_p99_ms is not None else None),
        "score": {"alpha": alpha, "sla_p99_ms": sla_p99_ms,
                  "max_error_percent": max_error_percent},
    }


def run_compare(endpoints: list[EndpointSpec], spec: LoadSpec, rounds: int = 3,
                facts: dict[str, dict[str, str]] | None = None,
                prices: dict[str, Price] | None = None, alpha: float = 0.5,
                sla_p99_ms: float | None = None, max_error_percent: float = 1.0,
                console: Console | None = None) -> dict[str, Any]:
    """Measure every endpoint ``rounds`` times, interleaved; the comparison document."""
    if len(endpoints) < 2:
        raise ValueError("compare needs at least two endpoints")
    names = [e.label for e in endpoints]
    if len(set(names)) != len(names):
        raise ValueError(f"endpoint names must differ: {', '.join(names)}")
    if spec.duration_s is None:
        raise ValueError("compare needs --duration (each round measures that long)")
    adapters = [make_adapter(e) for e in endpoints]
    per_round: list[list[dict[str, Any]]] = [[] for _ in endpoints]
    measured: list[list[dict[str, np.ndarray]]] = [[] for _ in endpoints]
    for round_no in range(rounds):
        for i, adapter in enumerate(adapters):
            if console:
                console.print(f"[bold]round {round_no + 1}/{rounds}: {names[i]}[/]")
            result, records, start_ns = run_benchmark(adapter, spec, console)
            result["endpoint"]["name"] = names[i]
            per_round[i].append(result)
            measured[i].append(_measured(records, start_ns, spec,
                                         result["summary"]["duration_s"]))
    entries, samples = [], []
    for i, adapter in enumerate(adapters):
        pooled = {key: np.concatenate([m[key] for m in measured[i]])
                  for key in measured[i][0]}
        merged = merge_rounds(per_round[i], pooled)
        entries.append({"name": names[i], "input_fingerprint": adapter.input_fingerprint,
                        "profile": profile(adapter, (facts or {}).get(names[i])),
                        "rounds": [r["summary"] for r in per_round[i]], "result": merged})
        samples.append(pooled)
    return _document(entries, samples, rounds, prices or {}, alpha, sla_p99_ms,
                     max_error_percent)


def compare_results(named: list[tuple[str, dict[str, Any]]],
                    facts: dict[str, dict[str, str]] | None = None,
                    prices: dict[str, Price] | None = None, alpha: float = 0.5,
                    sla_p99_ms: float | None = None, max_error_percent: float = 1.0
                    ) -> dict[str, Any]:
    """A comparison of bench results read from files (no new measurement)."""
    if len(named) < 2:
        raise ValueError("compare needs at least two results")
    entries = []
    for name, result in named:
        if not str(result.get("schema", "")).startswith("tradeoff.bench/"):
            raise ValueError(f"{name}: not a tradeoff.bench result")
        result = copy.deepcopy(result)
        result["endpoint"]["name"] = name
        endpoint = result["endpoint"]
        metadata = {k: endpoint.get(k) for k in ("platform", "inputs", "outputs")}
        config = endpoint.get("model_config") or {}
        entries.append({"name": name, "input_fingerprint": None,
                        "profile": build_profile(metadata, config, endpoint.get("server") or {},
                                                 (facts or {}).get(name)),
                        "rounds": [result["summary"]], "result": result})
    return _document(entries, None, 1, prices or {}, alpha, sla_p99_ms, max_error_percent)
