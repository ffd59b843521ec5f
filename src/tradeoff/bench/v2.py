"""The statistics extension of a v2 server, read around a measurement."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

__all__ = ["model_stats", "stats_delta"]


def model_stats(url: str, model: str) -> dict[str, Any]:
    """The model's entry of the statistics extension (``/v2/models/{m}/stats``)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        return json.loads(response.read())["model_stats"][0]


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """(successful requests, executions) between two statistics snapshots."""
    requests = (after["inference_stats"]["success"]["count"]
                - before["inference_stats"]["success"]["count"])
    return requests, after["execution_count"] - before["execution_count"]
