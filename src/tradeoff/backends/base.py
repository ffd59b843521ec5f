"""The small interface every runtime implements, so scheduling never depends on one."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Backend", "TensorSpec"]


@dataclass(frozen=True)
class TensorSpec:
    """What a runtime says about one of its tensors; ``None`` or -1 dims are variable."""

    name: str
    datatype: str
    shape: tuple[int, ...]


class Backend(ABC):
    """One model instance. ``run`` is called from a worker thread, one batch at a time;
    from the event loop too when ``inline`` (the scheduler decides, by measured time)."""

    # run may be called on the event loop when its batches prove short: pure computation
    # that cannot hang (no I/O, no waiting, no sleeping)
    inline = False

    @abstractmethod
    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        """Execute one batch; returns every requested output."""

    def close(self) -> None:  # noqa: B027 (optional: not every runtime holds resources)
        """Release the runtime's resources."""
