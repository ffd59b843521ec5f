"""``tradeoff soak``: hold a load for a long time and judge its stability."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tradeoff.bench.load import LOAD_DEFAULTS
from tradeoff.cli.options import (
    DURATION,
    Number,
    endpoint_options,
    json_option,
    load_options,
    save_result,
    take_endpoint,
    take_load,
)

__all__ = ["soak"]


@click.command()
@click.argument("url")
@endpoint_options
@click.option("--fraction", type=Number(min=0, max=2, min_open=True), default=0.75,
              show_default=True, help="Load as a fraction of the maximum rate.")
@click.option("--max-rate", type=Number(min=0, min_open=True),
              help="The endpoint's maximum req/s (default: measured first by a short sweep).")
@load_options("arrival", "duration", "window", "max_connections", "workers", "ray")
@click.option("--probe-duration", type=DURATION, default="5s", show_default=True,
              help="Length of each point of the sweep that measures the maximum rate.")
@click.option("--server-pid", type=int, help="Watch the resident memory of this local "
                                             "process.")
@click.option("--prometheus-url", help="Or read process_resident_memory_bytes from this "
                                       "/metrics URL.")
@json_option("tradeoff.soak/1")
def soak(url: str, fraction: float, max_rate: float | None, probe_duration: float,
         server_pid: int | None, prometheus_url: str | None, json_path: Path | None,
         **shared: Any) -> None:
    """Hold an open-loop load for a long time and judge it: drift of p99 and throughput
    (Mann-Kendall trend test), error bursts, and growth of the server's memory.

    The rate is --fraction of the maximum rate. A soak is long by nature: --duration
    defaults to 30m here and --window to 1m (the trend tests need at least 6 windows);
    every other load flag has the defaults of every command (docs/cli.md). Exits with
    status 3 when the verdict is unstable.

    \b
    Examples:
      tradeoff soak http://127.0.0.1:8000 --model mlp --fraction 0.75 --duration 30m \\
          --prometheus-url http://127.0.0.1:8002/metrics --json soak.json
      tradeoff soak http://127.0.0.1:8000 --model mlp --max-rate 2000 --duration 5m \\
          --window 30s --arrival poisson --server-pid $(pgrep -f "tradeoff serve")
    """
    from rich.console import Console

    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.soak import SoakPlan, run_soak
    from tradeoff.report.terminal import print_soak

    console = Console()
    duration = shared.pop("duration") or LOAD_DEFAULTS.soak_duration_s
    window = shared.pop("window") or LOAD_DEFAULTS.soak_window_s
    target = take_endpoint(url, shared)
    base = take_load(shared)  # the rate, length and windows are the plan's
    plan = SoakPlan(duration_s=duration, fraction=fraction, max_rate=max_rate,
                    window_s=window, arrival=base.arrival, probe_s=probe_duration,
                    server_pid=server_pid, prometheus_url=prometheus_url)
    result = run_soak(make_adapter(target), plan, base, console)
    print_soak(result, console)
    save_result(result, json_path, console, "soak")
    if not result.verdict.stable:
        sys.exit(3)
