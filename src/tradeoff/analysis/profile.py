"""What an endpoint reveals about itself, next to what the user tells us: the provider
checklist (format, precision, server, batching, instances, hardware).

Facts the endpoint does not reveal and the user did not give stay ``"unknown"``; nothing
is guessed. User facts (``--fact NAME:key=value``) win over what the endpoint says.
"""

from __future__ import annotations

from typing import Any

from tradeoff.bench.adapters import Adapter
from tradeoff.errors import InvalidValue

__all__ = ["CHECKLIST", "UNKNOWN", "build_profile", "parse_fact", "profile"]

UNKNOWN = "unknown"
CHECKLIST = ("format", "precision", "server", "batching", "instances", "hardware")


def _batching(config: dict[str, Any]) -> str | None:
    if "max_batch_size" not in config:
        return None
    max_batch = int(config.get("max_batch_size") or 0)
    if max_batch == 0:
        return "none (max_batch_size 0)"
    dynamic = config.get("dynamic_batching")
    if dynamic is None:
        return f"client-side only (max_batch_size {max_batch}, no dynamic batching)"
    delay = int(dynamic.get("max_queue_delay_microseconds") or 0)
    preferred = dynamic.get("preferred_batch_size") or []
    return (f"dynamic, max_batch_size {max_batch}, max_queue_delay {delay} us"
            + (f", preferred {list(preferred)}" if preferred else ""))


def _instances(config: dict[str, Any]) -> str | None:
    groups = config.get("instance_group")
    if not groups:
        return None
    parts = []
    for group in groups:
        kind = str(group.get("kind", "KIND_AUTO")).removeprefix("KIND_").lower()
        gpus = group.get("gpus")
        parts.append(f"{int(group.get('count') or 1)} x {kind}"
                     + (f" on GPUs {list(gpus)}" if gpus else ""))
    return ", ".join(parts)


def profile(adapter: Adapter, facts: dict[str, str] | None = None) -> dict[str, Any]:
    """The checklist and the raw metadata of an endpoint (after ``adapter.prepare()``)."""
    server = getattr(adapter, "server_info", None) or adapter.server_metadata() or {}
    return build_profile(getattr(adapter, "metadata", None) or {},
                         getattr(adapter, "config", None) or {}, server, facts)


def build_profile(metadata: dict[str, Any], config: dict[str, Any], server: dict[str, Any],
                  facts: dict[str, str] | None = None) -> dict[str, Any]:
    """The checklist from model metadata, model config and server metadata, plus facts."""
    inputs = metadata.get("inputs") or []
    outputs = metadata.get("outputs") or []
    precision = None
    if inputs or outputs:
        precision = ("in " + ", ".join(sorted({t["datatype"] for t in inputs})) + "; out "
                     + ", ".join(sorted({t["datatype"] for t in outputs})))
    kinds = {str(g.get("kind", "")) for g in config.get("instance_group") or []}
    hardware = None
    if kinds == {"KIND_CPU"}:
        hardware = "CPU (model of CPU not revealed)"
    revealed = {
        "format": metadata.get("platform") or config.get("platform") or config.get("backend"),
        "precision": precision,
        "server": " ".join(str(server[k]) for k in ("name", "version") if server.get(k)) or None,
        "batching": _batching(config),
        "instances": _instances(config),
        "hardware": hardware,
    }
    given = dict(facts or {})
    checklist: dict[str, str] = {}
    sources: dict[str, str] = {}
    for key in CHECKLIST:
        if key in given:
            checklist[key], sources[key] = given.pop(key), "user"
        elif revealed[key]:
            checklist[key], sources[key] = str(revealed[key]), "endpoint"
        else:
            checklist[key], sources[key] = UNKNOWN, "unknown"
    return {"checklist": checklist, "sources": sources, "facts": given,
            "server_metadata": server or None, "model_metadata": metadata or None,
            "model_config": config or None}


def parse_fact(text: str) -> tuple[str, str, str]:
    """``NAME:key=value`` -> (endpoint name, key, value)."""
    name, sep, rest = text.partition(":")
    key, sep2, value = rest.partition("=")
    if not sep or not sep2 or not name or not key:
        raise InvalidValue(f"--fact {text!r}: use NAME:key=value (e.g. a:hardware=H100)")
    return name, key.strip(), value.strip()
