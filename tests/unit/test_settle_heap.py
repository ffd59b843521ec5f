"""What `tradeoff serve` does to the cyclic garbage collector once its models are loaded."""

from __future__ import annotations

import gc
import weakref

from tradeoff.heap import YOUNG_GC_THRESHOLD, settle_heap


class _Node:
    other: object = None


def test_settle_heap_freezes_startup_objects_and_still_collects_later_cycles() -> None:
    threshold = gc.get_threshold()
    before = _Node()
    before.other = before  # a cycle made before: frozen, out of every collection
    try:
        settle_heap()
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold()[0] >= YOUNG_GC_THRESHOLD
        assert gc.get_threshold()[1:] == threshold[1:]
        after = _Node()
        after.other = after
        gone = weakref.ref(after)
        del after
        gc.collect()
        assert gone() is None  # cycles made while serving are still collected
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
