"""``tradeoff report``: one self-contained HTML file (inline CSS and SVG, works offline)
from any mix of bench, sweep, soak, compare and optimize results.

    report = write_report([load_result(p) for p in paths], Path("report.html"))

Result files are passed between people, so nothing a file holds is markup here: every value
reaches the page through :func:`_e` (text and attribute values escaped, quotes included),
:func:`_num` or :func:`_fixed` (a number formatted, anything else escaped), and the only
script is the report's own. A plot's labels go through ``plots.label``.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tradeoff.analysis.diagnose import diagnose
from tradeoff.bench.sweep import KNEE_RULE, point_summary
from tradeoff.errors import local_resource
from tradeoff.report import plots
from tradeoff.report.terminal import accuracy_cell, soak_memory_text
from tradeoff.results import (
    BatchSizeTune,
    BenchResult,
    CompareResult,
    OptimizeResult,
    PlanResult,
    Ratio,
    ResultDocument,
    ServeTune,
    SoakResult,
    Summary,
    SweepResult,
)
from tradeoff.version import __version__

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["CSS", "RENDER_CHECK", "Report", "build_report", "write_report"]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:#111827;
margin:0;background:#f9fafb}
main{max-width:1040px;margin:0 auto;padding:24px}
h1{font-size:24px;margin:0 0 4px}h2{font-size:18px;margin:32px 0 8px;border-bottom:1px
solid #e5e7eb;padding-bottom:4px}h3{font-size:15px;margin:18px 0 6px}
.muted{color:#6b7280}.grid{display:grid;grid-template-columns:repeat(auto-fill,496px);
gap:16px}figure{background:#fff;border:1px solid #e5e7eb;border-radius:8px;margin:0;padding:8px}
figure.plot{width:496px;max-width:100%;box-sizing:border-box}figure svg{width:100%;height:auto}
figcaption{font-size:12px;color:#6b7280;padding:4px}
table{border-collapse:collapse;background:#fff;margin:8px 0;font-size:13px}
th,td{border:1px solid #e5e7eb;padding:4px 8px;text-align:right}th{background:#f3f4f6}
td.l,th.l{text-align:left}tr.knee td{background:#fef9c3;font-weight:600}
.sev{display:inline-block;border-radius:4px;padding:0 6px;font-size:12px;color:#fff}
.critical{background:#dc2626}.warning{background:#d97706}.info{background:#2563eb}
.ok{color:#16a34a}.bad{color:#dc2626}code{font-size:12px}
"""


# Marks each plot with the size the browser drew it at, so a test (or a reader of the DOM)
# can tell that every plot rendered.
RENDER_CHECK = """
document.querySelectorAll('figure.plot svg').forEach(function (svg) {
  var box = svg.getBoundingClientRect();
  var drawn = svg.querySelectorAll('path,line,rect,use,text').length;
  svg.parentNode.setAttribute('data-rendered', Math.round(box.width) + 'x' +
    Math.round(box.height) + ':' + drawn);
});
"""


def _e(value: Any) -> str:
    """``value`` as HTML text, safe in an element and in a quoted attribute alike."""
    return html.escape(str(value), quote=True)


def _num(value: Any, digits: int = 2) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return _e(value)


def _fixed(value: Any, spec: str = "g") -> str:
    """``value`` formatted by ``spec`` when it is a number, else escaped as text (a figure
    of an open-ended dict a result file holds, such as its goal or traffic)."""
    return _e(plots.number(value, spec))


