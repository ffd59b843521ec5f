"""What one request's sampling settings may be: the bounds :class:`SamplingParams` holds
them to and the ``/v1`` request types declare, written once (and free of torch, so the
server reads them without loading it)."""

from __future__ import annotations

__all__ = ["MAX_STOP_CHARS", "MAX_STOP_STRINGS", "MAX_TEMPERATURE", "SEED_BITS", "SEED_MAX",
           "SEED_MIN"]

MAX_TEMPERATURE = 2.0  # as OpenAI's API
MAX_STOP_STRINGS = 4  # as OpenAI's API
MAX_STOP_CHARS = 256
SEED_BITS = 64
# a seed is any signed or unsigned 64-bit integer (as_seed makes them one)
SEED_MIN = -(2 ** (SEED_BITS - 1))
SEED_MAX = 2 ** SEED_BITS - 1
