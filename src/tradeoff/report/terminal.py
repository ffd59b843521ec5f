"""Terminal tables for benchmark, optimize and tune results."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich import box
from rich.console import Console, Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from tradeoff.results import (
    BatchSizeTune,
    BenchResult,
    CompareResult,
    Generation,
    OptimizeResult,
    PlanCandidate,
    PlanResult,
    Ratio,
    ServeTune,
    SoakResult,
    SweepResult,
)

if TYPE_CHECKING:  # for hints only: soak prints tables while it measures, and importing
    # prometheus_client's parser then would cost a measured window its p99
    from tradeoff.bench.scrape import GenerationRow, ModelRow, ReplicaRow

class FoldingTable(Table):
    """A rich table whose cells wrap, never cut: on 80 columns or into a file, a number
    too wide for its column goes on over lines instead of ending in an ellipsis."""

    def add_column(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("overflow", "fold")
        super().add_column(*args, **kwargs)


__all__ = [
    "SEVERITY_STYLE",
    "FoldingTable",
    "accuracy_cell",
    "live_view",
    "print_batch_size_tune",
    "print_bench_result",
    "print_compare",
    "print_findings",
    "print_optimize",
    "print_plan",
    "print_ranking",
    "print_serve_tune",
    "print_soak",
    "print_sweep",
    "soak_memory_text",
]

# what an error class's name does not say by itself (names: bench/records.py OUTCOME_NAMES)
_CLASS_NOTES = {"too_large": " (answers over --max-response-size)"}


def _t(value: object) -> str:
    """``value`` as text inside markup: a name, a label or an endpoint's error text comes
    from outside (a shared result file, a server) and may hold brackets that rich would
    read as tags.

    Escaped, and fenced by an empty style (``none``) so that the value always ends where
    a tag begins: an unclosed ``[link=...`` in one value cannot pair with a ``]`` in the
    next, and its trailing backslashes, doubled, show as written instead of escaping the
    tag printed after them.
    """
    text = str(value)
    body = text.rstrip("\\")
    trailing = "\\" * 2 * (len(text) - len(body))
    return f"[none]{escape(body)}{trailing}[/none]"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _class_table(result: BenchResult, console: Console) -> None:
    """Every --mix class apart (the table above holds them together)."""
    classes = result.classes or []
    total = sum(c.weight for c in classes)
    generated = any(c.ttft_ms is not None for c in classes)
    table = FoldingTable(title="by request class")
    for column in ("class", "share", "requests", "req/s", "p50 ms", "p99 ms", "p999 ms",
                   *(("TTFT p50 / p99 ms", "TPOT p50 / p99 ms") if generated else ()),
                   "errors"):
        table.add_column(column, justify="left" if column == "class" else "right",
                         no_wrap=True)
    for c in classes:
        per_token = [f"{_ms((d or {}).get('p50'))} / {_ms((d or {}).get('p99'))}"
                     for d in (c.ttft_ms, c.tpot_ms)] if generated else []
        table.add_row(_t(c.name), f"{c.weight / total:.0%}",
                      f"{c.requests:,}", f"{c.throughput_rps:,.1f}", _ms(c.latency("p50")),
                      _ms(c.latency("p99")), _ms(c.latency("p999")), *per_token,
                      f"{c.errors:,}")
    console.print(table)


def print_bench_result(result: BenchResult, console: Console) -> None:
    """The summary of one ``tradeoff bench`` result."""
    s = result.summary
    endpoint = result.endpoint
    load = result.load
    what = endpoint.get("model") or endpoint["url"]
    if load["mode"] == "closed":
        offered = f"concurrency {_t(load['concurrency'])}"
    elif load["mode"] == "open":
        offered = f"{_t(load['arrival'])} arrivals at {load['rate']:g}/s"
    else:
        offered = f"trace of {_t(load['intervals'])} requests"
    table = FoldingTable(title=f"{_t(what)} ({_t(endpoint['protocol'])}), {offered}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("requests (errors)", f"{s.requests:,} ({s.errors:,})")
    table.add_row("throughput", f"{s.throughput_rps:,.1f} req/s, "
                                f"{s.inferences_per_s:,.1f} infer/s")
    if s.asked_rate_rps:
        table.add_row("asked / achieved rate",
                      f"{s.asked_rate_rps:,.1f} / {s.achieved_rate_rps or 0:,.1f} req/s")
    for key in ("p50", "p90", "p99", "p999", "mean", "max"):
        table.add_row(f"latency {key} ms", _ms(s.latency(key)))
    if s.generation:
        _generation_rows(s.generation, table)
    server = s.server_ms
    if server:
        for part in ("queue", "compute_input", "compute_infer", "compute_output", "overhead"):
            values = server.get(part) or {}
            cell = f"mean {_ms(values.get('mean'))}"
            if "p99" in values:
                cell += f"  p99 {_ms(values['p99'])}"
            table.add_row(f"server {part} ms", cell)
        table.add_row("server breakdown from", _t(server["source"]))
    counts = s.server_counts
    if counts is not None and counts.cache_hit_ratio is not None:
        table.add_row("server cache hit ratio",
                      f"{counts.cache_hit_ratio:.1%} ({counts.cache_hits:,} hits of "
                      f"{(counts.cache_hits or 0) + (counts.cache_misses or 0):,} lookups, "
                      "measurement window)")
    mix = result.endpoint.get("input_mix")
    if mix and mix.get("draw") == "zipf":
        table.add_row("inputs", f"{mix['distinct_inputs']:,} distinct, Zipf s={mix['zipf_s']:g}")
    if s.errors_by_class:
        table.add_row("errors by class", _t(", ".join(f"{k}: {v}{_CLASS_NOTES.get(k, '')}"
                                                      for k, v in s.errors_by_class.items())))
    table.add_row("bytes sent / received", f"{s.bytes_sent:,} / {s.bytes_received:,}")
    table.add_row("cold start ms", _ms(result.cold_start_ms))
    table.add_row("warmup requests", f"{result.warmup.requests:,}")
    stable = result.stable
    table.add_row("windows", f"{len(result.windows)}, "
                             + ("stable" if stable else "unstable" if stable is False else
                                "stability not checked") + f" ({_t(result.stop_reason)})")
    client = result.client
    table.add_row("client CPU", f"{client.cpu_percent:.0f}%")
    if client.send_lag_ms:
        table.add_row("send lag p99 ms", _ms(client.send_lag_ms["p99"]))
    if client.loop_lag_ms:
        table.add_row("client loop lag p99 ms", _ms(client.loop_lag_ms["p99"]))
    console.print(table)
    if result.classes:
        _class_table(result, console)
    if client.client_bound:
        console.print("[bold yellow]client_bound[/]: the load generator could not keep up ("
                      + _t("; ".join(client.reasons)) + "); the figures understate the "
                      "endpoint. Try --workers N or a faster client machine.")
    if stable is False:
        console.print(f"[yellow]unstable[/]: {_t(result.stop_reason)}; last windows disagree "
                      f"by more than {load['stability_percent']:g}%.")
    length = s.generation.output_length if s.generation else None
    if length and not length.honoured:
        console.print(f"[bold yellow]output length not honoured[/]: of {length.asked} "
                      f"answers, {length.shorter} were shorter and {length.longer} "
                      "longer than the max_tokens asked"
                      + (" despite ignore_eos" if length.ignore_eos else "")
                      + "; tokens/s and TPOT compare unequal work.")
    for note in client.notes:
        console.print(f"[yellow]note[/]: {_t(note)}")


def _generation_rows(g: Generation, table: Table) -> None:
    """TTFT, ITL, TPOT, tokens and goodput of an LLM benchmark."""
    for metric, given in (("TTFT", g.ttft_ms), ("ITL", g.itl_ms), ("TPOT", g.tpot_ms)):
        values = given or {}
        table.add_row(f"{metric} p50 / p99 ms",
                      f"{_ms(values.get('p50'))} / {_ms(values.get('p99'))}")
    table.add_row("output tokens/s", f"{g.output_tokens_per_s:,.1f}")
    out = g.output_tokens
    per = out.per_request or {}
    table.add_row("output tokens (mean per request)",
                  f"{out.total:,} ({per.get('mean', 0):,.1f})"
                  + (f", {out.counted_events} counted from events: no usage"
                     if out.counted_events else ""))
    if g.input_tokens:
        table.add_row("input tokens (mean per request)",
                      f"{g.input_tokens.total:,} "
                      f"({(g.input_tokens.per_request or {}).get('mean', 0):,.1f})")
    length = g.output_length
    if length.asked:
        table.add_row("output length as asked",
                      f"{length.exact:,} of {length.asked:,} exact, "
                      f"{length.shorter:,} shorter, {length.longer:,} longer")
    if g.goodput_rps is not None:
        bounds = ", ".join(f"{_t(k)} <= {v:g}" for k, v in (g.slo or {}).items())
        table.add_row("goodput", f"{g.goodput_rps:,.2f} req/s ({bounds})")


def print_sweep(sweep: SweepResult, console: Console) -> None:
    """The sweep's points, the knee highlighted, and why it stopped."""
    from tradeoff.bench.sweep import SERVED_SHARE, first_unserved, point_summary

    knee = sweep.knee
    mode = _t(sweep.mode)  # shown only: a column's header and the lines below
    table = FoldingTable(title=f"{_t(sweep.label)}: sweep over {mode}")
    priced = any(row.cost_per_million is not None for row in sweep.rows)
    generated = any(row.tokens for row in sweep.rows)
    columns = ([mode, "req/s", "tok/s", "TTFT p50", "TTFT p99", "TPOT p99", "p99 ms",
                "errors %"] if generated else
               [mode, "req/s", "infer/s", "p50 ms", "p99 ms", "errors %"])
    for column in columns + (["$ / 1M req"] if priced else []) + [""]:
        table.add_column(column, justify="right")
    bound = {point_summary(p).load: p.client for p in sweep.points if p.client.client_bound}
    for row in sweep.rows:
        at_knee = knee is not None and row.load == knee.load
        if generated:
            tokens = row.tokens
            cells = [f"{row.load:g}", f"{row.throughput_rps:,.2f}",
                     f"{tokens.output_tokens_per_s if tokens else 0:,.1f}",
                     _ms(tokens.ttft_p50_ms if tokens else None),
                     _ms(tokens.ttft_p99_ms if tokens else None),
                     _ms(tokens.tpot_p99_ms if tokens else None), _ms(row.p99_ms),
                     f"{row.error_percent:.1f}"]
        else:
            cells = [f"{row.load:g}", f"{row.throughput_rps:,.1f}",
                     f"{row.inferences_per_s:,.1f}", _ms(row.p50_ms), _ms(row.p99_ms),
                     f"{row.error_percent:.1f}"]
        if priced:
            cost = row.cost_per_million
            cells.append("-" if cost is None else f"{cost:,.4f}")
        notes = ["[bold yellow]knee[/]"] if at_knee else []
        notes += ["[yellow]client-bound[/]"] if row.load in bound else []
        table.add_row(*cells, " ".join(notes), style="bold" if at_knee else None)
    console.print(table)
    if bound:
        reasons = sorted({r for client in bound.values() for r in client.reasons})
        console.print(f"[bold yellow]client_bound[/] at {mode} "
                      f"{', '.join(f'{load:g}' for load in sorted(bound))}: the load generator "
                      f"could not keep up ({_t('; '.join(reasons))}); those points understate "
                      "the endpoint. Try --workers N or a faster client machine.")
    if knee:
        rate = (f" ({knee.tokens.output_tokens_per_s:,.1f} tok/s)" if knee.tokens else "")
        console.print(f"knee at {mode} {knee.load:g}: {knee.throughput_rps:,.1f} req/s"
                      f"{rate}, p99 {_ms(knee.p99_ms)} ms ({_t(knee.rule)})")
    elif (short := first_unserved(sweep.points)) is not None:
        console.print(f"saturated from the first level: at {mode} {short.load:g} it served "
                      f"{short.throughput_rps:,.1f} req/s, under {SERVED_SHARE:.0%} of what "
                      "was sent; sweep lower rates to find where it keeps up")
    else:
        console.print("knee not reached: throughput was still growing")
    console.print(f"stopped: {_t(sweep.stop_reason)}")
    anchors = sweep.plan.get("profile")
    if anchors:
        console.print(f"profile: {anchors['synchronous_rps']:,.2f} req/s one at a time, "
                      f"{anchors['throughput_rps']:,.2f} req/s flat out; the rates above "
                      "are spread evenly between them")
    sla = sweep.sla
    if sla:
        if sla.best and sla.best_load is not None:
            best = sla.best
            console.print(f"[bold]SLA p99 <= {sla.p99_ms:g} ms[/]: highest {mode} meeting "
                          f"it is {sla.best_load:g} ({best.throughput_rps:,.1f} req/s, "
                          f"p99 {_ms(best.p99_ms)} ms)")
        else:
            console.print(f"[bold red]SLA p99 <= {sla.p99_ms:g} ms[/]: no load met it")