def _file_name(name: str) -> str:
    """A plot's name as one plain part of a file name: a model named ``../m`` or ``a/b``
    still writes its PNG into the --png folder."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip(".")[:80] or "plot"


def _table(header: list[str], rows: list[list[str]], classes: list[str] | None = None,
           left: int = 1) -> str:
    head = "".join(f'<th class="{"l" if i < left else ""}">{_e(h)}</th>'
                   for i, h in enumerate(header))
    body = []
    for n, row in enumerate(rows):
        cls = f' class="{classes[n]}"' if classes and classes[n] else ""
        cells = "".join(f'<td class="{"l" if i < left else ""}">{c}</td>'
                        for i, c in enumerate(row))
        body.append(f"<tr{cls}>{cells}</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class Report:
    """Collects sections and figures; ``render`` gives the HTML."""

    def __init__(self, png_dir: Path | None = None) -> None:
        self.sections: list[str] = []
        self.png_dir = png_dir
        self.pngs: list[Path] = []
        self._figures = 0

    def figure(self, figure: Figure, name: str, caption: str) -> str:
        self._figures += 1
        plots.tidy(figure)
        if self.png_dir is not None:
            path = self.png_dir / f"{self._figures:02d}-{_file_name(name)}.png"
            with local_resource(f"--png: cannot write {path}"):
                self.png_dir.mkdir(parents=True, exist_ok=True)
                figure.savefig(path, dpi=150)
            self.pngs.append(path)
        return (f'<figure class="plot" data-plot="{_e(name)}">{plots.to_svg(figure)}'
                f"<figcaption>{_e(caption)}</figcaption></figure>")

    def add(self, title: str, body: str) -> None:
        self.sections.append(f"<section><h2>{_e(title)}</h2>{body}</section>")


def _told_apart(named: list[tuple[str, BenchResult]]) -> list[tuple[str, Summary]]:
    """Each curve named once: a name several results share (a bench and a comparison's
    endpoint of one model) gets each one's load beside it, and a number if that is
    shared too."""
    def at(result: BenchResult) -> str:
        load = point_summary(result).load
        return f"concurrency {load:g}" if result.load.get("mode") == "closed" else \
            f"{load:g} req/s"

    counts = Counter(name for name, _ in named)
    shown = [f"{name} at {at(result)}" if counts[name] > 1 else name
             for name, result in named]
    again = Counter(shown)
    seen: Counter[str] = Counter()
    out = []
    for name, (_, result) in zip(shown, named, strict=True):
        seen[name] += 1
        out.append((f"{name} ({seen[name]} of {again[name]})" if again[name] > 1 else name,
                    result.summary))
    return out


def _sweep_section(report: Report, sweeps: list[SweepResult]) -> None:
    by_mode: dict[str, list[SweepResult]] = {}
    for sweep in sweeps:
        by_mode.setdefault(sweep.mode, []).append(sweep)
    for mode, group in by_mode.items():
        figures = [report.figure(plots.throughput_vs_load(group), f"throughput-vs-{mode}",
                                 "Throughput at each load; the circled point is the knee."),
                   report.figure(plots.latency_vs_load(group), f"latency-vs-{mode}",
                                 "p50 (solid) and p99 (dashed); the knee is circled."),
                   report.figure(plots.frontier(group), f"frontier-{mode}",
                                 "Each point is one load level: lower and further right "
                                 "is better.")]
        generated = all(r.tokens for sweep in group for r in sweep.rows)
        if generated:
            figures.append(report.figure(plots.generation_vs_load(group),
                                         f"generation-vs-{mode}",
                                         "TTFT and TPOT: p50 (solid), p99 (dashed)."))
        tables = []
        for sweep in group:
            knee = sweep.knee
            rows, classes = [], []
            for r in sweep.rows:
                t = r.tokens
                extra = [_num(t.output_tokens_per_s, 1), _num(t.ttft_p50_ms),
                         _num(t.ttft_p99_ms), _num(t.tpot_p50_ms)] if generated and t else []
                rows.append([_num(r.load), _num(r.throughput_rps, 1), *extra,
                             _num(r.p50_ms), _num(r.p99_ms), _num(r.error_percent, 1)])
                classes.append("knee" if knee and r.load == knee.load else "")
            sla = sweep.sla
            sla_text = ""
            if sla:
                sla_text = (f"<p>SLA p99 &le; {_fixed(sla.p99_ms)} ms: highest load meeting it "
                            f"<b>{_num(sla.best_load)}</b></p>")
            name = _e(sweep.label)
            tables.append(
                f"<h3>{name}</h3>" + _table(
                    [mode, "req/s",
                     *(["tok/s", "TTFT p50", "TTFT p99", "TPOT p50"] if generated else []),
                     "p50 ms", "p99 ms", "errors %"], rows, classes)
                + "<p class='muted'>knee: "
                + (f"{_e(mode)} {_fixed(knee.load)} ({_fixed(knee.throughput_rps, ',.0f')} "
                   "req/s, p99 "
                   f"{_num(knee.p99_ms)} ms)" if knee else "not reached")
                + f"; stopped: {_e(sweep.stop_reason)}</p>" + sla_text)
        rule = (f"<p class='muted'>Knee rule: {_e(KNEE_RULE)}.</p>")
        report.add(f"Sweep over {mode}",
                   f"<div class='grid'>{''.join(figures)}</div>{''.join(tables)}{rule}")


def _compare_section(report: Report, compare: CompareResult) -> None:
    rows = []
    for entry in compare.endpoints:
        s = entry.result.summary
        ratio = compare.ratios_of(entry.name).metrics
        rows.append([_e(entry.name), _num(s.throughput_rps, 1), _ratio_html(ratio["throughput"]),
                     _num(s.latency("p50")), _ratio_html(ratio["p50"]), _num(s.latency("p99")),
                     _ratio_html(ratio["p99"]), _num(s.errors)])
    table = _table(["endpoint", "req/s", "x baseline [95% CI]", "p50 ms", "x baseline",
                    "p99 ms", "x baseline", "errors"], rows)
    if all("output_tokens_per_s" in r.metrics for r in compare.ratios):
        table += "<h3>Generations</h3>" + _generation_compare_table(compare)
    checks = _table(["check", "result", "detail"], [
        [_e(c.check), "<span class='ok'>ok</span>" if c.ok else
         "-" if c.ok is None else "<span class='bad'>differs</span>", _e(c.detail)]
        for c in compare.fairness.checks], left=3)
    profiles = _table(["endpoint", "format", "precision", "server", "batching", "instances",
                       "hardware", "other facts"], [
        [_e(e.name)] + [_e(e.profile["checklist"][k]) for k in
                        ("format", "precision", "server", "batching", "instances",
                         "hardware")]
        + [_e(", ".join(f"{k}={v}" for k, v in e.profile.get("facts", {}).items()) or "-")]
        for e in compare.endpoints], left=8)
    ranking = _table(["rank", "endpoint", "req/s", "p99 ms", "cost / 1M req", "score",
                      "SLA"], [
        [_num(c["rank"]), _e(c["name"]), _num(c["throughput_rps"], 1), _num(c["p99_ms"]),
         _num(c["cost_per_million"], 4), _num(c["score"], 3),
         "met" if c["meets_sla"] else _e("; ".join(map(str, c["sla_misses"])))]
        for c in compare.ranking], left=2)
    how = (f"{compare.rounds} interleaved round(s)" if compare.fairness.interleaved
           else "from result files")
    report.add(f"Comparison (baseline {compare.baseline}, {how})",
               "<div class='grid'>"
               + report.figure(plots.comparison(compare), "comparison",
                               "Bars: pooled figures; whiskers: 95% bootstrap interval.")
               + "</div>" + table + "<h3>Fairness</h3>" + checks + "<h3>Endpoint profiles</h3>"
               + profiles
               + f"<h3>Cost and score (alpha {_fixed(compare.score.get('alpha'))})</h3>"
               + ranking)


def _ratio_html(value: Ratio) -> str:
    text = _num(value.ratio, 3)
    if value.ci95:
        text += (f" <span class='muted'>[{_fixed(value.ci95[0], '.3f')}, "
                 f"{_fixed(value.ci95[1], '.3f')}]</span>")
    return text


def _generation_compare_table(compare: CompareResult) -> str:
    rows = []
    for entry in compare.endpoints:
        g, r = entry.result.summary.generation, compare.ratios_of(entry.name).metrics
        if g is None:
            continue
        ttft, tpot = g.ttft_ms or {}, g.tpot_ms or {}
        rows.append([_e(entry.name), _num(g.output_tokens_per_s, 1),
                     _ratio_html(r["output_tokens_per_s"]), _num(ttft.get("p50")),
                     _ratio_html(r["ttft_p50"]), _num(ttft.get("p99")),
                     _ratio_html(r["ttft_p99"]), _num(tpot.get("p50")),
                     _ratio_html(r["tpot_p50"]), _num(g.goodput_rps, 2)])
    return _table(["endpoint", "tok/s", "x baseline [95% CI]", "TTFT p50 ms", "x baseline",
                   "TTFT p99 ms", "x baseline", "TPOT p50 ms", "x baseline", "goodput req/s"],
                  rows)


def _generation_table(benches: list[BenchResult]) -> str:
    rows = []
    for b in benches:
        g = b.summary.generation
        if g is None:
            continue
        d = [g.ttft_ms or {}, g.itl_ms or {}, g.tpot_ms or {}]
        length = g.output_length
        rows.append([_e(b.label), _num(b.summary.throughput_rps, 2),
                     _num(g.output_tokens_per_s, 1),
                     *(_num(dist.get(q)) for dist in d for q in ("p50", "p99")),
                     _num(g.goodput_rps, 2),
                     "yes" if length.honoured else
                     f"<span class='bad'>{_e(length.shorter)} short, {_e(length.longer)} "
                     "long</span>"])
    return _table(["endpoint", "req/s", "tok/s", "TTFT p50", "TTFT p99", "ITL p50", "ITL p99",
                   "TPOT p50", "TPOT p99", "goodput", "lengths as asked"], rows, left=1)


def _soak_section(report: Report, soak: SoakResult) -> None:
    verdict = soak.verdict
    reasons = "".join(f"<li>{_e(r['text'])}</li>" for r in verdict.reasons) or \
        "<li>no drift, error burst or memory growth found</li>"
    notes = "".join(f"<li class='muted'>{_e(n)}</li>" for n in verdict.notes)
    memory = verdict.trends.get("memory")
    if memory:
        flagged = any(r["kind"] == "memory_growth" for r in verdict.reasons)
        notes += f"<li>{_e(soak_memory_text(memory, flagged))}</li>"
    report.add(f"Soak: {soak.label}",
               report.figure(plots.soak_timeline(soak), "soak",
                             "Throughput and p99 per window; server memory below.")
               + f"<p>Verdict: <b class='{'ok' if verdict.stable else 'bad'}'>"
               + ("stable" if verdict.stable else "unstable") + f"</b></p><ul>{reasons}"
               + f"{notes}</ul>")


def _optimize_section(report: Report, result: OptimizeResult) -> None:
    """The versions of one model from ``tradeoff optimize``: speed in process and
    accuracy against the original, a version over the max drop marked."""
    rows, classes = [], []
    for v in result.versions:
        latency_ratio, throughput_ratio = result.speedup(v)
        rows.append([_e(v.version), _e(v.precision), _e(v.method),
                     _num(v.size_bytes / 1e6, 1), _num(v.latency_ms["p50"]),
                     _num(latency_ratio), _num(v.best_throughput, 1), _e(v.best_batch),
                     _num(throughput_ratio), _e(accuracy_cell(result, v.version))])
        classes.append("bad" if result.over_max_drop(v) else "")
    report.add(f"Optimized versions of {result.model}",
               _table(["version", "precision", "how it was made", "MB", "batch 1 p50 ms",
                       "x", "best samples/s", "at batch", "x", "accuracy vs original"],
                      rows, classes, left=3)
               + f"<p class='muted'>In process, {_e(result.environment.get('intra_op_threads'))}"
               f" thread(s); accuracy on {_e(result.validation['samples'])} samples from "
               f"{_e(result.validation['source'])}; max drop {_fixed(result.max_drop)} "
               "(marked rows lose more).</p>")


def _batch_size_section(report: Report, result: BatchSizeTune) -> None:
    """``tradeoff tune batch-size``: the curve, the table and the recommendation."""
    rows = []
    for p in result.points:
        latency = p.latency_ms or {}
        note = p.error or ("over --max-memory" if not p.fits else
                           "recommended" if p.batch_size == result.recommended else
                           "knee" if p.batch_size == result.knee else p.role)
        rows.append([_e(p.batch_size), _num(p.samples_per_s, 0), _num(latency.get("p50")),
                     _num(latency.get("p99")),
                     _num(None if p.memory_bytes is None else p.memory_bytes / 1e6, 1),
                     _e(note)])
    m = result.memory
    memory = (f"model {m.weights_bytes / 1e6:,.1f} MB; "
              + ("memory per sample not measurable" if m.per_sample_bytes is None else
                 f"{m.per_sample_bytes / 1e6:,.3f} MB per sample"))
    if m.max_memory_bytes is not None:
        memory += (f"; largest batch within {m.max_memory_bytes / 1e6:,.0f} MB: formula "
                   f"{_e(m.estimated_max_batch)}, measured {_e(m.largest_fit)}")
    report.add(f"Batch size of {result.model}",
               report.figure(plots.batch_size_curve(result), f"batch-size-{result.model}",
                             "Samples per second (left) and batch p99 (right) by batch size.")
               + f"<p>Recommended batch size: <b>{_e(result.recommended)}</b>: "
               f"{_e(result.why)}. Stopped: {_e(result.stop_reason)}.</p>"
               + _table(["batch", "samples/s", "p50 ms", "p99 ms", "peak MB", ""], rows,
                        left=0)
               + f"<p class='muted'>{_e(m.source)}: {memory}.</p>")


def _serve_tune_section(report: Report, result: ServeTune) -> None:
    """``tradeoff tune serve``: the Pareto plot and every configuration tried."""
    rows, classes = [], []
    for t in result.trials:
        marks = [m for m, on in (("winner", t.name == result.winner),
                                 ("server's config", t.name == result.baseline),
                                 ("pareto", t.pareto)) if on]
        if t.status != "measured":
            marks.append(f"{t.status}: {t.reason}")
        elif not t.meets_sla:
            marks.append("misses the SLA")
        rows.append([_e(t.name), _num(t.throughput_rps, 1), _num(t.p50_ms), _num(t.p99_ms),
                     _num(t.error_percent, 1), _num(t.cost_per_million, 3),
                     _e(", ".join(marks))])
        classes.append("ok" if t.name == result.winner else
                       "bad" if t.status != "measured" or not t.meets_sla else "")
    goal = result.goal
    report.add(f"Serving configuration of {result.model}",
               report.figure(plots.pareto(result), f"tune-{result.model}",
                             "p99 against throughput of each configuration tried.")
               + _table(["configuration", "req/s", "p50 ms", "p99 ms", "errors %", "$/1M",
                         ""], rows, classes, left=1)
               + f"<p class='muted'>SLA p99 &le; {_fixed(goal.get('sla_p99_ms'))} ms, "
               f"{_e(goal.get('objective'))}, {_e(goal.get('strategy'))} search: "
               f"{len(result.trials)} of {_e(result.grid_size)} configurations in "
               f"{_fixed(result.elapsed_s, ',.0f')} s; {_e(result.stop_reason)}.</p>")


def _plan_section(report: Report, result: PlanResult) -> None:
    """``tradeoff plan``: the front of cost, p99 and accuracy, the chosen deployment, the
    levers, and the replay measured next to predicted."""
    goal = result.goal
    generative = goal.get("sla_tpot_ms") is not None  # p50, p99: time to first token
    rows, classes = [], []
    for c in [*result.candidates[:12], result.baseline]:
        starting = c is result.baseline
        marks = [m for m, on in (("chosen", c.name == result.chosen), ("pareto", c.pareto),
                                 ("starting deployment", starting),
                                 ("misses the SLA", not c.meets_sla)) if on]
        p = c.predicted
        rows.append([_e(c.name), _e(c.cores), _num(p.p50_ms), _num(p.p99_ms),
                     *([_num(p.tpot_p99_ms)] if generative else []),
                     _num(p.mean_batch, 1), _fixed(p.hit_ratio, ".0%")
                     if c.cache_bytes or c.knobs.get("prefix_caching") else "-",
                     _fixed(c.drop, ".2%"), _num(c.cost_per_million, 3),
                     _e(", ".join(marks))])
        classes.append("ok" if c.name == result.chosen and not starting else
                       "bad" if not c.meets_sla else "")
    levers = [[_e(lever.lever), "taken" if lever.taken else "left", _e(lever.why)]
              for lever in result.levers]
    proof = []
    for r in result.proof:
        proof.append([_e(f"{r.role}: {r.name}"), _num(r.p99_ms) if r.classes else
                      f"{_num(r.p99_ms)} ({_num(r.predicted.p99_ms)})"
                      + (f"; TPOT {_num(r.tpot_p99_ms)} ({_num(r.predicted.tpot_p99_ms)})"
                         if generative else ""),
                      f"{_num(r.mean_batch, 1)} ({_num(r.predicted.mean_batch, 1)})",
                      "-" if r.hit_ratio is None else
                      f"{_fixed(r.hit_ratio, '.0%')} ({_fixed(r.predicted.hit_ratio, '.0%')})",
                      _num(r.throughput_rps, 1), _num(r.error_percent, 1),
                      _num(r.cost_per_million, 3), "met" if r.meets_sla else "missed"])
        proof += [[_e(f"class {c.request_class} (p99 ≤ {plots.number(c.sla_p99_ms)} ms"
                      + (f", TPOT ≤ {plots.number(c.sla_tpot_ms)} ms)" if c.sla_tpot_ms
                         else ")")),
                   f"{_num(c.p99_ms)} ({_num(c.predicted.p99_ms)})"
                   + (f"; TPOT {_num(c.tpot_p99_ms)} ({_num(c.predicted.tpot_p99_ms)})"
                      if c.sla_tpot_ms else ""), "", "", "",
                   _num(c.error_percent, 1), "", "met" if c.meets_sla else "missed"]
                  for c in r.classes]
    traffic = result.traffic
    report.add(f"Plan for {result.model}",
               report.figure(plots.plan_front(result), f"plan-{result.model}",
                             "Predicted p99 against cost of each deployment kept, by the "
                             "accuracy its version lost; crosses: measured on replay.")
               + f"<p><b>{_e(result.verdict)}</b></p>"
               + (f"<p class='muted'>SLA TTFT p99 &le; {_fixed(goal.get('sla_p99_ms'))} ms, "
                  f"TPOT p99 &le; {_fixed(goal.get('sla_tpot_ms'))} ms; traffic " if generative
                  else f"<p class='muted'>SLA p99 &le; {_fixed(goal.get('sla_p99_ms'))} ms; "
                  "traffic ")
               + f"{_e(traffic.get('source'))}: {_fixed(traffic.get('rate_rps'), ',.1f')} req/s, "
               f"peak {_fixed(traffic.get('peak_rps'), ',.0f')}/s, burstiness "
               f"{_fixed(traffic.get('burstiness'), '.2f')}; "
               f"{_e(result.stop_reason)}; deployment written to {_e(result.output)}.</p>"
               + _table(["deployment", "cores", "TTFT p50", "TTFT p99", "TPOT p99", "seqs",
                         "prefix hits", "perplexity rise", "$/1M tokens", ""] if generative
                        else ["deployment", "cores", "p50 ms", "p99 ms", "batch", "cache hits",
                              "accuracy lost", "$/1M", ""], rows, classes, left=1)
               + "<h3>Levers</h3>" + _table(["lever", "", "why"], levers, left=3)
               + ("<h3>Replayed (measured, predicted in brackets)</h3>"
                  + _table(["deployment", "TTFT p99 ms" if generative else "p99 ms",
                            "batch", "cache hits", "req/s",
                            "errors %", "$/1M", "SLA"], proof, left=1) if proof else ""))


def _findings_section(report: Report, documents: Sequence[ResultDocument]) -> None:
    """Every result's findings, each saying which result (its kind and number in the
    report's list) it came from: two results of one model find alike things."""
    rows = []
    for number, doc in enumerate(documents, 1):
        kind = doc.schema.removeprefix("tradeoff.").split("/")[0]
        source = f"{kind} #{number}"
        for f in diagnose(doc):
            rows.append([f"<span class='sev {_e(f.severity)}'>{_e(f.severity)}</span>",
                         _e(source), _e(f.subject), _e(f.title), _e(f.action)])
    report.add("Findings", _table(["severity", "from", "subject", "finding", "what to do"],
                                  rows, left=5)
               + "<p class='muted'>from: the kind of result and its place in the order "
               "the results were given.</p>" if rows else "<p>No findings.</p>")


