"""``tradeoff optimize``: INT8, FP16 and graph-optimised versions of a repository model."""

from __future__ import annotations

from pathlib import Path

import click

from tradeoff.cli.options import Duration, Number, json_option, save_result, step_progress

__all__ = ["optimize"]


@click.command()
@click.argument("model_dir", metavar="REPOSITORY/MODEL",
                type=click.Path(file_okay=False, path_type=Path))
@click.option("--int8", "int8", type=click.Choice(["dynamic", "static"]),
              help="Make an INT8 version: dynamic (weights only ahead of time) or static "
                   "(activation ranges from --calibration).")
@click.option("--per-channel", is_flag=True,
              help="INT8 weights get a scale per output channel (keeps more accuracy).")
@click.option("--exclude-node", "exclude", multiple=True,
              help="Leave this node in FP32 (repeatable): for sensitive layers.")
@click.option("--fp16", is_flag=True,
              help="Make an FP16 version (inputs and outputs stay FP32); for GPU providers.")
@click.option("--bf16", is_flag=True,
              help="Generative models: a sibling model with the decoder in bfloat16.")
@click.option("--graph-opt", is_flag=True,
              help="Make a version with ONNX Runtime's graph optimisations done ahead.")
@click.option("--calibration", type=click.Path(dir_okay=False, path_type=Path),
              help="Calibration samples for --int8 static (.npz, .npy or .txt); default: "
                   "the model's samples/calibration.*, else seeded random inputs.")
@click.option("--validation", type=click.Path(dir_okay=False, path_type=Path),
              help="Validation samples every version is graded on (.npz, .npy or .txt); "
                   "default: the model's samples/validation.*, else seeded random inputs.")
@click.option("--max-drop", type=Number(min=0), default=0.01, show_default=True,
              help="Mark a version that loses more: 1 - cosine (embeddings), 1 - top-1 "
                   "agreement (classifiers), relative max error (other outputs).")
@click.option("--from-version", type=click.IntRange(min=1),
              help="The version to start from (default: the newest not made by optimize).")
@click.option("--seconds", type=Duration(minimum_s=0.1), default="4s", show_default=True,
              help="Time to measure the speed of each version (4s, 500ms).")
@json_option("tradeoff.optimize/1")
def optimize(model_dir: Path, int8: str | None, per_channel: bool, exclude: tuple[str, ...],
             fp16: bool, bf16: bool, graph_opt: bool, calibration: Path | None,
             validation: Path | None, max_drop: float, from_version: int | None, seconds: float,
             json_path: Path | None) -> None:
    """Write optimised versions of an ONNX model as new versions of it in its repository,
    then measure every version in process on the same samples: size, latency at batch 1,
    throughput at its best batch, and accuracy against the original.

    The config records how each version was made (parameters version_<N>_precision and
    version_<N>_method) and serves all versions, so `tradeoff serve` serves them side by
    side and `tradeoff compare` can A/B them (version=N).

    A generative model (generate.yaml) gets a sibling model per precision instead,
    MODEL-int8 or MODEL-bf16, graded by perplexity and greedy next-token agreement.

    \b
    Examples:
      tradeoff optimize ./models/minilm --int8 dynamic --per-channel
      tradeoff optimize ./models/resnet50 --int8 static --per-channel --json opt.json
      tradeoff optimize ./models/mlp --int8 dynamic --fp16 --graph-opt
      tradeoff optimize ./models/smollm2-135m --int8 dynamic --bf16
      tradeoff optimize ./models/minilm --int8 static --calibration cal.txt \\
          --validation val.txt --max-drop 0.005
    """
    from rich.console import Console

    from tradeoff.optimize import OptimizePlan, Variant, optimize_model
    from tradeoff.report.terminal import print_optimize

    if per_channel and not int8:
        raise click.UsageError("--per-channel applies to --int8")
    variants = []
    if int8:
        variants.append(Variant(f"int8-{int8}", per_channel, exclude))
    if fp16:
        variants.append(Variant("fp16"))
    if bf16:
        variants.append(Variant("bf16"))
    if graph_opt:
        variants.append(Variant("graph-opt"))
    if not variants:
        raise click.UsageError("say what to make: --int8 dynamic|static, --fp16, --bf16 or "
                               "--graph-opt")
    plan = OptimizePlan(tuple(variants), validation, calibration, max_drop, seconds,
                        from_version)
    console = Console()
    with step_progress(console, "reading the model") as say:
        result = optimize_model(model_dir, plan, say)
    print_optimize(result, console)
    made = [v for v in result.versions if v.created]
    name = model_dir.resolve().name
    if made and made[0].model:
        console.print(f"new models {', '.join(str(v.model) for v in made)} beside "
                      f"{model_dir}; a running server serves them after "
                      f"curl -X POST localhost:8000/v2/repository/models/MODEL/load "
                      "(or a restart)", markup=False)
    elif made:
        console.print(f"new versions {', '.join(str(v.version) for v in made)} in "
                      f"{model_dir}; the config serves all versions. A running server "
                      f"serves them after: curl -X POST "
                      f"localhost:8000/v2/repository/models/{name}/load (or a restart)",
                      markup=False)
    save_result(result, json_path, console, "optimize result")
