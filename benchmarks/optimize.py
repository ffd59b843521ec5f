"""What INT8, FP16, BF16 and graph optimisation buy and cost, in process and served.

For `minilm`, `resnet50`, `mlp` and SmolLM2-135M: `tradeoff optimize` makes the versions
(in process, pinned to one core, one intra-op thread, on the same validation samples), then
`tradeoff serve` (pinned to core 0) serves the original and the INT8 version side by side
and `tradeoff compare` (load generator on core 1) measures them under the same load,
interleaved rounds, with 95% intervals on each ratio. Writes
benchmarks/results/optimize.json.

    .venv/bin/python benchmarks/optimize.py
    .venv/bin/python benchmarks/optimize.py --models minilm --rounds 3 --duration 5
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import command_line, write_results
from rich.console import Console

from tradeoff import data
from tradeoff.analysis.compare import run_compare
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions
from tradeoff.bench.load import LoadSpec
from tradeoff.models import build_repository
from tradeoff.optimize import OptimizePlan, Variant, optimize_model
from tradeoff.report.terminal import print_compare, print_optimize
from tradeoff.results import CompareResult, OptimizeResult
from tradeoff.server.process import ServerProcess

# the variants each model gets; the served A/B is the original against the first
PLANS = {
    "minilm": (Variant("int8-dynamic", per_channel=True), Variant("int8-dynamic"),
               Variant("int8-static", per_channel=True), Variant("graph-opt")),
    "resnet50": (Variant("int8-static", per_channel=True), Variant("int8-dynamic"),
                 Variant("fp16"), Variant("graph-opt")),
    "mlp": (Variant("int8-dynamic", per_channel=True), Variant("int8-static"),
            Variant("fp16")),
    "smollm2-135m": (Variant("int8-dynamic"), Variant("bf16")),
}


def sentences_input_data(path: Path) -> Path:
    """perf_analyzer-style --input-data with tradeoff's sentences, one per request."""
    entries = [{"text": {"content": [s], "shape": [1]}} for s in data.sentences()]
    path.write_text(json.dumps({"data": entries}))
    return path


def served_ab(root: Path, model: str, result: OptimizeResult, args: argparse.Namespace,
              console: Console) -> CompareResult:
    """The original against the first optimised version, served, through compare."""
    made = next(v for v in result.versions if v.created)
    with ServerProcess(root, cpus="0") as server:
        os.sched_setaffinity(0, {1})
        if made.model:  # an LLM: the sibling model, through /v1
            options = GenerationOptions(input_tokens=(32, 32), output_tokens=(64, 64),
                                        ignore_eos=True)
            targets = [EndpointSpec(f"{server.url}/v1", "openai", m, name=m,
                                    generation=options)
                       for m in (model, str(made.model))]
            concurrency = 1
        else:
            input_data = sentences_input_data(root / "sentences.json") \
                if model == "minilm" else None
            targets = [EndpointSpec(server.url, "v2", model, name=f"{model} v{v}",
                                    version=str(v), input_data=input_data)
                       for v in (result.source_version, made.version)]
            concurrency = 8
        spec = LoadSpec(concurrency=concurrency, duration_s=args.duration, warmup_s=1.0,
                        window_s=args.duration / 3)
        compare = run_compare(targets, spec, rounds=args.rounds, console=console)
        os.sched_setaffinity(0, {0, 1})
    return compare


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(PLANS), choices=list(PLANS))
    parser.add_argument("--seconds", type=float, default=6.0,
                        help="in-process speed measurement per version")
    parser.add_argument("--duration", type=float, default=6.0, help="seconds per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "optimize.json")
    args = parser.parse_args()
    console = Console(width=120)
    out: dict[str, Any] = {"command": command_line(),
                           "models": {}}
    with tempfile.TemporaryDirectory(prefix="tradeoff-optimize-") as scratch:
        root = Path(scratch)
        build_repository(root, tuple(args.models))
        for model in args.models:
            os.sched_setaffinity(0, {0})
            console.rule(f"{model}: tradeoff optimize (in process, core 0)")
            result = optimize_model(root / model, OptimizePlan(
                PLANS[model], seconds_per_version=args.seconds))
            os.sched_setaffinity(0, {0, 1})
            print_optimize(result, console)
            console.rule(f"{model}: served, original vs first variant (tradeoff compare)")
            compare = served_ab(root, model, result, args, console)
            print_compare(compare, console)
            out["models"][model] = {"optimize": result.to_dict(),
                                    "served": compare.to_dict()}
    write_results(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
