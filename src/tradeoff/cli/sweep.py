"""``tradeoff sweep``: one benchmark per load level, until the endpoint saturates."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

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

__all__ = ["sweep"]


@click.command()
@click.argument("url")
@endpoint_options
@click.option("--concurrency-range", help="START:END doubles (1:256), START:END:STEP steps "
                                          "like perf_analyzer, or a list 1,4,16.")
@click.option("--rate-range", help="Open-loop rates, same forms (100:3200 doubles).")
@click.option("--profile", "profile_count", type=click.IntRange(2, 1000), metavar="N",
              help="guidellm's sweep: one request at a time, then --profile-concurrency at "
                   "once, then N constant rates evenly between the two throughputs.")
@click.option("--profile-concurrency", type=click.IntRange(1), default=64,
              show_default=True, help="Concurrency of a profile's saturating run.")
@load_options("arrival", "duration", "warmup", "max_connections", "workers", "ray")
@click.option("--max-p99-ms", type=Number(min=0, min_open=True),
              help="Stop once p99 passes this.")
@max_error_percent_option
@click.option("--sla-p99-ms", type=Number(min=0, min_open=True),
              help="Find the highest load whose p99 <= this (steps up, then bisects).")
@click.option("--patience", type=click.IntRange(1), default=2, show_default=True,
              help="Points to measure past the knee before stopping.")
@click.option("--bisect-steps", type=click.IntRange(0), default=4, show_default=True,
              help="Bisection steps of an SLA search.")
@click.option("--price-per-hour", type=Number(min=0, min_open=True),
              help="USD per hour of the deployment: cost per million requests at each point "
                   "and a cost-performance ranking of the points.")
@click.option("--price-per-1k-requests", "per_1k", type=Number(min=0),
              help="USD per 1,000 requests, for priced APIs.")
@alpha_option
@json_option("tradeoff.sweep/1")
@summary_option
def sweep(url: str, concurrency_range: str | None, rate_range: str | None,
          profile_count: int | None, profile_concurrency: int, max_p99_ms: float | None,
          max_error_percent: float, sla_p99_ms: float | None,
          patience: int, bisect_steps: int, price_per_hour: float | None,
          per_1k: float | None, alpha: float, json_path: Path | None,
          summary_path: Path | None, **shared: Any) -> None:
    """Find where an endpoint saturates: one full benchmark per load level, until
    throughput stops growing, errors rise or p99 passes --max-p99-ms; the knee is marked.

    Each level sets the concurrency (--concurrency-range) or the rate (--rate-range),
    warms up for --warmup (1s by default here: a level's first requests are cold) and
    measures --duration, by default 5s per level (a sweep needs a fixed length per
    point); every other load flag has the defaults of every command (docs/cli.md).

    \b
    Examples:
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:256
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:64:8 \\
          --duration 5s --json sweep.json
      tradeoff sweep http://127.0.0.1:8000 --model mlp --rate-range 250:8000 \\
          --arrival poisson --sla-p99-ms 20 --json sla.json --summary sla.md
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:128 \\
          --price-per-hour 0.34 --max-p99-ms 50
      tradeoff sweep http://127.0.0.1:8000/v1 --protocol openai --model smollm2-135m \\
          --profile 6 --profile-concurrency 16 --duration 20s --json profile.json
    """
    from rich.console import Console

    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.sweep import (
        SWEEP_WARMUP_S,
        Sweep,
        SweepPlan,
        parse_levels,
        profile_levels,
    )
    from tradeoff.report.terminal import print_ranking, print_sweep
    from tradeoff.stats.cost import Price

    console = Console()
    given = [o for o in (concurrency_range, rate_range, profile_count) if o is not None]
    if len(given) != 1:
        raise InvalidValue("give one of --concurrency-range, --rate-range or --profile")
    mode = "concurrency" if concurrency_range else "rate"
    source = click.get_current_context().get_parameter_source("warmup")
    default_warmup = source is ParameterSource.DEFAULT
    if default_warmup:  # a level's first requests are cold
        shared["warmup"] = SWEEP_WARMUP_S
    target = take_endpoint(url, shared)
    base = take_load(shared, default_duration_s=LOAD_DEFAULTS.point_duration_s)
    adapter = make_adapter(target)
    adapter.prepare()  # a wrong endpoint says so before anything else is printed
    if default_warmup:
        console.print(f"warmup: {SWEEP_WARMUP_S:g}s at each level before measuring (a "
                      "sweep's default; --warmup 0 measures cold starts too)")
    anchors = None
    if profile_count is not None:
        levels, anchors = profile_levels(adapter, base, profile_count,
                                         profile_concurrency, console)
        console.print(f"profile: {profile_count} rates from "
                      f"{anchors['synchronous_rps']:,.2f} to "
                      f"{anchors['throughput_rps']:,.2f} req/s")
    else:
        levels = parse_levels(concurrency_range or rate_range or "",
                              integer=mode == "concurrency")
    plan = SweepPlan(mode, levels, max_p99_ms=max_p99_ms,
                     max_error_percent=max_error_percent, sla_p99_ms=sla_p99_ms,
                     patience=patience, bisect_steps=bisect_steps, profile=anchors)
    price = None
    if price_per_hour is not None or per_1k is not None:
        price = Price(per_hour=price_per_hour,
                      per_1k_requests=None if price_per_hour is not None else per_1k)
    result = Sweep(adapter, base, plan, console, price=price, alpha=alpha).run()
    print_sweep(result, console)
    if result.ranking:
        print_ranking(result.ranking, result.score, console)
    save_result(result, json_path, console, "sweep")
    save_summary(result, summary_path, console)
