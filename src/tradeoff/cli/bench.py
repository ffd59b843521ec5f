"""``tradeoff bench``: measure one endpoint under one load."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tradeoff.cli.options import (
    endpoint_options,
    json_option,
    load_options,
    records_option,
    save_result,
    take_endpoint,
    take_load,
)

__all__ = ["bench"]


@click.command()
@click.argument("url")
@endpoint_options
@load_options("concurrency", "rate", "arrival", "intervals", "duration", "requests",
              "warmup", "window", "stability", "max_connections", "workers", "ray")
@json_option("tradeoff.bench/1")
@records_option
def bench(url: str, json_path: Path | None, records_path: Path | None,
          **shared: Any) -> None:
    """Measure an inference endpoint: latency percentiles, throughput, errors, and where
    the time goes on the server. Without --duration or --requests it measures windows
    until the last three agree. The load flags' defaults are those of every command
    (docs/cli.md).

    \b
    Examples:
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 16 --duration 10s
      tradeoff bench http://127.0.0.1:8000 --model mlp --rate 500 --arrival poisson \\
          --duration 30s --warmup 5s --json mlp.json --records mlp.csv
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 8   # until stable
      tradeoff bench 127.0.0.1:8001 --protocol v2-grpc --model mlp --concurrency 8 \\
          --duration 10s
      tradeoff bench http://127.0.0.1:9000/predict --protocol http --body req.json \\
          --header "Authorization:Bearer $TOKEN" --rate 100 --duration 20s
      tradeoff bench http://127.0.0.1:8000/v1 --protocol openai --model smollm2-135m \\
          --concurrency 4 --duration 1m --output-tokens 16:256 --ignore-eos \\
          --slo ttft_ms=2000,tpot_ms=300
      tradeoff bench https://api.example.com/v1 --protocol openai --chat --model M \\
          --api-key-env PROVIDER_KEY --rate 2 --arrival poisson --duration 2m
      tradeoff bench http://10.0.0.1:8000 --model mlp --rate 20000 --duration 30s \\
          --ray 10.0.0.1:6379 --workers 8
    """
    from rich.console import Console

    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.session import run_benchmark
    from tradeoff.report.terminal import print_bench_result

    console = Console()
    target = take_endpoint(url, shared)
    spec = take_load(shared)
    result, records, start_ns = run_benchmark(make_adapter(target), spec, console)
    print_bench_result(result, console)
    save_result(result, json_path, console)
    if records_path:
        records.write(records_path, start_ns, start_ns + int(spec.warmup_s * 1e9))
        console.print(f"records: {records_path}")
