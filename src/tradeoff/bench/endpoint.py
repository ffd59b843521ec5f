"""Naming an endpoint under test: protocol, URL, model and request options -> an adapter.

    adapter = make_adapter(EndpointSpec("http://127.0.0.1:8000", model="mlp"))
    spec = parse_endpoint("b=127.0.0.1:8001,model=mlp,protocol=v2-grpc")
    parse_shapes(["INPUT0:3,224"]) == {"INPUT0": [3, 224]}           # --shape
    parse_headers(["Authorization:Bearer abc"]) == {"Authorization": "Bearer abc"}
    llm = EndpointSpec("http://127.0.0.1:8000/v1", "openai", "smollm2-135m",
                       generation=GenerationOptions(output_tokens=(16, 256), ignore_eos=True))
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tradeoff.bench.adapters import Adapter, HttpJsonAdapter, V2Adapter
from tradeoff.bench.load import LOAD_DEFAULTS
from tradeoff.bench.mix import InputMix, RequestClass
from tradeoff.errors import BenchSetupError, DatasetError, InvalidValue

__all__ = [
    "PROTOCOLS",
    "SLO_KEYS",
    "EndpointSpec",
    "GenerationOptions",
    "make_adapter",
    "parse_endpoint",
    "parse_headers",
    "parse_shapes",
    "parse_slo",
]

PROTOCOLS = ("v2", "v2-grpc", "http", "openai")
SLO_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


@dataclass(frozen=True)
class GenerationOptions:
    """What to ask an OpenAI-compatible endpoint: the prompts (a JSONL file, or synthetic
    ones of given lengths) and how to generate, plus the SLO that goodput counts against."""

    chat: bool = False
    prompts: Path | None = None
    input_tokens: tuple[int, int] = (128, 128)
    output_tokens: tuple[int, int] = (128, 128)
    num_prompts: int = 256
    ignore_eos: bool = False
    temperature: float = 0.0
    api_key_env: str = "OPENAI_API_KEY"
    slo: dict[str, float] = field(default_factory=dict)


def parse_slo(text: str) -> dict[str, float]:
    """``ttft_ms=500,tpot_ms=50[,e2e_ms=...]`` -> bounds in milliseconds."""
    slo: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = part.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = -1.0
        if not sep or key not in SLO_KEYS or not number > 0:
            raise BenchSetupError(f"--slo {text!r}: use KEY=MS,... with keys "
                                  f"{', '.join(SLO_KEYS)}, e.g. ttft_ms=500,tpot_ms=50")
        slo[key] = number
    return slo


def parse_shapes(values: Iterable[str]) -> dict[str, list[int]]:
    """``--shape NAME:d1,d2`` per input with variable dimensions (batch dimension
    excluded)."""
    shapes = {}
    for value in values:
        name, sep, dims = value.partition(":")
        try:
            if not sep or not name:
                raise ValueError
            shapes[name] = [int(d) for d in dims.split(",") if d.strip()]
        except ValueError:
            raise InvalidValue(f"--shape {value!r}: use NAME:d1,d2 (for example "
                               "INPUT0:3,224)") from None
    return shapes


def parse_headers(values: Iterable[str]) -> dict[str, str]:
    """``--header KEY:VALUE`` per header; the value may hold colons."""
    headers = {}
    for value in values:
        key, sep, header_value = value.partition(":")
        if not sep or not key.strip():
            raise InvalidValue(f"--header {value!r}: use KEY:VALUE")
        headers[key.strip()] = header_value.strip()
    return headers


@dataclass(frozen=True)
class EndpointSpec:
    """Everything needed to build the same requests against an endpoint."""

    url: str
    protocol: str = "v2"
    model: str | None = None
    name: str = ""
    version: str = ""
    json_tensors: bool = False
    shapes: dict[str, list[int]] = field(default_factory=dict)
    batch_size: int = 1
    input_data: Path | None = None
    method: str = "POST"
    headers: dict[str, str] = field(default_factory=dict)
    body: Path | None = None
    seed: int = 0
    timeout_s: float = 30.0
    max_response_bytes: int = LOAD_DEFAULTS.max_response_bytes  # one answer, at most
    generation: GenerationOptions = field(default_factory=GenerationOptions)
    distinct_inputs: int | None = None  # random inputs (v2) or synthetic prompts to make
    zipf: float | None = None  # draw them with this Zipf exponent (None: round-robin)
    classes: tuple[RequestClass, ...] = ()  # --mix: request classes drawn by weight
    # with distinct_inputs: the input each send uses, in order (a recorded trace's)
    input_sequence: tuple[int, ...] = ()
    class_sequence: tuple[int, ...] = ()  # each send's class (an index of classes) in turn

    @property
    def label(self) -> str:
        return self.name or self.model or self.url


def make_adapter(spec: EndpointSpec) -> Adapter:
    """The adapter for ``spec.protocol``; a missing model name is a setup error."""
    adapter = _adapter(spec)
    zipf = spec.zipf
    if spec.distinct_inputs is not None:
        if spec.protocol == "http" or spec.input_data is not None or \
                spec.generation.prompts is not None:
            raise BenchSetupError("--distinct-inputs makes random inputs or synthetic "
                                  "prompts; with --body, --input-data or --prompts the file's "
                                  "entries are the inputs (--zipf alone draws from them)")
        zipf = 1.0 if zipf is None else zipf
    if spec.classes and spec.protocol not in ("v2", "v2-grpc", "openai"):
        raise BenchSetupError("--mix sets request parameters: it works with --protocol v2, "
                              "v2-grpc and openai")
    if spec.input_sequence and spec.distinct_inputs is None:
        raise BenchSetupError("an input sequence indexes random inputs: give distinct_inputs")
    if spec.class_sequence and not spec.classes:
        raise BenchSetupError("a class sequence indexes classes: give classes")
    adapter.mix = InputMix(None if spec.input_sequence else zipf, spec.classes,
                           spec.input_sequence, spec.class_sequence)
    adapter.max_response_bytes = spec.max_response_bytes
    return adapter


def _adapter(spec: EndpointSpec) -> Adapter:
    if spec.protocol not in PROTOCOLS:
        raise BenchSetupError(f"protocol {spec.protocol!r}: use one of {', '.join(PROTOCOLS)}")
    if spec.protocol == "http":
        return HttpJsonAdapter(spec.url, method=spec.method, headers=spec.headers,
                               body=spec.body, timeout_s=spec.timeout_s)
    if not spec.model:
        raise BenchSetupError(f"{spec.label}: protocol {spec.protocol} needs a model name")
    if spec.protocol == "openai":
        return _openai_adapter(spec, spec.model)
    options: dict[str, Any] = dict(version=spec.version, shapes=spec.shapes,
                                   batch_size=spec.batch_size, input_data=spec.input_data,
                                   seed=spec.seed, timeout_s=spec.timeout_s)
    if spec.distinct_inputs is not None:
        options["variants"] = spec.distinct_inputs
    if spec.protocol == "v2-grpc":
        from tradeoff.bench.grpc_adapter import GrpcV2Adapter

        if spec.headers:
            raise BenchSetupError("--header is not sent over gRPC yet; use --protocol v2")
        return GrpcV2Adapter(spec.url, spec.model, **options)
    return V2Adapter(spec.url, spec.model, json_tensors=spec.json_tensors,
                     headers=spec.headers, **options)


def _openai_adapter(spec: EndpointSpec, model: str) -> Adapter:
    from tradeoff.bench.openai_adapter import OpenAIAdapter
    from tradeoff.bench.prompts import read_prompts, synthetic_prompts

    g = spec.generation
    try:
        if g.prompts is not None:
            items = read_prompts(g.prompts, g.output_tokens, spec.seed, g.chat)
            source = str(g.prompts)
        else:
            count = g.num_prompts if spec.distinct_inputs is None else spec.distinct_inputs
            items = synthetic_prompts(count, g.input_tokens, g.output_tokens, spec.seed,
                                      g.chat)
            source = (f"synthetic: input {_span(g.input_tokens)} words, output "
                      f"{_span(g.output_tokens)} tokens, seed {spec.seed}")
    except DatasetError as exc:
        raise BenchSetupError(str(exc)) from None
    return OpenAIAdapter(spec.url, model, items, chat=g.chat, ignore_eos=g.ignore_eos,
                         api_key_env=g.api_key_env, headers=spec.headers,
                         temperature=g.temperature, dataset=source, slo=g.slo,
                         timeout_s=spec.timeout_s)


def _span(bounds: tuple[int, int]) -> str:
    return str(bounds[0]) if bounds[0] == bounds[1] else f"{bounds[0]}-{bounds[1]}"


def parse_endpoint(text: str, defaults: EndpointSpec) -> EndpointSpec:
    """``NAME=URL[,model=M][,protocol=P][,version=V]``: one endpoint of a comparison; what
    it leaves out comes from ``defaults``."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise BenchSetupError(f"--endpoint {text!r}: use NAME=URL[,model=M][,protocol=P]")
    url, *options = rest.split(",")
    changes: dict[str, Any] = {"name": name, "url": url}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in ("model", "protocol", "version"):
            raise BenchSetupError(f"--endpoint {text!r}: unknown option {option!r}; "
                                  "use model=, protocol= or version=")
        changes[key] = value
    return dataclasses.replace(defaults, **changes)