def _ratio_cell(value: Ratio | None) -> str:
    if value is None or value.ratio is None:
        return "-"
    text = f"{value.ratio:.3f}"
    if value.ci95:
        text += f"\n[dim]{value.ci95[0]:.2f}-{value.ci95[1]:.2f}[/]"
    return text


def print_compare(compare: CompareResult, console: Console) -> None:
    """Side by side: figures, ratios to the baseline with 95% intervals, fairness, cost."""
    table = FoldingTable(title=f"Comparison: baseline {_t(compare.baseline)}, "
                        + (f"{compare.rounds} interleaved round(s) each"
                           if compare.fairness.interleaved else "from result files"))
    for column in ("endpoint", "req/s", "x base", "p50 ms", "p99 ms", "x base", "errors"):
        table.add_column(column, justify="left" if column == "endpoint" else "right")
    table.caption = ("x base: ratio to the baseline, 95% bootstrap interval below it "
                     "(p50 ratios in the JSON)")
    for entry in compare.endpoints:
        s = entry.result.summary
        r = compare.ratios_of(entry.name).metrics
        table.add_row(_t(entry.name), f"{s.throughput_rps:,.1f}",
                      _ratio_cell(r.get("throughput")),
                      _ms(s.latency("p50")), _ms(s.latency("p99")), _ratio_cell(r.get("p99")),
                      f"{s.errors:,}")
    console.print(table)
    if all("output_tokens_per_s" in r.metrics for r in compare.ratios):
        tokens = FoldingTable(title="Generations (x base: ratio to the baseline)")
        tokens.caption = "TTFT p50 and its ratio: in the JSON and the HTML report"
        for column in ("endpoint", "tok/s", "x base", "TTFT p99", "x base", "TPOT p50",
                       "x base"):
            tokens.add_column(column, justify="left" if column == "endpoint" else "right")
        for entry in compare.endpoints:
            g, r = entry.result.summary.generation, compare.ratios_of(entry.name).metrics
            ttft, tpot = (g.ttft_ms or {}, g.tpot_ms or {}) if g else ({}, {})
            tokens.add_row(_t(entry.name), f"{g.output_tokens_per_s if g else 0:,.1f}",
                           _ratio_cell(r["output_tokens_per_s"]),
                           _ms(ttft.get("p99")), _ratio_cell(r["ttft_p99"]),
                           _ms(tpot.get("p50")), _ratio_cell(r["tpot_p50"]))
        console.print(tokens)
    profiles = FoldingTable(title="Endpoint profiles (unknown: not revealed, not given)")
    profiles.add_column("")
    for entry in compare.endpoints:
        profiles.add_column(_t(entry.name))
    for key in ("format", "precision", "server", "batching", "instances", "hardware"):
        profiles.add_row(key, *(_t(e.profile["checklist"][key]) for e in compare.endpoints))
    extra = sorted({k for e in compare.endpoints for k in e.profile.get("facts", {})})
    for key in extra:
        profiles.add_row(_t(key), *(_t(e.profile["facts"].get(key, "unknown"))
                                    for e in compare.endpoints))
    console.print(profiles)
    for check in compare.fairness.checks:
        mark = {True: "[green]ok[/]", False: "[red]differs[/]", None: "[dim]n/a[/]"}[check.ok]
        console.print(f"  fairness: {_t(check.check)}: {mark} ({_t(check.detail)})")
    print_ranking(compare.ranking, compare.score, console)


