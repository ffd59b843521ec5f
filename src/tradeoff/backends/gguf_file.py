"""Llama-family models from a GGUF file (llama.cpp's format): weights dequantized to
float, Q/K projections put back in Hugging Face's RoPE layout, and the tokenizer rebuilt
from the file's metadata.

    decoder, tokenizer = load_gguf(Path("SmolLM2-135M-Instruct.Q4_1.gguf"))
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from tradeoff.backends.llama import LlamaConfig, LlamaDecoder
from tradeoff.backends.text import Tokenizer
from tradeoff.errors import ModelLoadError

__all__ = ["load_gguf"]

_LAYER_NAMES = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
                "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
                "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                "ffn_down": "mlp.down_proj"}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}
_CONTROL = 3  # token_type of special tokens


def _field(reader: Any, key: str, default: Any = None) -> Any:
    field = reader.fields.get(key)
    if field is None:
        return default
    if field.types and field.types[0].name == "STRING":
        return bytes(field.parts[field.data[0]]).decode()
    if field.types and field.types[0].name == "ARRAY":
        if len(field.types) > 1 and field.types[1].name == "STRING":
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    value = field.parts[field.data[0]].tolist()
    return value[0] if len(value) == 1 else value


def _unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    """Undo llama.cpp's reordering of Q/K rows (interleaved RoPE pairs -> halves)."""
    rows = weight.shape[0]
    return (weight.reshape(heads, rows // heads // 2, 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


def _tokenizer(reader: Any) -> Tokenizer:
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    if _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise ModelLoadError("only byte-level BPE (gpt2) GGUF tokenizers are supported")
    tokens = _field(reader, "tokenizer.ggml.tokens")
    merges = [tuple(m.split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges", [])]
    types = _field(reader, "tokenizer.ggml.token_type", [])
    backend = HfTokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens([t for t, kind in zip(tokens, types, strict=True)
                                if kind == _CONTROL])
    bos, eos = _field(reader, "tokenizer.ggml.bos_token_id"), _field(reader,
                                                                     "tokenizer.ggml.eos_token_id")
    config = {"bos_token": tokens[bos] if bos is not None else None,
              "eos_token": tokens[eos] if eos is not None else None,
              "add_bos_token": bool(_field(reader, "tokenizer.ggml.add_bos_token", False)),
              "chat_template": _field(reader, "tokenizer.chat_template")}
    return Tokenizer(backend, config)


def load_gguf(path: Path, device: str = "cpu",
              precision: str = "fp32") -> tuple[LlamaDecoder, Tokenizer]:
    """The decoder and tokenizer of a Llama-architecture GGUF file; its quantized blocks
    are dequantized, then held in ``precision`` (INT8 re-quantizes per output channel)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    try:
        reader = GGUFReader(str(path))
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable GGUF file: {exc}") from None
    arch = _field(reader, "general.architecture")
    if arch != "llama":
        raise ModelLoadError(f"{path}: architecture {arch!r} is not a Llama-family model")
    heads = int(_field(reader, "llama.attention.head_count"))
    kv_heads = int(_field(reader, "llama.attention.head_count_kv", heads))
    tokens = _field(reader, "tokenizer.ggml.tokens")
    names = {t.name for t in reader.tensors}
    config = LlamaConfig(
        vocab_size=int(_field(reader, "llama.vocab_size", len(tokens))),
        hidden_size=int(_field(reader, "llama.embedding_length")),
        intermediate_size=int(_field(reader, "llama.feed_forward_length")),
        num_layers=int(_field(reader, "llama.block_count")), num_heads=heads,
        num_kv_heads=kv_heads,
        rms_norm_eps=float(_field(reader, "llama.attention.layer_norm_rms_epsilon", 1e-5)),
        rope_theta=float(_field(reader, "llama.rope.freq_base", 10000.0)),
        max_position=int(_field(reader, "llama.context_length", 2048)),
        tie_word_embeddings="output.weight" not in names,
        bos_token_id=_field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_id=_field(reader, "tokenizer.ggml.eos_token_id"))
    weights: dict[str, torch.Tensor] = {}
    for tensor in reader.tensors:
        parts = tensor.name.split(".")
        if parts[0] == "blk":
            layer, kind = parts[1], parts[2]
            if kind not in _LAYER_NAMES:
                continue
            name = f"model.layers.{layer}.{_LAYER_NAMES[kind]}.weight"
        elif parts[0] in _TOP_NAMES:
            name = f"{_TOP_NAMES[parts[0]]}.weight"
        else:
            continue
        array = np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        if parts[0] == "blk" and parts[2] == "attn_q":
            array = _unpermute(array, heads)
        elif parts[0] == "blk" and parts[2] == "attn_k":
            array = _unpermute(array, kv_heads)
        weights[name] = torch.from_numpy(np.array(array, dtype=np.float32, copy=True))
    return LlamaDecoder(config, weights, device, precision=precision), _tokenizer(reader)
