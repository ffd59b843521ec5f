"""Every option that more than one command takes, declared once, so the same flag has the
same name, type, help and default everywhere; and the two builders that turn them into an
``EndpointSpec`` and a ``LoadSpec``.

    @click.command()
    @click.argument("url")
    @endpoint_options
    @load_options("concurrency", "rate", "arrival", "duration", "warmup")
    @json_option("tradeoff.bench/1")
    def bench(url: str, json_path: Path | None, **shared: Any) -> None:
        target = take_endpoint(url, shared)
        spec = take_load(shared)
"""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from tradeoff.bench.load import DURATION_FORMS, LOAD_DEFAULTS, LoadSpec, parse_duration
from tradeoff.errors import InvalidValue, local_resource

if TYPE_CHECKING:
    from rich.console import Console

    from tradeoff.bench.endpoint import EndpointSpec
    from tradeoff.results import CompareResult, ResultDocument, SweepResult

__all__ = [
    "DURATION",
    "DURATION_OR_ZERO",
    "LOAD_OPTIONS",
    "MAX_DISTINCT_INPUTS",
    "NOT_V2_OPTIONS",
    "ByteSize",
    "Decorator",
    "Duration",
    "Number",
    "apply",
    "hidden",
    "json_option",
    "load_options",
    "save_result",
    "save_summary",
    "seconds_text",
    "setup_logging",
    "size_text",
    "step_progress",
    "take_endpoint",
    "take_load",
]

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class Duration(click.ParamType):
    """A time flag: ``90`` (seconds), ``1.5``, ``500ms``, ``90s``, ``5m``, ``1h`` -> seconds.
    A bad value is one line saying what to write."""

    name = "duration"

    def __init__(self, *, allow_zero: bool = False, minimum_s: float = 0.0) -> None:
        self.allow_zero = allow_zero
        self.minimum_s = minimum_s

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> float:
        try:
            seconds = parse_duration(value, allow_zero=self.allow_zero)
        except InvalidValue as exc:
            self.fail(str(exc), param, ctx)
        if seconds < self.minimum_s:
            self.fail(f"{value!r}: at least {seconds_text(self.minimum_s)}", param, ctx)
        return seconds

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "DURATION"


DURATION = Duration()
DURATION_OR_ZERO = Duration(allow_zero=True)


class Number(click.FloatRange):
    """A float flag within a range, and finite: click's FloatRange lets ``nan`` through
    every bound (each comparison with it is false) and ``inf`` past an open upper one."""

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return number


class ByteSize(click.ParamType):
    """A size flag: ``64MiB``, ``1GB``, ``65536`` (bytes) -> bytes, at least ``minimum``."""

    name = "size"

    def __init__(self, minimum: int = 1) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int:
        if isinstance(value, int):
            return value
        from tradeoff.server.cache.spec import parse_size

        try:
            size = parse_size(str(value), "size")
        except InvalidValue:
            self.fail(f"{value!r} is not a size; write 64MiB, 1GB or 65536 (bytes)", param, ctx)
        if size < self.minimum:
            self.fail(f"{value!r}: this size must be at least {size_text(self.minimum)}",
                      param, ctx)
        return size

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "SIZE"


def size_text(size: int) -> str:
    """``67108864`` -> ``64MiB``: as a user would write it."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale}{unit}"
    return str(size)


def seconds_text(seconds: float) -> str:
    """``1800`` -> ``30m``, ``5`` -> ``5s``, ``0.5`` -> ``500ms``: as a user would write it."""
    if seconds == 0:
        return "0s"
    for unit, size in (("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    if seconds < 1:
        return f"{seconds * 1000:g}ms"
    return f"{seconds:g}s"


def apply(*decorators: Decorator) -> Decorator:
    """One decorator made of several, applied in the order listed (top first)."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for decorator in reversed(decorators):
            function = decorator(function)
        return function
    return decorate


# ---------------------------------------------------------------- what to send, to whom

# inputs are made and held before the run: a bound on what one flag can allocate
MAX_DISTINCT_INPUTS = 1_000_000

