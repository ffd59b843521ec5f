"""The model repository the integration tests serve, written as a Triton user would.

ONNX files come from ``onnx.helper``; every ``config.pbtxt`` is written by hand (no
generator), so the server reads the same text a Triton repository holds.

* the example models (``tiny``, ``mlp``, ...) from :func:`build_repository`;
* ``identity_<type>``: ``OUTPUT0 = INPUT0`` for every Open Inference Protocol datatype,
  ``[-1, -1]`` with ``max_batch_size: 8`` (BF16 apart: numpy has no bfloat16);
* ``add_sub``: Triton's classic "simple" model, two INT32 ``[16]`` inputs, sum and difference;
* ``versioned``: versions 1 and 2 (``OUTPUT0 = INPUT0 + version``), ``version_policy: all``;
* ``versioned_latest``: versions 1, 2 and 3 on disk, ``latest { num_versions: 2 }``;
* ``autocomplete``: no config file at all;
* ``broken``: a config whose ``instance_group[0].count`` is 0, and ``broken_syntax``, one
  with a misspelt ``data_type``: neither may load, and both must say why;
* ``queue_limited``: ``OUTPUT0 = INPUT0 + 1`` behind ``max_queue_size: 2`` and a long
  ``max_queue_delay_microseconds``, so requests wait in its queue until a batch of 4
  fills or the delay passes: the queue-full test needs no race against compute time;
* ``held``: like ``queue_limited`` without the limit, so requests stay in its queue for
  2 s (also in :func:`build_shutdown_repository`, for the shutdown test);
* ``reloadable``: ``OUTPUT0 = INPUT0 + 10``, for unload/load tests that change it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tradeoff.models import build_repository
from tradeoff.models.examples import tiny_model
from tradeoff.models.graph import make_model

# protocol datatype -> (ONNX element type, numpy dtype, Triton config type)
IDENTITY_TYPES: dict[str, tuple[int, type | np.dtype, str]] = {
    "BOOL": (TensorProto.BOOL, np.bool_, "TYPE_BOOL"),
    "UINT8": (TensorProto.UINT8, np.uint8, "TYPE_UINT8"),
    "UINT16": (TensorProto.UINT16, np.uint16, "TYPE_UINT16"),
    "UINT32": (TensorProto.UINT32, np.uint32, "TYPE_UINT32"),
    "UINT64": (TensorProto.UINT64, np.uint64, "TYPE_UINT64"),
    "INT8": (TensorProto.INT8, np.int8, "TYPE_INT8"),
    "INT16": (TensorProto.INT16, np.int16, "TYPE_INT16"),
    "INT32": (TensorProto.INT32, np.int32, "TYPE_INT32"),
    "INT64": (TensorProto.INT64, np.int64, "TYPE_INT64"),
    "FP16": (TensorProto.FLOAT16, np.float16, "TYPE_FP16"),
    "FP32": (TensorProto.FLOAT, np.float32, "TYPE_FP32"),
    "FP64": (TensorProto.DOUBLE, np.float64, "TYPE_FP64"),
    "BYTES": (TensorProto.STRING, np.object_, "TYPE_STRING"),
}

QUEUE_LIMIT = 2
QUEUE_DELAY_US = 2_000_000
HELD_DELAY_US = 2_000_000

# model -> what its load failure must name besides the config file
BROKEN_MODELS = {"broken": ("instance_group[0].count",),
                 "broken_syntax": ("data_type", "TYPE_FLOAT32")}


def identity_name(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    return make_model(graph, producer="tradeoff-tests")


def identity_model(elem_type: int) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "identity",
        [helper.make_tensor_value_info("INPUT0", elem_type, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", elem_type, ["batch", "n"])])
    return _model(graph)


def add_sub_model() -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
         helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])], "add_sub",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT32, ["batch", 16]),
         helper.make_tensor_value_info("INPUT1", TensorProto.INT32, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.INT32, ["batch", 16]),
         helper.make_tensor_value_info("OUTPUT1", TensorProto.INT32, ["batch", 16])])
    return _model(graph)


def add_constant_model(constant: float) -> onnx.ModelProto:
    """``OUTPUT0 = INPUT0 + constant`` on FP32 ``[-1, 4]``."""
    graph = helper.make_graph(
        [helper.make_node("Add", ["INPUT0", "c"], ["OUTPUT0"])], "add_constant",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])],
        initializer=[numpy_helper.from_array(np.array(constant, np.float32), "c")])
    return _model(graph)


def autocomplete_model() -> onnx.ModelProto:
    """``OUTPUT0 = -INPUT0`` on FP32 ``[batch, 4]``, served without a config file."""
    graph = helper.make_graph(
        [helper.make_node("Neg", ["INPUT0"], ["OUTPUT0"])], "autocomplete",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 4])])
    return _model(graph)


# ------------------------------------------------------------------ configs, by hand

def identity_config(datatype: str) -> str:
    config_type = f"TYPE_{datatype}" if datatype == "BF16" else IDENTITY_TYPES[datatype][2]
    return f"""\