def _environment_section(report: Report, documents: Sequence[ResultDocument]) -> None:
    seen = []
    for doc in documents:
        env = doc.environment
        if env and env not in seen:
            seen.append(env)
    rows = [[_e(k), _e(v)] for env in seen for k, v in env.items()]
    report.add("Environment", _table(["", "client"], rows, left=2))


def build_report(documents: Sequence[ResultDocument], png_dir: Path | None = None,
                 title: str = "tradeoff report") -> tuple[str, Report]:
    """The HTML text for these result documents, and the Report it was made of."""
    report = Report(png_dir)
    sweeps = [d for d in documents if isinstance(d, SweepResult)]
    benches = [d for d in documents if isinstance(d, BenchResult)]
    compares = [d for d in documents if isinstance(d, CompareResult)]
    soaks = [d for d in documents if isinstance(d, SoakResult)]
    optimized = [d for d in documents if isinstance(d, OptimizeResult)]
    if sweeps:
        _sweep_section(report, sweeps)
    for compare in compares:
        _compare_section(report, compare)
    named = [(b.label, b) for b in benches]
    named += [(e.name, e.result) for c in compares for e in c.endpoints]
    for sweep in sweeps:
        point = sweep.point_at(sweep.knee.load) if sweep.knee else None
        if point:
            named.append((f"{sweep.label} at knee", point))
    latencies = _told_apart([(n, result) for n, result in named if result.summary.latency_ms])
    if benches:
        rows = [[_e(b.label), _e(b.load["mode"]), _num(p.load),
                 _num(p.throughput_rps, 1), _num(p.p50_ms), _num(p.p99_ms),
                 _num(p.error_percent, 1)]
                for b in benches for p in [point_summary(b)]]
        generations = [b for b in benches if b.summary.generation]
        timed = [(b.label, b.summary) for b in benches if b.summary.timeline]
        over = report.figure(plots.over_the_run(timed), "over-the-run",
                             "Throughput and latency per second of the measurement (longer "
                             "bins for long runs), from every request.") if timed else ""
        report.add("Benchmarks", over + _table(["endpoint", "mode", "load", "req/s",
                                                "p50 ms", "p99 ms", "errors %"], rows, left=2)
                   + ("<h3>Generations (ms)</h3>" + _generation_table(generations)
                      if generations else ""))
    if latencies:
        report.add("Latency distribution",
                   report.figure(plots.latency_cdf(latencies), "latency-cdf",
                                 "From each run's own requests, every percentile and "
                                 "the tail (dashed: a result that kept only p50 ... "
                                 "p99.9)."))
    for soak in soaks:
        _soak_section(report, soak)
    for document in optimized:
        _optimize_section(report, document)
    for tuned in documents:
        if isinstance(tuned, BatchSizeTune):
            _batch_size_section(report, tuned)
        elif isinstance(tuned, ServeTune):
            _serve_tune_section(report, tuned)
        elif isinstance(tuned, PlanResult):
            _plan_section(report, tuned)
    _findings_section(report, documents)
    _environment_section(report, documents)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!doctype html><html lang='en'><head><meta charset='utf-8'>"
            f"<meta name='viewport' content='width=device-width,initial-scale=1'>"
            f"<title>{_e(title)}</title><style>{CSS}</style></head><body><main>"
            f"<h1>{_e(title)}</h1><p class='muted'>tradeoff {__version__}, {stamp}, "
            f"{len(documents)} result(s)</p>{''.join(report.sections)}</main>"
            f"<script>{RENDER_CHECK}</script></body></html>")
    return page, report


def write_report(documents: Sequence[ResultDocument], path: Path,
                 png_dir: Path | None = None, title: str = "tradeoff report") -> Report:
    """Write the report to ``path``; returns the Report (its ``pngs`` were written too)."""
    page, report = build_report(documents, png_dir, title)
    with local_resource(f"cannot write {path}"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(page)
    return report