endpoint_options = apply(
    click.option("--protocol", type=click.Choice(["v2", "v2-grpc", "http", "openai"]),
                 default="v2", show_default=True,
                 help="v2: Open Inference Protocol over HTTP; v2-grpc: the same over gRPC "
                      "(URL host:port); http: any JSON-over-HTTP endpoint; openai: an "
                      "OpenAI-compatible API, streamed (URL: its base, e.g. "
                      "http://host:8000/v1)."),
    click.option("--model", "-m", help="Model name (v2, openai)."),
    click.option("--model-version", default="", help="Model version (v2; default: the "
                                                     "server's)."),
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
    click.option("--temperature", type=Number(0), default=0.0, show_default=True,
                 help="openai: sampling temperature."),
    click.option("--api-key-env", default="OPENAI_API_KEY", show_default=True,
                 help="openai: the environment variable holding the API key (sent as a "
                      "Bearer token, never printed or stored)."),
    click.option("--slo", default="",
                 help="openai: goodput counts requests meeting all of these, e.g. "
                      "ttft_ms=500,tpot_ms=50 (keys ttft_ms, tpot_ms, e2e_ms)."),
    click.option("--distinct-inputs", type=click.IntRange(1, MAX_DISTINCT_INPUTS),
                 help="v2 random inputs or openai synthetic prompts: make N distinct ones "
                      "and draw each request's from a Zipf law (--zipf), reproducible with "
                      "--seed: traffic a response cache can be measured with "
                      "[default: 8 inputs (v2), round-robin]."),
    click.option("--zipf", type=Number(0), metavar="S",
                 help="Zipf exponent of the draw: the k-th most popular input is sent with "
                      "probability ∝ 1/k**S (0: uniform) [default with --distinct-inputs: "
                      "1.0; without it: round-robin over the inputs]."),
    click.option("--mix", "classes", multiple=True, metavar="NAME=WEIGHT[,param=value...]",
                 help="v2, v2-grpc, openai: a class of requests with its share and the "
                      "request parameters it carries (repeat it), e.g. --mix "
                      "latency=20,class=latency --mix bulk=80,class=throughput: each "
                      "request is drawn to a class, and every class is reported apart as "
                      "well as together (with openai, the parameters go into the body, "
                      "and TTFT and TPOT are reported per class)."),
    # used by the requests (inputs, connections) and by the load alike
    click.option("--timeout", type=DURATION, default=seconds_text(LOAD_DEFAULTS.timeout_s),
                 show_default=True,
                 help="Each request's deadline, connecting to the last byte of the answer; "
                      "when a run stops, what is in flight has this (at most "
                      f"{seconds_text(LOAD_DEFAULTS.stop_grace_s)}) more, then is cut and "
                      "counted as a timeout. The endpoint's metadata reads have it too."),
    click.option("--max-response-size", "max_response_bytes", type=ByteSize(),
                 default=size_text(LOAD_DEFAULTS.max_response_bytes), show_default=True,
                 help="The longest answer read (head included; the endpoint's metadata "
                      "too): a longer one is cut there and counted as an error."),
    click.option("--seed", type=int, default=LOAD_DEFAULTS.seed, show_default=True,
                 help="Seed for random inputs, synthetic prompts and Poisson arrivals."),
)


def hidden(*names: str) -> Decorator:
    """Keep these options of a command out of its --help (they still parse, with their
    defaults): a shared option set the command uses only part of. Put it above them."""
    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        for param in getattr(function, "__click_params__", []):
            if set(param.opts) & set(names):
                param.hidden = True
        return function
    return decorate


# what only the http and openai protocols use: hidden where a command takes only v2
NOT_V2_OPTIONS = ("--method", "--body", "--chat", "--prompts", "--input-tokens",
                  "--output-tokens", "--num-prompts", "--ignore-eos", "--temperature",
                  "--api-key-env", "--slo")


