"""The two priorities a request may carry, kept apart by type: they run in opposite
directions, and a type checker refuses one where the other is wanted.

* :data:`TensorPriority`: a tensor request's queue level, by Triton's rule: 1 is the most
  urgent, up to the model's ``priority_levels``; 0 (and a level beyond them) is the
  model's default level. From the v2 ``priority`` parameter through
  :func:`tensor_priority`; the batch queue reads it (``BatchQueue.level_of``).
* :data:`GenerationPriority`: a generation's place under the engine's ``scheduling:
  priority``, lower first (vLLM's), a signed 32-bit integer. From the ``/v1`` body's
  ``priority`` by its type (``server/openai_requests.py``, bounded by
  :data:`GENERATION_PRIORITY_MIN` and :data:`GENERATION_PRIORITY_MAX`), held to the
  caller's allowance (``server/access.py``), or set by a router's route.
"""

from __future__ import annotations

from typing import NewType

from tradeoff.errors import InvalidInput
from tradeoff.repository.router import PRIORITY_LIMIT

__all__ = ["DEFAULT_GENERATION_PRIORITY", "DEFAULT_TENSOR_PRIORITY", "GENERATION_PRIORITY_MAX",
           "GENERATION_PRIORITY_MIN", "GenerationPriority", "TensorPriority",
           "tensor_priority"]

TensorPriority = NewType("TensorPriority", int)
GenerationPriority = NewType("GenerationPriority", int)

DEFAULT_TENSOR_PRIORITY = TensorPriority(0)  # the model's default level
DEFAULT_GENERATION_PRIORITY = GenerationPriority(0)
GENERATION_PRIORITY_MIN = -PRIORITY_LIMIT
GENERATION_PRIORITY_MAX = PRIORITY_LIMIT - 1


def tensor_priority(value: object) -> TensorPriority:
    """A v2 request's ``priority`` parameter, or InvalidInput when it is not a
    non-negative integer (a level beyond the model's is its default, as Triton's)."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidInput("parameter 'priority' must be a non-negative integer")
    return TensorPriority(value)
