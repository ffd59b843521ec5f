"""One row per sweep level or compared endpoint, as CSV or Markdown: the table
perf_analyzer's ``-f`` writes, for spreadsheets and pull requests.

    write_summary(sweep_result, Path("sweep.csv"))   # or .md
"""

from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Any

from tradeoff.errors import InvalidValue, local_resource
from tradeoff.results import CompareResult, SweepResult

__all__ = ["SUFFIXES", "render_summary", "summary_table", "write_summary"]

SUFFIXES = (".csv", ".md")


def _figure(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def summary_table(result: SweepResult | CompareResult) -> tuple[list[str], list[list[Any]]]:
    """The header and rows: a sweep's levels in load order, or a comparison's endpoints
    with their throughput ratio to the baseline."""
    if isinstance(result, SweepResult):
        generation = any(r.tokens is not None for r in result.rows)
        priced = any(r.priced for r in result.rows)
        header = [result.mode, "throughput_rps", "p50_ms", "p99_ms", "error_percent",
                  "requests"]
        header += ["output_tokens_per_s", "ttft_p50_ms", "tpot_p50_ms"] if generation else []
        header += ["cost_per_million"] if priced else []
        rows = []
        for r in result.rows:
            row: list[Any] = [r.load, r.throughput_rps, r.p50_ms, r.p99_ms, r.error_percent,
                              r.requests]
            if generation:
                t = r.tokens
                row += [t.output_tokens_per_s, t.ttft_p50_ms, t.tpot_p50_ms] if t else \
                    [None] * 3
            if priced:
                row.append(r.cost_per_million)
            rows.append(row)
        return header, rows
    costs = {c["name"]: c.get("cost_per_million") for c in result.ranking}
    header = ["endpoint", "throughput_rps", "throughput_ratio", "p50_ms", "p99_ms",
              "error_percent", "requests", "cost_per_million"]
    rows = []
    for entry in result.endpoints:
        s = entry.result.summary
        ratio = result.ratios_of(entry.name).metrics.get("throughput")
        rows.append([entry.name, s.throughput_rps, ratio.ratio if ratio else None,
                     s.latency("p50"), s.latency("p99"), s.error_percent, s.requests,
                     costs.get(entry.name)])
    return header, rows


def render_summary(result: SweepResult | CompareResult, markdown: bool) -> str:
    """The table as CSV, or as a Markdown table."""
    header, rows = summary_table(result)
    cells = [[_figure(v) for v in row] for row in rows]
    if markdown:
        lines = ["| " + " | ".join(header) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|"]
        lines += ["| " + " | ".join(row) + " |" for row in cells]
        return "\n".join(lines) + "\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(cells)
    return out.getvalue()


def write_summary(result: SweepResult | CompareResult, path: Path) -> None:
    """Write the table to ``path``: Markdown for ``.md``, CSV for ``.csv``."""
    if path.suffix not in SUFFIXES:
        raise InvalidValue(f"--summary {path}: name a .csv or a .md file")
    text = render_summary(result, markdown=path.suffix == ".md")
    with local_resource(f"--summary: cannot write {path}"):
        path.write_text(text)