def take_endpoint(url: str, options: dict[str, Any]) -> EndpointSpec:
    """The EndpointSpec named by the endpoint options, which are taken out of ``options``
    (``--timeout`` and ``--seed`` stay there: the load needs them too)."""
    from tradeoff.bench.endpoint import (
        EndpointSpec,
        GenerationOptions,
        parse_headers,
        parse_shapes,
        parse_slo,
    )
    from tradeoff.bench.mix import RequestClass
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
        json_tensors=options.pop("json_tensors"), shapes=parse_shapes(options.pop("shapes")),
        batch_size=options.pop("batch_size"), input_data=options.pop("input_data"),
        method=options.pop("method"), headers=parse_headers(options.pop("headers")),
        body=options.pop("body"), seed=options["seed"], timeout_s=options["timeout"],
        max_response_bytes=options.pop("max_response_bytes"),
        generation=generation, distinct_inputs=options.pop("distinct_inputs"),
        zipf=options.pop("zipf"),
        classes=tuple(RequestClass.parse(text) for text in options.pop("classes")))


# ------------------------------------------------------------------------ the load

_D = LOAD_DEFAULTS

LOAD_OPTIONS: dict[str, Decorator] = {
    "concurrency": click.option(
        "--concurrency", type=click.IntRange(1),
        help=f"Closed loop: requests in flight [default: {_D.concurrency} when neither "
             "--rate nor --intervals is given]."),
    "rate": click.option(
        "--rate", type=Number(min=0, min_open=True),
        help="Open loop: requests per second, latency from the scheduled send time."),
    "arrival": click.option(
        "--arrival", type=click.Choice(["constant", "poisson"]), default=_D.arrival,
        show_default=True,
        help="Open-loop arrivals: constant gaps (perf_analyzer's default) or poisson "
             "(exponential gaps, like independent users; vLLM's default)."),
    "intervals": click.option(
        "--intervals", type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Replay a trace: one gap per line in microseconds ('# offsets' as the first "
             "line: offsets from the start)."),
    "duration": click.option(
        "--duration", type=DURATION,
        help=f"How long to measure: {DURATION_FORMS} [default: bench until stable; sweep "
             f"{seconds_text(_D.point_duration_s)} per level; compare "
             f"{seconds_text(_D.point_duration_s)} per round; soak "
             f"{seconds_text(_D.soak_duration_s)}]."),
    "requests": click.option(
        "--requests", type=click.IntRange(1),
        help="Requests to measure instead of a duration."),
    "warmup": click.option(
        "--warmup", type=DURATION_OR_ZERO, default=seconds_text(_D.warmup_s),
        show_default=True,
        help="Load before measuring, reported apart."),
    "window": click.option(
        "--window", type=DURATION,
        help=f"Length of each measurement window [default: 5s while waiting for stability, "
             f"one window over a fixed --duration; soak {seconds_text(_D.soak_window_s)}]."),
    "stability": apply(
        click.option("--stability-percent", type=Number(0, 100, min_open=True,
                                                                  max_open=True),
                     default=_D.stability_percent, show_default=True,
                     help="The last 3 windows must agree within this on throughput and "
                          "p99."),
        click.option("--max-windows", type=click.IntRange(3), default=_D.max_windows,
                     show_default=True, help="Most windows to wait for stability.")),
    "max_connections": click.option(
        "--max-connections", type=click.IntRange(1), default=_D.max_connections,
        show_default=True, help="Open loop: most connections to hold at once."),
    "workers": click.option(
        "--workers", type=click.IntRange(1), default=1, show_default=True,
        help="Load generators (processes, or Ray actors with --ray), each offering its "
             "share of the load; their raw records are merged exactly. Needs a "
             "fixed-length run, not one until stable."),
    "ray": click.option(
        "--ray", "ray_address", metavar="ADDRESS",
        help="Run the --workers as Ray actors spread over the nodes of the Ray cluster at "
             "ADDRESS (host:port of `ray start --head`); each times its own requests, "
             "all start together, and the clock skew seen is reported."),
}


def load_options(*names: str) -> Decorator:
    """The load options a command takes, by name (keys of ``LOAD_OPTIONS``)."""
    return apply(*(LOAD_OPTIONS[name] for name in names))


def take_load(options: dict[str, Any], *, default_duration_s: float | None = None
              ) -> LoadSpec:
    """The LoadSpec of the load options present in ``options`` (taken out of it), through
    the one builder, ``LoadSpec.from_flags``; ``default_duration_s`` is the command's
    length of a run without --duration or --requests (None: until stable)."""
    from tradeoff.bench.load import read_intervals

    intervals = options.pop("intervals", None)
    return LoadSpec.from_flags(
        concurrency=options.pop("concurrency", None), rate=options.pop("rate", None),
        arrival=options.pop("arrival", None),
        intervals=read_intervals(intervals) if intervals is not None else None,
        duration_s=options.pop("duration", None), requests=options.pop("requests", None),
        warmup_s=options.pop("warmup", None), window_s=options.pop("window", None),
        stability_percent=options.pop("stability_percent", None),
        max_windows=options.pop("max_windows", None), timeout_s=options.pop("timeout"),
        max_connections=options.pop("max_connections", None), seed=options.pop("seed"),
        default_duration_s=default_duration_s, workers=options.pop("workers", None),
        ray_address=options.pop("ray_address", None))


# --------------------------------------------------------------- scoring and limits

alpha_option = click.option(
    "--alpha", type=Number(0, 1), default=0.5, show_default=True,
    help="Score weight of throughput per dollar; 1-alpha goes to 1/p99.")

max_error_percent_option = click.option(
    "--max-error-percent", type=Number(0, 100), default=1.0, show_default=True,
    help="Highest error rate that counts as working: a sweep stops above it, and an SLA "
         "or a ranking leaves out what passes it.")


# ---------------------------------------------------------------------------- output

def json_option(schema: str) -> Decorator:
    """``--json FILE``: where the command's document (``schema``) goes."""
    return click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
                        help=f"Write the result (schema {schema}) here.")


