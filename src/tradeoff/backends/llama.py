"""A Llama-family decoder in PyTorch over a paged KV cache (RMSNorm, RoPE, grouped-query
attention, SwiGLU), for iteration-level batching.

One :meth:`LlamaDecoder.step` runs any mix of sequences, each contributing its new tokens
(a prompt chunk to prefill, or the one token to decode). The new tokens of every sequence
go through the projections and the MLP as one flat batch; attention reads each sequence's
keys and values from the cache through the *slots* of its positions (block table x block
size + offset), so sequences never need contiguous memory. The sequences that decode one
token attend in one batched call (their slots padded to the longest and masked); each
prompt chunk attends on its own.

    decoder = LlamaDecoder(LlamaConfig.from_hf(json.load(...)), state_dict)
    cache = decoder.new_cache(num_blocks=256, block_size=16)
    logits = decoder.step([SequenceStep(tokens, start=0, slots=slots)], cache)

Weights use Hugging Face names (``model.layers.0.self_attn.q_proj.weight`` ...); the
decoder joins the query, key and value projections, and the MLP's gate and up projections,
into one matrix each.

``precision`` sets how the weights are held, which is what a decode step mostly pays for
(it reads every weight to make one token per sequence):

* ``fp32``: as they are (on the CPU in oneDNN's blocked layout, see ``ONEDNN_ROWS``);
* ``bf16``: weights, activations and the KV cache in bfloat16;
* ``int8``: the attention projections, the MLP's gate and up projections and the output
  head as INT8 with a scale per output channel, run by fbgemm's dynamic-quantized linear
  (activations quantized per step), on the CPU; the down projection and the embedding
  table (a lookup reads one row) stay FP32. torch's weight-only INT8 and INT4 CPU kernels
  measured 8x and 16x slower than the FP32 matmul here, so they are not used, and a GGUF
  file's quantized blocks are dequantized rather than run as they are.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from tradeoff.backends.decoding import SequenceStep
from tradeoff.errors import InvalidValue, ModelLoadError

__all__ = [
    "ONEDNN_ROWS",
    "PRECISIONS",
    "REDUCE_RANGE",
    "LlamaConfig",
    "LlamaDecoder",
    "PagedKVCache",
    "load_hf_directory",
    "pack_int8",
]


@dataclass(frozen=True)
class LlamaConfig:
    """The shape of a Llama-family model (the fields of a Hugging Face config.json)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    max_position: int = 2048
    tie_word_embeddings: bool = False
    bos_token_id: int | None = None
    eos_token_id: int | None = None

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf(cls, doc: Mapping[str, Any]) -> LlamaConfig:
        """From a Hugging Face ``config.json`` of a Llama-architecture model."""
        scaling = doc.get("rope_scaling")
        if scaling and scaling.get("rope_type", scaling.get("type")) not in (None, "default"):
            raise ModelLoadError(f"rope_scaling {scaling!r} is not supported (only plain RoPE)")
        eos = doc.get("eos_token_id")
        try:
            return cls(
                vocab_size=int(doc["vocab_size"]), hidden_size=int(doc["hidden_size"]),
                intermediate_size=int(doc["intermediate_size"]),
                num_layers=int(doc["num_hidden_layers"]),
                num_heads=int(doc["num_attention_heads"]),
                num_kv_heads=int(doc.get("num_key_value_heads") or doc["num_attention_heads"]),
                rms_norm_eps=float(doc.get("rms_norm_eps", 1e-5)),
                rope_theta=float(doc.get("rope_theta", 10000.0)),
                max_position=int(doc.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(doc.get("tie_word_embeddings", False)),
                bos_token_id=doc.get("bos_token_id"),
                eos_token_id=eos[0] if isinstance(eos, list) else eos)
        except KeyError as exc:
            raise ModelLoadError(f"config.json lacks {exc.args[0]!r}") from None

    def to_hf(self) -> dict[str, Any]:
        return {"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                "vocab_size": self.vocab_size, "hidden_size": self.hidden_size,
                "intermediate_size": self.intermediate_size,
                "num_hidden_layers": self.num_layers, "num_attention_heads": self.num_heads,
                "num_key_value_heads": self.num_kv_heads, "rms_norm_eps": self.rms_norm_eps,
                "rope_theta": self.rope_theta, "max_position_embeddings": self.max_position,
                "tie_word_embeddings": self.tie_word_embeddings,
                "bos_token_id": self.bos_token_id, "eos_token_id": self.eos_token_id,
                "hidden_act": "silu"}


@dataclass
class PagedKVCache:
    """Keys and values of every layer in fixed-size blocks: ``[layers, slots, kv_heads,
    head_dim]`` where slot = block * block_size + offset."""

    keys: torch.Tensor
    values: torch.Tensor
    block_size: int

    @property
    def num_blocks(self) -> int:
        return self.keys.shape[1] // self.block_size


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm, computed in FP32 whatever the activations' precision."""
    x32 = x.float()
    variance = x32.pow(2).mean(-1, keepdim=True)
    return weight * (x32 * torch.rsqrt(variance + eps)).to(x.dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


PRECISIONS = ("fp32", "bf16", "int8")
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "int8": torch.float32}
# the weights INT8 packs: every matmul of a step but the MLP's down projection, whose
# input (SiLU(gate) x up) has outliers that per-step activation quantization clips:
# SmolLM2-135M's perplexity on tradeoff's sentences went 30.8 -> 55.1 with it packed,
# 30.8 -> 31.9 without
_LINEAR = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj")
# the projections that read the same input run as one matmul each (fewer, wider calls)
_FUSED = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
          "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
# oneDNN lays FP32 weights out for this many rows: a decode step's batch. Measured on one
# AVX2 core (SmolLM2-135M, thread CPU time against aten's matmul): decode steps of 2-16
# sequences 0.69-0.89x, 1 sequence 1.05x, a 512-token prefill 1.09x
ONEDNN_ROWS = 16


def _has_vnni() -> bool:
    """Whether this CPU multiplies INT8 with VNNI (AVX-512 VNNI or AVX-VNNI), which sums
    u8 x s8 products in 32 bits; without it fbgemm adds pairs in 16 bits, which saturate
    unless activations keep to 7 bits."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = next((line for line in cpuinfo if line.startswith("flags")), "").split()
    except OSError:
        return False
    return "avx512_vnni" in flags or "avx_vnni" in flags


# activations quantized to 7 bits on CPUs without VNNI (as torch's own dynamic
# quantization does for fbgemm); 8 bits where the products cannot saturate
REDUCE_RANGE = not _has_vnni()


def pack_int8(weight: torch.Tensor) -> tuple[Any, int]:
    """fbgemm's packed form of ``weight`` [out, in] in INT8, one symmetric scale per
    output channel; and the bytes it holds."""
    scale = (weight.float().abs().amax(dim=1) / 127).clamp(min=1e-12)
    zero = torch.zeros(len(scale), dtype=torch.long)
    with warnings.catch_warnings():  # torch marks its quantized tensors as deprecated
        warnings.simplefilter("ignore")
        quantized = torch.quantize_per_channel(weight.float(), scale.double(), zero, 0,
                                               torch.qint8)
        packed = torch.ops.quantized.linear_prepack(quantized, None)
    return packed, weight.numel() + 8 * len(scale)


def _attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
            mask: torch.Tensor) -> torch.Tensor:
    """Attention of ``query`` [b, n, heads, d] over ``keys``/``values`` [b, L, kv_heads, d]
    where ``mask`` [b or 1, n, L] is True; returns [b, n, heads * d]."""
    out = F.scaled_dot_product_attention(
        query.transpose(1, 2), keys.transpose(1, 2), values.transpose(1, 2),
        attn_mask=mask[:, None], enable_gqa=True)
    return out.transpose(1, 2).flatten(2)


@dataclass
class _DecodeBatch:
    """The sequences of a step that decode one token, attended in one batch: the cache
    slots of each (padded to the longest) and which of them are its own."""

    rows: torch.Tensor    # [b]: their rows in the step's flat batch of tokens
    slots: torch.Tensor   # [b * longest]
    mask: torch.Tensor    # [b, 1, longest]

    @classmethod
    def of(cls, steps: Sequence[SequenceStep], counts: list[int], bounds: list[int],
           device: torch.device) -> _DecodeBatch | None:
        picked = [i for i, n in enumerate(counts) if n == 1]
        if not picked:
            return None
        lengths = torch.tensor([steps[i].start + 1 for i in picked])
        longest = int(lengths.max())
        slots = torch.zeros(len(picked), longest, dtype=torch.int64)
        mask = torch.arange(longest)[None, :] < lengths[:, None]
        # the seen slots of every sequence, in order, fill the True places of the mask
        slots[mask] = torch.cat([steps[i].slots[:steps[i].start + 1] for i in picked])
        return cls(torch.tensor([bounds[i] for i in picked], device=device),
                   slots.reshape(-1).to(device), mask[:, None, :].to(device))

    def attend(self, query: torch.Tensor, keys: torch.Tensor,
               values: torch.Tensor) -> torch.Tensor:
        """[b, heads * d] from ``query`` [b, heads, d] and one layer's cache."""
        b, longest = self.mask.shape[0], self.mask.shape[-1]
        shape = (b, longest, *keys.shape[1:])
        return _attend(query[:, None], keys.index_select(0, self.slots).view(shape),
                       values.index_select(0, self.slots).view(shape), self.mask)[:, 0]


class LlamaDecoder:
    """The decoder's weights and its forward step; not an ``nn.Module`` (no training).
    ``onednn``: FP32 matmuls on the CPU through oneDNN's blocked weights (when torch has
    them), else aten's."""

    def __init__(self, config: LlamaConfig, weights: Mapping[str, torch.Tensor],
                 device: str = "cpu", dtype: torch.dtype | None = None,
                 precision: str = "fp32", onednn: bool = True) -> None:
        if precision not in PRECISIONS:
            raise ModelLoadError(f"precision {precision!r}: expected one of "
                                 f"{', '.join(PRECISIONS)}")
        self.config = config
        self.device = torch.device(device)
        self.precision = precision
        self.dtype = dtype = dtype or _DTYPES[precision]
        if precision == "int8" and self.device.type != "cpu":
            raise ModelLoadError("precision int8 runs on the CPU (fbgemm); on a GPU use bf16")
        missing = [name for name in self._names() if name not in weights]
        if missing:
            raise ModelLoadError(f"weights lack {missing[:3]}{'...' if len(missing) > 3 else ''}")
        self.w = {name: weights[name].to(self.device, dtype) for name in self._names()}
        self._parts: dict[str, list[tuple[str, int]]] = {}  # fused: (part, rows) each
        for i in range(config.num_layers):
            p = f"model.layers.{i}."
            for fused, parts in _FUSED.items():
                names = [f"{p}{part}.weight" for part in parts]
                self._parts[f"{p}{fused}.weight"] = [(n, self.w[n].shape[0]) for n in names]
                self.w[f"{p}{fused}.weight"] = torch.cat([self.w.pop(n) for n in names])
        if config.tie_word_embeddings or "lm_head.weight" not in weights:
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        else:
            self.w["lm_head.weight"] = weights["lm_head.weight"].to(self.device, dtype)
        self.packed: dict[str, Any] = {}  # INT8, run by fbgemm
        self.onednn: dict[str, torch.Tensor] = {}  # FP32, laid out for oneDNN
        self.weight_bytes = sum(t.numel() * t.element_size() for n, t in self.w.items()
                                if n != "lm_head.weight" or not config.tie_word_embeddings)
        if precision == "int8":
            self._pack_int8()
        elif onednn and self.dtype == torch.float32 and self.device.type == "cpu" and \
                torch.backends.mkldnn.is_available():
            self._pack_onednn()
        d = config.head_dim
        self.inv_freq = 1.0 / (config.rope_theta ** (
            torch.arange(0, d, 2, dtype=torch.float32, device=self.device) / d))

    def _linear_names(self, kinds: Sequence[str]) -> list[str]:
        return ["lm_head.weight"] + [f"model.layers.{i}.{kind}.weight"
                                     for i in range(self.config.num_layers) for kind in kinds]

    def _pack_int8(self) -> None:
        for name in self._linear_names(_LINEAR):
            self.packed[name], size = pack_int8(self.w[name])
            self.weight_bytes += size
            tied = name == "lm_head.weight" and self.w[name] is self.w["model.embed_tokens.weight"]
            if not tied:
                self.weight_bytes -= self.w[name].numel() * self.w[name].element_size()
            del self.w[name]

    def _pack_onednn(self) -> None:
        """Every FP32 matmul weight in oneDNN's blocked layout (the tied output head as a
        copy: the embedding lookup reads the plain table); nothing when this torch
        cannot."""
        try:
            for name in self._linear_names((*_LINEAR, "mlp.down_proj")):
                self.onednn[name] = torch.ops.mkldnn._reorder_linear_weight(
                    self.w[name], ONEDNN_ROWS)
        except (AttributeError, RuntimeError):  # a torch built without these kernels
            self.onednn.clear()
            return
        tied = self.w["lm_head.weight"] is self.w["model.embed_tokens.weight"]
        for name in self.onednn:
            if name == "lm_head.weight" and tied:
                self.weight_bytes += self.w[name].numel() * self.w[name].element_size()
            else:
                del self.w[name]

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        """``x @ weight.T`` for weight ``name``, in its precision."""
        blocked = self.onednn.get(name)
        if blocked is not None:
            return torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], "")
        packed = self.packed.get(name)
        if packed is None:
            return x @ self.w[name].T
        return torch.ops.quantized.linear_dynamic(x, packed, REDUCE_RANGE)

    def hf_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights under Hugging Face names, as plain tensors (to load the same model
        into ``transformers.LlamaForCausalLM``, say); not for ``int8``, whose weights
        are quantized."""
        if self.packed:
            raise InvalidValue("int8 weights are packed for fbgemm; load the model in fp32 "
                               "or bf16 to read them")
        out = {}
        for name, weight in (*self.w.items(), *self.onednn.items()):
            dense = weight.to_dense() if weight.is_mkldnn else weight
            parts = self._parts.get(name)
            if parts is None:
                out[name] = dense
            else:
                names, rows = zip(*parts, strict=True)
                out.update(zip(names, dense.split(list(rows)), strict=True))
        return out

    def _names(self) -> list[str]:
        names = ["model.embed_tokens.weight", "model.norm.weight"]
        for i in range(self.config.num_layers):
            p = f"model.layers.{i}."
            names += [p + n for n in (
                "input_layernorm.weight", "post_attention_layernorm.weight",
                "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
                "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight",
                "mlp.down_proj.weight")]
        return names

    def synchronize(self) -> None:
        """Wait for the device's work (on a CPU, done when a step returns)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """Keys and values for ``num_blocks`` blocks; ModelLoadError, before anything is
        allocated, when they would not fit in the device's free memory."""
        c = self.config
        shape = (c.num_layers, num_blocks * block_size, c.num_kv_heads, c.head_dim)
        needed = 2 * math.prod(shape) * torch.finfo(self.dtype).bits // 8
        free = _free_bytes(self.device)
        if free is not None and needed > free:
            raise ModelLoadError(
                f"a KV cache of {num_blocks} blocks of {block_size} tokens needs "
                f"{needed / 2**30:,.1f} GiB; {self.device} has {free / 2**30:,.1f} GiB free: "
                "lower num_blocks (or block_size) in generate.yaml")
        return PagedKVCache(torch.zeros(shape, dtype=self.dtype, device=self.device),
                            torch.zeros(shape, dtype=self.dtype, device=self.device),
                            block_size)

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dtype)[:, None, :], emb.sin().to(self.dtype)[:, None, :]

    @torch.inference_mode()
    def step(self, steps: Sequence[SequenceStep], cache: PagedKVCache,
             all_logits: bool = False) -> list[torch.Tensor]:
        """Run the new tokens of every sequence; returns per sequence the logits of its
        last new token ``[vocab]`` (or of every new token ``[n, vocab]``)."""
        c = self.config
        w = self.w
        counts = [int(s.tokens.numel()) for s in steps]
        tokens = torch.cat([s.tokens for s in steps]).to(self.device)
        positions = torch.cat([torch.arange(s.start, s.start + n) for s, n in
                               zip(steps, counts, strict=True)]).to(self.device)
        new_slots = torch.cat([s.slots[s.start:s.start + n] for s, n in
                               zip(steps, counts, strict=True)]).to(self.device)
        cos, sin = self._rope(positions)
        heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
        x = w["model.embed_tokens.weight"][tokens]
        bounds = torch.tensor([0, *counts]).cumsum(0).tolist()
        decoding = _DecodeBatch.of(steps, counts, bounds, self.device)
        # per prompt chunk, the same for every layer: the cache slots it reads, and which
        # of them each new token may see (causal)
        chunks = [(bounds[i], n, s.slots[:s.start + n].to(self.device),
                   torch.arange(s.start + n, device=self.device)[None, None, :]
                   <= torch.arange(s.start, s.start + n, device=self.device)[None, :, None])
                  for i, (s, n) in enumerate(zip(steps, counts, strict=True)) if n > 1]
        for layer in range(c.num_layers):
            p = f"model.layers.{layer}."
            h = _rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            qkv = self._linear(h, p + "self_attn.qkv_proj.weight").view(-1, heads + 2 * kv_heads, d)
            qk = qkv[:, :heads + kv_heads]
            qk = qk * cos + _rotate_half(qk) * sin  # RoPE on queries and keys at once
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]
            keys, values = cache.keys[layer], cache.values[layer]
            keys.index_copy_(0, new_slots, k)
            values.index_copy_(0, new_slots, v)
            if decoding is not None and not chunks:
                attended = decoding.attend(q, keys, values)
            else:
                attended = q.new_empty(q.shape[0], heads * d)
                if decoding is not None:
                    attended[decoding.rows] = decoding.attend(q[decoding.rows], keys, values)
                for first, n, seen, mask in chunks:
                    attended[first:first + n] = _attend(
                        q[None, first:first + n], keys.index_select(0, seen)[None],
                        values.index_select(0, seen)[None], mask)[0]
            x = x + self._linear(attended, p + "self_attn.o_proj.weight")
            h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate, up = self._linear(h, p + "mlp.gate_up_proj.weight").chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, p + "mlp.down_proj.weight")
        if not all_logits:
            last = torch.tensor([b - 1 for b in bounds[1:]], device=self.device)
            x = x[last]
        x = _rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
        logits = self._linear(x, "lm_head.weight").float()
        if all_logits:
            return [logits[bounds[i]:bounds[i + 1]] for i in range(len(steps))]
        return list(logits)

    @torch.inference_mode()
    def forward_decode(self, tokens: torch.Tensor, positions: torch.Tensor,
                       table: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        """One decode token per row, attending through the block table: ``tokens`` and
        ``positions`` int64 ``[rows]``, ``table`` ``[rows, blocks]`` (each row's cache
        blocks in order, any block past its length unused); returns float32 logits
        ``[rows, vocab]``. Every shape depends only on the arguments' shapes and nothing
        is read back to the host, so a CUDA graph can capture it: a row that pads a
        batch points its table at a block no sequence owns."""
        c = self.config
        w = self.w
        size = cache.block_size
        rows, blocks = table.shape
        table = table.long()
        slots = table.gather(1, (positions // size)[:, None])[:, 0] * size + positions % size
        # a row sees the cache places up to its own position
        seen = torch.arange(blocks * size, device=self.device)[None, :] <= positions[:, None]
        mask = seen[:, None, None, :]
        cos, sin = self._rope(positions)
        heads, kv_heads, d = c.num_heads, c.num_kv_heads, c.head_dim
        group = heads // kv_heads
        x = w["model.embed_tokens.weight"][tokens]
        for layer in range(c.num_layers):
            p = f"model.layers.{layer}."
            h = _rms_norm(x, w[p + "input_layernorm.weight"], c.rms_norm_eps)
            qkv = self._linear(h, p + "self_attn.qkv_proj.weight").view(-1, heads + 2 * kv_heads, d)
            qk = qkv[:, :heads + kv_heads]
            qk = qk * cos + _rotate_half(qk) * sin
            q, k, v = qk[:, :heads], qk[:, heads:], qkv[:, heads + kv_heads:]
            keys, values = cache.keys[layer], cache.values[layer]
            keys.index_copy_(0, slots, k)
            values.index_copy_(0, slots, v)
            # the query heads that share a KV head attend as that head's queries: no copy
            # of the keys per query head, on any attention kernel
            shape = (rows, blocks * size, kv_heads, d)
            attended = F.scaled_dot_product_attention(
                q.reshape(rows, kv_heads, group, d),
                keys.view(-1, size, kv_heads, d)[table].view(shape).transpose(1, 2),
                values.view(-1, size, kv_heads, d)[table].view(shape).transpose(1, 2),
                attn_mask=mask).reshape(rows, heads * d)
            x = x + self._linear(attended, p + "self_attn.o_proj.weight")
            h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate, up = self._linear(h, p + "mlp.gate_up_proj.weight").chunk(2, dim=-1)
            x = x + self._linear(F.silu(gate) * up, p + "mlp.down_proj.weight")
        x = _rms_norm(x, w["model.norm.weight"], c.rms_norm_eps)
        return self._linear(x, "lm_head.weight").float()


def _free_bytes(device: torch.device) -> int | None:
    """Free memory of a CUDA device, or the memory available to this host (Linux); None
    when it cannot be told."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def load_hf_directory(directory: Path, device: str = "cpu",
                      precision: str = "fp32") -> LlamaDecoder:
    """A decoder from a Hugging Face directory: ``config.json`` + ``*.safetensors``."""
    import json

    from safetensors.torch import load_file

    config_path = directory / "config.json"
    try:
        doc = json.loads(config_path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ModelLoadError(f"{config_path}: {exc}") from None
    if doc.get("model_type", "llama") != "llama":
        raise ModelLoadError(f"{config_path}: model_type {doc.get('model_type')!r} is not a "
                             "Llama-family model")
    files = sorted(directory.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{directory}: no .safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for path in files:
        weights.update(load_file(str(path)))
    return LlamaDecoder(LlamaConfig.from_hf(doc), weights, device, precision=precision)

