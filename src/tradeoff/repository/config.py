"""Model configuration: Triton's ``config.pbtxt`` (or the same fields in ``config.yaml``).

Both formats are parsed into the project's protobuf message (``model_config.proto``), then
validated and turned into the plain, frozen :class:`ModelConfig` the rest of tradeoff uses.
Every problem raises :class:`~tradeoff.errors.ConfigError` naming the file and the field.

    >>> cfg = parse_config_text('max_batch_size: 8 input [{name: "x" data_type: TYPE_FP32 '
    ...     'dims: [16]}] output [{name: "y" data_type: TYPE_FP32 dims: [16]}] '
    ...     'dynamic_batching {}', source="tiny/config.pbtxt", default_name="tiny")
    >>> cfg.max_batch_size, cfg.batching
    (8, True)
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Any

from google.protobuf import json_format, text_format

from tradeoff import dtypes
from tradeoff.backends.base import TensorSpec
from tradeoff.backends.registry import BackendRegistry, InstanceSpec, default_registry
from tradeoff.errors import ConfigError
from tradeoff.protocol import model_config_pb2 as pb
from tradeoff.repository.safe_yaml import parse_yaml

__all__ = [
    "IGNORED_FIELDS",
    "TARGET_P99",
    "UNSUPPORTED_FIELDS",
    "DynamicBatching",
    "InstanceGroup",
    "ModelConfig",
    "QueuePolicy",
    "TensorConfig",
    "VersionPolicy",
    "Warmup",
    "WarmupInput",
    "load_config_file",
    "parse_config_mapping",
    "parse_config_text",
    "validate_against_model",
]


@dataclass(frozen=True)
class TensorConfig:
    """One input or output; ``dims`` exclude the batch dimension when the model batches."""

    name: str
    datatype: str
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None = None
    optional: bool = False


@dataclass(frozen=True)
class QueuePolicy:
    """Triton's ModelQueuePolicy; times in microseconds, 0 meaning "no limit"."""

    timeout_action: str = "REJECT"
    default_timeout_us: int = 0
    allow_timeout_override: bool = False
    max_queue_size: int = 0


@dataclass(frozen=True)
class DynamicBatching:
    preferred_batch_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 0
    default_priority_level: int = 0
    default_queue_policy: QueuePolicy = QueuePolicy()
    priority_queue_policy: dict[int, QueuePolicy] = field(default_factory=dict)
    # from parameters priority_N_max_queue_delay_microseconds: a level's own delay
    priority_queue_delay_us: dict[int, int] = field(default_factory=dict)
    # from parameters target_p99_ms: the adaptive batcher sets the delay and batch cap
    target_p99_ms: float | None = None

    def policy_for(self, level: int) -> QueuePolicy:
        return self.priority_queue_policy.get(level, self.default_queue_policy)

    def delay_for(self, level: int) -> int:
        """The longest a batch waits to grow while it holds a request of ``level`` (µs)."""
        return self.priority_queue_delay_us.get(level, self.max_queue_delay_us)


@dataclass(frozen=True)
class InstanceGroup:
    count: int = 1
    kind: str = "KIND_CPU"
    gpus: tuple[int, ...] = ()

    def devices(self) -> tuple[int | None, ...]:
        """GPU ids to place ``count`` instances on each of (None: the CPU or GPU 0)."""
        if self.kind == "KIND_GPU" and self.gpus:
            return self.gpus
        return (None,)


@dataclass(frozen=True)
class VersionPolicy:
    """``latest`` (the newest ``num_versions``), ``all``, or ``specific`` ``versions``."""

    kind: str = "latest"
    num_versions: int = 1
    versions: tuple[int, ...] = ()

    def select(self, available: list[int]) -> list[int]:
        """The versions to load from those found on disk, ascending."""
        ordered = sorted(available)
        if self.kind == "all":
            return ordered
        if self.kind == "specific":
            return [v for v in ordered if v in self.versions]
        return ordered[-self.num_versions:]