def print_ranking(ranking: list[dict[str, Any]], score: dict[str, Any],
                  console: Console) -> None:
    """Cost per million requests and the cost-performance score."""
    basis = next((c["score_basis"] for c in ranking if c.get("score_basis")),
                 "requests per dollar")
    table = FoldingTable(title=f"Cost and score ({score['alpha']:g} x {_t(basis)} + "
                        f"{1 - score['alpha']:g} x 1/p99, each relative to the best)"
                        + (f", SLA p99 <= {score['sla_p99_ms']:g} ms"
                           if score.get("sla_p99_ms") else ""))
    for column in ("rank", "endpoint", "req/s", "p99 ms", "$ / 1M req", "score", "SLA"):
        table.add_column(column, justify="left" if column in ("endpoint", "SLA") else "right",
                         no_wrap=column == "endpoint")
    for c in ranking:
        cost = c["cost_per_million"]
        table.add_row("-" if c["rank"] is None else _t(c["rank"]), _t(c["name"]),
                      f"{c['throughput_rps']:,.1f}", _ms(c["p99_ms"]),
                      "-" if cost is None else f"{cost:,.4f}",
                      "-" if c["score"] is None else f"{c['score']:.3f}",
                      "met" if c["meets_sla"] else _t("; ".join(c["sla_misses"])))
    console.print(table)


