"""Optimised versions of an ONNX model file, made with ONNX Runtime's own tools.

* ``int8-dynamic``: weights to INT8 ahead of time, activations quantized per batch at
  run time (``quantize_dynamic``); nothing to calibrate.
* ``int8-static``: weights and activations to INT8 in QDQ form, activation ranges from a
  calibration set (``quantize_static`` with a calibration reader).
* ``fp16``: weights and compute in FP16, inputs and outputs kept FP32 (for GPU providers;
  on a CPU most FP16 kernels are missing and the casts make it slower).
* ``graph-opt``: ONNX Runtime's extended graph optimisations (fusions, constant folding)
  done once and saved, so a server need not repeat them at every load.
* ``bf16``: for generative models only (:mod:`tradeoff.optimize.generative`).

``per_channel`` gives each output channel of a weight its own scale; ``exclude`` names
nodes left in FP32 (the sensitive ones).
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

from tradeoff.errors import OptimizeError

__all__ = [
    "BF16",
    "KINDS",
    "QUANTIZABLE_OPS",
    "Feed",
    "Variant",
    "make_variant",
    "quantizable_ops",
]

INT8_DYNAMIC, INT8_STATIC, FP16, GRAPH_OPT = "int8-dynamic", "int8-static", "fp16", "graph-opt"
BF16 = "bf16"  # generative models only
KINDS = (INT8_DYNAMIC, INT8_STATIC, FP16, GRAPH_OPT, BF16)
# the ops INT8 quantization rewrites; a model with none of them gains nothing
QUANTIZABLE_OPS = ("MatMul", "Gemm", "Conv")

Feed = dict[str, np.ndarray]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Variant:
    """One way to optimise a model."""

    kind: str
    per_channel: bool = False
    exclude: tuple[str, ...] = ()

    @property
    def precision(self) -> str:
        return {INT8_DYNAMIC: "int8", INT8_STATIC: "int8", FP16: "fp16",
                BF16: "bf16"}.get(self.kind, "fp32")

    def describe(self) -> str:
        """How the version was made, in a few words (stored in the model's config)."""
        parts = [self.kind]
        if self.per_channel:
            parts.append("per-channel")
        if self.exclude:
            parts.append(f"excluding {', '.join(self.exclude)}")
        if self.kind == GRAPH_OPT:
            parts.append("extended level, CPU provider")
        return f"{'; '.join(parts)} (onnxruntime {ort.__version__})"


def quantizable_ops(model_path: Path) -> list[str]:
    """The op types INT8 quantization would rewrite in the model."""
    model = onnx.load(str(model_path), load_external_data=False)
    return sorted({n.op_type for n in model.graph.node if n.op_type in QUANTIZABLE_OPS})


def make_variant(source: Path, target: Path, variant: Variant,
                 calibration: Iterator[Feed] | None = None) -> None:
    """Write ``variant`` of the ONNX file ``source`` to ``target``; ``calibration`` feeds
    (ONNX input name -> array) are needed for ``int8-static``."""
    if variant.kind in (INT8_DYNAMIC, INT8_STATIC) and not quantizable_ops(source):
        raise OptimizeError(f"{source}: no {', '.join(QUANTIZABLE_OPS)} node to quantize; "
                            "INT8 would leave the model as it is")
    target.parent.mkdir(parents=True, exist_ok=True)
    if variant.kind == INT8_DYNAMIC:
        with _prepared(source) as prepared:
            _int8_dynamic(prepared, target, variant)
    elif variant.kind == INT8_STATIC:
        if calibration is None:
            raise OptimizeError("int8-static needs calibration samples")
        with _prepared(source) as prepared:
            _int8_static(prepared, target, variant, calibration)
    elif variant.kind == FP16:
        _fp16(source, target)
    elif variant.kind == GRAPH_OPT:
        _graph_opt(source, target)
    elif variant.kind == BF16:
        raise OptimizeError("bf16 is for generative models; an ONNX model takes --fp16")
    else:
        raise OptimizeError(f"unknown variant {variant.kind!r}; choose from {', '.join(KINDS)}")


@contextlib.contextmanager
def _prepared(source: Path) -> Iterator[Path]:
    """``source`` after ONNX Runtime's quantization pre-processing (shape inference and
    basic optimisation, as its docs advise before quantizing); ``source`` itself when
    that fails, as it may on graphs its shape inference does not follow."""
    from onnxruntime.quantization.shape_inference import quant_pre_process

    with tempfile.TemporaryDirectory(prefix="tradeoff-quant-") as scratch:
        prepared = Path(scratch) / "prepared.onnx"
        try:
            quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True)
        except Exception as exc:  # any failure: quantize the file as it is
            log.info("quantization pre-processing of %s failed (%s); quantizing it as it is",
                     source, exc)
            prepared = source
        yield prepared


def _int8_dynamic(source: Path, target: Path, variant: Variant) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(source, target, weight_type=QuantType.QInt8,
                     per_channel=variant.per_channel, nodes_to_exclude=list(variant.exclude))


def _int8_static(source: Path, target: Path, variant: Variant,
                 calibration: Iterator[Feed]) -> None:
    from onnxruntime.quantization import (
        CalibrationDataReader,
        QuantFormat,
        QuantType,
        quantize_static,
    )

    class Reader(CalibrationDataReader):
        def get_next(self) -> Feed | None:
            return next(calibration, None)

    quantize_static(source, target, Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=variant.per_channel, activation_type=QuantType.QUInt8,
                    weight_type=QuantType.QInt8, nodes_to_exclude=list(variant.exclude),
                    op_types_to_quantize=list(QUANTIZABLE_OPS))


def _fp16(source: Path, target: Path) -> None:
    from onnxruntime.transformers.float16 import convert_float_to_float16

    model = onnx.load(str(source))
    onnx.save(convert_float_to_float16(model, keep_io_types=True), str(target))


def _graph_opt(source: Path, target: Path) -> None:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    options.optimized_model_filepath = str(target)
    ort.InferenceSession(str(source), options, providers=["CPUExecutionProvider"])
