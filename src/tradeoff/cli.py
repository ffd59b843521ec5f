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
          max_request_bytes: int, shutdown_timeout: float, default_max_batch_size: int,
          intra_op_threads: int, strict_readiness: bool, log_level: str) -> None:
    """Serve a model repository over the Open Inference Protocol v2.

    \b
    Examples:
      tradeoff serve --model-repository ./models
      tradeoff serve --model-repository ./models --http-port 9000 --metrics-port 9002
      curl -s localhost:8000/v2/models/mlp/stats
    """
    from tradeoff.server.runner import ServeOptions
    from tradeoff.server.runner import serve as run_server

    _setup_logging(log_level)
    options = ServeOptions(
        model_repository=repository, host=host, http_port=http_port,
        metrics_port=None if no_metrics else metrics_port,
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
