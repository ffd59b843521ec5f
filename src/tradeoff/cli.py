"""The ``tradeoff`` command line: serve, models build, demo."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import click

from tradeoff import __version__
from tradeoff.errors import TradeoffError


def _setup_logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tradeoff")
def main() -> None:
    """Serve, benchmark and tune AI inference for the latency/throughput trade-off.

    \b
    Examples:
      tradeoff models build ./models          # example ONNX models + Triton configs
      tradeoff serve --model-repository ./models
      tradeoff demo                           # batching on vs off, side by side
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 16 --duration 10
    """


@main.command()
@click.option("--model-repository", "repository", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Triton-style model repository: <repo>/<model>/config.pbtxt and "
                   "<repo>/<model>/<version>/model.onnx.")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind. Use 0.0.0.0 only when others must reach the server.")
@click.option("--http-port", default=8000, show_default=True, type=click.IntRange(0, 65535),
              help="Open Inference Protocol v2 over HTTP (0 picks a free port).")
@click.option("--metrics-port", default=8002, show_default=True, type=click.IntRange(0, 65535),
              help="Prometheus /metrics (0 picks a free port).")
@click.option("--no-metrics", is_flag=True, help="Do not serve /metrics.")
@click.option("--grpc-port", default=8001, show_default=True, type=click.IntRange(0, 65535),
              help="Open Inference Protocol v2 over gRPC (0 picks a free port).")
@click.option("--no-grpc", is_flag=True, help="Do not serve gRPC.")
@click.option("--max-request-bytes", default=64 * 1024 * 1024, show_default=True,
              type=click.IntRange(1), help="Larger request bodies get 413.")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=float,
              help="Seconds to finish accepted requests after SIGTERM/SIGINT.")
@click.option("--default-max-batch-size", default=4, show_default=True,
              type=click.IntRange(0),
              help="max_batch_size given to batchable models whose config leaves it out.")
@click.option("--intra-op-threads", default=1, show_default=True, type=click.IntRange(0),
              help="ONNX Runtime threads per instance unless the model's parameters "
                   "set intra_op_thread_count (0: runtime default).")
@click.option("--strict-readiness", is_flag=True,
              help="/v2/health/ready only when every model in the repository is ready.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve(repository: Path, host: str, http_port: int, metrics_port: int, no_metrics: bool,
          grpc_port: int, no_grpc: bool,
          max_request_bytes: int, shutdown_timeout: float, default_max_batch_size: int,
          intra_op_threads: int, strict_readiness: bool, log_level: str) -> None:
    """Serve a model repository over the Open Inference Protocol v2.

    \b
    Examples:
      tradeoff serve --model-repository ./models
      tradeoff serve --model-repository ./models --http-port 9000 --metrics-port 9002
      tradeoff serve --model-repository ./models --grpc-port 9001
      curl -s localhost:8000/v2/models/mlp/stats
    """
    from tradeoff.server.runner import ServeOptions
    from tradeoff.server.runner import serve as run_server

    _setup_logging(log_level)
    options = ServeOptions(
        model_repository=repository, host=host, http_port=http_port,
        metrics_port=None if no_metrics else metrics_port,
        grpc_port=None if no_grpc else grpc_port,
        max_request_bytes=max_request_bytes, shutdown_timeout=shutdown_timeout,
        default_max_batch_size=default_max_batch_size, intra_op_threads=intra_op_threads,
        strict_readiness=strict_readiness)
    try:
        run_server(options)
    except (OSError, TradeoffError) as exc:
        raise click.ClickException(str(exc)) from None


@main.group()
def models() -> None:
    """Example models made locally (no downloads)."""


@models.command("build")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "names", multiple=True,
              help="Only these models (repeatable): tiny, tiny_nobatch, mlp, mlp_nobatch.")
def models_build(directory: Path, names: tuple[str, ...]) -> None:
    """Write example models into DIRECTORY as a Triton-style repository.

    \b
    Examples:
      tradeoff models build ./models
      tradeoff models build ./models --model mlp
    """
    from tradeoff.models import EXAMPLE_MODELS, build_repository

    try:
        written = build_repository(directory, names or EXAMPLE_MODELS)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"wrote {path}")


@main.command()
@click.option("--duration", default=3.0, show_default=True, type=click.FloatRange(0.5),
              help="Seconds of load per measurement.")
@click.option("--concurrency", "levels", multiple=True, type=click.IntRange(1),
              help="Concurrency levels (repeatable); default 1 and 64.")
@click.option("--output", default=Path("runs/demo"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the models and results.json go.")
def demo(duration: float, levels: tuple[int, ...], output: Path) -> None:
    """Serve the example models and show what dynamic batching buys.

    Builds the example models, starts `tradeoff serve` on free local ports, loads `mlp`
    (dynamic batching on) and `mlp_nobatch` (off) at each concurrency, prints throughput,
    p50, p99 and executions per request, and stops the server.

    \b
    Examples:
      tradeoff demo
      tradeoff demo --duration 10 --concurrency 1 --concurrency 16 --concurrency 64
    """
    from tradeoff.demo import run_demo

    _setup_logging("warning")
    try:
        run_demo(output, duration, levels or (1, 64))
    except (OSError, TradeoffError, RuntimeError) as exc:
        raise click.ClickException(str(exc)) from None


def _parse_shapes(values: tuple[str, ...]) -> dict[str, list[int]]:
    shapes = {}
    for value in values:
        name, sep, dims = value.partition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise click.BadParameter(f"{value!r}; use NAME:d1,d2 (for example INPUT0:3,224)",
                                     param_hint="--shape") from None
    return shapes


def _parse_headers(values: tuple[str, ...]) -> dict[str, str]:
    headers = {}
    for value in values:
        key, sep, header_value = value.partition(":")
        if not sep or not key.strip():
            raise click.BadParameter(f"{value!r}; use KEY:VALUE", param_hint="--header")
        headers[key.strip()] = header_value.strip()
    return headers


@main.command()
@click.argument("url")
@click.option("--protocol", type=click.Choice(["v2", "v2-grpc", "http"]), default="v2",
              show_default=True,
              help="v2: Open Inference Protocol over HTTP; v2-grpc: the same over gRPC "
                   "(URL host:port); http: any JSON-over-HTTP endpoint.")
@click.option("--model", "-m", help="Model name (v2).")
@click.option("--model-version", default="", help="Model version (v2; default: the server's).")
@click.option("--concurrency", type=click.IntRange(1), help="Closed loop: requests in flight.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Open loop: requests per second, latency from the scheduled send time.")
@click.option("--arrival", type=click.Choice(["constant", "poisson"]), default="constant",
              show_default=True, help="Open-loop arrival process.")
@click.option("--intervals", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Replay a trace: one gap per line in microseconds ('# offsets' as the first "
                   "line: offsets from the start).")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True),
              help="Seconds to measure (default: until stable).")
@click.option("--requests", "request_count", type=click.IntRange(1),
              help="Requests to measure instead of a duration.")
@click.option("--warmup", type=click.FloatRange(0), default=0.0, show_default=True,
              help="Seconds of load before measuring, reported apart.")
@click.option("--window", type=click.FloatRange(min=0, min_open=True),
              help="Measurement window in seconds (stability mode default: 5).")
@click.option("--stability-percent", type=float, default=10.0, show_default=True,
              help="The last 3 windows must agree within this on throughput and p99.")
@click.option("--max-windows", type=click.IntRange(3), default=10, show_default=True)
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
              show_default=True, help="Connect and read timeout per request, seconds.")
@click.option("--max-connections", type=click.IntRange(1), default=1024, show_default=True,
              help="Open loop: most connections to hold at once.")
@click.option("--json-tensors", is_flag=True, help="v2: JSON tensors instead of binary.")
@click.option("--shape", "shapes", multiple=True,
              help="v2: NAME:d1,d2 for variable dimensions (batch dimension excluded).")
@click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
              help="v2: rows per request.")
@click.option("--input-data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="v2: inputs in perf_analyzer's JSON format instead of random data.")
@click.option("--method", default="POST", show_default=True, help="http: request method.")
@click.option("--header", "headers", multiple=True, help="http: KEY:VALUE (repeatable).")
@click.option("--body", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="http: a request body, or a .jsonl file of bodies used round-robin.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed for random inputs and Poisson arrivals.")
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Load-generator processes; their raw records are merged exactly.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the result (schema tradeoff.bench/1) here.")
@click.option("--records", "records_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every request's record here (.csv, or .parquet with pyarrow).")
def bench(url: str, protocol: str, model: str | None, model_version: str,
          concurrency: int | None, rate: float | None, arrival: str, intervals: Path | None,
          duration: float | None, request_count: int | None, warmup: float,
          window: float | None, stability_percent: float, max_windows: int, timeout: float,
          max_connections: int, json_tensors: bool, shapes: tuple[str, ...], batch_size: int,
          input_data: Path | None, method: str, headers: tuple[str, ...], body: Path | None,
          seed: int, workers: int, json_path: Path | None,
          records_path: Path | None) -> None:
    """Measure an inference endpoint: latency percentiles, throughput, errors, and where
    the time goes on the server.

    \b
    Examples:
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 16 --duration 10
      tradeoff bench http://127.0.0.1:8000 --model mlp --rate 500 --arrival poisson \\
          --duration 30 --warmup 5 --json mlp.json --records mlp.csv
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 8   # until stable
      tradeoff bench 127.0.0.1:8001 --protocol v2-grpc --model mlp --concurrency 8 \\
          --duration 10
      tradeoff bench http://127.0.0.1:9000/predict --protocol http --body req.json \\
          --header "Authorization:Bearer $TOKEN" --rate 100 --duration 20
    """
    import json as json_module

    from rich.console import Console

    from tradeoff.bench.adapters import BenchSetupError
    from tradeoff.bench.endpoint import EndpointSpec, make_adapter
    from tradeoff.bench.load import LoadSpec, read_intervals
    from tradeoff.bench.session import run_benchmark
    from tradeoff.report.terminal import print_bench_result

    console = Console(stderr=False)
    try:
        if concurrency is None and rate is None and intervals is None:
            concurrency = 1
        spec = LoadSpec(concurrency=concurrency, rate=rate, arrival=arrival,
                        intervals=read_intervals(intervals) if intervals else None,
                        duration_s=duration, requests=request_count, warmup_s=warmup,
                        window_s=window, stability_percent=stability_percent,
                        max_windows=max_windows, timeout_s=timeout,
                        max_connections=max_connections, seed=seed)
        adapter = make_adapter(EndpointSpec(
            url, protocol, model, version=model_version, json_tensors=json_tensors,
            shapes=_parse_shapes(shapes), batch_size=batch_size, input_data=input_data,
            method=method, headers=_parse_headers(headers), body=body, seed=seed,
            timeout_s=timeout))
        result, records, start_ns = run_benchmark(adapter, spec, console, workers)
    except (ValueError, BenchSetupError) as exc:
        raise click.ClickException(str(exc)) from None
    print_bench_result(result, console)
    if json_path:
        json_path.write_text(json_module.dumps(result, indent=2))
        console.print(f"result: {json_path}")
    if records_path:
        try:
            records.write(records_path, start_ns)
        except (OSError, RuntimeError) as exc:
            raise click.ClickException(f"--records {records_path}: {exc}") from None
        console.print(f"records: {records_path}")
