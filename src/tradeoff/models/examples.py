"""Small ONNX models made with ``onnx.helper`` and fixed seeds, with Triton configs.

* ``tiny``: FP32 ``[-1, 16]`` elementwise (``y = 2x + 1``); all the cost is request handling.
* ``mlp``: FP32 ``[-1, 256]`` -> 1024 -> 1024 -> 10 with ReLU, random weights (seed 0),
  dynamic batching on.
* ``tiny_nobatch``, ``mlp_nobatch``: the same files with dynamic batching off, to show
  what batching buys.

Real models (``minilm``, ``resnet50``) come from :mod:`tradeoff.models.packaged`, generative
ones (``tinyllama``, ``smollm2-135m``, and ``synthetic-llm`` when named) from
:mod:`tradeoff.models.generative`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from tradeoff.errors import InvalidValue, local_resource
from tradeoff.models.generative import (
    BUILDABLE_GENERATIVE,
    available_generative_models,
    write_generative,
)
from tradeoff.models.graph import make_model
from tradeoff.models.packaged import (
    PACKAGED_MODELS,
    available_packaged_models,
    write_packaged,
)
from tradeoff.models.torch_models import TORCH_MODELS, write_torch_model

__all__ = [
    "EXAMPLE_MODELS",
    "MLP_CONFIG",
    "TINY_CONFIG",
    "build_repository",
    "default_models",
    "mlp_model",
    "tiny_model",
]


def tiny_model() -> onnx.ModelProto:
    """``OUTPUT0 = 2 * INPUT0 + 1`` on FP32 ``[-1, 16]``."""
    nodes = [helper.make_node("Mul", ["INPUT0", "two"], ["doubled"]),
             helper.make_node("Add", ["doubled", "one"], ["OUTPUT0"])]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 16])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 16])],
        initializer=[numpy_helper.from_array(np.array(2.0, np.float32), "two"),
                     numpy_helper.from_array(np.array(1.0, np.float32), "one")])
    return make_model(graph)


def mlp_model(seed: int = 0, sizes: tuple[int, ...] = (256, 1024, 1024, 10)) -> onnx.ModelProto:
    """A ReLU MLP with random (He-scaled) weights from a fixed seed."""
    rng = np.random.default_rng(seed)
    nodes, initializers = [], []
    previous = "INPUT0"
    layers = len(sizes) - 1
    for i in range(layers):
        fan_in, fan_out = sizes[i], sizes[i + 1]
        weight = (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32)
        bias = (rng.standard_normal(fan_out) * 0.01).astype(np.float32)
        initializers += [numpy_helper.from_array(weight, f"W{i}"),
                         numpy_helper.from_array(bias, f"B{i}")]
        out = "OUTPUT0" if i == layers - 1 else f"H{i}"
        gemm_out = out if i == layers - 1 else f"G{i}"
        nodes.append(helper.make_node("Gemm", [previous, f"W{i}", f"B{i}"], [gemm_out]))
        if i < layers - 1:
            nodes.append(helper.make_node("Relu", [gemm_out], [out]))
        previous = out
    graph = helper.make_graph(
        nodes, "mlp",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", sizes[0]])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", sizes[-1]])],
        initializer=initializers)
    return make_model(graph)


TINY_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
{batching}instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

MLP_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
{batching}instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""

EXAMPLE_MODELS = ("tiny", "tiny_nobatch", "mlp", "mlp_nobatch")
_BATCHING = "dynamic_batching { }\n"


def _write(root: Path, name: str, model: onnx.ModelProto, config: str) -> Path:
    directory = root / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(config)
    return directory


def default_models() -> tuple[str, ...]:
    """What ``tradeoff models build`` writes by default: the tensor models, plus the
    packaged and generative ones this installation can serve."""
    return EXAMPLE_MODELS + available_packaged_models() + available_generative_models()


def build_repository(root: Path, names: tuple[str, ...] = EXAMPLE_MODELS) -> list[Path]:
    """Write the example models (tensor and generative) into a repository at ``root``."""
    root = Path(root)
    known = EXAMPLE_MODELS + PACKAGED_MODELS + BUILDABLE_GENERATIVE + TORCH_MODELS
    unknown = set(names) - set(known)
    if unknown:
        raise InvalidValue(f"unknown example models {sorted(unknown)}; "
                           f"choose from {', '.join(known)}")
    with local_resource(f"cannot write models into {root}"):
        return _build(root, names)


def _build(root: Path, names: tuple[str, ...]) -> list[Path]:
    root.mkdir(parents=True, exist_ok=True)
    written = []
    builders = {"tiny": (tiny_model, TINY_CONFIG), "mlp": (mlp_model, MLP_CONFIG)}
    for base, (make, template) in builders.items():
        wanted = [n for n in (base, f"{base}_nobatch") if n in names]
        if not wanted:
            continue
        model = make()
        for name in wanted:
            batching = "" if name.endswith("_nobatch") else _BATCHING
            written.append(_write(root, name, model, template.format(name=name,
                                                                     batching=batching)))
    written += [write_packaged(root, name) for name in PACKAGED_MODELS if name in names]
    written += [write_generative(root, name) for name in BUILDABLE_GENERATIVE if name in names]
    written += [write_torch_model(root, name) for name in TORCH_MODELS if name in names]
    return written
