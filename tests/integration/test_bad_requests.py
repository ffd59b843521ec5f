"""Bad requests over raw HTTP: each gets the right status and a JSON ``error``.

After all of them the server still answers a good request.
"""

from __future__ import annotations

import gzip
import json
import struct
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

from .helpers import Response, infer_json, request

pytestmark = pytest.mark.integration

ZEROS16 = [0.0] * 16


def tiny_input(**changes: object) -> dict:
    tensor = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 16], "data": ZEROS16}
    tensor.update(changes)
    return tensor


def add_sub_inputs() -> list[dict]:
    return [{"name": f"INPUT{i}", "datatype": "INT32", "shape": [1, 16], "data": [i] * 16}
            for i in range(2)]


def binary_request(header: dict, blob: bytes, declared: int | None = None
                   ) -> tuple[bytes, dict[str, str]]:
    """A binary-extension body: JSON header, then raw tensor bytes."""
    head = json.dumps(header).encode()
    length = len(head) if declared is None else declared
    return head + blob, {"Inference-Header-Content-Length": str(length),
                         "Content-Type": "application/octet-stream"}


def binary_tiny(size: int, blob_bytes: int, declared: int | None = None,
                shape: list[int] | None = None) -> tuple[bytes, dict[str, str]]:
    header = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape or [1, 16],
                          "parameters": {"binary_data_size": size}}]}
    return binary_request(header, b"\0" * blob_bytes, declared)


def assert_error(response: Response, status: int, *fragments: str) -> None:
    assert response.status == status, (response.status, response.body)
    assert response.header("Content-Type") == "application/json"
    doc = response.json()
    assert set(doc) == {"error"}, doc
    assert isinstance(doc["error"], str) and doc["error"]
    for fragment in fragments:
        assert fragment in doc["error"], (fragment, doc["error"])


INFER = "/v2/models/tiny/infer"
JSON = {"Content-Type": "application/json"}

