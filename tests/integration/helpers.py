"""Small HTTP helpers for the integration tests: raw requests, metrics, the server's
memory, ONNX references."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import onnxruntime as ort
from prometheus_client.parser import text_string_to_metric_families

from tradeoff.bench.soak import read_rss
from tradeoff.server.process import ServerProcess

TIMEOUT_S = 60.0
# how a test's server runs: a module marked ``both_modes`` runs each test in each mode
# (conftest.py); "split": two front-end processes and an executor process per device
SERVER_MODES: dict[str, tuple[str, ...]] = {"in-process": (), "split": ("--workers", "2")}


@dataclass
class Response:
    status: int
    headers: http.client.HTTPMessage
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    def header(self, name: str) -> str | None:
        return self.headers.get(name)


def request(url: str, method: str, path: str, body: bytes | Any = None,
            headers: dict[str, str] | None = None, *, chunked: bool = False) -> Response:
    """One request on a fresh connection; ``body`` may be bytes or an iterable of chunks."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=TIMEOUT_S)
    try:
        connection.request(method, path, body=body, headers=headers or {},
                           encode_chunked=chunked)
        response = connection.getresponse()
        return Response(response.status, response.headers, response.read())
    finally:
        connection.close()


def post_json(url: str, path: str, doc: Any, headers: dict[str, str] | None = None) -> Response:
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return request(url, "POST", path, json.dumps(doc).encode(), all_headers)


def infer_json(url: str, model: str, inputs: list[dict[str, Any]], *,
               version: str | None = None, **extra: Any) -> Response:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/infer"
    return post_json(url, path, {"inputs": inputs, **extra})


def get_text(url: str) -> str:
    parts = urlsplit(url)
    response = request(f"{parts.scheme}://{parts.netloc}", "GET", parts.path)
    assert response.status == 200, response.body
    return response.body.decode()


def metric_samples(server: ServerProcess) -> dict[tuple[str, frozenset], float]:
    """Every sample of ``/metrics``: ``(name, frozenset(labels.items())) -> value``."""
    families = text_string_to_metric_families(get_text(server.metrics_url))
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in families for s in family.samples}


def model_metric(server: ServerProcess, name: str, model: str, version: str = "1") -> float:
    samples = metric_samples(server)
    key = (name, frozenset({"model": model, "version": version}.items()))
    assert key in samples, f"{name} for {model}/{version} missing from /metrics"
    return samples[key]


def rss(server: ServerProcess) -> int:
    """The server's resident memory in bytes, from ``/proc``."""
    assert server.process is not None
    found = read_rss(server.process.pid, None)
    assert found is not None, f"no VmRSS in /proc/{server.process.pid}/status"
    return int(found)


def wait_for(condition: Any, what: str, timeout: float = 30.0) -> None:
    """Poll ``condition()`` until true; fails the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


class References:
    """In-process ONNX Runtime sessions on the repository's model files."""

    def __init__(self, repository: Path) -> None:
        self.repository = repository
        self._sessions: dict[tuple[str, int], ort.InferenceSession] = {}

    def session(self, model: str, version: int = 1) -> ort.InferenceSession:
        key = (model, version)
        if key not in self._sessions:
            path = self.repository / model / str(version) / "model.onnx"
            self._sessions[key] = ort.InferenceSession(str(path),
                                                       providers=["CPUExecutionProvider"])
        return self._sessions[key]

    def run(self, model: str, inputs: dict[str, np.ndarray], version: int = 1
            ) -> dict[str, np.ndarray]:
        session = self.session(model, version)
        names = [o.name for o in session.get_outputs()]
        return dict(zip(names, session.run(names, inputs), strict=True))


def front_end_count(server: ServerProcess) -> int:
    """How many front-end processes serve (``--workers``), 1 in one process."""
    args = server.extra_args
    return int(args[args.index("--workers") + 1]) if "--workers" in args else 1


def running_server(repository: Path, cls: type[ServerProcess] = ServerProcess,
                   mode: str = "in-process", **options: Any) -> Iterator[ServerProcess]:
    """A `tradeoff serve` for a fixture's lifetime, in ``mode`` (SERVER_MODES; ``options``
    as ServerProcess, or the subclass ``cls``, takes them); it must stop with exit code
    0."""
    options["extra_args"] = (*options.get("extra_args", ()), *SERVER_MODES[mode])
    process = cls(repository, **options).start()
    try:
        yield process
    finally:
        code = process.stop()
        log = process.close_log()
    assert code == 0, f"server exited with {code}:\n{log[-3000:]}"


@contextmanager
def background_load(send: Callable[[], int], threads: int = 4) -> Iterator[list[int]]:
    """``threads`` threads calling ``send`` (which returns an HTTP status) over and over
    while the block runs; yields the list the statuses are appended to."""
    statuses: list[int] = []
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            statuses.append(send())

    workers = [threading.Thread(target=load) for _ in range(threads)]
    for worker in workers:
        worker.start()
    try:
        yield statuses
    finally:
        stop.set()
        for worker in workers:
            worker.join(30)
