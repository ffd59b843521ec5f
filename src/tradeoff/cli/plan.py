"""``tradeoff plan``: a deployment for a model, its traffic and an SLA, replayed."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from tradeoff.cli.options import DURATION, Duration, Number, json_option, save_result, step_progress
from tradeoff.cli.signals import RaiseOnSignal, Stopped
from tradeoff.errors import InvalidValue
from tradeoff.plan.continuous import MAX_LENGTH, Lengths

__all__ = ["plan"]

PRECISIONS = {"int8": ("int8-dynamic", True), "int8-static": ("int8-static", True),
              "fp16": ("fp16", False), "graph-opt": ("graph-opt", False),
              "bf16": ("bf16", False)}


@click.command()
@click.argument("model_dir", metavar="REPOSITORY/MODEL",
                type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--sla-p99-ms", type=Number(0, min_open=True),
              help="The p99 latency every request must meet, in ms (tensor models).")
@click.option("--sla-ttft-ms", type=Number(0, min_open=True),
              help="Generative models: the p99 time to first token, in ms.")
@click.option("--sla-tpot-ms", type=Number(0, min_open=True),
              help="Generative models: the p99 time per output token after the first, "
                   "in ms.")
@click.option("--prompt-words", type=click.IntRange(1, MAX_LENGTH),
              help="Generative models: each prompt's length in words (about a token each "
                   "for BPE tokenizers; the plan works in the server's own token count). "
                   "Default: a trace's mean prompt_tokens, else 128.")
@click.option("--output-tokens", type=click.IntRange(1, MAX_LENGTH),
              help="Generative models: tokens each answer generates. Default: a trace's "
                   "mean output_tokens, else 64.")
@click.option("--shared-prefix-words", type=click.IntRange(0, MAX_LENGTH), default=0,
              show_default=True,
              help="Generative models: the words every prompt starts with (a system "
                   "prompt), which prefix caching can reuse.")
@click.option("--rate", type=Number(0, min_open=True),
              help="The traffic: requests per second (with --arrival), or give --trace.")
@click.option("--arrival", type=click.Choice(["poisson", "constant"]), default="poisson",
              show_default=True, help="How --rate's requests arrive.")
@click.option("--distinct-inputs", type=click.IntRange(1),
              help="With --rate: the traffic repeats inputs drawn from this many (by "
                   "--zipf); without it every input differs.")
@click.option("--zipf", type=Number(0), metavar="S",
              help="With --distinct-inputs: the Zipf exponent of the draws (default 1.0).")
@click.option("--class-sla", "class_slas", multiple=True, metavar="NAME=MS",
              help="A class of requests with its own p99 (repeat it); the others have "
                   "--sla-p99-ms. With two or more classes, a pool per class behind a "
                   "router is weighed against one pool for all. Generative models: the "
                   "class's TTFT p99 (the others have --sla-ttft-ms), and the engine's "
                   "priority by class is weighed against first come, first served.")
@click.option("--class-sla-tpot", "class_tpots", multiple=True, metavar="NAME=MS",
              help="Generative models: a class's own TPOT p99 (repeat it); the others "
                   "have --sla-tpot-ms.")
@click.option("--class-share", "class_shares", multiple=True, metavar="NAME=SHARE",
              help="With --rate: a class's share of the requests (repeat it; normalised). "
                   "A trace's classes are measured from its 'class' field.")
@click.option("--trace", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The traffic recorded: a `tradeoff bench --records` CSV or JSON lines "
                   "({\"timestamp\": s, \"input\": ..., \"class\": ...}); its rate, peak, "
                   "burstiness and repetition are measured, and it is replayed.")
@click.option("--precision", "precisions", multiple=True, default=("int8",),
              show_default=True, type=click.Choice([*PRECISIONS, "none"]),
              help="Versions to make and weigh (repeat it): int8 (dynamic, per channel), "
                   "int8-static, fp16 (GPU), graph-opt; for generative models int8 and "
                   "bf16; none: the original only.")
@click.option("--max-drop", type=Number(0), default=0.01, show_default=True,
              help="The accuracy a version may lose: 1 - cosine (embeddings), 1 - top-1 "
                   "agreement (classifiers), relative max error (other outputs), the "
                   "perplexity's relative rise (generative models).")
@click.option("--price-per-hour", type=Number(0, min_open=True),
              help="What the deployment costs per hour: cost per 1M requests.")
@click.option("--price-per-core-hour", type=Number(0, min_open=True),
              help="Or per core it occupies (instances x threads); fewer cores cost less.")
@click.option("--price-per-gpu-hour", type=Number(0, min_open=True),
              help="Or per GPU the model's instance_group places instances on (KIND_GPU "
                   "models); instances and pools share the GPUs.")
@click.option("--cores", type=click.IntRange(1),
              help="Cores the server may use (default: all but one, which the load "
                   "generator takes); at most this machine's unless --another-host.")
@click.option("--another-host", is_flag=True,
              help="The deployment is for a host with more cores than this one: --cores "
                   "may exceed this machine's, and the replay here cannot prove it.")
@click.option("--budget", type=DURATION, default="10m", show_default=True,
              help="Time the whole plan may take; it stops replaying candidates past it.")
@click.option("--replay", "replay_s", type=Duration(minimum_s=1), default="15s",
              show_default=True, help="How long each replay round measures a deployment.")
@click.option("--seconds", type=Duration(minimum_s=0.1), default="2s", show_default=True,
              help="Time to measure the speed of each version.")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path),
              help="Where to write the deployment (default: REPOSITORY-plan-MODEL beside "
                   "the repository); must be new or empty.")
@json_option("tradeoff.plan/1")
def plan(model_dir: Path, sla_p99_ms: float | None, sla_ttft_ms: float | None,
         sla_tpot_ms: float | None, prompt_words: int | None, output_tokens: int | None,
         shared_prefix_words: int, rate: float | None, arrival: str,
         distinct_inputs: int | None, zipf: float | None, class_slas: tuple[str, ...],
         class_tpots: tuple[str, ...], class_shares: tuple[str, ...], trace: Path | None,
         precisions: tuple[str, ...], max_drop: float, price_per_hour: float | None,
         price_per_core_hour: float | None, price_per_gpu_hour: float | None,
         cores: int | None, another_host: bool, budget: float, replay_s: float,
         seconds: float, output: Path | None, json_path: Path | None) -> None:
    """Plan a deployment of a model for its traffic and an SLA, write it beside the
    repository, and prove it: served and replayed against the starting deployment.

    For a tensor model (a p99 SLA) it weighs the precision versions `tradeoff optimize`
    makes (within --max-drop), the batch size, queue delay and instances `tradeoff tune
    serve` moves, a response cache sized from the traffic's repetition, and a pool per
    class of requests behind a router; it predicts each deployment by simulating the
    batcher on the measured batch costs and the traffic's arrivals. For a generative
    model (TTFT and TPOT SLAs) it weighs precision (--max-drop: the perplexity's rise),
    max_num_seqs, max_num_batched_tokens and prefix caching, predicted by the engine's
    own scheduler over the measured step costs. It writes the best (REPOSITORY, its
    config, serve.sh) and replays the traffic against it and the starting deployment side
    by side. docs/plan.md says what it measures and its limits.

    \b
    Examples:
      tradeoff plan ./models/mlp --sla-p99-ms 5 --rate 2000
      tradeoff plan ./models/minilm --sla-p99-ms 50 --rate 100 --distinct-inputs 500 \\
          --zipf 1.0 --price-per-core-hour 0.05 --json plan.json
      tradeoff plan ./models/mlp --sla-p99-ms 5 --trace records.csv --precision none
      tradeoff plan ./models/mlp --sla-p99-ms 100 --class-sla latency=5 --rate 2000 \\
          --class-share latency=0.1 --class-share bulk=0.9 --cores 4
      tradeoff plan ./models/resnet50 --sla-p99-ms 200 --rate 20 --precision int8 \\
          --max-drop 0.02 --budget 20m -o ./deploy/resnet50
      tradeoff plan ./models/smollm2-135m --sla-ttft-ms 800 --sla-tpot-ms 80 --rate 1 \\
          --prompt-words 128 --output-tokens 32 --shared-prefix-words 96 \\
          --precision int8 --max-drop 0.05
      tradeoff plan ./models/smollm2-135m --sla-ttft-ms 6000 --sla-tpot-ms 300 \\
          --class-sla chat=1500 --class-sla-tpot chat=150 --rate 3 \\
          --class-share chat=0.3 --class-share batch=0.7
    """
    from rich.console import Console

    from tradeoff.analysis.diagnose import diagnose_plan
    from tradeoff.optimize import Variant
    from tradeoff.plan.planner import PlanRequest, make_plan
    from tradeoff.plan.traffic import Traffic
    from tradeoff.report.terminal import print_plan
    from tradeoff.stats.cost import Price
    from tradeoff.tune.goal import Goal

    if (sla_ttft_ms is None) != (sla_tpot_ms is None):
        raise click.UsageError("a generative model's SLA is both --sla-ttft-ms and "
                               "--sla-tpot-ms")
    if (sla_p99_ms is None) == (sla_ttft_ms is None):
        raise click.UsageError("give the SLA: --sla-p99-ms (tensor models), or "
                               "--sla-ttft-ms and --sla-tpot-ms (generative models)")
    if rate is not None and trace is not None:
        raise click.UsageError("give --rate or --trace, not both: a trace brings its own "
                               "rate (its send times)")
    if rate is None and trace is None:
        raise click.UsageError("give the traffic: --rate (with --arrival) or --trace")
    _one_model(model_dir)
    if trace is not None and (distinct_inputs is not None or zipf is not None):
        raise click.UsageError("--distinct-inputs and --zipf describe --rate's inputs; a "
                               "trace's repetition is measured from it")
    if "none" in precisions and len(precisions) > 1:
        raise click.UsageError("--precision none weighs the original only: give it alone")
    shares = _positive(class_shares, "--class-share", "NAME=SHARE")
    if trace is not None and shares:
        raise click.UsageError("--class-share describes --rate's classes; a trace's shares "
                               "are measured from its 'class' field")
    traffic = Traffic.read(trace) if trace is not None else \
        Traffic.law(rate or 0.0, arrival, distinct_inputs, zipf, shares)
    lengths = Lengths(prompt_words or round(traffic.prompt_tokens or 128),
                      output_tokens or round(traffic.output_tokens or 64), shared_prefix_words)
    class_sla = _positive(class_slas, "--class-sla", "NAME=MS")
    class_tpot = _positive(class_tpots, "--class-sla-tpot", "NAME=MS")
    available = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    if cores is not None and cores > len(available) and not another_host:
        raise click.UsageError(
            f"--cores {cores}: this machine gives the plan {len(available)} core(s); give "
            "at most that, or --another-host to plan for a bigger host (then the replay "
            "here cannot prove the plan)")
    server_cores = cores or max(1, len(available) - 1)
    server_cpus = None
    if len(available) > server_cores:
        server_cpus = ",".join(str(c) for c in available[:server_cores])
    variants = tuple(Variant(*PRECISIONS[p]) for p in precisions if p != "none")
    goal = Goal(sla_p99_ms=sla_p99_ms or sla_ttft_ms or 0.0, max_drop=max_drop,
                cores=server_cores, sla_tpot_ms=sla_tpot_ms,
                price=Price(per_hour=price_per_hour) if price_per_hour else None,
                price_per_core_hour=price_per_core_hour,
                price_per_gpu_hour=price_per_gpu_hour, budget_s=budget,
                replay_s=replay_s, class_sla_ms=class_sla, class_tpot_ms=class_tpot)
    try:  # the values checked against each other, the traffic and the goal
        request = PlanRequest(model_dir, traffic, goal, variants, output, seconds,
                              server_cpus, lengths)
    except InvalidValue as exc:
        raise click.UsageError(str(exc)) from None
    console = Console()
    if cores is not None and cores > len(available):
        console.print(f"[yellow]--cores {cores} for another host[/yellow]: this machine has "
                      f"{len(available)}, so the replay here runs the deployment on fewer "
                      "cores than it is planned for and cannot prove it; replay it on its "
                      "host")
    try:
        if server_cpus is not None:  # this process generates the load: the other cores
            os.sched_setaffinity(0, set(available[server_cores:]))
        with RaiseOnSignal(), step_progress(console) as say:
            result = make_plan(request, say)
    except Stopped as stop:
        click.echo(f"plan: stopped by {stop}; its servers are stopped and its scratch "
                   "removed", err=True)
        sys.exit(128 + stop.signum)
    finally:
        if server_cpus is not None:
            os.sched_setaffinity(0, set(available))
    print_plan(result, console)
    for finding in diagnose_plan(result):
        if finding.rule == "plan_prediction_off":  # the calibration and replay disagree
            console.print(f"[yellow]{finding.title}[/]: {finding.action}")
    save_result(result, json_path, console, "plan")
    if not (result.proof and result.proof[-1].meets_sla):  # a verdict, as soak's 3 is
        console.print("[red]no deployment met the SLA on replay[/red]: "
                      + ("the one written is the best reached, marked so in its serve.sh"
                         if result.chosen else f"none was written ({result.stop_reason})")
                      + "; exit status 3")
        sys.exit(3)



def _one_model(model_dir: Path) -> None:
    """A usage error when ``model_dir`` is a repository of models rather than one."""
    from tradeoff.repository.repository import GENERATIVE_FILE, ROUTER_FILE

    def is_model(folder: Path) -> bool:
        return any((folder / name).is_file() for name in ("config.pbtxt", GENERATIVE_FILE,
                                                          ROUTER_FILE)) or \
            any(p.is_dir() and p.name.isdigit() for p in folder.iterdir())

    if not model_dir.is_dir() or is_model(model_dir):
        return
    models = sorted(p.name for p in model_dir.iterdir() if p.is_dir() and is_model(p))
    if models:
        raise click.UsageError(
            f"{model_dir} is a model repository, not a model: name one of its models, "
            f"e.g. {model_dir / models[0]} (it holds {', '.join(models[:6])}"
            f"{', ...' if len(models) > 6 else ''})")


def _positive(values: tuple[str, ...], flag: str, form: str) -> dict[str, float]:
    """``NAME=NUMBER`` flags, each number above zero."""
    from tradeoff.stats.cost import named_numbers

    out = named_numbers(values, flag)
    zero = next((name for name, value in out.items() if value <= 0), None)
    if zero is not None:
        raise click.UsageError(f"{flag} {zero}: use {form} with a number above 0")
    return out