def _output_file(ctx: click.Context, param: click.Parameter, value: Path | None
                 ) -> Path | None:
    """A file the command writes after its run: its folder made now, so that a run is
    never lost to a folder that does not exist (as ``--json`` does)."""
    if value is not None:
        with local_resource(f"cannot make the folder of {param.opts[0]} {value}"):
            value.parent.mkdir(parents=True, exist_ok=True)
    return value


records_option = click.option(
    "--records", "records_path", type=click.Path(dir_okay=False, path_type=Path),
    callback=_output_file,
    help="Write every request's record here (.csv, or .parquet with pyarrow); its "
         "folder is made if missing.")


def _summary_path(ctx: click.Context, param: click.Parameter, value: Path | None
                  ) -> Path | None:
    if value is not None and value.suffix not in (".csv", ".md"):
        raise click.BadParameter(f"{value}: name a .csv or a .md file")
    return _output_file(ctx, param, value)


summary_option = click.option(
    "--summary", "summary_path", type=click.Path(dir_okay=False, path_type=Path),
    callback=_summary_path,
    help="Write one row per level or endpoint here: .csv, or .md for a Markdown table "
         "(as perf_analyzer's -f).")


def save_summary(result: SweepResult | CompareResult, path: Path | None,
                 console: Console) -> None:
    """Write ``--summary`` when one was given, and say where."""
    from tradeoff.report.summary import write_summary

    if path is None:
        return
    write_summary(result, path)
    console.print(f"summary table: {path}", markup=False)


def save_result(document: ResultDocument, path: Path | None, console: Console,
                what: str = "result") -> None:
    """Write ``document`` to ``path`` (``--json``) when one was given, and say where."""
    from tradeoff.results import write_json

    if path is None:
        return
    write_json(document, path)
    console.print(f"{what}: {path}", markup=False)


@contextmanager
def step_progress(console: Console, first: str = "starting") -> Iterator[Callable[[str], None]]:
    """A spinner whose text is the step under way, for long work in process; yields the
    function that names the next step. Not on a terminal (a log, CI): each step a plain
    line with the time so far."""
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not console.is_terminal:
        started = time.monotonic()

        def say(step: str) -> None:
            console.print(f"[{time.monotonic() - started:6.1f}s] {step}", highlight=False,
                          markup=False)

        say(first)
        yield say
        return
    with Progress(SpinnerColumn(), TextColumn("{task.description}", markup=False),
                  TimeElapsedColumn(),
                  console=console, transient=True) as progress:
        task = progress.add_task(first, total=None)
        yield lambda step: progress.update(task, description=step)


def setup_logging(level: str) -> None:
    """Log to stderr at ``level`` (debug, info, warning, error)."""
    logging.basicConfig(level=getattr(logging, level.upper()), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
