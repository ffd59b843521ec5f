"""A model whose cost is set, not computed: for testing schedulers and tuners.

Its model file, ``model.json``, declares the tensors and what a batch of ``rows`` costs:

    {"inputs":  [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 16]}],
     "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 16],
                  "copy_of": "INPUT0"}],
     "cost": {"fixed_ms": 2.0, "per_row_ms": 0.05,
              "slow_above_rows": 32, "per_row_ms_above": 0.2, "gil_releases": 1},
     "memory_per_row_bytes": 4000000}

A batch takes ``fixed_ms + per_row_ms * rows`` (rows past ``slow_above_rows`` cost
``per_row_ms_above`` each, as a batch that spills a cache would), spent sleeping so the
GIL is free as it is while a runtime's kernels run. The sleep is cut into ``gil_releases``
equal parts, so the batch's thread gives up the GIL and takes it back that many times, as
a GPU runtime's launches, copies and synchronisations do; beside a busy event loop each
retake waits. It sleeps on the instance's clock (``InstanceSpec.clock``): on a
:class:`~tradeoff.backends.clock.ModelledClock` the cost is added to the clock at once
instead, so an in-process measurement reads it exactly, however busy the machine.

``"pace_file": PATH`` in ``cost`` makes its speed change while it serves, as a host's does
under a noisy neighbour: each batch's cost is multiplied by the number written in that
file (read again at most every 50 ms; 1 while the file is missing or unreadable). A
test varies it between the rounds of a measurement.

It holds ``memory_per_row_bytes`` per row while it runs. Each output is a copy of its
``copy_of`` input, so answers can be checked. The throughput and memory curves are
therefore known in advance, which is what a test of the batch-size search or of the
adaptive batcher needs. Serve it with ``backend: "synthetic"`` in the config.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.backends.base import Backend, TensorSpec
from tradeoff.backends.clock import Clock
from tradeoff.backends.registry import InstanceSpec, TensorBackendType
from tradeoff.errors import InvalidInput, ModelLoadError, shown

__all__ = ["BACKEND", "MAX_GIL_RELEASES", "PACE_READ_S", "Cost", "Pace", "SyntheticBackend",
           "describe", "read_cost"]

MAX_GIL_RELEASES = 10_000  # parts of one batch's sleep


@dataclass(frozen=True)
class Cost:
    """What one batch costs."""

    fixed_ms: float = 1.0
    per_row_ms: float = 0.0
    slow_above_rows: int | None = None
    per_row_ms_above: float = 0.0
    memory_per_row_bytes: int = 0
    gil_releases: int = 1
    pace_file: str | None = None  # a multiplier of every batch's cost, read while serving

    def batch_ms(self, rows: int) -> float:
        """Time one batch of ``rows`` takes."""
        if self.slow_above_rows is None or rows <= self.slow_above_rows:
            return self.fixed_ms + self.per_row_ms * rows
        return (self.fixed_ms + self.per_row_ms * self.slow_above_rows
                + self.per_row_ms_above * (rows - self.slow_above_rows))


def _read(path: Path) -> dict[str, Any]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
        raise ModelLoadError(f"{path}: not a readable synthetic model: {exc}") from None
    if not isinstance(document, dict) or not document.get("inputs") \
            or not document.get("outputs"):
        raise ModelLoadError(f"{path}: a synthetic model needs 'inputs' and 'outputs' lists")
    return document


def _specs(document: dict[str, Any], key: str, path: Path) -> list[TensorSpec]:
    try:
        return [TensorSpec(str(t["name"]), str(t["datatype"]), tuple(int(d) for d in t["shape"]))
                for t in document[key]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: {key}: each needs name, datatype and shape "
                             f"({type(exc).__name__}: {exc})") from None


def describe(path: Path) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The tensors ``model.json`` declares."""
    document = _read(path)
    return _specs(document, "inputs", path), _specs(document, "outputs", path)


def read_cost(path: Path, document: dict[str, Any] | None = None) -> Cost:
    """The cost ``model.json`` declares (``document``: the file, already read)."""
    document = _read(path) if document is None else document
    try:
        cost = dict(document.get("cost", {}))
        parsed = Cost(fixed_ms=float(cost.get("fixed_ms", 1.0)),
                      per_row_ms=float(cost.get("per_row_ms", 0.0)),
                      slow_above_rows=(None if cost.get("slow_above_rows") is None
                                       else int(cost["slow_above_rows"])),
                      per_row_ms_above=float(cost.get("per_row_ms_above", 0.0)),
                      memory_per_row_bytes=int(document.get("memory_per_row_bytes", 0)),
                      gil_releases=cost.get("gil_releases", 1),
                      pace_file=None if cost.get("pace_file") is None
                      else str(cost["pace_file"]))
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: cost: {exc}") from None
    releases = parsed.gil_releases
    if isinstance(releases, bool) or not isinstance(releases, int) \
            or not 1 <= releases <= MAX_GIL_RELEASES:
        raise ModelLoadError(f"{path}: cost: gil_releases must be a whole number from 1 to "
                             f"{MAX_GIL_RELEASES}, not {shown(releases)}")
    return parsed


PACE_READ_S = 0.05  # how often the pace file is read again, at most


class Pace:
    """The multiplier in a pace file, read again at most every PACE_READ_S of ``clock``."""

    def __init__(self, path: str, clock: Clock) -> None:
        self.path = Path(path)
        self.clock = clock
        self.factor = 1.0
        self.read_at = -math.inf

    def now(self) -> float:
        at = self.clock.now()
        if at - self.read_at >= PACE_READ_S:
            self.read_at = at
            try:
                factor = float(self.path.read_text())
            except (OSError, ValueError):
                factor = 1.0
            self.factor = factor if math.isfinite(factor) and factor > 0 else 1.0
        return self.factor


class SyntheticBackend(Backend):
    """Spends the batch's set cost on its clock, holding its set memory, and copies
    inputs out."""

    def __init__(self, spec: InstanceSpec) -> None:
        document = _read(spec.path)
        self.cost = read_cost(spec.path, document)
        self.clock = spec.clock
        self.pace = Pace(self.cost.pace_file, spec.clock) if self.cost.pace_file else None
        self.copy_of = {str(t["name"]): str(t.get("copy_of") or document["inputs"][0]["name"])
                        for t in document["outputs"]}

    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        rows = len(next(iter(inputs.values())))
        held = None
        if self.cost.memory_per_row_bytes:
            held = np.ones(rows * self.cost.memory_per_row_bytes, dtype=np.uint8)  # touched
        part = self.cost.batch_ms(rows) / 1e3 / self.cost.gil_releases
        if self.pace is not None:
            part *= self.pace.now()
        for _ in range(self.cost.gil_releases):
            self.clock.sleep(part)
        del held
        try:
            return {name: np.array(inputs[self.copy_of[name]], copy=True)
                    for name in output_names}
        except KeyError as exc:
            raise InvalidInput(f"synthetic model has no output or input {exc}") from None


BACKEND = TensorBackendType(name="synthetic", platforms=("tradeoff_synthetic",),
                            default_filename="model.json", describe=describe,
                            create=SyntheticBackend)