SEVERITY_STYLE = {"critical": "bold red", "warning": "yellow", "info": "blue"}


def print_findings(findings: list[Any], console: Console) -> None:
    """Diagnosis findings, most severe first."""
    if not findings:
        console.print("[green]no findings[/]: none of the rules matched")
        return
    table = FoldingTable(title="Diagnosis", show_lines=True)
    for column in ("severity", "subject", "finding", "what to do"):
        table.add_column(column)
    for f in findings:
        table.add_row(Text.styled(f.severity, SEVERITY_STYLE.get(f.severity, "")),
                      _t(f.subject), _t(f.title), _t(f.action))
    console.print(table)


def soak_memory_text(memory: dict[str, Any], flagged: bool) -> str:
    """The server's memory trend in words: a trend can be certain (a small p) and still
    too small to matter, and then says so (``flagged``: the verdict called it growth)."""
    growth = memory["growth_mib"]
    size = f"{growth:+.1f} MiB" if abs(growth) >= 0.05 else f"{growth * 1024:+.0f} KiB"
    certain = memory["p_value"] < 0.05
    if not certain:
        return f"server memory: {size} over the run, no trend (Mann-Kendall p=" \
               f"{memory['p_value']:.2f})"
    grows = memory.get("direction") == "up"
    judged = "growth that makes the run unstable" if flagged else \
        "too small to matter" if grows else "shrinking"
    return (f"server memory: {size} over the run, a steady {memory.get('direction')} "
            f"trend (Mann-Kendall p={memory['p_value']:.3f}): {judged}")


def print_soak(soak: SoakResult, console: Console) -> None:
    """The soak's windows and its verdict."""
    table = FoldingTable(title=f"Soak at {soak.rate_rps:,.1f} req/s "
                        f"({soak.plan['fraction']:.0%} of {soak.max_rate['rps']:,.1f}, "
                        f"{_t(soak.max_rate['source'])})")
    for column in ("window", "req/s", "p50 ms", "p99 ms", "errors"):
        table.add_column(column, justify="right")
    for w in soak.result.windows:
        table.add_row(str(w.index + 1), f"{w.throughput_rps:,.1f}", _ms(w.p50_ms),
                      _ms(w.p99_ms), _t(w.errors))
    console.print(table)
    verdict = soak.verdict
    memory = verdict.trends.get("memory")
    if memory:
        flagged = any(r["kind"] == "memory_growth" for r in verdict.reasons)
        console.print(_t(soak_memory_text(memory, flagged)))
    if verdict.stable:
        console.print("[bold green]stable[/]: no drift, error burst or memory growth")
    else:
        console.print("[bold red]unstable[/]:")
        for reason in verdict.reasons:
            console.print(f"  - {_t(reason['text'])}")
    for note in verdict.notes:
        console.print(f"  note: {_t(note)}")


def accuracy_cell(result: OptimizeResult, version: int) -> str:
    """What a version lost, in the metric its outputs are graded by."""
    report = next(v for v in result.versions if v.version == version)
    if not report.accuracy:
        return "reference"
    cells = []
    for a in report.accuracy:
        m = a.metrics
        if a.kind == "embedding":
            cells.append(f"cos {m['cosine_mean']:.4f} min {m['cosine_min']:.4f}")
        elif a.kind == "classifier":
            cells.append(f"top-1 {m['top1_agreement']:.1%} "
                         f"dp {m['max_probability_difference']:.3f}")
        elif a.kind == "generative":
            cells.append(f"greedy {m['greedy_agreement']:.1%}, ppl {m['perplexity']:.2f} "
                         f"(was {m['perplexity_original']:.2f})")
        else:
            cells.append(f"err {m['max_abs_error']:.3g} ({m['max_relative_error']:.2%})")
    return "; ".join(cells)


