"""Writes a synthetic model (backends/synthetic.py): a model whose cost per batch is set."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG = """name: "{name}"
backend: "synthetic"
max_batch_size: {max_batch_size}
{extra}
"""


def write_synthetic_model(repository: Path, name: str = "synthetic", *,
                          fixed_ms: float = 2.0, per_row_ms: float = 0.05,
                          slow_above_rows: int | None = None, per_row_ms_above: float = 0.0,
                          memory_per_row_bytes: int = 0, max_batch_size: int = 64,
                          width: int = 4, extra: str = "", pace_file: Path | None = None
                          ) -> Path:
    """``repository/name`` with version 1's ``model.json`` and a ``config.pbtxt``."""
    directory = repository / name
    (directory / "1").mkdir(parents=True, exist_ok=True)
    cost: dict[str, Any] = {"fixed_ms": fixed_ms, "per_row_ms": per_row_ms}
    if slow_above_rows is not None:
        cost.update(slow_above_rows=slow_above_rows, per_row_ms_above=per_row_ms_above)
    if pace_file is not None:
        cost["pace_file"] = str(pace_file)
    (directory / "1" / "model.json").write_text(json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, width]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, width],
                     "copy_of": "INPUT0"}],
        "cost": cost, "memory_per_row_bytes": memory_per_row_bytes}))
    (directory / "config.pbtxt").write_text(
        CONFIG.format(name=name, max_batch_size=max_batch_size, extra=extra))
    return directory
