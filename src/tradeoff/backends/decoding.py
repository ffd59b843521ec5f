"""The contract between a generative backend and the generation engine: what
``GenerativeBackendType.load`` returns (a :class:`Decoder` and its :class:`Tokenizer`)
and what the engine hands a decoder each step (:class:`SequenceStep`). The engine
(``tradeoff.generate``) knows backends only through these.

    decoder, tokenizer = registry.generative("hf").load(path, "hf", "cpu", "fp32")
    cache = decoder.new_cache(num_blocks, block_size)
    logits = decoder.step([SequenceStep(tokens, start, slots)], cache)  # [1, vocab]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch

__all__ = ["Decoder", "DecoderConfig", "GraphDecoder", "SequenceStep", "Tokenizer"]


@dataclass
class SequenceStep:
    """One sequence's part of a step: its new tokens, the position of the first one, and
    the cache slot of every position up to the last new token."""

    tokens: torch.Tensor   # [n] int64
    start: int
    slots: torch.Tensor    # [start + n] int64


class DecoderConfig(Protocol):
    """What the engine reads of a decoder's model."""

    @property
    def vocab_size(self) -> int: ...

    @property
    def max_position(self) -> int: ...

    @property
    def eos_token_id(self) -> int | None: ...


class Decoder(Protocol):
    """A causal language model over a paged KV cache."""

    @property
    def config(self) -> DecoderConfig: ...

    @property
    def device(self) -> torch.device: ...

    @property
    def weight_bytes(self) -> int:
        """What the weights take on the device."""

    def new_cache(self, num_blocks: int, block_size: int) -> Any:
        """A paged KV cache of ``num_blocks`` blocks of ``block_size`` positions (a
        ModelLoadError when the device cannot hold it)."""

    def step(self, steps: Sequence[SequenceStep], cache: Any,
             all_logits: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """Run each sequence's new tokens, writing their keys and values at their slots:
        float32 logits of the token after each sequence, ``[len(steps), vocab]`` (with
        ``all_logits``, per sequence ``[n, vocab]``)."""

    def synchronize(self) -> None:
        """Return once the device has run the steps launched so far (the engine calls
        it just before it reads a step's tokens back)."""


class GraphDecoder(Decoder, Protocol):
    """A decoder whose pure-decode step a CUDA graph can capture (fixed shapes)."""

    def forward_decode(self, tokens: torch.Tensor, positions: torch.Tensor,
                       table: torch.Tensor, cache: Any) -> torch.Tensor:
        """One decode token per row through the block table: ``[rows, vocab]`` logits."""


class Tokenizer(Protocol):
    """Text to token ids and back, and the model's chat template."""

    longest_token_chars: int  # a text of n characters takes at least n / this many tokens

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: list[dict[str, Any]]) -> str:
        """The messages through the chat template, as one prompt text."""