@dataclass(frozen=True)
class WarmupInput:
    datatype: str
    dims: tuple[int, ...]
    source: str = "zero"  # zero | random | file
    file: str = ""


@dataclass(frozen=True)
class Warmup:
    name: str
    batch_size: int
    inputs: dict[str, WarmupInput]
    count: int = 1


@dataclass(frozen=True)
class ModelConfig:
    """The effective configuration of one model (after auto-complete)."""

    name: str
    platform: str = ""  # parsing fills both from the backend registry
    backend: str = ""
    max_batch_size: int = 0
    inputs: tuple[TensorConfig, ...] = ()
    outputs: tuple[TensorConfig, ...] = ()
    instance_groups: tuple[InstanceGroup, ...] = (InstanceGroup(),)
    dynamic_batching: DynamicBatching | None = None
    version_policy: VersionPolicy = VersionPolicy()
    warmup: tuple[Warmup, ...] = ()
    parameters: dict[str, str] = field(default_factory=dict)
    graph_optimization_level: int = 0
    gpu_accelerators: tuple[str, ...] = ()
    response_cache: bool = False
    default_model_filename: str = ""  # "": the backend's own file name
    max_batch_size_given: bool = True
    warnings: tuple[str, ...] = ()

    @property
    def batching(self) -> bool:
        """True when the dynamic batcher may group requests (Triton's rule)."""
        return self.max_batch_size > 0 and self.dynamic_batching is not None

    @property
    def instance_count(self) -> int:
        """Instances in all groups; a KIND_GPU group has ``count`` per listed GPU."""
        return sum(len(g.devices()) * g.count for g in self.instance_groups)

    @cached_property
    def _inputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.inputs}

    @cached_property
    def _outputs_by_name(self) -> dict[str, TensorConfig]:
        return {t.name: t for t in self.outputs}

    @cached_property
    def input_shapes(self) -> dict[str, tuple[int, ...]]:
        """Input name -> shape as the client sends it (-1: any size, batch dim included)."""
        return {t.name: tuple(self.full_shape(t)) for t in self.inputs}

    def input(self, name: str) -> TensorConfig | None:
        return self._inputs_by_name.get(name)

    def output(self, name: str) -> TensorConfig | None:
        return self._outputs_by_name.get(name)

    def full_shape(self, tensor: TensorConfig) -> list[int]:
        """Shape as the client sees it, with -1 for the batch dim when batching."""
        dims = list(tensor.dims)
        return [-1, *dims] if self.max_batch_size > 0 else dims

    def instance_spec(self, path: Path, *, intra_op_threads: int, kind: str = "KIND_CPU",
                      device_id: int | None = None,
                      parameters: dict[str, str] | None = None) -> InstanceSpec:
        """What a backend needs to create one instance of this model from ``path``."""
        def specs(tensors: tuple[TensorConfig, ...]) -> tuple[TensorSpec, ...]:
            return tuple(TensorSpec(t.name, t.datatype, tuple(t.reshape if t.reshape is not None
                                                              else t.dims)) for t in tensors)

        return InstanceSpec(self.name, path,
                            parameters=self.parameters if parameters is None else parameters,
                            intra_op_threads=intra_op_threads,
                            graph_optimization_level=self.graph_optimization_level,
                            gpu_accelerators=self.gpu_accelerators, kind=kind,
                            device_id=device_id, inputs=specs(self.inputs),
                            outputs=specs(self.outputs), max_batch_size=self.max_batch_size)

    def with_changes(self, **changes: Any) -> ModelConfig:
        return replace(self, **changes)

    def summary(self) -> str:
        """One line describing the effective config, for the server log."""
        parts = [f"max_batch_size={self.max_batch_size}"]
        if self.dynamic_batching is not None:
            db = self.dynamic_batching
            parts.append(f"dynamic_batching(delay={db.max_queue_delay_us}us"
                         f", preferred={list(db.preferred_batch_sizes)}"
                         f", max_queue={db.default_queue_policy.max_queue_size or 'unbounded'})")
        else:
            parts.append("dynamic_batching=off")
        groups = ",".join(f"{g.count}x{g.kind}" for g in self.instance_groups)
        parts.append(f"instances={groups}")
        ins = ",".join(f"{t.name}:{t.datatype}{list(self.full_shape(t))}" for t in self.inputs)
        outs = ",".join(f"{t.name}:{t.datatype}{list(self.full_shape(t))}" for t in self.outputs)
        parts.append(f"inputs={ins}")
        parts.append(f"outputs={outs}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """Triton's JSON form of the config (``GET /v2/models/{m}/config``)."""
        def tensor(t: TensorConfig) -> dict[str, Any]:
            d: dict[str, Any] = {"name": t.name, "data_type": dtypes.to_config_type(t.datatype),
                                 "dims": list(t.dims)}
            if t.reshape is not None:
                d["reshape"] = {"shape": list(t.reshape)}
            return d

        def policy(p: QueuePolicy) -> dict[str, Any]:
            return {"timeout_action": p.timeout_action,
                    "default_timeout_microseconds": p.default_timeout_us,
                    "allow_timeout_override": p.allow_timeout_override,
                    "max_queue_size": p.max_queue_size}

        out: dict[str, Any] = {
            "name": self.name,
            "platform": self.platform,
            "backend": self.backend,
            "version_policy": self._version_policy_dict(),
            "max_batch_size": self.max_batch_size,
            "input": [dict(tensor(t), optional=t.optional) for t in self.inputs],
            "output": [tensor(t) for t in self.outputs],
            "instance_group": [{"name": f"{self.name}_{i}", "kind": g.kind, "count": g.count,
                                "gpus": list(g.gpus)} for i, g in enumerate(self.instance_groups)],
            "default_model_filename": self.default_model_filename,
            "parameters": {k: {"string_value": v} for k, v in self.parameters.items()},
            "optimization": {"graph": {"level": self.graph_optimization_level},
                             "execution_accelerators": {"gpu_execution_accelerator": [
                                 {"name": a} for a in self.gpu_accelerators]}},
            "response_cache": {"enable": self.response_cache},
        }
        if self.dynamic_batching is not None:
            db = self.dynamic_batching
            out["dynamic_batching"] = {
                "preferred_batch_size": list(db.preferred_batch_sizes),
                "max_queue_delay_microseconds": db.max_queue_delay_us,
                "preserve_ordering": db.preserve_ordering,
                "priority_levels": db.priority_levels,
                "default_priority_level": db.default_priority_level,
                "default_queue_policy": policy(db.default_queue_policy),
                "priority_queue_policy": {str(k): policy(v)
                                          for k, v in db.priority_queue_policy.items()},
            }
        if self.warmup:
            out["model_warmup"] = [
                {"name": w.name, "batch_size": w.batch_size, "count": w.count,
                 "inputs": {n: {"data_type": dtypes.to_config_type(i.datatype),
                                "dims": list(i.dims), _WARMUP_FIELDS[i.source]: i.file or True}
                            for n, i in w.inputs.items()}}
                for w in self.warmup
            ]
        return out

    def _version_policy_dict(self) -> dict[str, Any]:
        vp = self.version_policy
        if vp.kind == "all":
            return {"all": {}}
        if vp.kind == "specific":
            return {"specific": {"versions": list(vp.versions)}}
        return {"latest": {"num_versions": vp.num_versions}}


# ---------------------------------------------------------------- parsing

_UNKNOWN_FIELD = re.compile(r'has no field named "?([A-Za-z_0-9]+)"?|'
                            r'no field named "?([A-Za-z_0-9]+)"?|'
                            r'Message type "[^"]+" has no field named "([^"]+)"')


def _unknown_field_name(message: str) -> str | None:
    match = _UNKNOWN_FIELD.search(message)
    if not match:
        return None
    return next(g for g in match.groups() if g)


# ``field [ {...} ]`` without a colon is valid text format, but protobuf's skipper for
# unknown fields only handles ``field: [ {...} ]``; Triton's own configs (sequence_batching
# control_input, ensemble steps) use the colon-less form. Strings and comments are kept.
_LIST_WITHOUT_COLON = re.compile(r'("(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*)'
                                 r'|\b([A-Za-z_][A-Za-z0-9_]*)(\s*)\[')


def _colon_before_lists(text: str) -> str:
    return _LIST_WITHOUT_COLON.sub(
        lambda m: m.group(1) or f"{m.group(2)}:{m.group(3)}[", text)


# Triton fields tradeoff cannot honour: a model that needs them would be served wrongly.
UNSUPPORTED_FIELDS = {
    "sequence_batching": "stateful (sequence) models are not supported",
    "ensemble_scheduling": "ensembles are not supported",
    "batch_input": "ragged batch inputs are not supported",
    "batch_output": "ragged batch outputs are not supported",
}
# Triton fields that only tune Triton itself (GPU memory, CUDA graphs, rate limits, agents,
# metrics tags): a repository that has them still loads, with a warning.
IGNORED_FIELDS = frozenset({
    "model_transaction_policy", "decoupled", "cuda", "graphs", "busy_wait_events",
    "graph_spec", "output_copy_stream", "input_pinned_memory", "output_pinned_memory",
    "gather_kernel_buffer_threshold", "eager_batching", "priority", "metric_tags",
    "model_metrics", "metric_control", "metric_identifier", "family", "histogram_options",
    "buckets", "model_operations", "model_repository_agents", "agents",
    "cc_model_filenames", "runtime", "host_policy", "profile", "passive", "rate_limiter",
    "resources", "global", "secondary_devices", "device_id", "is_non_linear_format_io",
    "lower_bound", "input_tensors_to_be_saved",
})


def _known_field_names() -> frozenset[str]:
    names: set[str] = set()

    def walk(descriptor: Any) -> None:
        for f in descriptor.fields:
            names.add(f.name)
            if f.message_type is not None and f.message_type.full_name not in seen:
                seen.add(f.message_type.full_name)
                walk(f.message_type)

    seen: set[str] = set()
    walk(pb.ModelConfig.DESCRIPTOR)
    return frozenset(names)


_KNOWN_FIELDS = _known_field_names()
_STRINGS_AND_COMMENTS = re.compile(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'|#[^\n]*')
_TOKEN = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)\s*(?=[:{\[<])|([{\[<])|([}\]>])")


def _text_field_names(text: str) -> list[str]:
    """Field names used in pbtxt text, not looking inside blocks of ignored fields."""
    names: list[str] = []
    depth = 0
    ignored_from: int | None = None  # depth at which an ignored block started
    pending_ignored = False
    for match in _TOKEN.finditer(_STRINGS_AND_COMMENTS.sub('""', text)):
        name, opening, closing = match.groups()
        if opening:
            depth += 1
            if pending_ignored and ignored_from is None:
                ignored_from = depth
            pending_ignored = False
        elif closing:
            if ignored_from is not None and depth == ignored_from:
                ignored_from = None
            depth -= 1
        elif ignored_from is None:
            names.append(name)
            pending_ignored = name in IGNORED_FIELDS and name not in _KNOWN_FIELDS
    return names


def _check_field_names(names: list[str], source: str, warnings: list[str],
                       decoupled: bool = False) -> None:
    """Unsupported Triton features fail the load; unknown names (typos) fail it; fields
    that only tune Triton itself are ignored with one warning."""
    for name in names:
        if name in UNSUPPORTED_FIELDS:
            raise ConfigError(source, name, UNSUPPORTED_FIELDS[name] + " by tradeoff")
    if decoupled:
        raise ConfigError(source, "model_transaction_policy.decoupled",
                          "decoupled (streaming) models are not supported by tradeoff")
    unknown = [n for n in names if n not in _KNOWN_FIELDS and n not in IGNORED_FIELDS]
    if unknown:
        close = difflib.get_close_matches(unknown[0], sorted(_KNOWN_FIELDS), n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise ConfigError(source, unknown[0], f"unknown field{hint}")
    ignored = sorted({n for n in names if n not in _KNOWN_FIELDS})
    if ignored:
        warnings.append(f"ignored Triton fields that do not apply here: {', '.join(ignored)}")


def parse_config_text(text: str, *, source: str, default_name: str,
                      backends: BackendRegistry | None = None) -> ModelConfig:
    """Parse ``config.pbtxt`` text (protobuf text format) into a validated config."""
    message = pb.ModelConfig()
    warnings: list[str] = []
    try:
        text_format.Parse(text, message)
    except text_format.ParseError as exc:
        if _unknown_field_name(str(exc)) is None:
            raise ConfigError(source, "", f"not valid protobuf text format: {exc}") from exc
        bare = _STRINGS_AND_COMMENTS.sub('""', text)
        _check_field_names(_text_field_names(text), source, warnings,
                           decoupled=bool(re.search(r"\bdecoupled\s*:\s*true\b", bare)))
        message = pb.ModelConfig()
        try:
            text_format.Parse(_colon_before_lists(text), message, allow_unknown_field=True)
        except text_format.ParseError as exc2:
            raise ConfigError(source, "", f"not valid protobuf text format: {exc2}") from exc2
    return _from_message(message, source=source, default_name=default_name, warnings=warnings,
                         backends=backends or default_registry())


def _mapping_field_names(data: Any, descriptor: Any, out: list[str]) -> None:
    """Every field name used in a config mapping (map keys are values, not names)."""
    if not isinstance(data, dict):
        return
    for key, value in data.items():
        out.append(str(key))
        field_descriptor = descriptor.fields_by_name.get(key) if descriptor else None
        if field_descriptor is None and key in IGNORED_FIELDS:
            continue  # not ours to check inside
        child = field_descriptor.message_type if field_descriptor is not None else None
        if child is not None and child.GetOptions().map_entry:
            value_type = child.fields_by_name["value"].message_type
            for item in (value.values() if isinstance(value, dict) else []):
                _mapping_field_names(item, value_type, out)
            continue
        for item in value if isinstance(value, list) else [value]:
            _mapping_field_names(item, child, out)


def parse_config_mapping(data: Any, *, source: str, default_name: str,
                         backends: BackendRegistry | None = None) -> ModelConfig:
    """Parse the YAML/JSON form (a mapping with Triton's field names)."""
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(source, "", "expected a mapping of config fields, got "
                                      f"{type(data).__name__}")
    message = pb.ModelConfig()
    warnings: list[str] = []
    try:
        json_format.ParseDict(data, message)
    except json_format.ParseError as exc:
        if _unknown_field_name(str(exc)) is None:
            raise ConfigError(source, "", str(exc)) from exc
        names: list[str] = []
        _mapping_field_names(data, pb.ModelConfig.DESCRIPTOR, names)
        policy = data.get("model_transaction_policy")
        _check_field_names(names, source, warnings,
                           decoupled=isinstance(policy, dict) and policy.get("decoupled") is True)
        message = pb.ModelConfig()
        try:
            json_format.ParseDict(data, message, ignore_unknown_fields=True)
        except json_format.ParseError as exc2:
            raise ConfigError(source, "", str(exc2)) from exc2
    return _from_message(message, source=source, default_name=default_name, warnings=warnings,
                         backends=backends or default_registry())


def load_config_file(path: Path, *, default_name: str,
                     backends: BackendRegistry | None = None) -> ModelConfig:
    """Read ``config.pbtxt`` or ``config.yaml``/``config.yml``."""
    source = str(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"cannot read: {exc}") from exc
    if path.suffix in (".yaml", ".yml"):
        return parse_config_mapping(parse_yaml(text, source), source=source,
                                    default_name=default_name, backends=backends)
    return parse_config_text(text, source=source, default_name=default_name, backends=backends)


def _enum_name(enum_type: Any, value: int) -> str:
    return enum_type.Name(value)


def _tensor(t: Any, *, source: str, where: str, is_input: bool) -> TensorConfig:
    if not t.name:
        raise ConfigError(source, f"{where}.name", "must not be empty")
    if t.data_type == pb.TYPE_INVALID:
        raise ConfigError(source, f"{where}.data_type",
                          "missing; use one of TYPE_FP32, TYPE_INT64, TYPE_STRING, ...")
    for j, d in enumerate(t.dims):
        if d < -1 or d == 0:
            raise ConfigError(source, f"{where}.dims[{j}]",
                              f"must be -1 (variable) or a positive size, got {d}")
    reshape = tuple(t.reshape.shape) if t.HasField("reshape") else None
    if reshape is not None:
        for j, d in enumerate(reshape):
            if d < -1 or d == 0:
                raise ConfigError(source, f"{where}.reshape.shape[{j}]",
                                  f"must be -1 or a positive size, got {d}")
    datatype = dtypes.from_config_type(_enum_name(pb.DataType, t.data_type))
    return TensorConfig(name=t.name, datatype=datatype, dims=tuple(t.dims), reshape=reshape,
                        optional=bool(getattr(t, "optional", False)) if is_input else False)


TARGET_P99 = "target_p99_ms"
_PRIORITY_DELAY = re.compile(r"^priority_(\d+)_max_queue_delay_microseconds$")


def _priority_delays(parameters: Any, levels: int, source: str) -> dict[int, int]:
    """``priority_N_max_queue_delay_microseconds`` parameters: a priority level's own
    queue delay, so a latency-class request need not wait for a throughput batch."""
    delays = {}
    for key, value in parameters.items():
        match = _PRIORITY_DELAY.match(key)
        if match is None:
            continue
        level = int(match.group(1))
        if not 1 <= level <= levels:
            raise ConfigError(source, f"parameters.{key}", f"priority level must be between "
                              f"1 and priority_levels ({levels})")
        text = value.string_value
        if not (text.isascii() and text.isdigit()):
            raise ConfigError(source, f"parameters.{key}",
                              f"must be a whole number of microseconds, got {text!r}")
        delays[level] = int(text)
    return delays


def _target_p99(parameters: Any, max_batch_size: int, source: str) -> float | None:
    """``target_p99_ms``: the p99 the adaptive batcher keeps the model under."""
    if TARGET_P99 not in parameters:
        return None
    text = parameters[TARGET_P99].string_value
    try:
        target = float(text)
    except ValueError:
        target = math.nan
    if not (math.isfinite(target) and target > 0):
        raise ConfigError(source, f"parameters.{TARGET_P99}",
                          f"must be a positive number of milliseconds, got {text!r}")
    if max_batch_size <= 0:
        raise ConfigError(source, f"parameters.{TARGET_P99}",
                          "the adaptive batcher needs max_batch_size > 0")
    return target


def _queue_policy(p: Any) -> QueuePolicy:
    return QueuePolicy(
        timeout_action=pb.QueuePolicy.TimeoutAction.Name(p.timeout_action),
        default_timeout_us=int(p.default_timeout_microseconds),
        allow_timeout_override=bool(p.allow_timeout_override),
        max_queue_size=int(p.max_queue_size),
    )


# ModelWarmup.Input's oneof choice -> WarmupInput.source, and back (Triton's field names)
_WARMUP_SOURCES = {"zero_data": "zero", "random_data": "random", "input_data_file": "file"}
_WARMUP_FIELDS = {v: k for k, v in _WARMUP_SOURCES.items()}


def _from_message(m: Any, *, source: str, default_name: str, warnings: list[str],
                  backends: BackendRegistry) -> ModelConfig:
    name = m.name or default_name
    if m.name and m.name != default_name:
        raise ConfigError(source, "name",
                          f"{m.name!r} does not match the model directory {default_name!r}")
    backend = backends.resolve(m.backend, m.platform, source)
    max_batch = m.max_batch_size if m.HasField("max_batch_size") else 0
    if max_batch < 0:
        raise ConfigError(source, "max_batch_size", f"must be >= 0, got {max_batch}")

    inputs = tuple(_tensor(t, source=source, where=f"input[{i}]", is_input=True)
                   for i, t in enumerate(m.input))
    outputs = tuple(_tensor(t, source=source, where=f"output[{i}]", is_input=False)
                    for i, t in enumerate(m.output))
    for kind, tensors in (("input", inputs), ("output", outputs)):
        seen: set[str] = set()
        for i, t in enumerate(tensors):
            if t.name in seen:
                raise ConfigError(source, f"{kind}[{i}].name", f"duplicate name {t.name!r}")
            seen.add(t.name)

    groups = []
    for i, g in enumerate(m.instance_group):
        count = g.count if g.HasField("count") else 1
        if count < 1:
            raise ConfigError(source, f"instance_group[{i}].count", f"must be >= 1, got {count}")
        kind = pb.InstanceGroup.Kind.Name(g.kind)
        groups.append(InstanceGroup(count=count, kind="KIND_CPU" if kind == "KIND_AUTO" else kind,
                                    gpus=tuple(g.gpus)))

    batching = None
    if m.HasField("dynamic_batching"):
        db = m.dynamic_batching
        for i, size in enumerate(db.preferred_batch_size):
            if size < 1 or (max_batch and size > max_batch):
                raise ConfigError(source, f"dynamic_batching.preferred_batch_size[{i}]",
                                  f"must be between 1 and max_batch_size ({max_batch}), got {size}")
        levels = int(db.priority_levels)
        default_level = int(db.default_priority_level)
        if levels and not 1 <= default_level <= levels:
            raise ConfigError(source, "dynamic_batching.default_priority_level",
                              f"must be between 1 and priority_levels ({levels}), "
                              f"got {default_level}")
        if not levels and default_level:
            raise ConfigError(source, "dynamic_batching.default_priority_level",
                              "is set but priority_levels is 0")
        per_level = {}
        for level, policy in db.priority_queue_policy.items():
            if not 1 <= level <= levels:
                raise ConfigError(source, f"dynamic_batching.priority_queue_policy[{level}]",
                                  f"priority level must be between 1 and {levels}")
            per_level[int(level)] = _queue_policy(policy)
        batching = DynamicBatching(
            preferred_batch_sizes=tuple(sorted(set(db.preferred_batch_size))),
            max_queue_delay_us=int(db.max_queue_delay_microseconds),
            preserve_ordering=bool(db.preserve_ordering),
            priority_levels=levels,
            default_priority_level=default_level,
            default_queue_policy=_queue_policy(db.default_queue_policy),
            priority_queue_policy=per_level,
            priority_queue_delay_us=_priority_delays(m.parameters, levels, source),
            target_p99_ms=_target_p99(m.parameters, m.max_batch_size, source),
        )
    elif TARGET_P99 in m.parameters:
        raise ConfigError(source, f"parameters.{TARGET_P99}", "the adaptive batcher needs "
                          "dynamic_batching { } (and max_batch_size > 0)")
    elif any(_PRIORITY_DELAY.match(k) for k in m.parameters):
        raise ConfigError(source, "parameters", "priority_N_max_queue_delay_microseconds "
                          "needs dynamic_batching with priority_levels")

    policy_kind = m.version_policy.WhichOneof("policy_choice") or "latest"
    if policy_kind == "latest":
        n = m.version_policy.latest.num_versions if m.version_policy.HasField("latest") else 1
        if n < 1:
            raise ConfigError(source, "version_policy.latest.num_versions",
                              f"must be >= 1, got {n}")
        version_policy = VersionPolicy("latest", num_versions=n)
    elif policy_kind == "all":
        version_policy = VersionPolicy("all")
    else:
        versions = tuple(int(v) for v in m.version_policy.specific.versions)
        if not versions:
            raise ConfigError(source, "version_policy.specific.versions", "must list at least one")
        version_policy = VersionPolicy("specific", versions=versions)

    warmups = []
    for i, w in enumerate(m.model_warmup):
        where = f"model_warmup[{i}]"
        batch_size = w.batch_size or 1
        if m.HasField("max_batch_size"):  # else auto-complete decides; see validate_against_model
            _check_warmup_batch(batch_size, max_batch, source, where)
        winputs = {}
        for input_name, wi in w.inputs.items():
            choice = wi.WhichOneof("input_data_type") or "zero_data"
            winputs[input_name] = WarmupInput(
                datatype=dtypes.from_config_type(_enum_name(pb.DataType, wi.data_type))
                if wi.data_type else "",
                dims=tuple(wi.dims),
                source=_WARMUP_SOURCES[choice],
                file=wi.input_data_file,
            )
        warmups.append(Warmup(name=w.name or f"warmup_{i}", batch_size=batch_size,
                              inputs=winputs, count=w.count or 1))

    accelerators = m.optimization.execution_accelerators.gpu_execution_accelerator
    gpu_accels = tuple(a.name for a in accelerators)
    return ModelConfig(
        name=name,
        platform=m.platform or backend.platforms[0],
        backend=backend.name,
        max_batch_size=int(max_batch),
        inputs=inputs,
        outputs=outputs,
        instance_groups=tuple(groups) or (InstanceGroup(),),
        dynamic_batching=batching,
        version_policy=version_policy,
        warmup=tuple(warmups),
        parameters={k: v.string_value for k, v in m.parameters.items()},
        graph_optimization_level=int(m.optimization.graph.level),
        gpu_accelerators=gpu_accels,
        response_cache=bool(m.response_cache.enable),
        default_model_filename=m.default_model_filename or backend.filename(
            m.platform or backend.platforms[0]),
        max_batch_size_given=m.HasField("max_batch_size"),
        warnings=tuple(warnings),
    )


def _check_warmup_batch(batch_size: int, max_batch: int, source: str, where: str) -> None:
    if max_batch and batch_size > max_batch:
        raise ConfigError(source, f"{where}.batch_size",
                          f"{batch_size} exceeds max_batch_size {max_batch}")
    if not max_batch and batch_size != 1:
        raise ConfigError(source, f"{where}.batch_size",
                          "must be 1 for a model that does not batch")


def validate_against_model(cfg: ModelConfig, source: str) -> None:
    """Checks that need the whole (auto-completed) config: warmup inputs exist, etc."""
    names = {t.name for t in cfg.inputs}
    # max_batch_size may come from auto-complete, after parsing could check these
    if cfg.dynamic_batching is not None and cfg.max_batch_size > 0:
        for i, size in enumerate(cfg.dynamic_batching.preferred_batch_sizes):
            if size > cfg.max_batch_size:
                raise ConfigError(source, f"dynamic_batching.preferred_batch_size[{i}]",
                                  f"must be between 1 and max_batch_size "
                                  f"({cfg.max_batch_size}), got {size}")
    for i, w in enumerate(cfg.warmup):
        _check_warmup_batch(w.batch_size, cfg.max_batch_size, source, f"model_warmup[{i}]")
        for input_name in w.inputs:
            if input_name not in names:
                raise ConfigError(source, f"model_warmup[{i}].inputs",
                                  f"{input_name!r} is not an input of the model "
                                  f"(inputs: {', '.join(sorted(names))})")
