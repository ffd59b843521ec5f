"""Endpoint adapters: what to send to an endpoint and what its answers say.

An adapter prepares raw request bytes once (so the hot loop only writes bytes), and reads
the server's own timings from a response when the server gives them. ``V2Adapter`` speaks
the Open Inference Protocol over HTTP (binary tensors by default); ``HttpJsonAdapter``
sends given bodies to any JSON-over-HTTP endpoint.
"""

from __future__ import annotations

import hashlib
import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import numpy as np
import orjson

from tradeoff import dtypes
from tradeoff.bench.mix import InputMix
from tradeoff.bench.records import SERVER_PARTS
from tradeoff.errors import BenchSetupError
from tradeoff.protocol.http_client import DEFAULT_MAX_RESPONSE_BYTES, Response, build_request, get
from tradeoff.protocol.http_client import Connection as HttpConnection
from tradeoff.protocol.v2 import encode_bytes_elements

__all__ = [
    "Adapter",
    "Connection",
    "HttpJsonAdapter",
    "V2Adapter",
    "parse_server_timing",
    "split_url",
]


class Connection(Protocol):
    """One client connection: sends a prepared request, returns the response."""

    async def request(self, raw: bytes) -> Response: ...

    def close(self) -> None: ...


def split_url(url: str) -> tuple[str, int, str]:
    """(host, port, path prefix) of an http:// or https:// URL."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https"):
        raise BenchSetupError(f"{url}: only http:// and https:// endpoints are supported here")
    if not parts.hostname:
        raise BenchSetupError(f"{url}: no host in the URL")
    return (parts.hostname, parts.port or (443 if parts.scheme == "https" else 80),
            parts.path.rstrip("/"))


def parse_server_timing(value: bytes) -> tuple[float, float, float, float] | None:
    """queue, compute_input, compute_infer, compute_output (ms) from ``Server-Timing``."""
    found: dict[str, float] = {}
    for metric in value.split(b","):
        name, _, params = metric.strip().partition(b";")
        for param in params.split(b";"):
            key, _, number = param.strip().partition(b"=")
            if key == b"dur":
                try:
                    found[name.decode()] = float(number)
                except ValueError:
                    pass
    if not all(part in found for part in SERVER_PARTS):
        return None
    return tuple(found[part] for part in SERVER_PARTS)  # type: ignore[return-value]


class Adapter(ABC):
    """One endpoint under test."""

    protocol = "?"
    streaming = False  # streamed generations: the runner reads them with reader()
    asked_tokens: Sequence[int] = ()  # streaming: the output length each request asks
    mix = InputMix()  # which prepared request each send uses (make_adapter sets it)
    input_count = 0  # requests prepare() made
    max_response_bytes = DEFAULT_MAX_RESPONSE_BYTES  # one answer at most (make_adapter sets it)

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url
        self.host, self.port, self.prefix = split_url(url)
        self.tls = url.startswith("https://")
        self.timeout_s = timeout_s
        self.rows_per_request = 1
        self.input_fingerprint = ""  # sha256 of what prepare() sends, endpoint-independent

    def connect(self, timeout_s: float) -> Connection:
        """A new connection to the endpoint (keep-alive HTTP/1.1 unless overridden)."""
        return HttpConnection(self.host, self.port, timeout_s, tls=self.tls,
                              max_bytes=self.max_response_bytes)

    def reader(self) -> Any:
        """Streaming adapters: a fresh reader of one answer's body."""
        raise NotImplementedError

    @abstractmethod
    def prepare(self) -> list[bytes]:
        """Raw requests to send, used round-robin (reads the endpoint's metadata first)."""

    def invalid(self, response: Response) -> str | None:
        """Why a 2xx answer cannot be read as one, or None when it can."""
        return None

    def server_timing(self, response: Response) -> tuple[float, float, float, float] | None:
        value = response.headers.get(b"server-timing")
        return parse_server_timing(value) if value else None

    def server_stats(self) -> dict[str, Any] | None:
        """Cumulative server statistics for the aggregate breakdown, when it has them."""
        return None

    def server_metadata(self) -> dict[str, Any] | None:
        """What the server says about itself (name, version, extensions), when it can."""
        return None

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "url": self.url}

    def _get_json(self, path: str) -> Any:
        """One set-up read, bounded like every request: --timeout for all of it, and
        --max-response-size."""
        scheme = "https" if self.tls else "http"
        url = f"{scheme}://{self.host}:{self.port}{self.prefix}{path}"
        headers = getattr(self, "headers", None) or {}
        try:
            response = get(url, timeout_s=self.timeout_s, max_bytes=self.max_response_bytes,
                           headers=headers)
        except OSError as exc:
            raise BenchSetupError(f"GET {self.url}{path}: {exc}") from None
        if not 200 <= response.status < 300:
            detail = response.body[:300].decode(errors="replace")
            raise BenchSetupError(f"GET {self.url}{path}: HTTP {response.status} {detail}",
                                  response.status)
        try:
            return orjson.loads(response.body)
        except orjson.JSONDecodeError as exc:
            raise BenchSetupError(f"GET {self.url}{path}: the answer is not JSON "
                                  f"({exc})") from None


