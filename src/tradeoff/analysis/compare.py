"""``tradeoff compare``: the same load and the same inputs against several endpoints.

Live runs interleave the endpoints round by round (A B C, A B C, ...) so that slow drift
of the machine falls on all of them alike, pool each endpoint's rounds, and give every
ratio to the baseline (the first endpoint) a 95% bootstrap confidence interval:
throughput from one-second bins of successful requests, p50 and p99 from the raw
latencies (at most ``stats.bootstrap.BOOTSTRAP_SAMPLES`` per endpoint, drawn at random).
Results read from files get a throughput interval from their windows when each has at
least ``MIN_FILE_WINDOWS``; their latency ratios have none (raw samples are not in the file).

    compare = run_compare([EndpointSpec("http://a:8000", model="mlp", name="a"),
                           EndpointSpec("http://b:8000", model="mlp", name="b")],
                          LoadSpec(concurrency=8, duration_s=5))
    compare.ratios_of("b").metrics["throughput"].ratio

:func:`run_compare` (live, interleaved) and :func:`compare_results` (bench results read
from files) give the typed :class:`~tradeoff.results.CompareResult`; ``to_dict()`` is the
document ``tradeoff compare --json`` writes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from tradeoff.analysis.profile import build_profile, profile
from tradeoff.bench.adapters import Adapter
from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import OK, Records
from tradeoff.bench.session import run_benchmark
from tradeoff.errors import BenchSetupError, InvalidValue
from tradeoff.results import (
    BenchResult,
    ClassSummary,
    CompareEntry,
    CompareResult,
    Fairness,
    FairnessCheck,
    Generation,
    Ratio,
    Ratios,
    ServerCounts,
    Summary,
    environment,
)
from tradeoff.stats.bootstrap import STATISTICS, bootstrap_ratio
from tradeoff.stats.cost import Price, rank
from tradeoff.stats.distribution import distribution

__all__ = [
    "GENERATION_METRICS",
    "METRICS",
    "METRIC_STATISTIC",
    "MIN_FILE_WINDOWS",
    "compare_results",
    "merge_rounds",
    "run_compare",
]

METRICS = ("throughput", "p50", "p99")
MIN_FILE_WINDOWS = 8  # fewer windows give too few distinct resamples for an interval


def _measured(adapter: Adapter, records: Records, start_ns: int, spec: LoadSpec,
              duration_s: float) -> dict[str, np.ndarray]:
    """Raw samples of the measured successes: latencies (also of each ``--mix`` class
    apart), successes per one-second bin and, for generations, TTFT, TPOT, inter-token
    gaps and output tokens per bin."""
    measure_start = start_ns + int(spec.warmup_s * 1e9)
    measured = records.select(records.scheduled_ns >= measure_start)
    ok = measured.outcome == OK
    if adapter.mix.classes:  # mix.py lays the prepared requests out class by class
        in_class = measured.request // adapter.mix.inputs_of(adapter.input_count)
        classes = {}
        for i in range(len(adapter.mix.classes)):
            mine = ok & (in_class == i)
            classes[_class_key(i)] = measured.latency_ms[mine]
            if measured.generated:
                classes[_class_key(i, "ttft")] = measured.ttft_ms[mine]
                classes[_class_key(i, "tpot")] = measured.tpot_ms[mine]
    else:
        classes = {}
    bins = max(int(duration_s), 1)
    # completions per bin count whenever the request was sent, as the summary does
    done = records.outcome == OK
    ends = (records.end_ns[done] - measure_start) / 1e9
    inside = (ends >= 0) & (ends < bins)
    slot = ends[inside].astype(np.int64)
    samples = {"latency": measured.latency_ms[ok],
               "bins": np.bincount(slot, minlength=bins)[:bins].astype(float), **classes}
    if measured.generated:  # tokens per bin: where their text events fell
        times, weights = records.text_events(done)
        at = (times - measure_start) / 1e9
        within = (at >= 0) & (at < bins)
        samples.update(ttft=measured.ttft_ms[ok], tpot=measured.tpot_ms[ok],
                       itl=measured.gaps_of(ok) / 1e6,
                       token_bins=np.bincount(at[within].astype(np.int64),
                                              weights=weights[within], minlength=bins)[:bins])
    return samples


METRIC_STATISTIC = {"throughput": "mean", "p50": "p50", "p99": "p99"}
# generations: metric -> (summary key, statistic, sample source); a token rate is
# better when higher, the times when lower
GENERATION_METRICS: dict[str, tuple[str, str, str]] = {
    "output_tokens_per_s": ("output_tokens_per_s", "mean", "token_bins"),
    "ttft_p50": ("ttft_ms", "p50", "ttft"), "ttft_p99": ("ttft_ms", "p99", "ttft"),
    "tpot_p50": ("tpot_ms", "p50", "tpot")}


def _finite(values: np.ndarray) -> np.ndarray:
    return values[np.isfinite(values)]


def _class_key(index: int, figure: str = "latency") -> str:
    return f"class {index}" if figure == "latency" else f"class {index} {figure}"


def _merge_classes(rounds: list[BenchResult], samples: dict[str, np.ndarray]
                   ) -> list[ClassSummary] | None:
    """Each ``--mix`` class over every round: counts summed, throughput pooled over the
    measured time, latency over every round's samples."""
    if rounds[0].classes is None:
        return None
    seconds = sum(r.summary.duration_s for r in rounds)
    out = []
    for index, first in enumerate(rounds[0].classes):
        each = [r.classes[index] for r in rounds if r.classes is not None]
        done = sum(c.throughput_rps * r.summary.duration_s
                   for c, r in zip(each, rounds, strict=True))
        out.append(dataclasses.replace(
            first, requests=sum(c.requests for c in each), errors=sum(c.errors for c in each),
            throughput_rps=done / seconds if seconds else 0.0,
            latency_ms=distribution(samples[_class_key(index)]),
            ttft_ms=distribution(samples[_class_key(index, "ttft")])
            if _class_key(index, "ttft") in samples else first.ttft_ms,
            tpot_ms=distribution(samples[_class_key(index, "tpot")])
            if _class_key(index, "tpot") in samples else first.tpot_ms))
    return out


