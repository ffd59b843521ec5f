"""One request's sampling settings, checked when made. Free of torch: the front end
builds them from a request body and the engine (``generate/sampling.py``) turns a step's
worth into tensors.

    params = SamplingParams(max_tokens=64, temperature=0.7, top_p=0.9, seed=1)
    params.deterministic   # True: seeded
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tradeoff.errors import InvalidInput
from tradeoff.generate.sampling_limits import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    SEED_BITS,
    SEED_MAX,
    SEED_MIN,
)

__all__ = ["GREEDY_BELOW", "SamplingParams", "as_seed", "sampling_kind"]

GREEDY_BELOW = 1e-5  # a temperature this small samples the top token anyway


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

    @property
    def deterministic(self) -> bool:
        """Whether the same prompt always gets the same answer: greedy, or seeded."""
        return self.temperature == 0 or self.seed is not None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise InvalidInput(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.temperature <= MAX_TEMPERATURE:
            raise InvalidInput(f"temperature must be in [0, {MAX_TEMPERATURE:g}], got "
                               f"{self.temperature}")
        if not 0 < self.top_p <= 1:
            raise InvalidInput(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise InvalidInput(f"top_k must be >= 0, got {self.top_k}")
        if self.seed is not None and not SEED_MIN <= self.seed <= SEED_MAX:
            raise InvalidInput(f"'seed' must be an integer from -2**63 to 2**64 - 1, got "
                               f"{self.seed}")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise InvalidInput(f"'stop' takes at most {MAX_STOP_STRINGS} strings, got "
                               f"{len(self.stop)}")
        if any(not 0 < len(text) <= MAX_STOP_CHARS for text in self.stop):
            raise InvalidInput(f"each 'stop' string must be 1 to {MAX_STOP_CHARS} "
                               "characters long")

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @property
    def truncates(self) -> bool:
        """Whether top-k or top-p drop tokens (which needs a sort of the vocabulary)."""
        return self.top_k > 0 or self.top_p < 1

    def kept(self, vocab: int) -> int:
        """How many tokens top-k keeps of a vocabulary of ``vocab``."""
        return self.top_k if 0 < self.top_k < vocab else vocab


def sampling_kind(params: Sequence[SamplingParams]) -> tuple[bool, bool]:
    """(every row greedy, some sampled row truncates): what a step's sampling needs."""
    return (all(p.greedy for p in params),
            any(p.truncates and not p.greedy for p in params))


def as_seed(seed: int) -> int:
    """A seed as the signed 64-bit integer the hash takes (2**64 - 1 and -1 are one)."""
    seed &= (1 << SEED_BITS) - 1
    return seed - (1 << SEED_BITS) if seed >= 1 << (SEED_BITS - 1) else seed
