"""Reduced-precision versions of a PyTorch model file (the ``pytorch`` backend's).

* ``fp16`` / ``bf16``: the weights cast once and saved in the same form as the source
  (TorchScript ``model.pt`` through ``torch.jit``, an exported ``model.pt2`` exported again
  from its cast module with the same dynamic batch dimension). The backend sees 16-bit
  weights and casts FP32 inputs to them, and answers FP32 as the config says.

INT8 and graph optimisation are ONNX Runtime's tools: a PyTorch model is quantized from its
eager module (``torch.ao.quantization.quantize_dynamic``) before it is scripted or
exported, which a saved file no longer has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tradeoff.backends.pytorch import (
    check_code_file,
    forward_names,
    input_positions,
    is_exported,
    load_exported,
    torchscript_quietly,
)
from tradeoff.errors import OptimizeError
from tradeoff.optimize.samples import Samples
from tradeoff.optimize.variants import BF16, FP16, Variant

__all__ = ["TORCH_KINDS", "describe_torch", "make_torch_variant"]

TORCH_KINDS = (FP16, BF16)


def describe_torch(variant: Variant) -> str:
    """How a version was made, in a few words (stored in the model's config)."""
    import torch

    return f"{variant.kind}: the weights cast once (torch {torch.__version__})"


def make_torch_variant(source: Path, target: Path, variant: Variant,
                       input_names: list[str], example: Samples) -> None:
    """Write ``variant`` of the PyTorch file ``source`` to ``target``; an exported
    program is exported again on ``example`` (config input name -> a batch of rows)."""
    import torch

    if variant.kind not in TORCH_KINDS:
        raise OptimizeError(
            f"{source.name}: a PyTorch model takes --fp16 and --bf16; {variant.kind} is "
            "ONNX Runtime's (quantize a PyTorch model from its eager module, "
            "torch.ao.quantization.quantize_dynamic, before scripting or exporting it)")
    dtype = torch.float16 if variant.kind == FP16 else torch.bfloat16
    target.parent.mkdir(parents=True, exist_ok=True)
    if not is_exported(source):
        check_code_file(source)
        with torchscript_quietly():
            module = torch.jit.load(str(source), map_location="cpu")
            torch.jit.save(module.to(dtype), str(target))
        return
    program = load_exported(source)
    module = program.module().to(dtype)
    forward = forward_names(module, program)
    positions = input_positions(input_names, forward, f"{source}")
    args: list[Any] = [None] * len(forward)
    for name, position in zip(input_names, positions, strict=True):
        tensor = torch.from_numpy(example[name][:3].copy())
        args[position] = tensor.to(dtype) if tensor.is_floating_point() else tensor
    try:  # the batch range as the source program's own guards allow it
        exported = torch.export.export(
            module, tuple(args), dynamic_shapes=tuple({0: torch.export.Dim.AUTO} for _ in args))
    except Exception as exc:  # export's own errors name the operation that failed
        raise OptimizeError(f"{source}: exporting the {variant.kind} module failed: "
                            f"{type(exc).__name__}: {str(exc).splitlines()[0]}") from exc
    torch.export.save(exported, str(target))