# (id, path, body, headers, status, fragments the error names)
CASES = [
    ("malformed-json", INFER, b'{"inputs": [', JSON, 400, ("JSON",)),
    ("not-an-object", INFER, b"[1, 2]", JSON, 400, ()),
    ("empty-body", INFER, b"", JSON, 400, ()),
    ("no-inputs", INFER, json.dumps({"inputs": []}).encode(), JSON, 400, ("inputs",)),
    ("unknown-model", "/v2/models/no_such_model/infer",
     json.dumps({"inputs": [tiny_input()]}).encode(), JSON, 404, ("no_such_model",)),
    ("unknown-version", "/v2/models/versioned/versions/9/infer",
     json.dumps({"inputs": [tiny_input(shape=[1, 4], data=[0.0] * 4)]}).encode(), JSON,
     404, ("9",)),
    ("non-numeric-version", "/v2/models/versioned/versions/latest/infer",
     json.dumps({"inputs": [tiny_input(shape=[1, 4], data=[0.0] * 4)]}).encode(), JSON,
     404, ()),
    ("missing-input", "/v2/models/add_sub/infer",
     json.dumps({"inputs": add_sub_inputs()[:1]}).encode(), JSON, 400, ("INPUT1",)),
    ("extra-input", "/v2/models/add_sub/infer",
     json.dumps({"inputs": add_sub_inputs() + [
         {"name": "INPUT2", "datatype": "INT32", "shape": [1, 16], "data": [0] * 16}]}
     ).encode(), JSON, 400, ("INPUT2",)),
    ("duplicate-input", "/v2/models/add_sub/infer",
     json.dumps({"inputs": add_sub_inputs() + add_sub_inputs()[:1]}).encode(), JSON, 400,
     ("INPUT0",)),
    ("wrong-datatype", INFER, json.dumps({"inputs": [tiny_input(datatype="FP64")]}).encode(),
     JSON, 400, ("FP64", "FP32")),
    ("unknown-datatype", INFER,
     json.dumps({"inputs": [tiny_input(datatype="FLOAT")]}).encode(), JSON, 400, ("FLOAT",)),
    ("wrong-shape", INFER,
     json.dumps({"inputs": [tiny_input(shape=[1, 15], data=[0.0] * 15)]}).encode(), JSON,
     400, ("shape",)),
    ("wrong-rank", INFER,
     json.dumps({"inputs": [tiny_input(shape=[16], data=ZEROS16)]}).encode(), JSON, 400,
     ("shape",)),
    ("batch-over-max", INFER,
     json.dumps({"inputs": [tiny_input(shape=[65, 16], data=[0.0] * 65 * 16)]}).encode(),
     JSON, 400, ("max_batch_size",)),
    ("negative-dim", INFER,
     json.dumps({"inputs": [tiny_input(shape=[1, -16])]}).encode(), JSON, 400, ("shape",)),
    ("batch-mismatch", "/v2/models/add_sub/infer",
     json.dumps({"inputs": [add_sub_inputs()[0],
                            {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16],
                             "data": [0] * 32}]}).encode(), JSON, 400, ("batch",)),
    ("json-data-too-short", INFER,
     json.dumps({"inputs": [tiny_input(data=[0.0] * 15)]}).encode(), JSON, 400, ("15",)),
    ("json-data-too-long", INFER,
     json.dumps({"inputs": [tiny_input(data=[0.0] * 17)]}).encode(), JSON, 400, ("17",)),
    ("json-data-strings", INFER,
     json.dumps({"inputs": [tiny_input(data=["a"] * 16)]}).encode(), JSON, 400, ()),
    ("int-data-float-values", "/v2/models/add_sub/infer",
     json.dumps({"inputs": [add_sub_inputs()[0],
                            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16],
                             "data": [0.5] * 16}]}).encode(), JSON, 400, ("INT32",)),
    ("int-out-of-range", "/v2/models/identity_int8/infer",
     json.dumps({"inputs": [{"name": "INPUT0", "datatype": "INT8", "shape": [1, 1],
                             "data": [300]}]}).encode(), JSON, 400, ("range",)),
    ("no-data", INFER,
     json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16]}]}
                ).encode(), JSON, 400, ("data",)),
    ("unknown-output", INFER,
     json.dumps({"inputs": [tiny_input()], "outputs": [{"name": "NOPE"}]}).encode(), JSON,
     400, ("NOPE",)),
    ("binary-size-past-body", INFER, *binary_tiny(64, 60), 400, ("binary_data_size",)),
    ("binary-bytes-left-over", INFER, *binary_tiny(64, 70), 400, ("binary",)),
    ("binary-size-wrong-for-shape", INFER, *binary_tiny(32, 32), 400, ("64",)),
    ("header-length-past-body", INFER, *binary_tiny(64, 64, declared=10_000), 400,
     ("Inference-Header-Content-Length",)),
    ("header-length-not-a-number", INFER,
     json.dumps({"inputs": [tiny_input()]}).encode(),
     {"Inference-Header-Content-Length": "abc", **JSON}, 400,
     ("Inference-Header-Content-Length",)),
    ("binary-size-without-header", INFER,
     json.dumps({"inputs": [tiny_input(parameters={"binary_data_size": 64})]}).encode(),
     JSON, 400, ("Inference-Header-Content-Length",)),
    ("bytes-element-overruns", "/v2/models/identity_bytes/infer",
     *binary_request({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1],
                                  "parameters": {"binary_data_size": 6}}]},
                     struct.pack("<I", 10) + b"ab"), 400, ("BYTES",)),
    ("bad-priority", INFER,
     json.dumps({"inputs": [tiny_input()], "parameters": {"priority": -1}}).encode(), JSON,
     400, ("priority",)),
    ("unsupported-content-encoding", INFER,
     json.dumps({"inputs": [tiny_input()]}).encode(), {"Content-Encoding": "br", **JSON},
     400, ("br",)),
    ("corrupt-gzip", INFER, b"not gzip at all", {"Content-Encoding": "gzip", **JSON}, 400,
     ("gzip",)),
]