def print_optimize(result: OptimizeResult, console: Console) -> None:
    """Each version of the model side by side: size, speed in process, what it lost."""
    base = result.source_version
    env = result.environment
    runtime = f"onnxruntime {_t(env['onnxruntime'])}" if "onnxruntime" in env else \
        f"torch {_t(env.get('torch', '?'))}"
    table = FoldingTable(title=f"{_t(result.model)}: versions in process "
                        f"({_t(env.get('intra_op_threads', 1))} thread, {runtime})",
                  box=box.SIMPLE_HEAD)
    for column in ("v", "precision", "MB", "batch 1 p50 ms", "best throughput", "accuracy"):
        table.add_column(column, justify="left" if column in ("precision", "accuracy")
                         else "right")
    for v in result.versions:
        latency_ratio, throughput_ratio = result.speedup(v)
        accuracy = _t(accuracy_cell(result, v.version))
        if result.over_max_drop(v):
            accuracy = f"[red]{accuracy}: over max drop[/red]"
        table.add_row(_t(v.version), _t(v.precision), f"{v.size_bytes / 1e6:.1f}",
                      f"{_ms(v.latency_ms['p50'])} ({latency_ratio:.2f}x)",
                      f"{v.best_throughput:,.0f}/s @{v.best_batch} ({throughput_ratio:.2f}x)",
                      accuracy)
    console.print(table)
    console.print(f"(x: speed against v{_t(base)}, higher is faster; @: best batch size)")
    for v in result.versions:
        console.print(f"  v{_t(v.version)}{f' ({_t(v.model)})' if v.model else ''}: "
                      f"{_t(v.method)}")
    console.print(f"accuracy: against v{_t(base)} on {_t(result.validation['samples'])} "
                  f"samples from {_t(result.validation['source'])}; max drop "
                  f"{result.max_drop:g}")


def _mb(value: float | None) -> str:
    return "-" if value is None else f"{value / 1e6:,.1f}"


def print_batch_size_tune(result: BatchSizeTune, console: Console) -> None:
    """The doubling search: each batch size, the knee, the recommendation and why."""
    plan = result.plan
    table = FoldingTable(title=f"{_t(result.model)}: batch size in process ({_t(result.device)}, "
                        f"{_t(plan.get('intra_op_threads', 1))} thread(s))",
                  box=box.SIMPLE_HEAD)
    for column in ("batch", "samples/s", "batch p50 ms", "batch p99 ms", "ms/sample",
                   "peak MB"):
        table.add_column(column, justify="right")
    table.add_column("", min_width=12)
    for p in result.points:
        latency = p.latency_ms or {}
        mark = []
        if p.batch_size == result.knee:
            mark.append("knee")
        if p.batch_size == result.recommended:
            mark.append("[green]recommended[/green]")
        if p.role == "memory":
            mark.append("memory probe")
        if p.error:
            mark.append(f"[red]failed: {_t(p.error)}[/red]")
        elif not p.fits:
            mark.append("[red]over --max-memory[/red]")
        per_sample = latency.get("p50", 0) / p.batch_size if latency else None
        table.add_row(str(p.batch_size),
                      "-" if p.samples_per_s is None else f"{p.samples_per_s:,.0f}",
                      _ms(latency.get("p50")), _ms(latency.get("p99")), _ms(per_sample),
                      _mb(p.memory_bytes), ", ".join(mark))
    console.print(table)
    console.print(f"recommended batch size: [bold]{_t(result.recommended)}[/bold] "
                  f"({_t(result.why)})")
    console.print("what this optimises: the model's own throughput per batch, in process "
                  "with no server or queue; `tune serve` chooses a served config under a "
                  "latency SLA, where max_batch_size is only a ceiling on the batches the "
                  "queue forms, so it may keep a larger one")
    console.print(f"stopped: {_t(result.stop_reason)}")
    m = result.memory
    per = "not measurable (memory did not grow with the batch)" if m.per_sample_bytes is None \
        else f"{m.per_sample_bytes / 1e6:,.3f} MB per sample"
    console.print(f"memory ({_t(m.source)}): model {m.weights_bytes / 1e6:,.1f} MB, {per}")
    if m.max_memory_bytes is not None:
        estimate = "-" if m.estimated_max_batch is None else f"{m.estimated_max_batch:,}"
        fit = "none" if m.largest_fit is None else f"{m.largest_fit:,}"
        console.print(f"largest batch within {m.max_memory_bytes / 1e6:,.0f} MB: formula "
                      f"(max - model) / per sample = {estimate}; measured (doubling) = {fit}")


