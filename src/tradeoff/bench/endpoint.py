"""Naming an endpoint under test: protocol, URL, model and request options -> an adapter.

    adapter = make_adapter(EndpointSpec("http://127.0.0.1:8000", model="mlp"))
    spec = parse_endpoint("b=127.0.0.1:8001,model=mlp,protocol=v2-grpc")
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tradeoff.bench.adapters import Adapter, BenchSetupError, HttpJsonAdapter, V2Adapter

PROTOCOLS = ("v2", "v2-grpc", "http")


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

    @property
    def label(self) -> str:
        return self.name or self.model or self.url


def make_adapter(spec: EndpointSpec) -> Adapter:
    """The adapter for ``spec.protocol``; a missing model name is a setup error."""
    if spec.protocol not in PROTOCOLS:
        raise BenchSetupError(f"protocol {spec.protocol!r}: use one of {', '.join(PROTOCOLS)}")
    if spec.protocol == "http":
        return HttpJsonAdapter(spec.url, method=spec.method, headers=spec.headers,
                               body=spec.body, timeout_s=spec.timeout_s)
    if not spec.model:
        raise BenchSetupError(f"{spec.label}: protocol {spec.protocol} needs a model name")
    options: dict[str, Any] = dict(version=spec.version, shapes=spec.shapes,
                                   batch_size=spec.batch_size, input_data=spec.input_data,
                                   seed=spec.seed, timeout_s=spec.timeout_s)
    if spec.protocol == "v2-grpc":
        from tradeoff.bench.grpc_adapter import GrpcV2Adapter

        if spec.headers:
            raise BenchSetupError("--header is not sent over gRPC yet; use --protocol v2")
        return GrpcV2Adapter(spec.url, spec.model, **options)
    return V2Adapter(spec.url, spec.model, json_tensors=spec.json_tensors,
                     headers=spec.headers, **options)


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
