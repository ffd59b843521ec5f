"""The Pareto front: the items no other beats on every count at once.

    front(trials, key=lambda t: (-t.throughput_rps, t.p99_ms, t.cost))   # all minimised
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

__all__ = ["front"]

_Item = TypeVar("_Item")


def front(items: Sequence[_Item], key: Callable[[_Item], tuple[float, ...]]) -> list[_Item]:
    """The items whose ``key`` (every coordinate to minimise) no other item's key is at
    most on every coordinate and below on one; items with equal keys keep each other."""
    keys = [key(item) for item in items]
    return [item for item, mine in zip(items, keys, strict=True)
            if not any(other != mine and all(o <= m for o, m in zip(other, mine, strict=True))
                       for other in keys)]
