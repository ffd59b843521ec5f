"""``tradeoff tune``: find the configuration by measurement (batch size, serving config)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from tradeoff.cli.options import json_option, save_result, user_errors


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
@click.option("--max-latency-ms", type=click.FloatRange(min=0, min_open=True),
              help="Stop once one batch takes longer than this at p99.")
@click.option("--max-batch", type=click.IntRange(min=1), default=1024, show_default=True,
              help="The largest batch size to try.")
@click.option("--seconds", type=click.FloatRange(min=0.05), default=1.0, show_default=True,
              help="Time each batch size runs.")
@click.option("--back-off", type=click.FloatRange(0, 1, max_open=True), default=0.2,
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
    from tradeoff.server.cache import parse_size
    from tradeoff.tune.batch_size import BatchSizePlan, tune_batch_size

    console = Console()
    try:
        plan = BatchSizePlan(device=device, max_memory_bytes=(
            parse_size(max_memory, "--max-memory") if max_memory else None),
            max_latency_ms=max_latency_ms, max_batch=max_batch, seconds_per_batch=seconds,
            back_off=back_off, threads=threads)
        with _progress(console) as say:
            result = tune_batch_size(model_dir, plan, say)
    except user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    print_batch_size_tune(result, console)
    save_result(result, json_path, console, "tune result")


class _progress:
    """A spinner whose text is the step being measured."""

    def __init__(self, console: Any) -> None:
        from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

        self.progress = Progress(SpinnerColumn(), TextColumn("{task.description}"),
                                 TimeElapsedColumn(), console=console, transient=True)

    def __enter__(self) -> Any:
        self.progress.__enter__()
        task = self.progress.add_task("starting", total=None)
        return lambda step: self.progress.update(task, description=step)

    def __exit__(self, *exc: object) -> None:
        self.progress.__exit__(*exc)  # type: ignore[arg-type]
