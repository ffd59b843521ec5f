"""Example PyTorch models made offline (random weights from a fixed seed), written for the
``pytorch`` backend as TorchScript (``model.pt``, Triton's ``pytorch_libtorch``) and as
``torch.export`` programs (``model.pt2``).

* ``bert_base_torch`` / ``bert_base_export``: a BERT-base-shaped encoder (12 layers, 768
  wide, 12 heads, 3072 feed-forward, vocabulary 30,522) with int64 ``input_ids`` and
  ``attention_mask`` at a sequence length set in the config (128), returning the pooled
  [CLS] vector;
* ``resnet50_torch`` / ``resnet50_export``: a ResNet-50-shaped classifier (bottleneck
  stages 3, 4, 6, 3) on FP32 ``[3, 224, 224]`` images, returning 1,000 logits.

Only the shapes are real: the weights are random, so the figures are of the computation,
not of an accuracy. The TorchScript configs use Triton's positional names (``INPUT__0``,
``OUTPUT__0``); the exported ones the forward's argument names, as their file declares.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradeoff.backends.pytorch import torchscript_quietly
from tradeoff.errors import InvalidValue

__all__ = [
    "ENCODER_CONFIG",
    "RESNET_CONFIG",
    "TORCH_MODELS",
    "EncoderShape",
    "ResNetShape",
    "encoder_module",
    "resnet_module",
    "torch_available",
    "write_encoder",
    "write_exported",
    "write_resnet",
    "write_torch_model",
    "write_torchscript",
]

TORCH_MODELS = ("bert_base_torch", "bert_base_export", "resnet50_torch", "resnet50_export")


def torch_available() -> bool:
    return importlib.util.find_spec("torch") is not None


@dataclass(frozen=True)
class EncoderShape:
    """A BERT-shaped encoder's sizes; the defaults are BERT-base's."""

    vocab: int = 30522
    hidden: int = 768
    layers: int = 12
    heads: int = 12
    intermediate: int = 3072
    sequence: int = 128
    max_batch: int = 64


@dataclass(frozen=True)
class ResNetShape:
    """A ResNet-shaped classifier's sizes; the defaults are ResNet-50's."""

    blocks: tuple[int, ...] = (3, 4, 6, 3)
    width: int = 64
    classes: int = 1000
    image: int = 224
    max_batch: int = 32


def encoder_module(shape: EncoderShape, seed: int = 0) -> Any:
    """The encoder as an ``nn.Module`` in eval mode."""
    import torch
    from torch import nn
    from torch.nn import functional

    class Layer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.heads = shape.heads
            self.qkv = nn.Linear(shape.hidden, 3 * shape.hidden)
            self.out = nn.Linear(shape.hidden, shape.hidden)
            self.norm1 = nn.LayerNorm(shape.hidden, eps=1e-12)
            self.up = nn.Linear(shape.hidden, shape.intermediate)
            self.down = nn.Linear(shape.intermediate, shape.hidden)
            self.norm2 = nn.LayerNorm(shape.hidden, eps=1e-12)

        def forward(self, x: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
            rows, length, width = x.shape
            qkv = self.qkv(x).view(rows, length, 3, self.heads, width // self.heads)
            q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
            attended = functional.scaled_dot_product_attention(q, k, v, attn_mask=bias)
            x = self.norm1(x + self.out(attended.transpose(1, 2).reshape(rows, length, width)))
            return self.norm2(x + self.down(functional.gelu(self.up(x))))

    class Encoder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(shape.vocab, shape.hidden)
            self.positions = nn.Embedding(512, shape.hidden)
            self.token_type = nn.Parameter(torch.zeros(shape.hidden))
            self.norm = nn.LayerNorm(shape.hidden, eps=1e-12)
            self.layers = nn.ModuleList([Layer() for _ in range(shape.layers)])
            self.pool = nn.Linear(shape.hidden, shape.hidden)

        def forward(self, input_ids: torch.Tensor,
                    attention_mask: torch.Tensor) -> torch.Tensor:
            places = torch.arange(input_ids.shape[1], device=input_ids.device)
            x = self.words(input_ids) + self.positions(places).unsqueeze(0) + self.token_type
            x = self.norm(x)
            # an additive mask: padded keys get a large negative score (-1e4 fits FP16)
            keep = (attention_mask[:, None, None, :] > 0).to(x.dtype)
            bias = (1.0 - keep) * -10000.0
            for layer in self.layers:
                x = layer(x, bias)
            return torch.tanh(self.pool(x[:, 0]))

    torch.manual_seed(seed)
    module = Encoder()
    for parameter in module.parameters():  # BERT's initialisation scale
        if parameter.dim() > 1:
            torch.nn.init.normal_(parameter, std=0.02)
    return module.eval()


def resnet_module(shape: ResNetShape, seed: int = 0) -> Any:
    """The classifier as an ``nn.Module`` in eval mode."""
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inputs: int, width: int, stride: int) -> None:
            super().__init__()
            outputs = width * 4
            self.body = nn.Sequential(
                nn.Conv2d(inputs, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
                nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width),
                nn.ReLU(), nn.Conv2d(width, outputs, 1, bias=False), nn.BatchNorm2d(outputs))
            self.skip = nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride, bias=False),
                                      nn.BatchNorm2d(outputs)) \
                if stride != 1 or inputs != outputs else nn.Identity()
            self.relu = nn.ReLU()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.relu(self.body(x) + self.skip(x))

    torch.manual_seed(seed)
    stages: list[nn.Module] = [nn.Conv2d(3, shape.width, 7, 2, 3, bias=False),
                               nn.BatchNorm2d(shape.width), nn.ReLU(), nn.MaxPool2d(3, 2, 1)]
    inputs = shape.width
    for i, count in enumerate(shape.blocks):
        width = shape.width * 2 ** i
        for j in range(count):
            stages.append(Bottleneck(inputs, width, 2 if j == 0 and i > 0 else 1))
            inputs = width * 4
    stages += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(inputs, shape.classes)]
    return nn.Sequential(*stages).eval()


def _encoder_example(shape: EncoderShape, rows: int) -> tuple[Any, Any]:
    import torch

    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, shape.vocab, (rows, shape.sequence), generator=generator)
    mask = torch.ones(rows, shape.sequence, dtype=torch.int64)
    return ids, mask


def write_torchscript(module: Any, example: tuple[Any, ...], path: Path) -> None:
    """``module`` scripted (traced when it cannot be) and saved for the pytorch backend."""
    import torch

    with torchscript_quietly():
        try:
            program = torch.jit.script(module)
        except Exception:  # scripting rejects some Python; tracing takes it
            program = torch.jit.trace(module, example)
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.jit.save(program, str(path))


def write_exported(module: Any, example: tuple[Any, ...], names: tuple[str, ...],
                   path: Path, max_rows: int = 4096) -> None:
    """``module`` exported with a dynamic batch dimension (1 to ``max_rows``: above the
    config's max_batch_size, so `tune batch-size` can search past it)."""
    import torch
    from torch.export import Dim

    batch = Dim("batch", min=1, max=max_rows)
    program = torch.export.export(module, example,
                                  dynamic_shapes={name: {0: batch} for name in names})
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.export.save(program, str(path))


def _write_version(module: Any, example: tuple[Any, ...], names: tuple[str, ...],
                   directory: Path, exported: bool) -> Path:
    """Version 1 of ``directory``: ``model.pt2`` when ``exported``, else ``model.pt``."""
    if exported:
        write_exported(module, example, names, directory / "1" / "model.pt2")
    else:
        write_torchscript(module, example, directory / "1" / "model.pt")
    return directory


ENCODER_CONFIG = """\
name: "{name}"
platform: "{platform}"
max_batch_size: {max_batch}
input [
  {{ name: "{ids}" data_type: TYPE_INT64 dims: [ {sequence} ] }},
  {{ name: "{mask}" data_type: TYPE_INT64 dims: [ {sequence} ] }}
]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {hidden} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: {kind} }} ]
"""

RESNET_CONFIG = """\
name: "{name}"
platform: "{platform}"
max_batch_size: {max_batch}
input [ {{ name: "{image}" data_type: TYPE_FP32 dims: [ 3, {size}, {size} ] }} ]
output [ {{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ {classes} ] }} ]
dynamic_batching {{ }}
instance_group [ {{ count: 1 kind: {kind} }} ]
"""


def write_encoder(root: Path, name: str, shape: EncoderShape = EncoderShape(), *,
                  exported: bool = False, kind: str = "KIND_CPU") -> Path:
    """An encoder model directory ``root/name``: version 1 and its config."""
    module = encoder_module(shape)
    example = _encoder_example(shape, 2)
    directory = _write_version(module, example, ("input_ids", "attention_mask"),
                               Path(root) / name, exported)
    (directory / "config.pbtxt").write_text(ENCODER_CONFIG.format(
        name=name, platform="torch_export" if exported else "pytorch_libtorch",
        max_batch=shape.max_batch, sequence=shape.sequence, hidden=shape.hidden, kind=kind,
        ids="input_ids" if exported else "INPUT__0",
        mask="attention_mask" if exported else "INPUT__1"))
    return directory


def write_resnet(root: Path, name: str, shape: ResNetShape = ResNetShape(), *,
                 exported: bool = False, kind: str = "KIND_CPU") -> Path:
    """A classifier model directory ``root/name``: version 1 and its config."""
    import torch

    module = resnet_module(shape)
    example = (torch.zeros(2, 3, shape.image, shape.image),)
    # nn.Sequential's forward takes "input"
    directory = _write_version(module, example, ("input",), Path(root) / name, exported)
    (directory / "config.pbtxt").write_text(RESNET_CONFIG.format(
        name=name, platform="torch_export" if exported else "pytorch_libtorch",
        max_batch=shape.max_batch, size=shape.image, classes=shape.classes, kind=kind,
        image="input" if exported else "INPUT__0"))
    return directory


def write_torch_model(root: Path, name: str) -> Path:
    """Write example model ``name`` (one of TORCH_MODELS) into ``root``."""
    if not torch_available():
        raise InvalidValue(f"{name} needs torch: pip install 'tradeoff[llm]'")
    exported = name.endswith("_export")
    if name.startswith("bert"):
        return write_encoder(root, name, exported=exported)
    return write_resnet(root, name, exported=exported)
