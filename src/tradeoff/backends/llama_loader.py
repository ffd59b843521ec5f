"""The generative backend: a Llama-family decoder (:mod:`tradeoff.backends.llama`) from
a Hugging Face directory or a GGUF file, on the device ``generate.yaml`` asks for."""

from __future__ import annotations

from pathlib import Path

import torch

from tradeoff.backends.decoding import Decoder
from tradeoff.backends.gguf_file import load_gguf
from tradeoff.backends.llama import load_hf_directory
from tradeoff.backends.registry import GenerativeBackendType
from tradeoff.backends.text import Tokenizer
from tradeoff.errors import ModelLoadError

__all__ = ["BACKEND", "load_model", "resolve_device"]


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; a CUDA device that is not
    there is a load error."""
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r}: torch sees no CUDA GPU "
                             f"(torch {torch.__version__}); use device: cpu or auto")
    return device


def load_model(path: Path, fmt: str, device: str,
               precision: str = "fp32") -> tuple[Decoder, Tokenizer]:
    """Decoder and tokenizer of a Hugging Face directory (``hf``) or a GGUF file, its
    weights held in ``precision`` (fp32, bf16, int8)."""
    device = resolve_device(device)
    if fmt == "gguf":
        return load_gguf(path, device=device, precision=precision)
    return (load_hf_directory(path, device=device, precision=precision),
            Tokenizer.from_directory(path))


BACKEND = GenerativeBackendType(name="llama", formats=("hf", "gguf"), load=load_model)