def print_serve_tune(result: ServeTune, console: Console) -> None:
    """Every configuration tried, the Pareto front marked, the winner and where it went."""
    goal = result.goal
    asked = (f"at {goal['rate']:g} req/s" if goal["rate"] is not None
             else "highest throughput")
    table = FoldingTable(title=f"{_t(result.model)}: serving configs tried ({asked}, p99 <= "
                        f"{goal['sla_p99_ms']:g} ms)", box=box.SIMPLE_HEAD)
    for column in ("configuration", "req/s", "p50 ms", "p99 ms", "errors", "$/1M", ""):
        table.add_column(column, justify="left" if column in ("configuration", "")
                         else "right")
    for t in result.trials:
        marks = []
        if t.name == result.winner:
            marks.append("[green bold]winner[/green bold]")
        if t.name == result.baseline:
            marks.append("server's config")
        if t.pareto:
            marks.append("pareto")
        if len(t.measurements) > 1:
            marks.append(f"median of {len(t.measurements)}")
        if t.status != "measured":
            marks.append(f"[red]{_t(t.status)}: {_t(t.reason)}[/red]")
        elif not t.meets_sla:
            marks.append("[yellow]misses SLA[/yellow]")
        money = "-" if t.cost_per_million is None else f"{t.cost_per_million:,.3f}"
        table.add_row(_t(t.name),
                      "-" if t.throughput_rps is None else f"{t.throughput_rps:,.1f}",
                      _ms(t.p50_ms), _ms(t.p99_ms),
                      "-" if t.error_percent is None else f"{t.error_percent:.1f}%", money,
                      ", ".join(marks))
    console.print(table)
    console.print(f"{len(result.trials)} of {result.grid_size} configurations of the grid "
                  f"tried in {result.elapsed_s:,.0f} s ({_t(goal['strategy'])}); stopped: "
                  f"{_t(result.stop_reason)}")
    winner, baseline = result.trial(result.winner), result.trial(result.baseline)
    if winner is None:
        console.print("[red]no configuration met the SLA[/red]")
        return
    gain = ""
    if baseline and baseline.throughput_rps and winner.throughput_rps and \
            goal["rate"] is None:
        gain = f" ({winner.throughput_rps / baseline.throughput_rps:.2f}x the server's config)"
    console.print(f"winner: [bold]{_t(winner.name)}[/bold]: {winner.throughput_rps or 0:,.1f} "
                  f"req/s at p99 {_ms(winner.p99_ms)} ms{gain}")
    r = result.recommended
    if r is not None:
        spread = (f"the spread of its {r.measurements} measurements, {r.spread:.0%}"
                  if r.spread is not None else "one measurement: a default")
        replay = ("not replayed: the budget left no time" if r.holds is None else
                  f"replayed there: p99 {_ms(r.replay_p99_ms)} ms, errors "
                  f"{r.replay_error_percent or 0:.1f}%, "
                  + ("[green]holds the SLA[/green]" if r.holds else
                     "[red]misses the SLA[/red]: the machine's noise is larger than "
                     "measured; run lower"))
        console.print(f"recommended rate: [bold]{r.rate_rps:,.1f} req/s[/bold], "
                      f"{r.headroom:.0%} below its lowest measured rate for {spread}; "
                      f"{replay}")
    console.print("what this optimises: served throughput (or the cost at the asked rate) "
                  "with p99 under the SLA, batching, queueing and the network included; "
                  "`tune batch-size` measures the model alone in process, so its batch size "
                  "can differ: max_batch_size here only caps the batches the queue forms")
    if result.written:
        console.print(f"config.pbtxt of the winner: {_t(result.written)}")


def _money(value: float | None) -> str:
    return "-" if value is None else f"{value:,.3f}"


def _candidate_row(c: PlanCandidate, generative: bool) -> list[str]:
    p = c.predicted
    if generative:  # p99: time to first token; batch: sequences a step; hits: prefix cache
        return [_t(c.name), _ms(p.p99_ms), _ms(p.tpot_p99_ms), f"{p.mean_batch:.1f}",
                f"{p.hit_ratio:.0%}" if c.knobs.get("prefix_caching") else "-",
                f"{p.utilisation:.0%}", _money(c.cost_per_million)]
    return [_t(c.name), _ms(p.p99_ms), f"{p.mean_batch:.1f}",
            f"{p.hit_ratio:.0%}" if c.cache_bytes else "-", f"{p.utilisation:.0%}",
            _money(c.cost_per_million)]


