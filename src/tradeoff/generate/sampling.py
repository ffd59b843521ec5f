"""Choosing each sequence's next token, for the whole step at once, on the logits' device.

Temperature, top-k and top-p are applied to the step's logits as one tensor operation
per rule; rows with temperature 0 (or below ``GREEDY_BELOW``, where dividing float32
logits by it would overflow) are greedy. A sampled row inverts the cumulative
distribution of its kept tokens at one uniform number, which comes from a counter-based
hash of (the row's seed, how many tokens it has made), not from a stateful generator: a
seeded request gets the same tokens whatever it is batched with, on any device, and the
whole draw is a fixed sequence of tensor operations that a CUDA graph can capture (no
host sync, no shape that depends on the data). The host reads back one int64 per row.

    batch = SamplingBatch.of(params, seeds, produced, vocab, device=logits.device)
    tokens = sample_tokens(logits, batch)   # [rows]; FAILED where a row's logits are bad
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from tradeoff.generate.sampling_params import SamplingParams, sampling_kind

__all__ = ["FAILED", "SamplingBatch", "sample", "sample_tokens", "uniform"]

FAILED = -1  # the token of a row whose logits hold NaN or no finite value


@dataclass
class SamplingBatch:
    """A step's sampling settings as tensors, one row per sequence. ``greedy_only`` and
    ``truncating`` (:func:`sampling_kind`) are known on the host, so a step skips the
    draw or the sort it does not need (and a captured graph is chosen by them)."""

    temperature: torch.Tensor  # [rows] float32; 1 for greedy rows
    top_p: torch.Tensor        # [rows] float32
    top_k: torch.Tensor        # [rows] int64; the vocabulary size for "all"
    seed: torch.Tensor         # [rows] int64
    produced: torch.Tensor     # [rows] int64: tokens the sequence made before this one
    greedy: torch.Tensor       # [rows] bool
    greedy_only: bool
    truncating: bool

    @classmethod
    def of(cls, params: Sequence[SamplingParams], seeds: Sequence[int],
           produced: Sequence[int], vocab: int, device: torch.device | str = "cpu"
           ) -> SamplingBatch:
        """``seeds``: each row's seed (its request's, or one drawn for it when it came);
        ``produced``: how many tokens each row's sequence has made so far."""
        floats = torch.tensor([[1.0 if p.greedy else p.temperature, p.top_p] for p in params],
                              dtype=torch.float32).reshape(-1, 2)
        ints = torch.tensor([[p.kept(vocab), s, n, p.greedy]
                             for p, s, n in zip(params, seeds, produced, strict=True)],
                            dtype=torch.int64).reshape(-1, 4)
        if torch.device(device).type != "cpu":
            floats = floats.to(device, non_blocking=True)
            ints = ints.to(device, non_blocking=True)
        return cls(floats[:, 0], floats[:, 1], ints[:, 0], ints[:, 1], ints[:, 2],
                   ints[:, 3].bool(), *sampling_kind(params))


# splitmix64's constants as signed 64-bit integers (torch has no uint64 arithmetic)
_GAMMA = 0x9E3779B97F4A7C15 - (1 << 64)
_MIX1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_MIX2 = 0x94D049BB133111EB - (1 << 64)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's ``>>`` keeps the sign)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64's finaliser: every input bit flips about half the output bits."""
    x = (x ^ _shr(x, 30)) * _MIX1
    x = (x ^ _shr(x, 27)) * _MIX2
    return x ^ _shr(x, 31)


def uniform(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One float64 uniform in (0, 1) per row, a pure function of the row's seed and
    counter (53 bits of a splitmix64 hash): the same number on every device and in any
    batch."""
    bits = _shr(_mix(_mix(seed + _GAMMA) + counter * _GAMMA), 11)
    return (bits.double() + 0.5) * (1.0 / (1 << 53))


def sample_tokens(logits: torch.Tensor, batch: SamplingBatch) -> torch.Tensor:
    """One token per row of ``logits`` ``[rows, vocab]`` (int64, on the logits' device);
    :data:`FAILED` for a row whose logits hold NaN or nothing finite, which fails only
    that row's sequence.

    A sampled row inverts the cumulative distribution of its kept tokens, in token-id
    order, at its uniform: one draw from softmax(logits / temperature) over them. Top-k
    and top-p choose the kept tokens from the sorted probabilities; the draw itself never
    depends on whether a sort happened, so a seeded row gets the same token in a batch
    that needs one and in a batch that does not."""
    logits = logits.float()
    bad = ~logits.amax(dim=-1).isfinite()  # NaN anywhere, or nothing finite, in the row
    chosen = logits.argmax(dim=-1)
    if not batch.greedy_only:
        scaled = logits / batch.temperature[:, None]
        if batch.truncating:
            vocab = logits.shape[-1]
            ordered, order = scaled.sort(dim=-1, descending=True)
            drop = torch.arange(vocab, device=logits.device)[None, :] >= batch.top_k[:, None]
            probs = ordered.softmax(dim=-1)
            # keep the first token past top_p; rounding must not cut anything at top_p = 1
            past = (probs.cumsum(dim=-1) - probs) >= batch.top_p[:, None]
            drop |= past & (batch.top_p < 1)[:, None]
            scaled = scaled.masked_fill(torch.zeros_like(drop).scatter(1, order, drop),
                                        float("-inf"))
        cdf = scaled.softmax(dim=-1).cumsum(dim=-1, dtype=torch.float64)
        at = uniform(batch.seed, batch.produced) * cdf[:, -1]
        sampled = torch.searchsorted(cdf, at[:, None], right=True)[:, 0]
        sampled = sampled.clamp(max=logits.shape[-1] - 1)
        chosen = torch.where(batch.greedy, chosen, sampled)
    return torch.where(bad, torch.full_like(chosen, FAILED), chosen)


def sample(logits: torch.Tensor, params: Sequence[SamplingParams], seeds: Sequence[int],
           produced: Sequence[int]) -> list[int]:
    """:func:`sample_tokens` for rows on the host (tests, tools): the tokens as ints."""
    batch = SamplingBatch.of(params, seeds, produced, logits.shape[-1], logits.device)
    return sample_tokens(logits, batch).tolist()