def _random_array(datatype: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    if datatype == "BYTES":
        return np.array([f"s{v}".encode() for v in rng.integers(0, 10**6, size=shape).ravel()],
                        dtype=object).reshape(shape)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype == "BF16":
        values = rng.standard_normal(shape).astype(np.float32)
        return (values.view(np.uint32) >> 16).astype(np.uint16)
    dtype = dtypes.numpy_dtype(datatype)
    if dtype.kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    high = min(100, np.iinfo(dtype).max)
    return rng.integers(0, high, size=shape).astype(dtype)


class V2Adapter(Adapter):
    """Open Inference Protocol v2 over HTTP against ``tradeoff serve``, Triton, KServe."""

    protocol = "v2"

    def __init__(self, url: str, model: str, *, version: str = "", json_tensors: bool = False,
                 shapes: dict[str, list[int]] | None = None, batch_size: int = 1,
                 input_data: Path | None = None, variants: int = 8, seed: int = 0,
                 timeout_s: float = 10.0, headers: dict[str, str] | None = None) -> None:
        super().__init__(url, timeout_s)
        if "/v2/" in f"{self.prefix}/":
            raise BenchSetupError(f"{url}: give the server's base URL (http://HOST:PORT, "
                                  "with a path prefix if it has one), not a route of it; "
                                  "--model names the model")
        self.headers = headers or {}  # sent with every request, e.g. Authorization
        self.model = model
        self.version = version
        self.json_tensors = json_tensors
        self.shapes = shapes or {}
        self.batch_size = batch_size
        self.input_data = input_data
        self.variants = variants
        self.seed = seed
        self.metadata: dict[str, Any] = {}
        self.config: dict[str, Any] | None = None
        self.server_info: dict[str, Any] | None = None

    @property
    def _model_path(self) -> str:
        path = f"/v2/models/{self.model}"
        return f"{path}/versions/{self.version}" if self.version else path

    def _read_model(self) -> None:
        """The model's metadata and config (``self.metadata``, ``self.config``)."""
        self.metadata = self._get_json(self._model_path)
        try:
            self.config = self._get_json(f"{self._model_path}/config")
        except BenchSetupError:
            self.config = None  # not every v2 server has the configuration extension

    def prepare(self) -> list[bytes]:
        self._read_model()
        self.server_info = self.server_metadata()
        max_batch = int((self.config or {}).get("max_batch_size", 0) or 0)
        if self.batch_size > 1 and max_batch == 0:
            raise BenchSetupError(f"--batch-size {self.batch_size}: model {self.model!r} "
                                  "does not batch (max_batch_size 0)")
        if max_batch and self.batch_size > max_batch:
            raise BenchSetupError(f"--batch-size {self.batch_size} is over the model's "
                                  f"max_batch_size {max_batch}")
        self.rows_per_request = self.batch_size if max_batch else 1
        datasets = (self._file_inputs() if self.input_data is not None
                    else self._random_inputs(max_batch))
        digest = hashlib.sha256()
        for inputs in datasets:
            for name, (datatype, array) in inputs.items():
                digest.update(f"{name}:{datatype}:{list(array.shape)}".encode())
                digest.update(encode_bytes_elements(array) if datatype == "BYTES"
                              else np.ascontiguousarray(array).tobytes())
        self.input_fingerprint = digest.hexdigest()
        # one copy of the inputs per request class (mix.py lays them out class by class)
        classes: list[dict[str, Any] | None] = [c.parameters for c in self.mix.classes] \
            or [None]
        return [self._request(inputs, parameters) for parameters in classes
                for inputs in datasets]

    def _input_shape(self, tensor: dict[str, Any], batching: bool) -> tuple[int, ...]:
        name, shape = tensor["name"], list(tensor["shape"])
        if batching:
            shape = shape[1:]
        if name in self.shapes:
            given = self.shapes[name]
            if len(given) != len(shape):
                raise BenchSetupError(f"--shape {name}: {given} has rank {len(given)}, the "
                                      f"model's input has {shape}"
                                      + (" (batch dimension excluded)" if batching else ""))
            shape = given
        if any(d < 0 for d in shape):
            raise BenchSetupError(f"input {name!r} has variable dimensions {shape}; give them "
                                  f"with --shape {name}:" + ",".join("N" for _ in shape))
        return tuple([self.batch_size] + shape if batching else shape)

    def _random_inputs(self, max_batch: int) -> list[dict[str, tuple[str, np.ndarray]]]:
        rng = np.random.default_rng(self.seed)
        tensors = self.metadata.get("inputs", [])
        if not tensors:
            raise BenchSetupError(f"model {self.model!r} metadata lists no inputs")
        shapes = {t["name"]: self._input_shape(t, max_batch > 0) for t in tensors}
        return [{t["name"]: (t["datatype"], _random_array(t["datatype"], shapes[t["name"]], rng))
                 for t in tensors} for _ in range(self.variants)]

    def _file_inputs(self) -> list[dict[str, tuple[str, np.ndarray]]]:
        """perf_analyzer's --input-data JSON: {"data": [{NAME: [...] | {"content": [...],
        "shape": [...]}}, ...]}."""
        assert self.input_data is not None
        try:
            doc = json.loads(self.input_data.read_text())
        except (OSError, ValueError, RecursionError) as exc:
            raise BenchSetupError(f"--input-data {self.input_data}: {exc}") from None
        entries = doc.get("data") if isinstance(doc, dict) else None
        if not isinstance(entries, list) or not entries:
            raise BenchSetupError(f"--input-data {self.input_data}: expected "
                                  '{"data": [{"INPUT": [...]}, ...]}')
        by_name = {t["name"]: t for t in self.metadata.get("inputs", [])}
        batching = bool((self.config or {}).get("max_batch_size"))
        datasets = []
        for index, entry in enumerate(entries):
            inputs = {}
            for name, value in entry.items():
                if name not in by_name:
                    raise BenchSetupError(f"--input-data entry {index}: {name!r} is not an "
                                          f"input of {self.model!r}")
                datatype = by_name[name]["datatype"]
                if isinstance(value, dict):
                    content, shape = value.get("content"), value.get("shape")
                    if "b64" in value:
                        raise BenchSetupError("--input-data: b64 content is not supported; "
                                              "give the values as a list")
                else:
                    content, shape = value, None
                dtype = object if datatype == "BYTES" else dtypes.numpy_dtype(datatype)
                array = np.asarray(content, dtype=dtype)
                if datatype == "BYTES":
                    array = np.array([str(v).encode() for v in array.ravel()], dtype=object)
                target = tuple(shape) if shape else self._input_shape(
                    {"name": name, "shape": by_name[name]["shape"]},
                    batching)[1 if batching else 0:]
                try:
                    array = array.reshape(target)
                except ValueError:
                    raise BenchSetupError(
                        f"--input-data entry {index}: {name!r} has {array.size} values, "
                        f"not shape {list(target)}") from None
                if batching:
                    array = np.repeat(array[None, ...], self.batch_size, axis=0)
                inputs[name] = (datatype, array)
            datasets.append(inputs)
        return datasets

    def _request(self, inputs: dict[str, tuple[str, np.ndarray]],
                 parameters: dict[str, Any] | None = None) -> bytes:
        path = f"{self.prefix}{self._model_path}/infer"
        if self.json_tensors:
            doc: dict[str, Any] = {
                "inputs": [{"name": n, "datatype": d, "shape": list(a.shape),
                            "data": [v.decode() for v in a.ravel()] if d == "BYTES"
                            else a.ravel().tolist()} for n, (d, a) in inputs.items()]}
            if parameters:
                doc["parameters"] = parameters
            return build_request("POST", self.host, path, orjson.dumps(doc),
                                 {"Content-Type": "application/json", **self.headers})
        blobs = [encode_bytes_elements(a) if d == "BYTES" else np.ascontiguousarray(a).tobytes()
                 for d, a in inputs.values()]
        header = orjson.dumps({
            "inputs": [{"name": n, "datatype": d, "shape": list(a.shape),
                        "parameters": {"binary_data_size": len(b)}}
                       for (n, (d, a)), b in zip(inputs.items(), blobs, strict=True)],
            "parameters": {"binary_data_output": True, **(parameters or {})},
        })
        return build_request("POST", self.host, path, header + b"".join(blobs),
                             {"Inference-Header-Content-Length": str(len(header)),
                              "Content-Type": "application/octet-stream", **self.headers})

    def invalid(self, response: Response) -> str | None:
        """An answer is a JSON object (binary outputs: its JSON header, then the blobs
        it announces)."""
        body = response.body
        size = response.headers.get(b"inference-header-content-length")
        try:
            header = int(size) if size is not None else len(body)
            if not 0 < header <= len(body):
                return (f"undecodable answer: a JSON header of {size!r} bytes in "
                        f"{len(body):,}")
            doc = orjson.loads(body if header == len(body) else body[:header])
        except ValueError as exc:  # orjson's errors too
            return f"undecodable answer: {exc}"
        if not isinstance(doc, dict):
            return f"undecodable answer: {type(doc).__name__}, not an object"
        return None

    def server_stats(self) -> dict[str, Any] | None:
        try:
            stats = self._get_json(f"{self._model_path}/stats")["model_stats"]
        except (BenchSetupError, KeyError, TypeError):
            return None
        return stats[-1] if stats else None

    def server_metadata(self) -> dict[str, Any] | None:
        try:
            return self._get_json("/v2")
        except BenchSetupError:
            return None

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "url": self.url, "model": self.model,
                "version": self.version or None,
                "tensors": "json" if self.json_tensors else "binary",
                "batch_size": self.batch_size, "inputs": self.metadata.get("inputs"),
                "outputs": self.metadata.get("outputs"),
                "platform": self.metadata.get("platform"),
                "max_batch_size": (self.config or {}).get("max_batch_size"),
                "model_config": self.config, "server": self.server_info}