def print_plan(result: PlanResult, console: Console) -> None:
    """The traffic, the versions weighed, the best predicted deployments, the levers
    taken or left, and the replay: measured next to predicted."""
    goal, t = result.goal, result.traffic
    repeats = (f"{t['distinct_inputs']:,} distinct inputs (Zipf {t['zipf']:.2f})"
               + (" of the bench's own input set" if t.get("inputs_from") == "bench"
                  else "")
               if t.get("zipf") is not None else "no repeated inputs")
    class_slas = goal.get("class_sla_ms") or {}
    class_tpots = goal.get("class_tpot_ms") or {}
    generative = goal.get("sla_tpot_ms") is not None
    classes = "".join(
        f", {_t(name)} {share:.0%} ({'TTFT ' if generative else ''}p99 <= "
        f"{class_slas.get(name, goal['sla_p99_ms']):g} ms"
        + (f", TPOT <= {class_tpots.get(name, goal['sla_tpot_ms']):g} ms" if generative
           else "") + ")"
        for name, share in (t.get("classes") or {}).items()) \
        if len(t.get("classes") or {}) > 1 else ""
    c = result.calibration
    if generative:
        repeats = (f"prompts of {_t(t['prompt_tokens'])} tokens "
                   f"({_t(t['shared_prefix_tokens'])} shared), answers of "
                   f"{_t(t['output_tokens'])}")
        sla = f"TTFT p99 <= {goal['sla_p99_ms']:g} ms, TPOT p99 <= {goal['sla_tpot_ms']:g} ms"
    else:
        sla = f"p99 <= {goal['sla_p99_ms']:g} ms"
    console.print(f"[bold]{_t(result.model)}[/bold]: {sla}, traffic "
                  f"{_t(t['source'])}: {t['rate_rps']:,.1f} req/s (peak {t['peak_rps']:,.0f}/s, "
                  f"burstiness {t['burstiness']:.2f}), {repeats}{classes}; {_t(goal['cores'])} "
                  f"core(s) for the server")
    if generative:
        console.print(f"measured on the starting deployment, one request at a time "
                      f"({_t(c['requests'])} answers): its prompt steps take "
                      f"{c['prefill_scale']:.2f}x and its decode steps {c['decode_scale']:.2f}x "
                      "the in-process timings"
                      + (f"; under the load, {c['load_scale']:.2f}x more, and "
                         f"{c['ttft_extra_p50_ms']:.0f} / {c['ttft_extra_p99_ms']:.0f} ms of "
                         "TTFT p50 / p99 the simulation leaves out"
                         + (" (in the run's windows the p99 ran {:+.0f} to {:+.0f} ms from "
                            "the simulated)".format(*c["ttft_extra_p99_range_ms"])
                            if c.get("ttft_extra_p99_range_ms") else "")
                         + " (measured at "
                         f"{c['load_rate_rps']:.2f} req/s)" if c.get("load_rate_rps") else "")
                      + "; every prediction runs on the scaled costs")
    else:
        console.print(f"measured on the starting deployment: the server's CPU per request "
                      f"{c['server_cpu_ms_per_request']:.3f} ms beside the model; latency "
                      f"the simulation leaves out (client, wire) {c['wire_p50_ms']:.2f} ms at "
                      f"p50, {c['wire_p99_ms']:.2f} ms at p99"
                      + (" (in the run's windows the p99 ran {:+.2f} to {:+.2f} ms from the "
                         "simulated)".format(*c["wire_p99_range_ms"])
                         if c.get("wire_p99_range_ms") else "")
                      + f", at {c['rate_rps']:,.0f} req/s")
    versions = FoldingTable(title="versions weighed (tradeoff optimize)" + (
        ": a decode step by sequences" if generative else ""), box=box.SIMPLE_HEAD)
    for column in ("v", "precision", "perplexity" if generative else "lost",
                   "batch 1 ms", "largest ms", ""):
        versions.add_column(column, justify="left" if column in ("precision", "") else "right")
    for v in result.versions:
        largest = max(v.batch_ms)
        versions.add_row(_t(v.version), _t(v.precision),
                         f"{v.drop:+.2%}" if generative else f"{v.drop:.2%}",
                         _ms(v.batch_ms[min(v.batch_ms)]),
                         f"{_ms(v.batch_ms[largest])} @{largest}",
                         _t(v.why) if v.kept else f"[yellow]left out: {_t(v.why)}[/yellow]")
    console.print(versions)
    table = FoldingTable(title="deployments predicted: version, s max_num_seqs, t "
                        "max_num_batched_tokens, pc prefix caching, prio priority by class"
                  if generative else
                  "deployments predicted: version, b max batch, d queue delay (us), "
                  "instances x threads, c cached answers", box=box.SIMPLE_HEAD)
    columns = ("deployment", "TTFT p99", "TPOT p99", "seqs", "prefix hits", "busy",
               "$/1M tok", "") if generative else \
        ("deployment", "p99 ms", "batch", "hits", "busy", "$/1M", "")
    for column in columns:
        table.add_column(column, justify="left" if column in ("deployment", "")
                         else "right", no_wrap=column == "deployment")
    for candidate in result.candidates[:8]:
        marks = ["[green bold]chosen[/green bold]"] if candidate.name == result.chosen else []
        marks += ["pareto"] if candidate.pareto else []
        marks += [] if candidate.meets_sla else ["[yellow]misses SLA[/yellow]"]
        table.add_row(*_candidate_row(candidate, generative), ", ".join(marks))
    table.add_row(*_candidate_row(result.baseline, generative), "starting")
    console.print(table)
    console.print(f"{len(result.candidates)} kept of the deployments predicted; stopped: "
                  f"{_t(result.stop_reason)}")
    for lever in result.levers:
        mark = "[green]taken[/green]" if lever.taken else "left"
        console.print(f"  {_t(lever.lever)}: {mark}: {_t(lever.why)}")
    if result.proof:
        proof = FoldingTable(title="replayed side by side (measured, predicted in brackets)",
                      box=box.SIMPLE_HEAD)
        for column in (("", "TTFT p99", "TPOT p99", "prefix hits", "tokens/s", "goodput/s",
                        "errors", "SLA") if generative
                       else ("", "p99 ms", "batch", "hits", "errors", "SLA")):
            proof.add_column(column, justify="left" if column == "" else "right",
                             no_wrap=column == "")
        for r in result.proof:
            if generative:
                proof.add_row(
                    f"{_t(r.role)}: {_t(r.name)}",
                    f"{_ms(r.p99_ms)} ({_ms(r.predicted.p99_ms)})",
                    f"{_ms(r.tpot_p99_ms)} ({_ms(r.predicted.tpot_p99_ms)})",
                    ("-" if r.hit_ratio is None else f"{r.hit_ratio:.0%}")
                    + f" ({r.predicted.hit_ratio:.0%})",
                    f"{r.output_tokens_per_s or 0:,.1f}",
                    "-" if r.goodput_rps is None else f"{r.goodput_rps:,.2f}",
                    f"{r.error_percent:.1f}%",
                    "[green]met[/green]" if r.meets_sla else "[red]missed[/red]")
                for each in r.classes:
                    proof.add_row(
                        f"  class {_t(each.request_class)} (TTFT <= {each.sla_p99_ms:g}, "
                        "TPOT <= "
                        f"{each.sla_tpot_ms or 0:g} ms)",
                        f"{_ms(each.p99_ms)} ({_ms(each.predicted.p99_ms)})",
                        f"{_ms(each.tpot_p99_ms)} ({_ms(each.predicted.tpot_p99_ms)})", "",
                        "", "", f"{each.error_percent:.1f}%",
                        "[green]met[/green]" if each.meets_sla else "[red]missed[/red]")
                continue
            hits = "-" if r.hit_ratio is None else f"{r.hit_ratio:.0%}"
            batch = "-" if r.mean_batch is None else f"{r.mean_batch:.1f}"
            proof.add_row(
                f"{_t(r.role)}: {_t(r.name)}", _ms(r.p99_ms) if r.classes else  # each class's below
                f"{_ms(r.p99_ms)} ({_ms(r.predicted.p99_ms)})",
                f"{batch} ({r.predicted.mean_batch:.1f})",
                f"{hits} ({r.predicted.hit_ratio:.0%})", f"{r.error_percent:.1f}%",
                "[green]met[/green]" if r.meets_sla else "[red]missed[/red]")
            for each in r.classes:
                proof.add_row(f"  class {_t(each.request_class)} "
                              f"(p99 <= {each.sla_p99_ms:g} ms)",
                              f"{_ms(each.p99_ms)} ({_ms(each.predicted.p99_ms)})", "", "",
                              f"{each.error_percent:.1f}%",
                              "[green]met[/green]" if each.meets_sla else "[red]missed[/red]")
        console.print(proof)
        ranges = [f"{_t(r.role)} {r.predicted.p99_range_ms[0]:.3g}-"
                  f"{r.predicted.p99_range_ms[1]:.3g} ms" for r in result.proof
                  if r.predicted.p99_range_ms is not None]
        if ranges:
            console.print(f"the {'TTFT ' if generative else ''}p99 each calibration "
                          f"supports: {', '.join(ranges)}")
        plan = result.proof[-1]
        console.print(f"replayed at {plan.throughput_rps:,.1f} req/s; cost per 1M "
                      f"{'output tokens' if generative else 'requests'}: "
                      f"plan {_money(plan.cost_per_million)}, starting "
                      f"{_money(result.proof[-2].cost_per_million)}")
    console.print(_t(result.verdict))
    if result.output and result.chosen:
        console.print(f"deployment: {_t(result.output)}/repository; start it with "
                      f"{_t(result.output)}/serve.sh")


