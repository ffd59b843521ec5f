"""``tradeoff diagnose`` and ``tradeoff report``: explain and show saved results."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from tradeoff.cli.options import json_option
from tradeoff.errors import local_resource

if TYPE_CHECKING:
    from tradeoff.results import ResultDocument

__all__ = ["diagnose", "report"]


def _read_results(paths: tuple[Path, ...]) -> list[ResultDocument]:
    """The result files, typed; one that is not a result this version reads is one line
    naming the file and the field (ResultFormatError)."""
    from tradeoff.results import load_result

    return [load_result(path) for path in paths]


@click.command()
@click.argument("results", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@json_option("tradeoff.diagnosis/1")
def diagnose(results: tuple[Path, ...], json_path: Path | None) -> None:
    """Explain results: documented rules (no batching, saturation, long tail, queue- vs
    compute-bound, overhead-bound, client-bound, cold start, unstable) with the numbers
    behind each finding and what to do. See docs/diagnose.md.

    \b
    Examples:
      tradeoff diagnose sweep.json
      tradeoff diagnose a.json b.json compare.json --json findings.json
    """
    from rich.console import Console

    from tradeoff.analysis.diagnose import SEVERITY_ORDER
    from tradeoff.analysis.diagnose import diagnose as run_rules
    from tradeoff.report.terminal import print_findings

    console = Console()
    findings = []
    for document in _read_results(results):
        findings += run_rules(document)
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    print_findings(findings, console)
    if json_path is not None:
        text = json.dumps({"schema": "tradeoff.diagnosis/1",
                           "findings": [f.to_dict() for f in findings]}, indent=2)
        with local_resource(f"cannot write {json_path}"):
            json_path.parent.mkdir(parents=True, exist_ok=True)
            json_path.write_text(text)
        console.print(f"findings: {json_path}")


@click.command()
@click.argument("results", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", default=Path("report.html"), show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The HTML file to write.")
@click.option("--png", "png_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also save every plot as a PNG in this folder.")
@click.option("--title", default="tradeoff report", show_default=True)
def report(results: tuple[Path, ...], output: Path, png_dir: Path | None, title: str) -> None:
    """Write one self-contained HTML report (works offline) from bench, sweep, soak and
    compare results: curves with the knee marked, frontier, latency CDF, soak timelines,
    comparison, findings, profiles and environment.

    \b
    Examples:
      tradeoff report sweep-mlp.json sweep-mlp_nobatch.json -o report.html
      tradeoff report compare.json soak.json -o report.html --png plots/
    """
    from tradeoff.report.html import write_report

    documents = _read_results(results)
    written = write_report(documents, output, png_dir, title)
    click.echo(f"report: {output}")
    if written.pngs:
        click.echo(f"plots: {len(written.pngs)} PNG files in {png_dir}")
