"""Choosing each sequence's next token, for the whole step at once.

Temperature, top-k and top-p are applied to the step's logits as one tensor operation
per rule; rows with temperature 0 (or below ``GREEDY_BELOW``, where dividing float32
logits by it would overflow) are greedy. A row with its own seed draws from its own
generator, so its tokens do not depend on what it was batched with.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from tradeoff.errors import InvalidInput

GREEDY_BELOW = 1e-5  # a temperature this small samples the top token anyway
MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_STOP_CHARS = 256


@dataclass(frozen=True)
class SamplingParams:
    """OpenAI-style sampling settings of one request."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0               # 0: all tokens
    seed: int | None = None
    stop: tuple[str, ...] = field(default_factory=tuple)
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidInput(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= 2:
            raise InvalidInput(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidInput(f"top_k must be >= 0, got {self.top_k}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidInput(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got "
                               f"{len(self.stop)}")
        if any(not 0 < len(text) <= MAX_STOP_CHARS for text in self.stop):
            raise InvalidInput(f"each 'stop' string must be 1 to {MAX_STOP_CHARS} "
                               "characters long")


def sample(logits: torch.Tensor, params: Sequence[SamplingParams],
           generators: Sequence[torch.Generator | None]) -> list[int]:
    """One token per row of ``logits`` ``[rows, vocab]``."""
    greedy = torch.tensor([p.temperature < GREEDY_BELOW for p in params])
    chosen = logits.argmax(dim=-1)
    if bool(greedy.all()):
        return chosen.tolist()
    temperature = torch.tensor([1.0 if p.temperature < GREEDY_BELOW else p.temperature
                                for p in params], dtype=logits.dtype)
    scaled = logits / temperature[:, None]
    vocab = logits.shape[-1]
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    ordered, order = scaled.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab)[None, :]
    drop = ranks >= top_k[:, None]
    probs = ordered.softmax(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=probs.dtype)
    drop |= (probs.cumsum(dim=-1) - probs) >= top_p[:, None]  # keep the first past top_p
    ordered = ordered.masked_fill(drop, float("-inf"))
    probs = ordered.softmax(dim=-1)
    picks = torch.empty(len(params), dtype=torch.int64)
    shared = [i for i, g in enumerate(generators) if g is None]
    if shared:
        picks[shared] = torch.multinomial(probs[shared], 1)[:, 0]
    for i, generator in enumerate(generators):  # seeded rows: one draw each
        if generator is not None:
            picks[i] = torch.multinomial(probs[i], 1, generator=generator)[0]
    sampled = order.gather(1, picks[:, None])[:, 0]
    return torch.where(greedy, chosen, sampled).tolist()
