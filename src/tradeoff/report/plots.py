"""The report's plots, drawn with matplotlib (no browser-side code, no CDN).

Each function returns a Figure; ``to_svg`` inlines it in the HTML report and ``--png``
saves the same figure as a file. Every text a result file gave (a name, a mode, a model)
goes through :func:`label`, so matplotlib draws it as written and never parses it as
mathtext; :func:`number` formats a figure from an open-ended dict without failing on text.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from functools import cache
from itertools import cycle, islice
from typing import TYPE_CHECKING, Any

from tradeoff.errors import MissingDependency
from tradeoff.results import (
    BatchSizeTune,
    CompareResult,
    PlanResult,
    ServeTune,
    SoakResult,
    Summary,
    SweepResult,
)
from tradeoff.stats.distribution import PERCENTILES, QUANTILES

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = [
    "COLORS",
    "batch_size_curve",
    "comparison",
    "frontier",
    "generation_vs_load",
    "label",
    "latency_cdf",
    "latency_vs_load",
    "number",
    "over_the_run",
    "pareto",
    "plan_front",
    "require",
    "soak_timeline",
    "throughput_vs_load",
    "tidy",
    "to_svg",
]

COLORS = ("#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563")


@cache
def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend, imported on first use: matplotlib is the
    ``report`` extra, and nothing but drawing a plot needs it."""
    try:
        import matplotlib
    except ImportError:
        raise MissingDependency("the HTML report", "matplotlib", "report") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # every figure is drawn 6.4 in wide and shown 500-520 px wide (html.py): these sizes
    # read as 11-12 px text there
    plt.rcParams.update({"svg.fonttype": "none", "font.size": 10, "axes.titlesize": 10,
                         "legend.fontsize": 9, "axes.spines.top": False,
                         "axes.spines.right": False, "axes.grid": True, "grid.alpha": 0.3})
    return plt


def label(text: object) -> str:
    """``text`` as matplotlib draws it literally: every ``$`` escaped, so a name such as
    ``$\\foo$`` is neither mathtext nor a parse error (matplotlib shows ``\\$`` as ``$``).

        axes.set_title(label(f"{result.model}: configurations tried"))
    """
    return str(text).replace("$", "\\$")


def number(value: object, spec: str = "g") -> str:
    """``value`` formatted by ``spec`` when it is a number; any other value (a string in an
    open-ended dict of a result file) as its text, so a label is written, not a crash."""
    return format(value, spec) if _is_number(value) else str(value)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def require() -> None:
    """Raise MissingDependency now, before any work, when the plots cannot be drawn."""
    _pyplot()


