"""``tradeoff tune``: find the configuration by measurement (batch size, serving config)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from tradeoff.bench.load import LOAD_DEFAULTS
from tradeoff.cli.options import (
    NOT_V2_OPTIONS,
    Duration,
    Number,
    endpoint_options,
    hidden,
    json_option,
    load_options,
    max_error_percent_option,
    save_result,
    step_progress,
    take_endpoint,
    take_load,
)
from tradeoff.cli.signals import SignalStop, Stopped

__all__ = ["batch_size", "serve", "tune"]


@click.group()
def tune() -> None:
    """Find a configuration by measurement: the batch size a model should run at, and
    the serving config that meets a latency SLA at the lowest cost.

    \b
    Examples:
      tradeoff tune batch-size ./models/mlp --max-memory 4GB
      tradeoff tune serve http://127.0.0.1:8000 --model mlp --sla-p99-ms 20 \\
          --max-throughput --price-per-hour 0.34 --budget 10m
    """


@tune.command("batch-size")
@click.argument("model_dir", metavar="REPOSITORY/MODEL",
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True,
              help="Where the model runs (cuda: ONNX Runtime's CUDA provider).")
@click.option("--max-memory", help="Memory the model may hold (weights and batch), e.g. 4GB "
                                   "or 512MiB: stops the doubling and sizes the formula.")
@click.option("--max-latency-ms", type=Number(min=0, min_open=True),
              help="Stop once one batch takes longer than this at p99.")
@click.option("--max-batch", type=click.IntRange(min=1), default=1024, show_default=True,
              help="The largest batch size to try.")
@click.option("--seconds", type=Duration(minimum_s=0.05), default="1s", show_default=True,
              help="Time each batch size runs (1s, 500ms).")
@click.option("--back-off", type=Number(0, 1, max_open=True), default=0.2,
              show_default=True, help="Fraction to back off from the knee.")
@click.option("--threads", type=click.IntRange(min=1),
              help="Intra-op threads (default: the config's intra_op_thread_count, else 1).")
@json_option("tradeoff.tune/1")
def batch_size(model_dir: Path, device: str, max_memory: str | None,
               max_latency_ms: float | None, max_batch: int, seconds: float, back_off: float,
               threads: int | None, json_path: Path | None) -> None:
    """Find the batch size a model should run at, in process: start at batch 1, double
    until throughput stops growing (or memory, latency or --max-batch stops it), and
    back off 20% from the knee.

    Prints throughput, batch latency and peak memory per batch size, the memory per
    sample, and the largest batch the formula (max_memory - weights) / per_sample
    allows next to the largest batch that actually stayed within --max-memory.

    \b
    Examples:
      tradeoff tune batch-size ./models/mlp
      tradeoff tune batch-size ./models/minilm --max-memory 2GB --json minilm-batch.json
      tradeoff tune batch-size ./models/resnet50 --device cuda --max-memory 8GB
      tradeoff tune batch-size ./models/mlp --max-latency-ms 5 --seconds 0.5
    """
    from rich.console import Console

    from tradeoff.report.terminal import print_batch_size_tune
    from tradeoff.server.cache.spec import parse_size
    from tradeoff.tune.batch_size import BatchSizePlan, tune_batch_size

    console = Console()
    plan = BatchSizePlan(device=device, max_memory_bytes=(
        parse_size(max_memory, "--max-memory") if max_memory else None),
        max_latency_ms=max_latency_ms, max_batch=max_batch, seconds_per_batch=seconds,
        back_off=back_off, threads=threads)
    with step_progress(console) as say:
        result = tune_batch_size(model_dir, plan, say)
    print_batch_size_tune(result, console)
    save_result(result, json_path, console, "tune result")


def _values(text: str, option: str, least: int) -> tuple[int, ...]:
    try:
        values = tuple(sorted({int(v) for v in text.split(",") if v.strip()}))
    except ValueError:
        values = ()
    if not values or values[0] < least:
        raise click.BadParameter(f"{text!r}: give whole numbers >= {least}, such as 1,4,16",
                                 param_hint=option)
    return values


@tune.command("serve")
@click.argument("url")
@hidden(*NOT_V2_OPTIONS)
@endpoint_options
@load_options("arrival", "duration", "warmup", "max_connections")
@click.option("--sla-p99-ms", type=Number(min=0, min_open=True),
              help="The SLA: p99 latency at most this (required unless --restore).")
@click.option("--rate", type=Number(min=0, min_open=True),
              help="Requests per second the deployment must serve within the SLA; the "
                   "winner is the cheapest (then lowest p99) that does.")
@click.option("--max-throughput", is_flag=True,
              help="Find the configuration with the highest throughput within the SLA "
                   "(each candidate gets an SLA rate search).")
@max_error_percent_option
@click.option("--price-per-hour", type=Number(min=0, min_open=True),
              help="USD per hour of the deployment: cost per million requests.")
@click.option("--price-per-core-hour", type=Number(min=0, min_open=True),
              help="USD per core-hour: a configuration pays for instances x threads cores.")
@click.option("--budget", type=Duration(minimum_s=1), default="10m", show_default=True,
              help="Time the search may take (90s, 10m, 1h).")
@click.option("--strategy", type=click.Choice(["coordinate", "grid"]), default="coordinate",
              show_default=True, help="coordinate: one knob at a time from the server's "
                                      "config; grid: every combination.")
@click.option("--max-batch-sizes", default="1,4,16,64", show_default=True,
              help="max_batch_size values to try.")
@click.option("--delays-us", default="0,500,2000,10000", show_default=True,
              help="max_queue_delay_microseconds values to try.")
@click.option("--instances", default="1,2", show_default=True,
              help="instance_group count values to try.")
@click.option("--threads", default="1,2", show_default=True,
              help="Intra-op thread values to try (parameters intra_op_thread_count).")
@click.option("--confirm", type=click.IntRange(min=0), default=3, show_default=True,
              help="After the search, measure this many of the best again (with the "
                   "server's config) and pick the winner on the medians; 0: do not.")
@click.option("--preferred", type=click.Choice(["both", "off", "max"]), default="both",
              show_default=True, help="preferred_batch_size values to try: none, equal to "
                                      "max_batch_size, or both.")
@click.option("--output", "output_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Where the winner's config.pbtxt goes (default: ./tune-MODEL), with the "
                   "server's config beside it as original.pbtxt.")
@click.option("--apply-to", type=click.Path(file_okay=False, path_type=Path),
              metavar="REPOSITORY/MODEL",
              help="Also write the winner as this model's config.pbtxt (the file there is "
                   "kept as config.pbtxt.orig).")
@click.option("--restore", is_flag=True,
              help="Do not tune: put back the config a tune serve that was killed left the "
                   "model without (the repository index marks a model on a trial config; "
                   "the marker holds the original).")
@json_option("tradeoff.tune/1")
def serve(url: str, sla_p99_ms: float | None, rate: float | None, max_throughput: bool,
          max_error_percent: float, price_per_hour: float | None,
          price_per_core_hour: float | None, budget: float, strategy: str,
          max_batch_sizes: str, delays_us: str, instances: str, threads: str,
          confirm: int, preferred: str, output_dir: Path | None, apply_to: Path | None,
          restore: bool, json_path: Path | None,
          **shared: Any) -> None:
    """Search the serving config of a model on a running `tradeoff serve` for an SLA:
    max_batch_size, max_queue_delay_microseconds, preferred_batch_size, instance count and
    intra-op threads. Each candidate is loaded live (the repository extension's load with
    a config; no restart) and measured with the bench engine: at --rate, or for the
    highest throughput within the SLA (--max-throughput). The search stops at --budget;
    the server gets its original config back at the end, and on SIGINT, SIGTERM or
    SIGHUP. Each trial config carries a marker (parameters tradeoff_tune, shown in the
    repository index); if the tuner is killed outright, --restore puts the original back.

    Prints every configuration tried (a refused one with the server's reason), marks the
    Pareto front of throughput, p99 and cost per million requests, and writes the winner
    as config.pbtxt.

    \b
    Examples:
      tradeoff tune serve http://127.0.0.1:8000 --model mlp --sla-p99-ms 20 \\
          --max-throughput --budget 5m
      tradeoff tune serve http://127.0.0.1:8000 --model minilm --sla-p99-ms 20 \\
          --rate 200 --price-per-core-hour 0.05 --json tune.json
      tradeoff tune serve http://127.0.0.1:8000 --model mlp --sla-p99-ms 10 \\
          --max-throughput --strategy grid --budget 30m --apply-to ./models/mlp
      tradeoff tune serve http://127.0.0.1:8000 --model mlp --restore
    """
    from rich.console import Console

    from tradeoff.errors import RunStopped
    from tradeoff.report.terminal import print_serve_tune
    from tradeoff.stats.cost import Price
    from tradeoff.tune.goal import Goal
    from tradeoff.tune.knobs import Space
    from tradeoff.tune.serve_search import ServeSearch
    from tradeoff.tune.winner import check_apply_target, write_winner

    console = Console()
    if restore:
        _restore(url, shared)
        return
    if sla_p99_ms is None:
        raise click.UsageError("give --sla-p99-ms (the p99 latency the config must meet)")
    if (rate is None) == (not max_throughput):
        raise click.UsageError("give one of --rate R or --max-throughput")
    try:
        space = Space(_values(max_batch_sizes, "--max-batch-sizes", 1),
                      _values(delays_us, "--delays-us", 0), _values(instances, "--instances", 1),
                      _values(threads, "--threads", 1),
                      {"both": (False, True), "off": (False,), "max": (True,)}[preferred])
        target = take_endpoint(url, shared)
        base = take_load(shared, default_duration_s=LOAD_DEFAULTS.point_duration_s)
        goal = Goal(sla_p99_ms, rate=rate,
                    price=Price(per_hour=price_per_hour) if price_per_hour else None,
                    price_per_core_hour=price_per_core_hour, budget_s=budget,
                    strategy=strategy, max_error_percent=max_error_percent, confirm=confirm)
        search = ServeSearch(target, base, goal, space)  # checks the arguments first
        if apply_to is not None:
            check_apply_target(apply_to, target.model or "")
        with SignalStop() as stop, step_progress(console) as say:
            search.say, search.checkpoint = say, stop.check
            try:
                result = search.run()
            except RunStopped:
                stop.check()
                raise
            stop.check()
        result = write_winner(result, search.original,
                              output_dir or Path(f"tune-{result.model}"), apply_to)
    except Stopped as stop:
        click.echo(f"tune serve: stopped by {stop}; {target.model} has its original config "
                   "back", err=True)
        sys.exit(128 + stop.signum)
    print_serve_tune(result, console)
    save_result(result, json_path, console, "tune result")


def _restore(url: str, shared: dict[str, Any]) -> None:
    from tradeoff.bench.v2 import ModelControl
    from tradeoff.tune.marker import restore_original

    target = take_endpoint(url, shared)
    if not target.model:
        raise click.UsageError("give --model: the model whose config to restore")
    click.echo(restore_original(ModelControl.of(target)))
