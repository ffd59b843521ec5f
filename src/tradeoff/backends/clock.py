"""The clock a measurement reads and a modelled cost is spent on.

The real clock reads ``time.perf_counter`` and sleeps. A :class:`ModelledClock` moves
only by what is spent on it: a synthetic backend (``backends/synthetic.py``) given one
advances it by its batch's modelled cost instead of sleeping, so a measurement read on it
(``tune_batch_size(..., clock=...)``) is the model's cost exactly, whatever else the
machine is doing.

    clock = ModelledClock()
    clock.sleep(0.002)
    clock.now()   # 0.002, at once
"""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["REAL_CLOCK", "Clock", "ModelledClock", "RealClock"]


class Clock(Protocol):
    """Seconds read (``now``, monotonic) and spent (``sleep``)."""

    def now(self) -> float: ...

    def sleep(self, seconds: float) -> None: ...


class RealClock:
    """The machine's time: ``time.perf_counter``, and a real sleep."""

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class ModelledClock:
    """Time that passes only when spent: ``sleep`` advances ``now`` at once. One thread
    spends it (the tuner's, which runs the backend and reads the clock)."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        self._now += max(seconds, 0.0)


REAL_CLOCK = RealClock()