@pytest.mark.parametrize(("path", "body", "headers", "status", "fragments"),
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_bad_request(server: ServerProcess, path: str, body: bytes, headers: dict[str, str],
                     status: int, fragments: tuple[str, ...]) -> None:
    assert_error(request(server.url, "POST", path, body, headers), status, *fragments)


@pytest.mark.parametrize(("method", "path", "status"), [
    ("GET", "/v2/models/tiny/infer", 405),
    ("POST", "/v2/models/tiny", 405),
    ("POST", "/v2/health/ready", 405),
    ("GET", "/v2/nowhere", 404),
    ("GET", "/v3/models", 404),
    ("GET", "/v2/models/no_such_model", 404),
    ("GET", "/v2/models/no_such_model/config", 404),
    ("GET", "/v2/models/no_such_model/stats", 404),
    ("GET", "/v2/models/versioned/versions/9", 404),
    # digits outside ASCII pass str.isdigit() but not int(): found by the fuzz test
    ("GET", "/v2/models/versioned/versions/%C2%B2/stats", 404),
    ("GET", "/v2/models/versioned/versions/%C2%B2", 404),
    ("GET", "/v2/models/tiny/nothing", 404),
])
def test_bad_route(server: ServerProcess, method: str, path: str, status: int) -> None:
    assert_error(request(server.url, method, path), status)


def test_unknown_model_ready_is_not_200(server: ServerProcess) -> None:
    assert request(server.url, "GET", "/v2/models/no_such_model/ready").status != 200


def test_gzip_request_body_is_accepted(server: ServerProcess) -> None:
    body = gzip.compress(json.dumps({"inputs": [tiny_input()]}).encode())
    response = request(server.url, "POST", INFER, body, {"Content-Encoding": "gzip", **JSON})
    assert response.status == 200, response.body
    assert response.json()["outputs"][0]["data"] == [1.0] * 16


def test_good_request_after_all_the_bad_ones(server: ServerProcess) -> None:
    # runs after the parametrized cases above (pytest keeps file order)
    data = np.arange(16, dtype=np.float32)
    response = infer_json(server.url, "tiny", [tiny_input(data=data.tolist())], id="still-ok")
    assert response.status == 200, response.body
    doc = response.json()
    assert doc["id"] == "still-ok"
    np.testing.assert_array_equal(np.array(doc["outputs"][0]["data"], np.float32),
                                  2 * data + 1)
    assert request(server.url, "GET", "/v2/health/ready").status == 200


# ------------------------------------------------------------------ body size limit

LIMIT = 1000


@pytest.fixture(scope="module")
def small_limit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root: Path = tmp_path_factory.mktemp("limit-models")
    build_repository(root, ("tiny",))
    process = ServerProcess(root, extra_args=("--max-request-bytes", str(LIMIT)))
    with process:
        yield process


def test_body_under_the_limit_is_served(small_limit_server: ServerProcess) -> None:
    response = infer_json(small_limit_server.url, "tiny", [tiny_input()])
    assert len(json.dumps({"inputs": [tiny_input()]})) < LIMIT
    assert response.status == 200, response.body


def test_body_over_the_limit_is_413(small_limit_server: ServerProcess) -> None:
    rows = 16
    body = json.dumps({"inputs": [tiny_input(shape=[rows, 16], data=[0.5] * 16 * rows)]}
                      ).encode()
    assert len(body) > LIMIT
    assert_error(request(small_limit_server.url, "POST", INFER, body, JSON), 413,
                 str(LIMIT))


def test_chunked_body_over_the_limit_is_413(small_limit_server: ServerProcess) -> None:
    chunks = [b'{"inputs": [', b" " * 600, b" " * 600, b"]}"]
    response = request(small_limit_server.url, "POST", INFER, iter(chunks), JSON,
                       chunked=True)
    assert_error(response, 413, str(LIMIT))


def test_gzip_body_that_inflates_over_the_limit_is_413(small_limit_server: ServerProcess
                                                       ) -> None:
    rows = 64
    raw = json.dumps({"inputs": [tiny_input(shape=[rows, 16], data=[0.0] * 16 * rows)]}
                     ).encode()
    body = gzip.compress(raw)
    assert len(body) < LIMIT < len(raw)
    response = request(small_limit_server.url, "POST", INFER, body,
                       {"Content-Encoding": "gzip", **JSON})
    assert_error(response, 413, str(LIMIT))


def test_limit_server_still_serves(small_limit_server: ServerProcess) -> None:
    assert infer_json(small_limit_server.url, "tiny", [tiny_input()]).status == 200
