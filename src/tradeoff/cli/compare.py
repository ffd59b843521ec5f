"""``tradeoff compare``: several endpoints under the same load, side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tradeoff.bench.load import LOAD_DEFAULTS
from tradeoff.cli.options import (
    Number,
    alpha_option,
    endpoint_options,
    json_option,
    load_options,
    max_error_percent_option,
    save_result,
    save_summary,
    summary_option,
    take_endpoint,
    take_load,
)
from tradeoff.errors import InvalidValue

__all__ = ["compare"]


def _facts(values: tuple[str, ...]) -> dict[str, dict[str, str]]:
    from tradeoff.analysis.profile import parse_fact

    facts: dict[str, dict[str, str]] = {}
    for value in values:
        name, key, fact = parse_fact(value)
        facts.setdefault(name, {})[key] = fact
    return facts


@click.command()
@click.argument("results", nargs=-1, type=click.Path(exists=True, dir_okay=False,
                                                     path_type=Path))
@click.option("--endpoint", "endpoints", multiple=True,
              help="NAME=URL[,model=M][,protocol=P][,version=V] (repeatable); the first "
                   "is the baseline.")
@endpoint_options
@load_options("concurrency", "rate", "arrival", "duration", "warmup", "max_connections",
              "workers", "ray")
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Interleaved rounds per endpoint (A B A B ...).")
@click.option("--fact", "facts", multiple=True,
              help="NAME:key=value the endpoint cannot tell (hardware=H100, price, region).")
@click.option("--price-per-hour", "per_hour", multiple=True,
              help="NAME=USD per hour of a deployment (or USD for all).")
@click.option("--price-per-1k-requests", "per_1k", multiple=True,
              help="NAME=USD per 1,000 requests for priced APIs.")
@alpha_option
@click.option("--sla-p99-ms", type=Number(min=0, min_open=True),
              help="Only endpoints meeting this p99 (and --max-error-percent) rank.")
@max_error_percent_option
@json_option("tradeoff.compare/1")
@summary_option
def compare(results: tuple[Path, ...], endpoints: tuple[str, ...], rounds: int,
            facts: tuple[str, ...], per_hour: tuple[str, ...], per_1k: tuple[str, ...],
            alpha: float, sla_p99_ms: float | None, max_error_percent: float,
            json_path: Path | None, summary_path: Path | None, **shared: Any) -> None:
    """Run the same load with the same inputs against several endpoints, interleaved, and
    show them side by side with ratios, confidence intervals, fairness checks, profiles
    and cost. Or compare existing bench results (RESULTS...).

    Every round measures --duration, by default 5s (rounds must be equally long to be
    compared); every other load flag has the defaults of every command (docs/cli.md).

    \b
    Examples:
      tradeoff compare --endpoint batched=http://127.0.0.1:8000,model=mlp \\
          --endpoint single=http://127.0.0.1:8000,model=mlp_nobatch --concurrency 16 \\
          --duration 5s --price-per-hour 1.20 --fact batched:hardware="2 vCPU"
      tradeoff compare --endpoint http=http://127.0.0.1:8000,model=mlp \\
          --endpoint grpc=127.0.0.1:8001,model=mlp,protocol=v2-grpc --concurrency 8
      tradeoff compare a.json b.json --price-per-hour a=2.5 --price-per-hour b=0.9 \\
          --summary compare.md
    """
    from rich.console import Console

    from tradeoff.analysis.compare import compare_results, run_compare
    from tradeoff.bench.endpoint import parse_endpoint
    from tradeoff.report.terminal import print_compare
    from tradeoff.results import BenchResult, load_as
    from tradeoff.stats.cost import parse_prices

    console = Console()
    if results and endpoints:
        raise InvalidValue("give result files or --endpoint, not both")
    if results:
        named = [(p.stem, load_as(BenchResult, p)) for p in results]
        document = compare_results(named, _facts(facts),
                                   parse_prices(per_hour, per_1k, [n for n, _ in named]),
                                   alpha, sla_p99_ms, max_error_percent)
    else:
        defaults = take_endpoint("", shared)
        targets = [parse_endpoint(e, defaults) for e in endpoints]
        spec = take_load(shared, default_duration_s=LOAD_DEFAULTS.point_duration_s)
        document = run_compare(targets, spec, rounds, _facts(facts),
                               parse_prices(per_hour, per_1k, [t.label for t in targets]),
                               alpha, sla_p99_ms, max_error_percent, console)
    print_compare(document, console)
    save_result(document, json_path, console, "comparison")
    save_summary(document, summary_path, console)
