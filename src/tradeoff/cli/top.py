"""``tradeoff top``: a live view of a server's models, from its ``/metrics``."""

from __future__ import annotations

import time

import click

from tradeoff.cli.options import Duration, user_errors


@click.command()
@click.argument("url")
@click.option("--interval", type=Duration(minimum_s=0.1), default="1s", show_default=True,
              help="Time between readings (rates and percentiles cover it).")
@click.option("--iterations", type=click.IntRange(min=1),
              help="Stop after this many refreshes (default: until Ctrl-C).")
def top(url: str, interval: float, iterations: int | None) -> None:
    """Watch a running server live: per model, requests per second, p50 and p99 (from the
    latency histograms), queue depth, requests in flight, executions per second and the
    mean batch, failures per second; for generative models, tokens per second, requests
    running and waiting, KV cache use and TTFT. Refreshed every --interval.

    URL is the server's metrics address (http://HOST:8002/metrics; the /metrics path
    may be left out).

    \b
    Examples:
      tradeoff top http://127.0.0.1:8002
      tradeoff top 127.0.0.1:8002/metrics --interval 2s
      tradeoff top http://127.0.0.1:8002 --iterations 10
    """
    from rich.console import Console
    from rich.live import Live

    from tradeoff.bench.scrape import live_rows, metrics_url, scrape
    from tradeoff.report.terminal import live_view

    console = Console()
    address = metrics_url(url)
    try:
        before = scrape(address)
        shown = 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while iterations is None or shown < iterations:
                time.sleep(interval)
                after = scrape(address)
                models, generations = live_rows(before, after)
                live.update(live_view(models, generations, address, after.at - before.at),
                            refresh=True)
                before = after
                shown += 1
    except KeyboardInterrupt:
        pass
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
