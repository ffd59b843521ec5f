"""The cyclic garbage collector under load, for the server and the load generator.

Both keep many small objects alive at once (requests or streams in flight) and make no
reference cycles per request, so refcounting frees what they leave. Left as is, the
young generation is collected whenever about 700 objects outlive a collection, and each
full collection walks every object of the process: 25-30 ms with two small models, a
pause every request in flight is charged for.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

__all__ = ["YOUNG_GC_THRESHOLD", "settle_heap", "settled_heap"]

# the young generation's collection threshold under load (CPython's default is 700)
YOUNG_GC_THRESHOLD = 10_000


def settle_heap() -> None:
    """What the process allocated so far (modules, models, configs, prepared requests)
    leaves the cyclic collector's reach, and the young generation is collected less
    often. The server calls it once its models are loaded."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(max(YOUNG_GC_THRESHOLD, gc.get_threshold()[0]), *gc.get_threshold()[1:])


@contextlib.contextmanager
def settled_heap() -> Iterator[None]:
    """:func:`settle_heap` for a while (a load generator's run), then the collector as
    it was."""
    threshold = gc.get_threshold()
    settle_heap()
    try:
        yield
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
