"""Open Inference Protocol v2 requests for load generation, and the server's statistics."""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import numpy as np
import orjson

from tradeoff.bench.http_client import build_request


def binary_infer_request(host: str, model: str, input_name: str, array: np.ndarray,
                         datatype: str) -> bytes:
    """Bytes of an infer request with one binary input tensor, asking for binary outputs."""
    header = orjson.dumps({
        "inputs": [{"name": input_name, "datatype": datatype, "shape": list(array.shape),
                    "parameters": {"binary_data_size": array.nbytes}}],
        "parameters": {"binary_data_output": True},
    })
    return build_request("POST", host, f"/v2/models/{model}/infer", header + array.tobytes(),
                         {"Inference-Header-Content-Length": str(len(header)),
                          "Content-Type": "application/octet-stream"})


def model_stats(url: str, model: str) -> dict[str, Any]:
    """The model's entry of the statistics extension (``/v2/models/{m}/stats``)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        return json.loads(response.read())["model_stats"][0]


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """(successful requests, executions) between two statistics snapshots."""
    requests = (after["inference_stats"]["success"]["count"]
                - before["inference_stats"]["success"]["count"])
    return requests, after["execution_count"] - before["execution_count"]
