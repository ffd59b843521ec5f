"""A v2 server's extensions, called around a measurement: a model's statistics, and its
config read and loaded with another (the repository extension's load with a ``config``
parameter, no restart), as ``tune serve`` tries configurations.

    before = model_stats(url, "mlp")
    control = ModelControl(url, "mlp")
    refused = control.load({**control.config(), "max_batch_size": 16})  # None: loaded
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from tradeoff.bench.endpoint import EndpointSpec
from tradeoff.errors import TuneError

__all__ = ["ModelControl", "model_stats", "stats_delta"]


def model_stats(url: str, model: str) -> dict[str, Any]:
    """The model's entry of the statistics extension (``/v2/models/{m}/stats``)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as response:
        return json.loads(response.read())["model_stats"][0]


def stats_delta(before: dict[str, Any], after: dict[str, Any]) -> tuple[int, int]:
    """(successful requests, executions) between two statistics snapshots."""
    requests = (after["inference_stats"]["success"]["count"]
                - before["inference_stats"]["success"]["count"])
    return requests, after["execution_count"] - before["execution_count"]


class ModelControl:
    """The server's config and repository-load calls for one model."""

    def __init__(self, url: str, model: str, timeout_s: float = 300.0,
                 headers: dict[str, str] | None = None) -> None:
        self.url = url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s
        self.headers = headers or {}

    @classmethod
    def of(cls, target: EndpointSpec) -> ModelControl:
        """The control of the model an endpoint names (a bare host:port is plain HTTP)."""
        url = target.url if target.url.startswith("http") else f"http://{target.url}"
        return cls(url, target.model or "", headers=dict(target.headers or {}))

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json",
                                                  **self.headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                text = response.read()
                return response.status, json.loads(text) if text else {}
        except urllib.error.HTTPError as exc:
            text = exc.read().decode(errors="replace")
            try:
                return exc.code, json.loads(text)
            except ValueError:
                return exc.code, {"error": text[:300]}
        except (urllib.error.URLError, OSError) as exc:
            raise TuneError(f"{method} {self.url}{path}: {exc}") from None

    def config(self) -> dict[str, Any]:
        status, body = self._call("GET", f"/v2/models/{self.model}/config")
        if status != 200:
            raise TuneError(f"cannot read the config of {self.model!r}: HTTP {status} "
                            f"{body.get('error', body)}")
        return dict(body)

    def load(self, config: dict[str, Any] | None) -> str | None:
        """Load the model with ``config`` (None: its file); the server's refusal, or None."""
        body = {} if config is None else {"parameters": {"config": json.dumps(config)}}
        status, answer = self._call("POST", f"/v2/repository/models/{self.model}/load", body)
        if status == 200:
            return None
        return f"HTTP {status}: {answer.get('error', answer)}"