def merge_rounds(rounds: list[BenchResult], samples: dict[str, np.ndarray]) -> BenchResult:
    """One bench result for an endpoint from its rounds: counts summed, throughput pooled
    over the measured time, latency percentiles over every round's samples (``samples``:
    the pooled raw samples of :func:`_measured`)."""
    summaries = [r.summary for r in rounds]
    seconds = sum(s.duration_s for s in summaries)
    successes = sum(s.throughput_rps * s.duration_s for s in summaries)
    inferences = sum(s.inferences_per_s * s.duration_s for s in summaries)
    errors: dict[str, int] = {}
    for s in summaries:
        for name, count in s.errors_by_class.items():
            errors[name] = errors.get(name, 0) + count
    counts = [s.server_counts for s in summaries]
    median_round = sorted(summaries, key=lambda s: s.throughput_rps)[len(rounds) // 2]
    summary = dataclasses.replace(
        summaries[0],
        requests=sum(s.requests for s in summaries),
        successes=sum(s.successes for s in summaries),
        errors=sum(s.errors for s in summaries),
        bytes_sent=sum(s.bytes_sent for s in summaries),
        bytes_received=sum(s.bytes_received for s in summaries),
        errors_by_class=errors,
        duration_s=seconds,
        throughput_rps=successes / seconds if seconds else 0.0,
        inferences_per_s=inferences / seconds if seconds else 0.0,
        latency_ms=distribution(samples["latency"]),
        server_counts=_merge_counts(counts) if all(counts) else summaries[0].server_counts,
        server_ms=median_round.server_ms,
        generation=_merge_generations(summaries, samples, seconds)
        if "ttft" in samples else summaries[0].generation)
    first = rounds[0]
    return dataclasses.replace(
        first, summary=summary,
        windows=[dataclasses.replace(w, round=i) for i, r in enumerate(rounds)
                 for w in r.windows],
        stable=None if any(r.stable is None for r in rounds) else all(r.stable for r in rounds),
        client=dataclasses.replace(
            first.client, client_bound=any(r.client.client_bound for r in rounds),
            reasons=sorted({x for r in rounds for x in r.client.reasons})),
        merged_rounds=len(rounds), classes=_merge_classes(rounds, samples))


def _merge_counts(counts: list[ServerCounts | None]) -> ServerCounts:
    """The rounds' server counts summed (cache counts only when every round has them)."""
    present = [c for c in counts if c is not None]
    cached = all(c.cache_hits is not None for c in present)
    return ServerCounts(sum(c.requests for c in present), sum(c.executions for c in present),
                        sum(c.cache_hits or 0 for c in present) if cached else None,
                        sum(c.cache_misses or 0 for c in present) if cached else None)


def _merge_generations(summaries: list[Summary], samples: dict[str, np.ndarray],
                       seconds: float) -> Generation:
    """The generation figures of merged rounds: distributions from the pooled samples,
    rates pooled over the measured time, counts summed."""
    rounds = [s.generation for s in summaries if s.generation is not None]
    first = rounds[0]

    def pooled(values: list[float]) -> float:
        return sum(v * s.duration_s for v, s in zip(values, summaries, strict=True)) / seconds \
            if seconds else 0.0

    lengths = [g.output_length for g in rounds]
    outputs = [g.output_tokens for g in rounds]
    return dataclasses.replace(
        first,
        ttft_ms=distribution(samples["ttft"]),
        tpot_ms=distribution(samples["tpot"]),
        itl_ms=distribution(samples["itl"]),
        output_tokens_per_s=pooled([g.output_tokens_per_s for g in rounds]),
        goodput_rps=None if first.goodput_rps is None else
        pooled([g.goodput_rps or 0.0 for g in rounds]),
        output_length=dataclasses.replace(
            first.output_length, asked=sum(n.asked for n in lengths),
            exact=sum(n.exact for n in lengths), shorter=sum(n.shorter for n in lengths),
            longer=sum(n.longer for n in lengths), honoured=all(n.honoured for n in lengths)),
        output_tokens=dataclasses.replace(
            first.output_tokens, total=sum(o.total for o in outputs),
            from_usage=sum(o.from_usage for o in outputs),
            counted_events=sum(o.counted_events for o in outputs)),
        input_tokens=dataclasses.replace(
            first.input_tokens, total=sum(g.input_tokens.total if g.input_tokens else 0
                                          for g in rounds))
        if first.input_tokens else None)


def _fairness(entries: list[CompareEntry], interleaved: bool) -> Fairness:
    checks = []

    def check(name: str, values: list[Any], detail: str) -> None:
        same = all(v == values[0] for v in values)
        if same:
            text = detail
        elif all(isinstance(v, dict) for v in values):
            keys = sorted(k for k in set().union(*values)
                          if any(v.get(k) != values[0].get(k) for v in values))
            text = "differs in " + "; ".join(
                f"{k} (" + ", ".join(f"{e.name}: {v.get(k)}"
                                     for e, v in zip(entries, values, strict=True))
                + ")" for k in keys)
        else:
            text = "differs: " + "; ".join(f"{e.name}: {v}"
                                           for e, v in zip(entries, values, strict=True))
        checks.append(FairnessCheck(name, same, text))

    fingerprints = [e.input_fingerprint or "" for e in entries]
    if all(fingerprints):
        check("same inputs", [f[:12] for f in fingerprints],
              f"every endpoint got the same inputs (sha256 {fingerprints[0][:12]})")
    else:
        checks.append(FairnessCheck("same inputs", None,
                                    "not known for results read from files"))
    shapes = [[(t["name"], t["datatype"], t["shape"]) for t in
               (e.result.endpoint.get("inputs") or [])] for e in entries]
    check("same input names, datatypes and shapes", shapes, "model metadata inputs match")
    loads = [dict(e.result.load) for e in entries]
    check("same load and warmup", loads, "same load spec, warmup and timeout")
    batch = [e.result.endpoint.get("batch_size") for e in entries]
    check("same rows per request", batch, f"batch size {batch[0]}")
    generations = [e.result.summary.generation for e in entries]
    if all(generations):
        bad = [f"{e.name}: {g.output_length.shorter} shorter, {g.output_length.longer} longer "
               f"of {g.output_length.asked}" for e, g in zip(entries, generations, strict=True)
               if g and not g.output_length.honoured]
        checks.append(FairnessCheck("output lengths as asked", not bad,
                                    "; ".join(bad) if bad else
                                    "every endpoint generated the max_tokens asked"))
    hosts = [e.result.environment["client_host"] for e in entries]
    check("same client machine", hosts, f"all measured from {hosts[0]}")
    checks.append(FairnessCheck("interleaved", interleaved,
                                "rounds alternated between endpoints" if interleaved else
                                "results measured separately: machine drift does not cancel"))
    return Fairness(all(c.ok is not False for c in checks), checks)


def _ratios(entries: list[CompareEntry], samples: list[dict[str, np.ndarray]] | None
            ) -> list[Ratios]:
    base = entries[0].result.summary
    out = []
    for index, entry in enumerate(entries):
        s = entry.result.summary
        values = {"throughput": (base.throughput_rps, s.throughput_rps),
                  "p50": (base.latency("p50"), s.latency("p50")),
                  "p99": (base.latency("p99"), s.latency("p99"))}
        metrics: dict[str, Ratio] = {}
        for metric, (a, b) in values.items():
            ratio = b / a if a and b is not None else None
            ci = None
            if index and samples is not None:
                source = "bins" if metric == "throughput" else "latency"
                ci = bootstrap_ratio(samples[0][source], samples[index][source],
                                     STATISTICS[METRIC_STATISTIC[metric]], seed=index)
            elif index and metric == "throughput":
                # pooled throughput is the mean over equal windows; percentiles of the
                # pooled samples cannot be rebuilt from per-window percentiles
                wa, wb = (np.array([w.throughput_rps for w in e.result.windows], float)
                          for e in (entries[0], entry))
                wa, wb = wa[np.isfinite(wa)], wb[np.isfinite(wb)]
                if wa.size >= MIN_FILE_WINDOWS and wb.size >= MIN_FILE_WINDOWS:
                    ci = bootstrap_ratio(wa, wb, np.mean, seed=index)
            metrics[metric] = Ratio(ratio, ci)
        if base.generation and s.generation:
            for metric, (key, stat, source) in GENERATION_METRICS.items():
                a, b = (getattr(g, key) if stat == "mean" else (getattr(g, key) or {}).get(stat)
                        for g in (base.generation, s.generation))
                ci = None
                if index and samples is not None and source in samples[index]:
                    ci = bootstrap_ratio(_finite(samples[0][source]),
                                         _finite(samples[index][source]), STATISTICS[stat],
                                         seed=index)
                metrics[metric] = Ratio(b / a if a and b is not None else None, ci)
        out.append(Ratios(entry.name, metrics))
    return out


def _document(entries: list[CompareEntry], samples: list[dict[str, np.ndarray]] | None,
              rounds: int, prices: dict[str, Price], alpha: float,
              sla_p99_ms: float | None, max_error_percent: float) -> CompareResult:
    candidates = [{"name": e.name, "throughput_rps": e.result.summary.throughput_rps,
                   "p99_ms": e.result.summary.latency("p99"),
                   "error_percent": e.result.summary.error_percent,
                   "price": prices.get(e.name)} for e in entries]
    return CompareResult(
        baseline=entries[0].name,
        rounds=rounds,
        environment=environment(),
        endpoints=entries,
        ratios=_ratios(entries, samples),
        fairness=_fairness(entries, interleaved=samples is not None),
        ranking=rank(candidates, alpha, sla_p99_ms,
                     max_error_percent if sla_p99_ms is not None else None),
        score={"alpha": alpha, "sla_p99_ms": sla_p99_ms,
               "max_error_percent": max_error_percent},
    )


def run_compare(endpoints: list[EndpointSpec], spec: LoadSpec, rounds: int = 3,
                facts: dict[str, dict[str, str]] | None = None,
                prices: dict[str, Price] | None = None, alpha: float = 0.5,
                sla_p99_ms: float | None = None, max_error_percent: float = 1.0,
                console: Console | None = None,
                later_rounds: list[list[EndpointSpec]] | None = None,
                on_round: Callable[[int, str], None] | None = None) -> CompareResult:
    """Measure every endpoint ``rounds`` times, interleaved; the comparison.
    ``later_rounds``: what rounds 2, 3, ... send instead, per endpoint (the same
    endpoints with other prompts, where a prompt seen in round 1 would be cached).
    ``on_round(round, endpoint)`` is called as each endpoint's round begins (from 1)."""
    if len(endpoints) < 2:
        raise InvalidValue("compare needs at least two endpoints")
    names = [e.label for e in endpoints]
    if len(set(names)) != len(names):
        raise InvalidValue(f"endpoint names must differ: {', '.join(names)}")
    if spec.duration_s is None:
        raise InvalidValue("compare needs --duration (each round measures that long)")
    adapters = [make_adapter(e) for e in endpoints]
    for name, adapter in zip(names, adapters, strict=True):
        try:  # every endpoint answers before the first round, not after a wasted one
            adapter.prepare()
        except BenchSetupError as exc:
            raise BenchSetupError(f"endpoint {name}: {exc}", exc.status) from None
    per_round: list[list[BenchResult]] = [[] for _ in endpoints]
    measured: list[list[dict[str, np.ndarray]]] = [[] for _ in endpoints]
    for round_no in range(rounds):
        if round_no and later_rounds:
            adapters = [make_adapter(e) for e in later_rounds[round_no - 1]]
            for adapter in adapters:
                adapter.prepare()
        for i, adapter in enumerate(adapters):
            if console:
                console.print(f"[bold]round {round_no + 1}/{rounds}: {escape(names[i])}[/]")
            if on_round is not None:
                on_round(round_no + 1, names[i])
            result, records, start_ns = run_benchmark(adapter, spec, console)
            per_round[i].append(result.named(names[i]))
            measured[i].append(_measured(adapter, records, start_ns, spec,
                                         result.summary.duration_s))
    entries, samples = [], []
    for i, adapter in enumerate(adapters):
        pooled = {key: np.concatenate([m[key] for m in measured[i]])
                  for key in measured[i][0]}
        entries.append(CompareEntry(names[i], adapter.input_fingerprint,
                                    profile(adapter, (facts or {}).get(names[i])),
                                    [r.summary for r in per_round[i]],
                                    merge_rounds(per_round[i], pooled)))
        samples.append(pooled)
    return _document(entries, samples, rounds, prices or {}, alpha, sla_p99_ms,
                     max_error_percent)


def compare_results(named: list[tuple[str, BenchResult]],
                    facts: dict[str, dict[str, str]] | None = None,
                    prices: dict[str, Price] | None = None, alpha: float = 0.5,
                    sla_p99_ms: float | None = None, max_error_percent: float = 1.0
                    ) -> CompareResult:
    """A comparison of bench results already measured, each under its name (no new
    measurement): ``[("a", load_as(BenchResult, "a.json")), ...]``."""
    if len(named) < 2:
        raise InvalidValue("compare needs at least two results")
    entries = []
    for name, given in named:
        result = given.named(name)
        endpoint = result.endpoint
        metadata = {k: endpoint.get(k) for k in ("platform", "inputs", "outputs")}
        config = endpoint.get("model_config") or {}
        entries.append(CompareEntry(name, None,
                                    build_profile(metadata, config, endpoint.get("server") or {},
                                                  (facts or {}).get(name)),
                                    [result.summary], result))
    return _document(entries, None, 1, prices or {}, alpha, sla_p99_ms, max_error_percent)