def _plain_log_axis(axes: Any) -> None:
    """Log-scale tick labels as plain numbers (1, 2, 4 ... not 2^0, 2^1)."""
    from matplotlib.ticker import FuncFormatter, LogLocator

    plain = FuncFormatter(lambda value, _: f"{value:g}")
    for axis in (axes.xaxis, axes.yaxis):
        if axis.get_scale() == "log":
            if axis is axes.yaxis:
                axis.set_major_locator(LogLocator(10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(plain)
            axis.set_minor_formatter(FuncFormatter(lambda value, _: ""))


def _figure() -> tuple[Figure, Any]:
    figure, axes = _pyplot().subplots(figsize=(6.4, 3.6), layout="constrained")
    return figure, axes


def _knee_marker(axes: Any, x: float | None, y: float | None, color: str) -> None:
    if x is None or y is None:
        return
    axes.plot([x], [y], marker="o", markersize=11, markerfacecolor="none",
              markeredgecolor=color, markeredgewidth=2, zorder=5)
    axes.annotate("knee", (x, y), textcoords="offset points", xytext=(6, -14), color=color,
                  fontweight="bold")


def throughput_vs_load(sweeps: list[SweepResult]) -> Figure:
    figure, axes = _figure()
    mode = sweeps[0].mode
    tokens = all(r.tokens for s in sweeps for r in s.rows)
    for color, sweep in zip(cycle(COLORS), sweeps):
        rows = sweep.rows
        axes.plot([r.load for r in rows], [r.work_rate for r in rows], "o-",
                  color=color, label=label(sweep.label))
        if sweep.knee:
            _knee_marker(axes, sweep.knee.load, sweep.knee.work_rate, color)
    axes.set_xscale("log", base=2)
    axes.set_xlabel("concurrency" if mode == "concurrency" else "offered rate (req/s)")
    axes.set_ylabel("output tokens/s" if tokens else "throughput (req/s)")
    axes.set_title(label(f"Throughput vs {mode}"))
    axes.legend()
    return figure


def latency_vs_load(sweeps: list[SweepResult]) -> Figure:
    figure, axes = _figure()
    mode = sweeps[0].mode
    for color, sweep in zip(cycle(COLORS), sweeps):
        rows = [r for r in sweep.rows if r.p99_ms is not None]
        loads = [r.load for r in rows]
        axes.plot(loads, [r.p50_ms for r in rows], "o-", color=color,
                  label=label(f"{sweep.label} p50"))
        axes.plot(loads, [r.p99_ms for r in rows], "s--", color=color, alpha=0.7,
                  label=label(f"{sweep.label} p99"))
        if sweep.knee:
            _knee_marker(axes, sweep.knee.load, sweep.knee.p99_ms, color)
    axes.set_xscale("log", base=2)
    axes.set_yscale("log")
    axes.set_xlabel("concurrency" if mode == "concurrency" else "offered rate (req/s)")
    axes.set_ylabel("latency (ms)")
    axes.set_title(label(f"p50 and p99 latency vs {mode}"))
    axes.legend()
    return figure


def frontier(sweeps: list[SweepResult]) -> Figure:
    """p99 against throughput: the lower-right envelope is the best trade-off on offer."""
    figure, axes = _figure()
    for color, sweep in zip(cycle(COLORS), sweeps):
        rows = [r for r in sweep.rows if r.p99_ms is not None]
        axes.plot([r.throughput_rps for r in rows], [r.p99_ms for r in rows], "o-",
                  color=color, label=label(sweep.label))
        for r in rows:
            axes.annotate(number(r.load), (r.throughput_rps, r.p99_ms), fontsize=8,
                          textcoords="offset points", xytext=(3, 3), color=color)
        if sweep.knee:
            _knee_marker(axes, sweep.knee.throughput_rps, sweep.knee.p99_ms, color)
    axes.set_yscale("log")
    axes.set_xlabel("throughput (req/s)")
    axes.set_ylabel("p99 latency (ms)")
    axes.set_title("Latency-throughput frontier (labels: load)")
    axes.legend()
    return figure


def batch_size_curve(result: BatchSizeTune) -> Figure:
    """Samples/s and batch latency over the batch size, the knee and the recommendation
    marked."""
    figure, axes = _figure()
    ran = [p for p in result.points if p.samples_per_s is not None]
    doubling = [p for p in ran if p.role == "doubling"]
    axes.plot([p.batch_size for p in doubling], [p.samples_per_s for p in doubling], "o-",
              color=COLORS[0], label="samples/s")
    others = [p for p in ran if p.role != "doubling"]
    axes.plot([p.batch_size for p in others], [p.samples_per_s for p in others], "o",
              color=COLORS[0], alpha=0.4, label="back-off and memory probes")
    knee = result.point(result.knee) if result.knee is not None else None
    if knee is not None:
        _knee_marker(axes, knee.batch_size, knee.samples_per_s, COLORS[0])
    chosen = result.point(result.recommended)
    if chosen is not None and chosen.samples_per_s is not None:
        axes.plot([chosen.batch_size], [chosen.samples_per_s], marker="*", markersize=14,
                  color=COLORS[2], linestyle="none",
                  label=label(f"recommended ({chosen.batch_size})"))
    latency = axes.twinx()
    latency.plot([p.batch_size for p in doubling],
                 [(p.latency_ms or {}).get("p99") for p in doubling], "s--", color=COLORS[1],
                 alpha=0.7, label="batch p99 ms")
    latency.set_ylabel("batch p99 (ms)")
    latency.set_yscale("log")
    axes.set_xscale("log", base=2)
    _plain_log_axis(axes)
    axes.set_xlabel("batch size")
    axes.set_ylabel("samples/s")
    axes.set_title(label(f"{result.model}: throughput and latency by batch size"))
    lines, labels = axes.get_legend_handles_labels()
    more, more_labels = latency.get_legend_handles_labels()
    axes.legend(lines + more, labels + more_labels)
    return figure


def pareto(result: ServeTune) -> Figure:
    """p99 against throughput of every configuration tried: the Pareto front joined, the
    SLA drawn, the winner starred."""
    figure, axes = _figure()
    measured = [t for t in result.trials if t.status == "measured" and t.p99_ms]
    for meets, color, kind in ((True, COLORS[0], "meets the SLA"),
                               (False, COLORS[6], "misses the SLA")):
        chosen = [t for t in measured if t.meets_sla == meets]
        axes.plot([t.throughput_rps for t in chosen], [t.p99_ms for t in chosen], "o",
                  color=color, alpha=0.8, label=kind)
    front = sorted((t for t in measured if t.pareto), key=lambda t: t.throughput_rps or 0)
    axes.plot([t.throughput_rps for t in front], [t.p99_ms for t in front], "-",
              color=COLORS[2], label="Pareto front")
    winner = result.trial(result.winner)
    if winner is not None:
        axes.plot([winner.throughput_rps], [winner.p99_ms], marker="*", markersize=16,
                  color=COLORS[2], linestyle="none", label="winner")
    _sla_line(axes, result.goal.get("sla_p99_ms"))
    axes.set_yscale("log")
    axes.set_xlabel("throughput (req/s)")
    axes.set_ylabel("p99 latency (ms)")
    axes.set_title(label(f"{result.model}: configurations tried"))
    axes.legend()
    return figure


def plan_front(result: PlanResult) -> Figure:
    """Predicted p99 against cost (cores without a price) of the candidates kept, marked
    by the accuracy their version lost; the Pareto front joined, the chosen starred, the
    starting deployment and each replay's measured p99 drawn beside their predictions."""
    figure, axes = _figure()

    finite = [c for c in result.candidates if math.isfinite(c.predicted.p99_ms)]
    for color, drop in zip(cycle(COLORS), sorted({c.drop for c in finite})):
        chosen = [c for c in finite if c.drop == drop]
        axes.plot([c.cost for c in chosen], [c.predicted.p99_ms for c in chosen], "o",
                  color=color, alpha=0.6,
                  label=label(f"predicted, {number(drop, '.2%')} accuracy lost"))
    front = sorted((c for c in finite if c.pareto), key=lambda c: c.cost)
    axes.plot([c.cost for c in front], [c.predicted.p99_ms for c in front], "-",
              color=COLORS[2], label="Pareto front")
    best = result.candidate(result.chosen)
    if best is not None and math.isfinite(best.predicted.p99_ms):
        axes.plot([best.cost], [best.predicted.p99_ms], marker="*", markersize=16,
                  color=COLORS[2], linestyle="none", label="chosen (predicted)")
    if math.isfinite(result.baseline.predicted.p99_ms):
        axes.plot([result.baseline.cost], [result.baseline.predicted.p99_ms], marker="s",
                  color=COLORS[6], linestyle="none", label="starting deployment (predicted)")
    for replayed in result.proof:
        source = result.baseline if replayed.role == "baseline" else \
            result.candidate(replayed.name)
        if source is not None and replayed.p99_ms is not None:
            axes.plot([source.cost], [replayed.p99_ms], marker="x", markersize=10,
                      color=COLORS[1] if replayed.role == "baseline" else COLORS[3],
                      linestyle="none", label=label(f"{replayed.role}, replayed"))
    _sla_line(axes, result.goal.get("sla_p99_ms"))
    priced = any(c.cost_per_million is not None for c in result.candidates)
    axes.set_yscale("log")
    if not priced:  # whole cores: integer ticks, and room around a single one
        cores = [c.cost for c in result.candidates] + [result.baseline.cost]
        from matplotlib.ticker import MaxNLocator

        axes.xaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        axes.set_xlim(min(cores) - 0.5, max(cores) + 0.5)
    axes.set_xlabel("cost per 1M requests" if priced else "cores")
    axes.set_ylabel("p99 latency (ms)")
    axes.set_title(label(f"{result.model}: deployments for "
                         f"{number(result.traffic.get('rate_rps'), ',.0f')} req/s"))
    handles, labels = axes.get_legend_handles_labels()
    unique = dict(zip(labels, handles, strict=True))
    axes.legend(unique.values(), unique.keys())
    return figure


def latency_cdf(named: list[tuple[str, Summary]]) -> Figure:
    """The latency CDF of each result, from its quantiles of every request (QUANTILES);
    a result written before they were kept is drawn dashed through its percentiles."""
    figure, axes = _figure()
    for color, (name, summary) in zip(cycle(COLORS), named):
        latency = summary.latency_ms or {}
        if summary.latency_quantiles_ms:
            xs = summary.latency_quantiles_ms
            ys = [q / 100 for q in QUANTILES]
            style = "-"
        else:
            points = [(latency["min"], 0.0)] + [(latency[k], q / 100) for k, q in
                                                PERCENTILES.items()] + [(latency["max"], 1.0)]
            xs, ys, style = [p[0] for p in points], [p[1] for p in points], "o--"
        axes.plot(xs, ys, style, color=color, label=label(name), markersize=3)
    axes.set_xscale("log")
    axes.set_xlabel("latency (ms)")
    axes.set_ylabel("fraction of requests")
    axes.set_title("Latency CDF")
    axes.legend()
    return figure


WIDE_RANGE = 20.0  # values this many times apart on one axis: a log scale shows both


def _spread(values: list[float | None]) -> float:
    """The largest over the smallest positive value (1 when fewer than two)."""
    positive = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    return max(positive) / min(positive) if len(positive) > 1 else 1.0


def over_the_run(named: list[tuple[str, Summary]]) -> Figure:
    """Throughput (top) and p50/p99 latency (bottom) over each run's measurement, from
    its requests (``Summary.timeline``); a generation's latency is its whole answer's.
    Runs far apart (a 0.6 ms model beside a 5 s answer) share log axes."""
    figure, (top, bottom) = _pyplot().subplots(2, 1, figsize=(6.4, 4.6), sharex=True,
                                               layout="constrained")
    rates: list[float | None] = []
    latencies: list[float | None] = []
    for color, (name, summary) in zip(cycle(COLORS), named):
        line = summary.timeline or {}
        bin_s = line.get("bin_s", 1.0)
        ends = [bin_s * (i + 1) for i in range(len(line.get("throughput_rps", [])))]
        top.plot(ends, line["throughput_rps"], "-", color=color, label=label(name))
        rates += line["throughput_rps"]
        whole = " (whole answer)" if summary.generation else ""
        for key, style in (("p50_ms", "-"), ("p99_ms", "--")):
            values = [float("nan") if v is None else v for v in line[key]]
            latencies += line[key]
            bottom.plot(ends, values, style, color=color,
                        label=label(f"{name} {key.removesuffix('_ms')}{whole}"))
    for axes, values in ((top, rates), (bottom, latencies)):
        if _spread(values) > WIDE_RANGE:
            axes.set_yscale("log")
            _plain_log_axis(axes)
    top.set_ylabel("req/s")
    top.set_title("Over the run (each point: the requests that ended in its bin)")
    top.legend()
    bottom.set_ylabel("latency (ms)")
    bottom.set_xlabel("seconds into the measurement")
    bottom.legend()
    return figure


def soak_timeline(soak: SoakResult) -> Figure:
    figure, (top, bottom) = _pyplot().subplots(2, 1, figsize=(6.4, 4.6), sharex=True,
                                         layout="constrained")
    windows = soak.result.windows
    ends, t = [], 0.0
    for w in windows:
        t += w.duration_s
        ends.append(t)
    top.plot(ends, [w.throughput_rps for w in windows], "o-", color=COLORS[0],
             label="throughput")
    top.set_ylabel("req/s")
    right = top.twinx()
    right.plot(ends, [w.p99_ms for w in windows], "s--", color=COLORS[1], label="p99")
    right.set_ylabel("p99 ms", color=COLORS[1])
    top.set_title(f"Soak at {soak.rate_rps:,.0f} req/s: "
                  + ("stable" if soak.verdict.stable else "UNSTABLE"))
    samples = soak.memory.samples
    if samples:
        bottom.plot([s[0] for s in samples], [s[1] / 2**20 for s in samples], color=COLORS[2])
        bottom.set_ylabel("server RSS (MiB)")
    else:
        bottom.text(0.5, 0.5, "server memory not watched (--server-pid or --prometheus-url)",
                    ha="center", va="center", transform=bottom.transAxes)
    bottom.set_xlabel("seconds into the soak")
    return figure


def generation_vs_load(sweeps: list[SweepResult]) -> Figure:
    """TTFT (p50, p99) and TPOT (p50, p99) at each load of LLM sweeps."""
    figure, (left, right) = _pyplot().subplots(1, 2, figsize=(6.4, 3.2), layout="constrained")
    mode = sweeps[0].mode
    for color, sweep in zip(cycle(COLORS), sweeps):
        rows = [(r.load, r.tokens) for r in sweep.rows
                if r.tokens and r.tokens.ttft_p50_ms is not None]
        loads = [load for load, _ in rows]
        for axes, key in ((left, "ttft"), (right, "tpot")):
            axes.plot(loads, [getattr(t, f"{key}_p50_ms") for _, t in rows], "o-",
                      color=color, label=label(f"{sweep.label} p50"))
            axes.plot(loads, [getattr(t, f"{key}_p99_ms") for _, t in rows], "s--",
                      color=color, alpha=0.7, label=label(f"{sweep.label} p99"))
    for axes, title in ((left, "time to first token (ms)"),
                        (right, "time per output token (ms)")):
        axes.set_xscale("log", base=2)
        axes.set_yscale("log")
        axes.set_xlabel("concurrency" if mode == "concurrency" else "offered rate (req/s)")
        axes.set_title(title)
    left.legend()
    return figure


def comparison(compare: CompareResult) -> Figure:
    """Pooled figures per endpoint with the 95% interval of each ratio to the baseline:
    throughput and p99, or for generations tokens/s, TTFT p50/p99 and TPOT p50."""
    names = [label(e.name) for e in compare.endpoints]
    summaries = [e.result.summary for e in compare.endpoints]
    panels: list[tuple[str, Callable[[Summary], float | None], str]]
    if all(s.generation for s in summaries):
        panels = [("output_tokens_per_s",
                   lambda s: s.generation.output_tokens_per_s if s.generation else None,
                   "output tokens/s"),
                  ("ttft_p50", lambda s: _generation_figure(s, "ttft_ms", "p50"),
                   "TTFT p50 (ms)"),
                  ("ttft_p99", lambda s: _generation_figure(s, "ttft_ms", "p99"),
                   "TTFT p99 (ms)"),
                  ("tpot_p50", lambda s: _generation_figure(s, "tpot_ms", "p50"),
                   "TPOT p50 (ms)")]
        figure, grid = _pyplot().subplots(2, 2, figsize=(6.4, 4.8), layout="constrained")
        axes_list = list(grid.ravel())
    else:
        panels = [("throughput", lambda s: s.throughput_rps, "throughput (req/s)"),
                  ("p99", lambda s: s.latency("p99"), "p99 latency (ms)")]
        figure, pair = _pyplot().subplots(1, 2, figsize=(6.4, 3.2), layout="constrained")
        axes_list = list(pair)
    for axes, (metric, value_of, title) in zip(axes_list, panels, strict=True):
        values = [value_of(s) or 0 for s in summaries]
        base_value = values[0]
        errors = [[0.0] * len(names), [0.0] * len(names)]
        for i, ratios in enumerate(compare.ratios):
            ratio = ratios.metrics.get(metric)
            ci = ratio.ci95 if ratio else None
            if ci and base_value:
                errors[0][i] = max(values[i] - ci[0] * base_value, 0)
                errors[1][i] = max(ci[1] * base_value - values[i], 0)
        axes.bar(names, values, color=list(islice(cycle(COLORS), len(names))), yerr=errors,
                 capsize=4)
        axes.set_title(title)
    return figure


def _sla_line(axes: Any, sla_p99_ms: object) -> None:
    """The SLA's p99 bound across the plot, when the goal gives it as a number."""
    if _is_number(sla_p99_ms):
        axes.axhline(sla_p99_ms, color=COLORS[1], linestyle=":",
                     label=label(f"SLA p99 {number(sla_p99_ms)} ms"))


def _generation_figure(summary: Summary, distribution: str, key: str) -> float | None:
    values = getattr(summary.generation, distribution) if summary.generation else None
    return (values or {}).get(key)


def tidy(figure: Figure) -> Figure:
    """Last touches shared by the SVG and the PNG of a figure: plain numbers on every axis
    (no '1e3' or '+2.185e3' offsets: a soak's RSS over a 0.1 MiB range read as
    offsets)."""
    from matplotlib.ticker import ScalarFormatter

    for axes in figure.axes:
        _plain_log_axis(axes)
        for axis in (axes.xaxis, axes.yaxis):
            formatter = axis.get_major_formatter()
            if isinstance(formatter, ScalarFormatter):
                formatter.set_useOffset(False)
                formatter.set_scientific(False)
    return figure


def to_svg(figure: Figure) -> str:
    """The figure as an inline <svg> element (the XML prologue dropped)."""
    buffer = io.StringIO()
    figure.savefig(buffer, format="svg")
    _pyplot().close(figure)
    text = buffer.getvalue()
    return text[text.index("<svg"):]