def live_view(models: list[ModelRow], generations: list[GenerationRow], source: str,
              seconds: float | None = None, window: str | None = None,
              replicas: list[ReplicaRow] | None = None) -> Group:
    """``tradeoff top``'s screen: one row per model over the last interval (``seconds``)
    or a PromQL ``window``, and one per gateway replica."""
    span = f"last {seconds:.1f} s" if seconds is not None else f"rates over {_t(window)}"
    table = FoldingTable(title=f"{_t(source)}: {span}", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
    for column in ("model", "v", "req/s", "p50 ms", "p99 ms", "queue", "inflight",
                   "exec/s", "batch", "fail/s"):
        table.add_column(column, justify="left" if column == "model" else "right",
                         no_wrap=True, min_width=len(column))
    for m in models:
        table.add_row(_t(m.model), _t(m.version), f"{m.requests_per_s:,.1f}", _ms(m.p50_ms),
                      _ms(m.p99_ms), f"{m.queue_depth:,.0f}", f"{m.in_flight:,.0f}",
                      f"{m.executions_per_s:,.1f}",
                      "-" if m.mean_batch is None else f"{m.mean_batch:.1f}",
                      f"[red]{m.failures_per_s:,.1f}[/red]" if m.failures_per_s
                      else "0")
    parts: list[Any] = [table]
    if generations:
        tokens = FoldingTable(title="generations", box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)
        for column in ("model", "tokens/s", "req/s", "running", "waiting", "KV used",
                       "TTFT p50 ms", "TTFT p99 ms"):
            tokens.add_column(column, justify="left" if column == "model" else "right",
                              no_wrap=True, min_width=len(column))
        for g in generations:
            tokens.add_row(_t(g.model), f"{g.output_tokens_per_s:,.1f}",
                           f"{g.requests_per_s:,.2f}", f"{g.running:,.0f}",
                           f"{g.waiting:,.0f}", f"{g.kv_usage:.0%}", _ms(g.ttft_p50_ms),
                           _ms(g.ttft_p99_ms))
        parts.append(tokens)
    if replicas:
        pools = FoldingTable(title="gateway replicas", box=box.SIMPLE_HEAD, pad_edge=False,
                             collapse_padding=True)
        for column in ("router", "pool", "replica", "req/s", "err/s", "inflight", "queued",
                       "state", "mean ms", "prefix hit"):
            pools.add_column(column, justify="left" if column in ("router", "pool",
                                                                  "replica", "state")
                             else "right", no_wrap=True, min_width=len(column))
        for r in replicas:
            pools.add_row(_t(r.router), _t(r.pool), _t(r.replica), f"{r.requests_per_s:,.1f}",
                          f"[red]{r.errors_per_s:,.1f}[/red]" if r.errors_per_s else "0",
                          f"{r.in_flight:,.0f}",
                          "-" if r.queued is None else f"{r.queued:,.0f}",
                          "up" if r.ready else "[red]out[/red]",
                          _ms(r.latency_ms),
                          "-" if r.prefix_matched is None else f"{r.prefix_matched:.0%}")
        parts.append(pools)
    return Group(*parts)
