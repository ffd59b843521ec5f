"""Model configuration: config.pbtxt and YAML parsing, validation, auto-complete."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from tradeoff.backends.base import TensorSpec
from tradeoff.errors import ConfigError
from tradeoff.repository.autocomplete import autocomplete
from tradeoff.repository.config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorConfig,
    VersionPolicy,
    WarmupInput,
    load_config_file,
    parse_config_mapping,
    parse_config_text,
    validate_against_model,
)

PBTXT_SOURCE = "models/mlp/config.pbtxt"
YAML_SOURCE = "models/mlp/config.yaml"

FULL_PBTXT = """
name: "mlp"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [
  {
    name: "x"
    data_type: TYPE_FP32
    dims: [ 3, 4 ]
    reshape { shape: [ 12 ] }
  },
  {
    name: "mask"
    data_type: TYPE_BOOL
    dims: [ -1 ]
    optional: true
  }
]
output [
  {
    name: "y"
    data_type: TYPE_INT64
    dims: [ 10 ]
  }
]
dynamic_batching {
  preferred_batch_size: [ 8, 4 ]
  max_queue_delay_microseconds: 500
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy {
    timeout_action: DELAY
    default_timeout_microseconds: 2000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy {
    key: 1
    value {
      timeout_action: REJECT
      default_timeout_microseconds: 100
      max_queue_size: 8
    }
  }
}
instance_group [
  { count: 2 kind: KIND_CPU },
  { count: 1 kind: KIND_GPU gpus: [ 0 ] }
]
version_policy: { specific: { versions: [ 1, 3 ] } }
model_warmup [
  {
    name: "warm"
    batch_size: 4
    count: 2
    inputs {
      key: "x"
      value { data_type: TYPE_FP32 dims: [ 3, 4 ] random_data: true }
    }
    inputs {
      key: "mask"
      value { data_type: TYPE_BOOL dims: [ 5 ] input_data_file: "mask.bin" }
    }
  }
]
parameters { key: "intra_op_thread_count" value { string_value: "4" } }
optimization {
  graph { level: 1 }
  execution_accelerators {
    gpu_execution_accelerator [ { name: "tensorrt" } ]
  }
}
response_cache { enable: true }
"""

FULL_YAML = """
name: mlp
platform: onnxruntime_onnx
max_batch_size: 16
input:
  - name: x
    data_type: TYPE_FP32
    dims: [3, 4]
    reshape: {shape: [12]}
  - name: mask
    data_type: TYPE_BOOL
    dims: [-1]
    optional: true
output:
  - {name: y, data_type: TYPE_INT64, dims: [10]}
dynamic_batching:
  preferred_batch_size: [8, 4]
  max_queue_delay_microseconds: 500
  preserve_ordering: true
  priority_levels: 3
  default_priority_level: 2
  default_queue_policy:
    timeout_action: DELAY
    default_timeout_microseconds: 2000
    allow_timeout_override: true
    max_queue_size: 64
  priority_queue_policy:
    1: {timeout_action: REJECT, default_timeout_microseconds: 100, max_queue_size: 8}
instance_group:
  - {count: 2, kind: KIND_CPU}
  - {count: 1, kind: KIND_GPU, gpus: [0]}
version_policy: {specific: {versions: [1, 3]}}
model_warmup:
  - name: warm
    batch_size: 4
    count: 2
    inputs:
      x: {data_type: TYPE_FP32, dims: [3, 4], random_data: true}
      mask: {data_type: TYPE_BOOL, dims: [5], input_data_file: mask.bin}
parameters:
  intra_op_thread_count: {string_value: "4"}
optimization:
  graph: {level: 1}
  execution_accelerators:
    gpu_execution_accelerator: [{name: tensorrt}]
response_cache: {enable: true}
"""

# A hand-written Triton config, with fields tradeoff does not support (sequence batching,
# CUDA graphs, transaction policy) written the way Triton's docs write them.
TRITON_PBTXT = """
# Triton model repository config, unchanged
name: "mlp"
backend: "onnxruntime"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FP32
    format: FORMAT_NONE
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 16 ]
    label_filename: "labels [v2].txt"
  }
]
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "note" value { string_value: "keep [this] # and this" } }
optimization {
  cuda {
    graphs: true
    graph_spec [
      {
        batch_size: 4
        input [ { key: "INPUT0" value: { dim: [ 16 ] } } ]
      }
    ]
  }
  input_pinned_memory { enable: true }
  graph { level: -1 }
}
model_transaction_policy { decoupled: False }
"""


def parse_text(text: str, name: str = "mlp") -> ModelConfig:
    return parse_config_text(text, source=PBTXT_SOURCE, default_name=name)


def parse_mapping(data: object, name: str = "mlp") -> ModelConfig:
    return parse_config_mapping(data, source=YAML_SOURCE, default_name=name)


def raises_config_error(source: str, field: str):
    """The message must start with the file and the field: ``models/m/config.pbtxt: x: ...``."""
    return pytest.raises(ConfigError, match="^" + re.escape(f"{source}: {field}: "))


# ------------------------------------------------------------------- good configs


def check_full(cfg: ModelConfig) -> None:
    assert cfg.name == "mlp"
    assert cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 16
    assert cfg.max_batch_size_given
    assert cfg.inputs == (
        TensorConfig("x", "FP32", (3, 4), reshape=(12,)),
        TensorConfig("mask", "BOOL", (-1,), optional=True),
    )
    assert cfg.outputs == (TensorConfig("y", "INT64", (10,)),)
    assert cfg.dynamic_batching == DynamicBatching(
        preferred_batch_sizes=(4, 8),
        max_queue_delay_us=500,
        preserve_ordering=True,
        priority_levels=3,
        default_priority_level=2,
        default_queue_policy=QueuePolicy("DELAY", 2000, True, 64),
        priority_queue_policy={1: QueuePolicy("REJECT", 100, False, 8)},
    )
    assert cfg.dynamic_batching.policy_for(1) == QueuePolicy("REJECT", 100, False, 8)
    assert cfg.dynamic_batching.policy_for(3) == QueuePolicy("DELAY", 2000, True, 64)
    assert cfg.batching
    assert cfg.instance_groups == (InstanceGroup(2, "KIND_CPU"), InstanceGroup(1, "KIND_GPU", (0,)))
    assert cfg.instance_count == 3
    assert cfg.version_policy == VersionPolicy("specific", versions=(1, 3))
    (warm,) = cfg.warmup
    assert (warm.name, warm.batch_size, warm.count) == ("warm", 4, 2)
    assert warm.inputs == {"x": WarmupInput("FP32", (3, 4), "random"),
                           "mask": WarmupInput("BOOL", (5,), "file", "mask.bin")}
    assert cfg.parameters == {"intra_op_thread_count": "4"}
    assert cfg.graph_optimization_level == 1
    assert cfg.gpu_accelerators == ("tensorrt",)
    assert cfg.response_cache
    assert cfg.warnings == ()


def test_full_pbtxt() -> None:
    check_full(parse_text(FULL_PBTXT))


def test_full_yaml_mapping() -> None:
    check_full(parse_mapping(yaml.safe_load(FULL_YAML)))


def test_pbtxt_and_yaml_files_give_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text(FULL_PBTXT)
    (tmp_path / "config.yaml").write_text(FULL_YAML)
    from_pbtxt = load_config_file(tmp_path / "config.pbtxt", default_name="mlp")
    from_yaml = load_config_file(tmp_path / "config.yaml", default_name="mlp")
    check_full(from_pbtxt)
    assert from_pbtxt == from_yaml


def test_to_dict_parses_back_to_the_same_config() -> None:
    cfg = parse_text(FULL_PBTXT)
    assert parse_mapping(cfg.to_dict()) == cfg


def test_to_dict_uses_triton_field_names() -> None:
    d = parse_text(FULL_PBTXT).to_dict()
    assert d["max_batch_size"] == 16
    assert d["input"][0] == {"name": "x", "data_type": "TYPE_FP32", "dims": [3, 4],
                             "reshape": {"shape": [12]}, "optional": False}
    assert d["dynamic_batching"]["max_queue_delay_microseconds"] == 500
    assert d["dynamic_batching"]["priority_queue_policy"]["1"]["timeout_action"] == "REJECT"
    assert d["version_policy"] == {"specific": {"versions": [1, 3]}}
    assert d["model_warmup"][0]["inputs"]["x"]["random_data"] is True
    assert d["model_warmup"][0]["inputs"]["mask"]["input_data_file"] == "mask.bin"


def test_minimal_config_defaults() -> None:
    cfg = parse_text("")
    assert cfg.name == "mlp"  # from the directory
    assert cfg.platform == "onnxruntime_onnx" and cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == 0 and not cfg.max_batch_size_given
    assert cfg.dynamic_batching is None and not cfg.batching
    assert cfg.instance_groups == (InstanceGroup(),)
    assert cfg.version_policy == VersionPolicy("latest", num_versions=1)
    assert cfg.warmup == () and cfg.warnings == ()
    assert cfg.default_model_filename == "model.onnx"


def test_empty_yaml_is_the_minimal_config() -> None:
    assert parse_mapping(None) == parse_text("")


def test_explicit_zero_max_batch_size_is_remembered() -> None:
    cfg = parse_text("max_batch_size: 0")
    assert cfg.max_batch_size == 0 and cfg.max_batch_size_given


def test_empty_dynamic_batching_enables_batcher_with_defaults() -> None:
    cfg = parse_text("max_batch_size: 4 dynamic_batching { }")
    assert cfg.dynamic_batching == DynamicBatching()
    assert cfg.batching
    assert cfg.dynamic_batching.policy_for(1) == QueuePolicy()


def test_dynamic_batching_without_max_batch_size_does_not_batch() -> None:
    cfg = parse_text("max_batch_size: 0 dynamic_batching { }")
    assert not cfg.batching


def test_kind_auto_means_cpu_and_count_defaults_to_one() -> None:
    cfg = parse_text("instance_group [ { kind: KIND_AUTO } ]")
    assert cfg.instance_groups == (InstanceGroup(1, "KIND_CPU"),)


@pytest.mark.parametrize(("text", "expected"), [
    ("", VersionPolicy("latest", 1)),
    ("version_policy: { latest: { num_versions: 2 } }", VersionPolicy("latest", 2)),
    ("version_policy: { all: { } }", VersionPolicy("all")),
    ("version_policy: { specific: { versions: [ 2, 5 ] } }",
     VersionPolicy("specific", versions=(2, 5))),
])
def test_version_policy_forms(text: str, expected: VersionPolicy) -> None:
    assert parse_text(text).version_policy == expected


@pytest.mark.parametrize(("policy", "available", "expected"), [
    (VersionPolicy("latest", 1), [3, 1, 2], [3]),
    (VersionPolicy("latest", 2), [3, 1, 2], [2, 3]),
    (VersionPolicy("latest", 5), [3, 1], [1, 3]),
    (VersionPolicy("latest", 1), [], []),
    (VersionPolicy("all"), [10, 2, 1], [1, 2, 10]),
    (VersionPolicy("specific", versions=(1, 3, 7)), [3, 2, 1], [1, 3]),
    (VersionPolicy("specific", versions=(9,)), [1, 2], []),
])
def test_version_policy_select(policy: VersionPolicy, available: list[int],
                               expected: list[int]) -> None:
    assert policy.select(available) == expected


def test_warmup_zero_data_is_the_default_source() -> None:
    cfg = parse_text('max_batch_size: 2 model_warmup [ { inputs { key: "x" value { '
                     "data_type: TYPE_INT32 dims: [ 2 ] } } } ]")
    (warm,) = cfg.warmup
    assert warm.name == "warmup_0" and warm.batch_size == 1 and warm.count == 1
    assert warm.inputs["x"] == WarmupInput("INT32", (2,), "zero")


@pytest.mark.parametrize("config_type, datatype", [
    ("TYPE_BOOL", "BOOL"), ("TYPE_UINT8", "UINT8"), ("TYPE_UINT64", "UINT64"),
    ("TYPE_INT8", "INT8"), ("TYPE_INT64", "INT64"), ("TYPE_FP16", "FP16"),
    ("TYPE_FP64", "FP64"), ("TYPE_BF16", "BF16"), ("TYPE_STRING", "BYTES"),
])
def test_tensor_datatypes(config_type: str, datatype: str) -> None:
    cfg = parse_text(f'input [ {{ name: "x" data_type: {config_type} dims: [ 1 ] }} ]')
    assert cfg.inputs[0].datatype == datatype


def test_full_shape_adds_batch_dim_only_when_batching() -> None:
    one_input = 'input [ { name: "x" data_type: TYPE_FP32 dims: [ 3 ] } ]'
    batching = parse_text(f"max_batch_size: 4 {one_input}")
    plain = parse_text(f"max_batch_size: 0 {one_input}")
    assert batching.full_shape(batching.inputs[0]) == [-1, 3]
    assert plain.full_shape(plain.inputs[0]) == [3]


# --------------------------------------------- Triton configs with unsupported fields


def test_realistic_triton_config_parses_with_a_warning() -> None:
    cfg = parse_text(TRITON_PBTXT)
    assert cfg.backend == "onnxruntime"
    assert cfg.max_batch_size == 8
    assert cfg.inputs == (TensorConfig("INPUT0", "FP32", (16,)),)
    assert cfg.outputs == (TensorConfig("OUTPUT0", "FP32", (16,)),)
    assert cfg.instance_groups == (InstanceGroup(2, "KIND_CPU"),)
    assert cfg.graph_optimization_level == -1
    # strings and comments are left as written
    assert cfg.parameters == {"note": "keep [this] # and this"}
    assert len(cfg.warnings) == 1
    assert "model_transaction_policy" in cfg.warnings[0] and "cuda" in cfg.warnings[0]


@pytest.mark.parametrize(("extra", "field"), [
    ("sequence_batching { oldest { max_candidate_sequences: 4 } }", "sequence_batching"),
    ("ensemble_scheduling { step [ { model_name: \"a\" } ] }", "ensemble_scheduling"),
    ("model_transaction_policy { decoupled: true }", "model_transaction_policy.decoupled"),
])
def test_triton_features_tradeoff_cannot_honour_fail_the_load(extra: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^{PBTXT_SOURCE}: {field}: .*not supported"):
        parse_text("max_batch_size: 4\n" + extra)


def test_misspelt_field_fails_with_a_suggestion() -> None:
    with pytest.raises(ConfigError, match=rf"^{PBTXT_SOURCE}: dynamic_batchng: unknown field; "
                                          "did you mean 'dynamic_batching'"):
        parse_text("max_batch_size: 4 dynamic_batchng { }")
    with pytest.raises(ConfigError, match="max_queue_dealy_microseconds: unknown field"):
        parse_text("max_batch_size: 4 dynamic_batching { max_queue_dealy_microseconds: 5 }")


def test_triton_only_field_in_yaml_parses_with_a_warning() -> None:
    cfg = parse_mapping({"max_batch_size": 2, "optimization": {"cuda": {"graphs": True}},
                         "parameters": {"any_key": {"string_value": "1"}},
                         "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}]})
    assert cfg.max_batch_size == 2
    assert cfg.inputs == (TensorConfig("x", "FP32", (1,)),)
    assert cfg.parameters == {"any_key": "1"}
    assert len(cfg.warnings) == 1 and "ignored Triton fields" in cfg.warnings[0]


def test_unknown_field_in_yaml_fails() -> None:
    with pytest.raises(ConfigError, match="allow_ragged_batch_2: unknown field"):
        parse_mapping({"max_batch_size": 2,
                       "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1],
                                  "allow_ragged_batch_2": True}]})


def test_known_config_has_no_warnings() -> None:
    text = FULL_PBTXT.replace("response_cache { enable: true }", "")
    assert parse_text(text).warnings == ()


def test_unsupported_field_does_not_hide_a_later_syntax_error() -> None:
    with pytest.raises(ConfigError, match=rf"^{PBTXT_SOURCE}: not valid protobuf text format"):
        parse_text("optimization { cuda { graphs: true } } max_batch_size: 4 input [ { name: ")


# -------------------------------------------------------------------- bad configs


@pytest.mark.parametrize("parse", [
    lambda: parse_text("max_batch_size: -1"),
    lambda: parse_mapping({"max_batch_size": -1}),
])
def test_negative_max_batch_size(parse) -> None:
    with pytest.raises(ConfigError, match=r"max_batch_size: must be >= 0, got -1") as info:
        parse()
    assert info.value.field == "max_batch_size"
    assert str(info.value).startswith(info.value.source + ": ")


def test_preferred_batch_size_above_max_batch_size() -> None:
    with raises_config_error(PBTXT_SOURCE, "dynamic_batching.preferred_batch_size[1]") as info:
        parse_text("max_batch_size: 8 dynamic_batching { preferred_batch_size: [ 4, 16 ] }")
    assert "got 16" in str(info.value)


def test_preferred_batch_size_must_be_positive() -> None:
    with raises_config_error(YAML_SOURCE, "dynamic_batching.preferred_batch_size[0]"):
        parse_mapping({"max_batch_size": 8, "dynamic_batching": {"preferred_batch_size": [0]}})


@pytest.mark.parametrize("text", [
    "priority_levels: 2 default_priority_level: 3",
    "priority_levels: 2 default_priority_level: 0",
    "priority_levels: 0 default_priority_level: 1",
])
def test_default_priority_level_out_of_range(text: str) -> None:
    with raises_config_error(PBTXT_SOURCE, "dynamic_batching.default_priority_level"):
        parse_text(f"max_batch_size: 4 dynamic_batching {{ {text} }}")


def test_priority_queue_policy_level_out_of_range() -> None:
    with raises_config_error(YAML_SOURCE, "dynamic_batching.priority_queue_policy[3]"):
        parse_mapping({"max_batch_size": 4, "dynamic_batching": {
            "priority_levels": 2, "default_priority_level": 1,
            "priority_queue_policy": {"3": {"max_queue_size": 1}}}})


@pytest.mark.parametrize(("tensor", "field"), [
    ('name: "x" data_type: TYPE_FP32 dims: [ 4, 0 ]', "input[0].dims[1]"),
    ('name: "x" data_type: TYPE_FP32 dims: [ -2 ]', "input[0].dims[0]"),
    ('name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 2, 0 ] }',
     "input[0].reshape.shape[1]"),
    ('data_type: TYPE_FP32 dims: [ 4 ]', "input[0].name"),
    ('name: "x" dims: [ 4 ]', "input[0].data_type"),
])
def test_bad_tensor(tensor: str, field: str) -> None:
    with raises_config_error(PBTXT_SOURCE, field):
        parse_text(f"input [ {{ {tensor} }} ]")


def test_bad_output_dims_name_the_output() -> None:
    with raises_config_error(YAML_SOURCE, "output[1].dims[0]"):
        parse_mapping({"output": [{"name": "a", "data_type": "TYPE_FP32", "dims": [1]},
                                  {"name": "b", "data_type": "TYPE_FP32", "dims": [0]}]})


def test_duplicate_input_name() -> None:
    with raises_config_error(PBTXT_SOURCE, "input[1].name"):
        parse_text('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1 ] },'
                   ' { name: "x" data_type: TYPE_FP32 dims: [ 1 ] } ]')


def test_unknown_data_type_in_pbtxt() -> None:
    text = 'input [\n  {\n    name: "x"\n    data_type: TYPE_FP33\n    dims: [ 1 ]\n  }\n]\n'
    with pytest.raises(ConfigError) as info:
        parse_text(text)
    message = str(info.value)
    assert message.startswith(PBTXT_SOURCE + ": ")
    assert "data_type" in message and "TYPE_FP33" in message
    assert "4:" in message  # the line of the bad value


def test_unknown_data_type_in_yaml() -> None:
    with pytest.raises(ConfigError) as info:
        parse_mapping({"input": [{"name": "x", "data_type": "TYPE_FP33", "dims": [1]}]})
    message = str(info.value)
    assert message.startswith(YAML_SOURCE + ": ")
    assert "input[0].data_type" in message and "TYPE_FP33" in message


def test_syntax_error_names_file_and_position() -> None:
    with pytest.raises(ConfigError, match=rf"^{PBTXT_SOURCE}: not valid protobuf text format: "
                                          r"2:\d+") as info:
        parse_text('max_batch_size: 4\ninput [ { name: "x" data_type: TYPE_FP32 dims: [ 1 }\n')
    assert info.value.source == PBTXT_SOURCE


def test_wrong_value_type_names_the_field() -> None:
    with pytest.raises(ConfigError, match=rf"^{PBTXT_SOURCE}: .*max_batch_size"):
        parse_text('max_batch_size: "eight"')
    with pytest.raises(ConfigError, match=rf"^{YAML_SOURCE}: .*max_batch_size"):
        parse_mapping({"max_batch_size": "eight"})


def test_name_must_match_directory() -> None:
    with raises_config_error(PBTXT_SOURCE, "name") as info:
        parse_text('name: "resnet"', name="mlp")
    assert "'resnet'" in str(info.value) and "'mlp'" in str(info.value)


@pytest.mark.parametrize(("text", "field"), [
    ('platform: "tensorrt_plan"', "platform"),
    ('platform: "ensemble"', "platform"),
    ('backend: "python"', "backend"),
])
def test_unsupported_platform_or_backend(text: str, field: str) -> None:
    with raises_config_error(PBTXT_SOURCE, field) as info:
        parse_text(text)
    assert "onnxruntime" in str(info.value)  # says what is supported


@pytest.mark.parametrize(("text", "field"), [
    ("instance_group [ { count: 0 } ]", "instance_group[0].count"),
    ("instance_group [ { count: 1 }, { count: -2 } ]", "instance_group[1].count"),
    ("version_policy: { latest: { num_versions: 0 } }", "version_policy.latest.num_versions"),
    ("version_policy: { specific: { } }", "version_policy.specific.versions"),
    ("max_batch_size: 2 model_warmup [ { batch_size: 3 } ]", "model_warmup[0].batch_size"),
    ("max_batch_size: 0 model_warmup [ { batch_size: 2 } ]", "model_warmup[0].batch_size"),
])
def test_bad_other_fields(text: str, field: str) -> None:
    with raises_config_error(PBTXT_SOURCE, field):
        parse_text(text)


def test_yaml_must_be_a_mapping() -> None:
    with pytest.raises(ConfigError, match=rf"^{YAML_SOURCE}: expected a mapping"):
        parse_mapping([{"name": "x"}])


def test_yaml_syntax_error(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("max_batch_size: [4\n")
    with pytest.raises(ConfigError, match="not valid YAML") as info:
        load_config_file(path, default_name="mlp")
    assert info.value.source == str(path)


def test_unreadable_file(tmp_path: Path) -> None:
    path = tmp_path / "config.pbtxt"
    with pytest.raises(ConfigError, match="cannot read") as info:
        load_config_file(path, default_name="mlp")
    assert info.value.source == str(path)


def test_yml_suffix_is_yaml(tmp_path: Path) -> None:
    path = tmp_path / "config.yml"
    path.write_text("max_batch_size: 3\n")
    assert load_config_file(path, default_name="mlp").max_batch_size == 3


# ----------------------------------------------------------------- auto-complete

X = TensorSpec("x", "FP32", (-1, 16))
Y = TensorSpec("y", "FP32", (-1, 4))


def complete(config: ModelConfig, inputs: list[TensorSpec], outputs: list[TensorSpec],
             **kwargs) -> ModelConfig:
    return autocomplete(config, (inputs, outputs), source=PBTXT_SOURCE, **kwargs)


def no_config() -> ModelConfig:
    return ModelConfig(name="mlp", max_batch_size_given=False)


def test_autocomplete_without_config_batches_by_default() -> None:
    cfg = complete(no_config(), [X], [Y])
    assert cfg.max_batch_size == 4
    assert cfg.inputs == (TensorConfig("x", "FP32", (16,)),)
    assert cfg.outputs == (TensorConfig("y", "FP32", (4,)),)
    assert cfg.dynamic_batching == DynamicBatching()
    assert cfg.batching


def test_autocomplete_default_max_batch_size_is_configurable() -> None:
    assert complete(no_config(), [X], [Y], default_max_batch_size=32).max_batch_size == 32


def test_autocomplete_max_batch_size_one_does_not_enable_batcher() -> None:
    cfg = complete(no_config(), [X], [Y], default_max_batch_size=1)
    assert cfg.max_batch_size == 1 and cfg.dynamic_batching is None


@pytest.mark.parametrize("outputs", [
    [TensorSpec("y", "FP32", (1, 4))],   # fixed first dim
    [TensorSpec("y", "FP32", ())],       # scalar
])
def test_autocomplete_fixed_first_dim_means_no_batching(outputs: list[TensorSpec]) -> None:
    cfg = complete(no_config(), [X], outputs)
    assert cfg.max_batch_size == 0
    assert cfg.dynamic_batching is None and not cfg.batching
    assert cfg.inputs == (TensorConfig("x", "FP32", (-1, 16)),)  # full shape, no batch dim
    assert cfg.outputs == (TensorConfig("y", "FP32", outputs[0].shape),)


def test_autocomplete_keeps_configured_dynamic_batching() -> None:
    config = parse_text("dynamic_batching { max_queue_delay_microseconds: 100 }")
    cfg = complete(config, [X], [Y])
    assert cfg.max_batch_size == 4
    assert cfg.dynamic_batching == DynamicBatching(max_queue_delay_us=100)


def test_autocomplete_keeps_given_max_batch_size_without_adding_batcher() -> None:
    cfg = complete(parse_text("max_batch_size: 8"), [X], [Y])
    assert cfg.max_batch_size == 8 and cfg.dynamic_batching is None


def test_autocomplete_given_zero_keeps_batch_dim_in_dims() -> None:
    cfg = complete(parse_text("max_batch_size: 0"), [X], [Y])
    assert cfg.max_batch_size == 0
    assert cfg.inputs == (TensorConfig("x", "FP32", (-1, 16)),)


def test_autocomplete_rejects_max_batch_size_for_unbatchable_model() -> None:
    with raises_config_error(PBTXT_SOURCE, "max_batch_size") as info:
        complete(parse_text("max_batch_size: 8"), [TensorSpec("x", "FP32", (2, 16))], [Y])
    assert "'x'" in str(info.value)


def declared(text: str, max_batch_size: int = 4) -> ModelConfig:
    return parse_text(f"max_batch_size: {max_batch_size} {text}")


def test_autocomplete_accepts_matching_declared_tensors() -> None:
    config = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ] '
                      'output [ { name: "y" data_type: TYPE_FP32 dims: [ -1 ] } ]')
    cfg = complete(config, [X], [Y])
    assert cfg.inputs == config.inputs and cfg.outputs == config.outputs


def test_autocomplete_declared_variable_dim_matches_fixed_model_dim() -> None:
    config = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ -1 ] } ]')
    assert complete(config, [X], [Y]).inputs == (TensorConfig("x", "FP32", (-1,)),)


def test_autocomplete_fills_outputs_when_only_inputs_declared() -> None:
    config = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]')
    assert complete(config, [X], [Y]).outputs == (TensorConfig("y", "FP32", (4,)),)


def test_autocomplete_reshape_is_checked_instead_of_dims() -> None:
    model_x = TensorSpec("x", "FP32", (-1, 4, 4))
    ok = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
                  'reshape { shape: [ 4, 4 ] } } ]')
    assert complete(ok, [model_x], [Y]).inputs[0].reshape == (4, 4)
    bad = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] '
                   'reshape { shape: [ 4, 2 ] } } ]')
    with raises_config_error(PBTXT_SOURCE, "input[0].reshape.shape[1]"):
        complete(bad, [model_x], [Y])


@pytest.mark.parametrize(("text", "field", "says"), [
    ('input [ { name: "x" data_type: TYPE_INT64 dims: [ 16 ] } ]', "input[0].data_type",
     "INT64 does not match the model's FP32"),
    ('input [ { name: "z" data_type: TYPE_FP32 dims: [ 16 ] } ]', "input[0].name",
     "'z' is not"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 8 ] } ]', "input[0].dims[0]",
     "8 does not match the model's fixed size 16"),
    ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 1, 16 ] } ]', "input[0].dims",
     "has rank 2"),
    ('output [ { name: "y" data_type: TYPE_FP16 dims: [ 4 ] } ]', "output[0].data_type",
     "FP16"),
    ('output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] }, '
     '{ name: "w" data_type: TYPE_FP32 dims: [ 4 ] } ]', "output[1].name", "'w'"),
])
def test_autocomplete_rejects_declared_tensor_that_disagrees(text: str, field: str,
                                                             says: str) -> None:
    with raises_config_error(PBTXT_SOURCE, field) as info:
        complete(declared(text), [X], [Y])
    assert says in str(info.value)


def test_autocomplete_rejects_config_missing_a_model_input() -> None:
    mask = TensorSpec("mask", "BOOL", (-1, 16))
    config = declared('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]')
    with raises_config_error(PBTXT_SOURCE, "input") as info:
        complete(config, [X, mask], [Y])
    assert "'mask'" in str(info.value)


# -------------------------------------------- checks after auto-complete (whole config)


def test_validate_warmup_input_must_exist() -> None:
    config = complete(parse_text('max_batch_size: 4 model_warmup [ { inputs { key: "nope" '
                                 "value { data_type: TYPE_FP32 dims: [ 16 ] } } } ]"), [X], [Y])
    with raises_config_error(PBTXT_SOURCE, "model_warmup[0].inputs") as info:
        validate_against_model(config, PBTXT_SOURCE)
    assert "'nope'" in str(info.value) and "x" in str(info.value)


def test_validate_warmup_batch_size_against_autocompleted_max_batch_size() -> None:
    # max_batch_size is left to auto-complete, which makes it 4: batch_size 2 is fine
    config = complete(parse_text("model_warmup [ { batch_size: 2 } ]"), [X], [Y])
    assert config.max_batch_size == 4
    validate_against_model(config, PBTXT_SOURCE)
    too_big = complete(parse_text("model_warmup [ { batch_size: 8 } ]"), [X], [Y])
    with raises_config_error(PBTXT_SOURCE, "model_warmup[0].batch_size"):
        validate_against_model(too_big, PBTXT_SOURCE)


def test_validate_preferred_batch_size_against_autocompleted_max_batch_size() -> None:
    config = complete(parse_text("dynamic_batching { preferred_batch_size: [ 2, 8 ] }"),
                      [X], [Y])
    assert config.max_batch_size == 4
    with raises_config_error(PBTXT_SOURCE, "dynamic_batching.preferred_batch_size[1]"):
        validate_against_model(config, PBTXT_SOURCE)


PRIORITY_DELAYS = """
max_batch_size: 8
dynamic_batching {{ max_queue_delay_microseconds: 10000 priority_levels: 2
                   default_priority_level: 2 }}
parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}
"""


def test_a_priority_level_may_have_its_own_queue_delay() -> None:
    cfg = parse_text(PRIORITY_DELAYS.format(key="priority_1_max_queue_delay_microseconds",
                                            value="0"))
    assert cfg.dynamic_batching is not None
    assert cfg.dynamic_batching.priority_queue_delay_us == {1: 0}
    assert cfg.dynamic_batching.delay_for(1) == 0 and cfg.dynamic_batching.delay_for(2) == 10000


@pytest.mark.parametrize(("key", "value", "message"), [
    ("priority_3_max_queue_delay_microseconds", "0", "between 1 and priority_levels (2)"),
    ("priority_1_max_queue_delay_microseconds", "2ms", "whole number of microseconds"),
])
def test_bad_priority_delays_name_the_parameter(key: str, value: str, message: str) -> None:
    with raises_config_error(PBTXT_SOURCE, f"parameters.{key}") as caught:
        parse_text(PRIORITY_DELAYS.format(key=key, value=value))
    assert message in str(caught.value)
    with raises_config_error(PBTXT_SOURCE, "parameters"):
        parse_text('max_batch_size: 8\nparameters { key: '
                   '"priority_1_max_queue_delay_microseconds" value: { string_value: "0" } }')


def test_a_pytorch_models_indexed_names_bind_by_position() -> None:
    """INPUT__0 and OUTPUT__0 name a torch.export program's first input and output, whose
    own names are the forward's (x): Triton's rule, which docs/pytorch.md promises; an
    ONNX model's tensors stay bound by name."""
    text = ('platform: "{platform}"\nmax_batch_size: 8\n'
            'input [ {{ name: "INPUT__0" data_type: TYPE_FP32 dims: [16] }} ]\n'
            'output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [4] }} ]\n')
    exported = parse_text(text.format(platform="torch_export"))
    cfg = complete(exported, [X], [Y])
    assert [t.name for t in cfg.inputs] == ["INPUT__0"] and cfg.outputs[0].name == "OUTPUT__0"
    wrong = parse_text(text.format(platform="torch_export").replace("dims: [16]", "dims: [15]"))
    with pytest.raises(ConfigError, match="input"):  # bound by position, still checked
        complete(wrong, [X], [Y])
    onnx = parse_text(text.format(platform="onnxruntime_onnx"))
    with pytest.raises(ConfigError, match=r"'INPUT__0' is not an input of the model "
                                          r"\(it has: x"):
        complete(onnx, [X], [Y])
