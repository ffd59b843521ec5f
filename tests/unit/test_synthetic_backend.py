"""The synthetic backend's cost: what a batch sleeps, and in how many GIL-free parts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest

from tradeoff.backends.clock import ModelledClock
from tradeoff.backends.registry import InstanceSpec
from tradeoff.backends.synthetic import MAX_GIL_RELEASES, SyntheticBackend, read_cost
from tradeoff.errors import ModelLoadError


def model_file(tmp_path: Path, cost: dict[str, object]) -> Path:
    path = tmp_path / "model.json"
    path.write_text(json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "cost": cost}))
    return path


def test_a_batch_sleeps_its_cost_in_gil_releases_parts(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_file(tmp_path, {"fixed_ms": 2.0, "per_row_ms": 0.5, "gil_releases": 4})
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    backend = SyntheticBackend(InstanceSpec(name="s", path=path))
    rows = np.arange(24, dtype=np.float32).reshape(6, 4)
    out = backend.run({"INPUT0": rows}, ["OUTPUT0"])
    assert slept == pytest.approx([0.00125] * 4)  # (2 + 6 x 0.5) ms in four parts
    np.testing.assert_array_equal(out["OUTPUT0"], rows)


def test_on_a_modelled_clock_a_batch_advances_the_clock_by_its_cost_without_sleeping(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = model_file(tmp_path, {"fixed_ms": 2.0, "per_row_ms": 0.5, "gil_releases": 4})
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    clock = ModelledClock()
    backend = SyntheticBackend(InstanceSpec(name="s", path=path, clock=clock))
    backend.run({"INPUT0": np.zeros((6, 4), dtype=np.float32)}, ["OUTPUT0"])
    assert clock.now() == pytest.approx(0.005) and slept == []


def test_one_gil_release_unless_told(tmp_path: Path) -> None:
    assert read_cost(model_file(tmp_path, {"fixed_ms": 1.0})).gil_releases == 1


@pytest.mark.parametrize("value", [0, -3, "many", 2.5, True, MAX_GIL_RELEASES + 1, 10**30])
def test_gil_releases_not_a_whole_number_in_range_is_refused(tmp_path: Path,
                                                             value: object) -> None:
    with pytest.raises(ModelLoadError, match="gil_releases must be a whole number from 1"):
        read_cost(model_file(tmp_path, {"gil_releases": value}))


def test_the_pace_file_multiplies_each_batchs_cost_while_it_serves(tmp_path: Path) -> None:
    """Missing or unreadable: 1; written: that multiple, read again once 50 ms passed on
    the instance's clock."""
    pace = tmp_path / "pace"
    path = model_file(tmp_path, {"fixed_ms": 2.0, "pace_file": str(pace)})
    clock = ModelledClock()
    backend = SyntheticBackend(InstanceSpec(name="s", path=path, clock=clock))
    rows = {"INPUT0": np.zeros((1, 4), dtype=np.float32)}

    def batch_ms(after_s: float) -> float:
        clock.sleep(after_s)
        before = clock.now()
        backend.run(rows, ["OUTPUT0"])
        return (clock.now() - before) * 1e3

    assert batch_ms(0.0) == pytest.approx(2.0)  # no file yet
    pace.write_text("5")
    assert batch_ms(0.01) == pytest.approx(2.0)  # read 12 ms ago: not again yet
    assert batch_ms(0.05) == pytest.approx(10.0)
    pace.write_text("not a number")
    assert batch_ms(0.05) == pytest.approx(2.0)
    pace.write_text("0.5")
    assert batch_ms(0.05) == pytest.approx(1.0)
