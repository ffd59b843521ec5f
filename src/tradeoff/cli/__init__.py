"""The ``tradeoff`` command line: serve, models build, demo, bench, sweep, soak, compare,
diagnose, report, optimize, tune, top.

A thin layer: each command translates its flags into the domain's objects and prints what
comes back. Options that several commands take are declared once in ``options``; the load
they describe is built by ``LoadSpec.from_flags``, with one set of defaults
(docs/cli.md).
"""

from __future__ import annotations

from typing import Any

import click

from tradeoff.cli.analyze import diagnose, report
from tradeoff.cli.bench import bench
from tradeoff.cli.compare import compare
from tradeoff.cli.demo import demo
from tradeoff.cli.optimize import optimize
from tradeoff.cli.plan import plan
from tradeoff.cli.serve import models, serve
from tradeoff.cli.soak import soak
from tradeoff.cli.sweep import sweep
from tradeoff.cli.top import top
from tradeoff.cli.tune import tune
from tradeoff.errors import TradeoffError
from tradeoff.version import __version__

__all__ = ["main"]


class _Commands(click.Group):
    """Every error of the project's tree that reaches the command line is one line (the
    one place the commands' errors are mapped); anything else is a bug, and its
    traceback says where."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except TradeoffError as exc:
            raise click.ClickException(str(exc)) from None


@click.group(cls=_Commands, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="tradeoff")
def main() -> None:
    """Serve, benchmark and tune AI inference for the latency/throughput trade-off.

    Time flags (--duration, --warmup, --window, --timeout ...) take 90 (seconds), 1.5,
    500ms, 90s, 5m or 1h in every command; the load flags have the same defaults in
    bench, sweep, soak and compare (docs/cli.md).

    \b
    Examples:
      tradeoff models build ./models          # example ONNX models (+ LLMs with torch)
      tradeoff serve --model-repository ./models
      tradeoff demo                           # batching on vs off, LLM streams, report
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 16 --duration 10s
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:256 --json s.json
      tradeoff diagnose s.json && tradeoff report s.json -o report.html
      tradeoff optimize ./models/minilm --int8 dynamic --per-channel --json opt.json
      tradeoff tune batch-size ./models/mlp --max-memory 4GB
      tradeoff tune serve http://127.0.0.1:8000 --model mlp --sla-p99-ms 20 --max-throughput
      tradeoff top http://127.0.0.1:8002     # live: req/s, p99, queue, batch per model
      tradeoff plan ./models/mlp --sla-p99-ms 5 --rate 2000   # deployment, written, replayed
      tradeoff bench http://127.0.0.1:8000/v1 --protocol openai --model smollm2-135m \\
          --concurrency 4 --duration 1m --output-tokens 16:256 --ignore-eos
    """


main.add_command(serve)
main.add_command(models)
main.add_command(demo)
main.add_command(bench)
main.add_command(sweep)
main.add_command(soak)
main.add_command(compare)
main.add_command(diagnose)
main.add_command(report)
main.add_command(optimize)
main.add_command(tune)
main.add_command(plan)
main.add_command(top)
