"""``tradeoff top``: a live view of a server's models, from its ``/metrics`` or from a
Prometheus that scrapes it."""

from __future__ import annotations

import re
import time
from typing import Any

import click

from tradeoff.cli.options import Duration

__all__ = ["top"]

_PROMQL_RANGE = re.compile(r"^(?:\d+(?:ms|s|m|h|d|w|y))+$")


def _promql_range(ctx: click.Context, param: click.Parameter, value: str) -> str:
    if not _PROMQL_RANGE.match(value):
        raise click.BadParameter(f"{value!r} is not a PromQL range; write 30s, 5m or 1h30m")
    return value


@click.command()
@click.argument("url", required=False)
@click.option("--prometheus-url", help="Read a Prometheus server that scrapes the servers "
                                       "instead (replicas summed), e.g. http://HOST:9090.")
@click.option("--window", default="1m", show_default=True, callback=_promql_range,
              help="With --prometheus-url: the PromQL range of rates and percentiles "
                   "(30s, 5m, 1h30m).")
@click.option("--interval", type=Duration(minimum_s=0.1), default="1s", show_default=True,
              help="Time between readings (rates and percentiles cover it).")
@click.option("--iterations", type=click.IntRange(min=1),
              help="Stop after this many refreshes (default: until Ctrl-C).")
def top(url: str | None, prometheus_url: str | None, window: str, interval: float,
        iterations: int | None) -> None:
    """Watch a running server live: per model, requests per second, p50 and p99 (from the
    latency histograms), queue depth, requests in flight, executions per second and the
    mean batch, failures per second; for generative models, tokens per second, requests
    running and waiting, KV cache use and TTFT; for a gateway, each replica's requests
    and errors per second, in flight, state, mean answer time and prefix hits. Refreshed
    every --interval.

    URL is the server's metrics address (http://HOST:8002/metrics; the /metrics path
    may be left out). With --prometheus-url, the figures come from PromQL over --window
    instead, summed over every server that Prometheus scrapes.

    A reading has 5 s in all, 32 MiB and 100,000 series at most: one past a bound is
    skipped with a line that says which, and the next is taken as usual.

    \b
    Examples:
      tradeoff top http://127.0.0.1:8002
      tradeoff top 127.0.0.1:8002/metrics --interval 2s
      tradeoff top --prometheus-url http://127.0.0.1:9090 --window 30s
      tradeoff top http://127.0.0.1:8002 --iterations 10
    """
    from rich.console import Console
    from rich.live import Live
    from rich.text import Text

    from tradeoff.bench.scrape import (
        ScrapeError,
        Snapshot,
        live_rows,
        metrics_url,
        prometheus_replica_rows,
        prometheus_rows,
        replica_rows,
        scrape,
    )
    from tradeoff.report.terminal import live_view

    if (url is None) == (prometheus_url is None):
        raise click.UsageError("give the server's metrics URL or --prometheus-url")
    if prometheus_url is not None and not window.strip():
        raise click.UsageError("--window: give a PromQL range such as 30s or 1m")
    console = Console()

    def skipped(exc: ScrapeError) -> Text:
        return Text(f"{exc}; reading again in {interval:g} s", style="yellow")

    try:
        address = metrics_url(url) if url else None
        before: Snapshot | None = None
        if address is not None:
            try:
                before = scrape(address)
            except ScrapeError:
                pass  # said at the first refresh, when the next reading fails too
        shown = 0
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                view: Any
                if address is not None:
                    time.sleep(interval)  # a reading needs the one before it
                    try:
                        after = scrape(address)
                    except ScrapeError as exc:
                        view, before = skipped(exc), None
                    else:
                        if before is None:
                            view = Text(f"{address}: read; the rates come with the next "
                                        "reading")
                        else:
                            models, generations = live_rows(before, after)
                            view = live_view(models, generations, address,
                                             after.at - before.at,
                                             replicas=replica_rows(before, after))
                        before = after
                else:
                    assert prometheus_url is not None
                    try:
                        models, generations = prometheus_rows(prometheus_url, window)
                        replicas = prometheus_replica_rows(prometheus_url, window)
                    except ScrapeError as exc:
                        view = skipped(exc)
                    else:
                        view = live_view(models, generations,
                                         f"{prometheus_url} (Prometheus)", window=window,
                                         replicas=replicas)
                live.update(view, refresh=True)
                shown += 1
                if iterations is not None and shown >= iterations:
                    break
                if address is None:
                    time.sleep(interval)
    except KeyboardInterrupt:
        pass