name: "{identity_name(datatype)}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {{
    name: "INPUT0"
    data_type: {config_type}
    dims: [ -1 ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: {config_type}
    dims: [ -1 ]
  }}
]
dynamic_batching {{
  max_queue_delay_microseconds: 100
}}
instance_group [
  {{
    count: 1
    kind: KIND_CPU
  }}
]
version_policy: {{ latest: {{ num_versions: 1 }} }}
"""


ADD_SUB_CONFIG = """\
name: "add_sub"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
dynamic_batching { }
instance_group [ { count: 2 kind: KIND_CPU } ]
"""

# a model of add_constant_model: FP32 [batch, 4] in and out ({extra}: more fields)
CONSTANT_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}"""

VERSIONED_CONFIG = """\
name: "{name}"
backend: "onnxruntime"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
version_policy: {policy}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

HELD_CONFIG = f"""\
name: "held"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: {HELD_DELAY_US} }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

QUEUE_LIMITED_CONFIG = f"""\
name: "queue_limited"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{
  max_queue_delay_microseconds: {QUEUE_DELAY_US}
  default_queue_policy {{
    max_queue_size: {QUEUE_LIMIT}
  }}
}}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

RELOADABLE_CONFIG = """\
name: "reloadable"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

BROKEN_CONFIG = """\
name: "broken"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
instance_group [ { count: 0 kind: KIND_CPU } ]
"""

BROKEN_SYNTAX_CONFIG = """\
name: "broken_syntax"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_FLOAT32
    dims: [ 16 ]
  }
]
"""


def _write(root: Path, name: str, versions: dict[int, onnx.ModelProto],
           config: str | None) -> Path:
    directory = root / name
    for version, model in versions.items():
        (directory / str(version)).mkdir(parents=True, exist_ok=True)
        onnx.save(model, str(directory / str(version) / "model.onnx"))
    if config is not None:
        (directory / "config.pbtxt").write_text(config)
    return directory


def build_test_repository(root: Path) -> Path:
    """Write every test model under ``root``; returns ``root``."""
    root = Path(root)
    build_repository(root)
    for datatype, (elem_type, _, _) in IDENTITY_TYPES.items():
        _write(root, identity_name(datatype), {1: identity_model(elem_type)},
               identity_config(datatype))
    _write(root, identity_name("BF16"), {1: identity_model(TensorProto.BFLOAT16)},
           identity_config("BF16"))
    _write(root, "add_sub", {1: add_sub_model()}, ADD_SUB_CONFIG)
    _write(root, "versioned", {1: add_constant_model(1.0), 2: add_constant_model(2.0)},
           VERSIONED_CONFIG.format(name="versioned", policy="{ all: { } }"))
    _write(root, "versioned_latest",
           {v: add_constant_model(float(v)) for v in (1, 2, 3)},
           VERSIONED_CONFIG.format(name="versioned_latest",
                                   policy="{ latest: { num_versions: 2 } }"))
    _write(root, "autocomplete", {1: autocomplete_model()}, None)
    _write(root, "broken", {1: tiny_model()}, BROKEN_CONFIG)
    _write(root, "broken_syntax", {1: tiny_model()}, BROKEN_SYNTAX_CONFIG)
    _write(root, "queue_limited", {1: add_constant_model(1.0)}, QUEUE_LIMITED_CONFIG)
    _write(root, "reloadable", {1: add_constant_model(10.0)}, RELOADABLE_CONFIG)
    _write(root, "held", {1: add_constant_model(1.0)}, HELD_CONFIG)
    return root


def build_shutdown_repository(root: Path) -> Path:
    """Only ``mlp`` and ``held``: a small repository for a server a test stops itself."""
    root = Path(root)
    build_repository(root, ("mlp",))
    _write(root, "held", {1: add_constant_model(1.0)}, HELD_CONFIG)
    return root