class HttpJsonAdapter(Adapter):
    """Any JSON-over-HTTP endpoint: given bodies, any 2xx is a success."""

    protocol = "http"

    def __init__(self, url: str, *, method: str = "POST", headers: dict[str, str] | None = None,
                 body: Path | None = None, timeout_s: float = 10.0) -> None:
        super().__init__(url, timeout_s)
        self.method = method.upper()
        self.headers = headers or {}
        self.body = body
        self.path = urlsplit(url if "://" in url else f"http://{url}").path or "/"
        query = urlsplit(url if "://" in url else f"http://{url}").query
        if query:
            self.path += f"?{query}"

    def prepare(self) -> list[bytes]:
        bodies = [b""]
        if self.body is not None:
            try:
                text = self.body.read_bytes()
            except OSError as exc:
                raise BenchSetupError(f"--body {self.body}: {exc.strerror}") from None
            if self.body.suffix == ".jsonl":
                bodies = [line for line in text.splitlines() if line.strip()]
                if not bodies:
                    raise BenchSetupError(f"--body {self.body}: no bodies in the file")
            else:
                bodies = [text]
        headers = {"Content-Type": "application/json", **self.headers} if self.body else \
            dict(self.headers)
        self.input_fingerprint = hashlib.sha256(b"\n".join(bodies)).hexdigest()
        return [build_request(self.method, self.host, self.path, b, headers) for b in bodies]

    def describe(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "url": self.url, "method": self.method,
                "headers": sorted(self.headers), "body": str(self.body) if self.body else None}
