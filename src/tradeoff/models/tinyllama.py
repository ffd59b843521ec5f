"""``tinyllama``: a tiny Llama-architecture model with random weights (fixed seed) and a
byte-level tokenizer, written as a Hugging Face directory (config.json, safetensors,
tokenizer.json, tokenizer_config.json with a chat template). Made locally; needs torch.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "tinyllama_config", "write_tinyllama"]

SPECIAL_TOKENS = ["<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
                 "{{ message['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def tinyllama_config() -> dict:
    from tradeoff.backends.llama import LlamaConfig

    return LlamaConfig(vocab_size=256 + len(SPECIAL_TOKENS), hidden_size=64,
                       intermediate_size=172, num_layers=2, num_heads=4, num_kv_heads=2,
                       rope_theta=10000.0, max_position=512,
                       bos_token_id=257, eos_token_id=258).to_hf()


def _tokenizer() -> object:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from tokenizers.pre_tokenizers import ByteLevel

    alphabet = ByteLevel.alphabet()  # the 256 byte symbols, one token each, in byte order
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet, key=_byte_of))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False,
                                                       use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def _byte_of(symbol: str) -> int:
    """The byte a ByteLevel symbol stands for (GPT-2's printable remapping)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]
    mapping = {b: b for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = 256 + extra
            extra += 1
    inverse = {chr(v): b for b, v in mapping.items()}
    return inverse[symbol]


def write_tinyllama(directory: Path, seed: int = 0) -> Path:
    """Write the model into ``directory``; returns it."""
    import torch
    from safetensors.torch import save_file

    from tradeoff.backends.llama import LlamaConfig

    directory.mkdir(parents=True, exist_ok=True)
    doc = tinyllama_config()
    config = LlamaConfig.from_hf(doc)
    generator = torch.Generator().manual_seed(seed)
    d, kv = config.hidden_size, config.num_kv_heads * config.head_dim

    def rand(*shape: int, scale: float = 0.2) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * scale

    weights = {"model.embed_tokens.weight": rand(config.vocab_size, d, scale=1.0),
               "model.norm.weight": torch.ones(d), "lm_head.weight": rand(config.vocab_size, d)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": torch.ones(d),
            p + "post_attention_layernorm.weight": torch.ones(d),
            p + "self_attn.q_proj.weight": rand(d, d), p + "self_attn.k_proj.weight": rand(kv, d),
            p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, d),
            p + "mlp.gate_proj.weight": rand(config.intermediate_size, d),
            p + "mlp.up_proj.weight": rand(config.intermediate_size, d),
            p + "mlp.down_proj.weight": rand(d, config.intermediate_size)})
    save_file({k: v.contiguous() for k, v in weights.items()},
              str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(doc, indent=2))
    _tokenizer().save(str(directory / "tokenizer.json"))  # type: ignore[attr-defined]
    (directory / "tokenizer_config.json").write_text(json.dumps({
        "bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>",
        "add_bos_token": True, "chat_template": CHAT_TEMPLATE}, indent=2))
    return directory
