"""Surprises from the operator's side of a real `tradeoff serve`: model warmups that fail,
and model files symlinked out of the repository.

* A model whose configured warmup fails must be ``UNAVAILABLE`` with the reason (at start
  and when loaded later), its sessions released, and the other models keep serving.
* Files the operator placed on disk load, symbolic links out of the repository included
  (shared model caches); names in a config file still cannot climb out with ``..`` or an
  absolute path, and a config sent with ``load`` cannot follow a link out.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tradeoff.models.examples import make_model
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, post_json, request, running_server
from .model_repo import add_constant_model

pytestmark = pytest.mark.integration

ROW = [1.0, 2.0, 3.0, 4.0]
SHARED_CONSTANT = 2.0  # the model in the shared cache adds 2


def reshape_model() -> onnx.ModelProto:
    """``OUTPUT0 = reshape(INPUT0, [3, -1])`` on FP32 ``[batch, 4]``: it runs only when
    ``4 * batch`` is a multiple of 3 (batches of 3 and 6), and fails at run time otherwise."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])], "reshape",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["rows", "columns"])],
        initializer=[numpy_helper.from_array(np.array([3, -1], np.int64), "shape")])
    return make_model(graph, producer="tradeoff-tests")


def config(name: str, extra: str = "", *, output_dims: str = "4") -> str:
    return f"""\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {output_dims} ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
{extra}"""


def warmup(batch_size: int = 1, *, data_type: str = "TYPE_FP32", dims: str = "4",
           source: str = "zero_data: true") -> str:
    return (f'model_warmup [ {{ name: "w" batch_size: {batch_size} inputs {{ key: "INPUT0" '
            f'value {{ data_type: {data_type} dims: [ {dims} ] {source} }} }} }} ]\n')


# model -> (ONNX model, config text, a fragment its UNAVAILABLE reason must hold)
WARMUP_FAILURES: dict[str, tuple[onnx.ModelProto, str, str]] = {
    # the warmup declares INT32 for an FP32 input: it used to be sent as FP32 (and pass)
    "warmup_dtype": (add_constant_model(1.0),
                     config("warmup_dtype", warmup(data_type="TYPE_INT32")), "tensor(int32)"),
    "warmup_shape": (add_constant_model(1.0), config("warmup_shape", warmup(dims="5")),
                     "Got: 5 Expected: 4"),
    "warmup_file": (add_constant_model(1.0),
                    config("warmup_file", warmup(source='input_data_file: "short.bin"')),
                    "cannot build its inputs"),
    "warmup_reshape": (reshape_model(),
                       config("warmup_reshape", warmup(2), output_dims="-1"),
                       "cannot be reshaped"),
}
# a reshape model with 4 instances of 4 intra-op threads each: a session that is not
# released keeps 3 threads alive in the server, so leaks show in its thread count
LEAKY_THREADS = 4
LEAKY_INSTANCES = 4
LEAKY_CONFIG = config("warmup_threads", warmup(2), output_dims="-1").replace(
    "count: 1", f"count: {LEAKY_INSTANCES}") + (
    f'parameters {{ key: "intra_op_thread_count" value {{ string_value: "{LEAKY_THREADS}" }} }}\n')


@dataclass
class Repository:
    root: Path
    cache: Path  # a shared model cache outside the repository


def write_model(root: Path, name: str, model: onnx.ModelProto, text: str) -> Path:
    directory = root / name
    (directory / "1").mkdir(parents=True)
    onnx.save(model, str(directory / "1" / "model.onnx"))
    (directory / "config.pbtxt").write_text(text)
    return directory


def build(base: Path) -> Repository:
    root, cache = base / "models", base / "cache"
    cache.mkdir(parents=True)
    write_model(root, "good", add_constant_model(1.0), config("good"))
    for name, (model, text, _) in WARMUP_FAILURES.items():
        write_model(root, name, model, text)
    (root / "warmup_file" / "warmup").mkdir()
    (root / "warmup_file" / "warmup" / "short.bin").write_bytes(b"\0" * 12)  # 16 needed

    # the shared cache: one model file, one warmup file, one model's version directory
    onnx.save(add_constant_model(SHARED_CONSTANT), str(cache / "add.onnx"))
    (cache / "row.bin").write_bytes(np.array([ROW], np.float32).tobytes())
    (cache / "versions" / "1").mkdir(parents=True)
    onnx.save(add_constant_model(SHARED_CONSTANT), str(cache / "versions" / "1" / "model.onnx"))

    # linked: model.onnx and its warmup file are links into the cache; alias.onnx and
    # cachedir are links a network client must not follow; inside.bin is a plain file
    linked = root / "linked"
    (linked / "1").mkdir(parents=True)
    (linked / "1" / "model.onnx").symlink_to(cache / "add.onnx")
    (linked / "1" / "alias.onnx").symlink_to(cache / "add.onnx")
    (linked / "1" / "cachedir").symlink_to(cache, target_is_directory=True)
    (linked / "warmup").mkdir()
    (linked / "warmup" / "row.bin").symlink_to(cache / "row.bin")
    (linked / "warmup" / "inside.bin").write_bytes(np.zeros((1, 4), np.float32).tobytes())
    (linked / "config.pbtxt").write_text(
        config("linked", warmup(source='input_data_file: "row.bin"')))
    # linked_version: the whole version directory is a link
    (root / "linked_version").mkdir()
    (root / "linked_version" / "1").symlink_to(cache / "versions" / "1",
                                               target_is_directory=True)
    (root / "linked_version" / "config.pbtxt").write_text(config("linked_version"))

    # config files that name files out of their model: still refused
    escaping = {"escape_dotdot": 'default_model_filename: "../../linked/1/model.onnx"\n',
                "escape_absolute": f'default_model_filename: "{cache / "add.onnx"}"\n',
                "escape_warmup": warmup(source='input_data_file: "../../../cache/row.bin"')}
    for name, extra in escaping.items():
        write_model(root, name, add_constant_model(1.0), config(name, extra))
    return Repository(root, cache)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Repository:
    return build(tmp_path_factory.mktemp("operators"))


@pytest.fixture(scope="module")
def server(repo: Repository) -> Iterator[ServerProcess]:
    yield from running_server(repo.root)


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    response = post_json(server.url, "/v2/repository/index", {})
    assert response.status == 200, response.body
    return {row["name"]: row for row in response.json()}


def infer_row(server: ServerProcess, model: str) -> tuple[int, Any]:
    response = infer_json(server.url, model, [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": ROW}])
    return response.status, response.json()


def assert_serves(server: ServerProcess, model: str, constant: float) -> None:
    status, doc = infer_row(server, model)
    assert status == 200, doc
    assert doc["outputs"][0]["data"] == [x + constant for x in ROW]


def load(server: ServerProcess, model: str, override: dict[str, Any] | None = None
         ) -> tuple[int, Any]:
    body = {} if override is None else {"parameters": {"config": json.dumps(override)}}
    response = post_json(server.url, f"/v2/repository/models/{model}/load", body)
    return response.status, response.json() if response.body else None


def thread_count(server: ServerProcess) -> int:
    assert server.process is not None
    return len(os.listdir(f"/proc/{server.process.pid}/task"))


# ------------------------------------------------------------------ warmup failures

@pytest.mark.parametrize("model", list(WARMUP_FAILURES))
def test_a_model_whose_warmup_fails_is_unavailable_with_the_reason(
        server: ServerProcess, model: str) -> None:
    says = WARMUP_FAILURES[model][2]
    row = index(server)[model]
    assert row["state"] == "UNAVAILABLE", row
    assert f"model {model!r}: warmup 'w'" in row["reason"] and says in row["reason"], row
    assert request(server.url, "GET", f"/v2/models/{model}/ready").status == 503
    status, doc = infer_row(server, model)
    assert status == 503 and "not ready" in doc["error"] and says in doc["error"], doc
    metadata = request(server.url, "GET", f"/v2/models/{model}")
    assert metadata.status == 503 and "warmup 'w'" in metadata.json()["error"]
    # the server started, and the model next to it serves
    assert request(server.url, "GET", "/v2/health/ready").status == 200
    assert_serves(server, "good", 1.0)


@pytest.mark.parametrize("model", list(WARMUP_FAILURES))
def test_loading_a_model_whose_warmup_fails_is_a_400_and_it_stays_unavailable(
        server: ServerProcess, model: str) -> None:
    status, doc = load(server, model)
    assert status == 400, doc
    assert "warmup 'w'" in doc["error"] and WARMUP_FAILURES[model][2] in doc["error"]
    row = index(server)[model]
    assert row["state"] == "UNAVAILABLE" and "warmup 'w'" in row["reason"], row
    assert_serves(server, "good", 1.0)


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_failed_warmup_releases_its_sessions(server: ServerProcess, repo: Repository) -> None:
    """Each load of ``warmup_threads`` creates 4 sessions of 4 intra-op threads (3 threads
    each) and fails its warmup: a load whose sessions are not released leaves 12 more
    threads in the idle server. The model is added after the start, so the count before
    holds none of its sessions."""
    write_model(repo.root, "warmup_threads", reshape_model(), LEAKY_CONFIG)
    before = thread_count(server)
    seen = []
    for _ in range(8):
        status, doc = load(server, "warmup_threads")
        assert status == 400 and "cannot be reshaped" in doc["error"], doc
        seen.append(thread_count(server))
    # one more worker thread for the loads at most; a leaked load is 12
    assert max(seen) <= before + 2, (before, seen)
    assert index(server)["warmup_threads"]["state"] == "UNAVAILABLE"
    assert_serves(server, "good", 1.0)


def test_a_model_added_later_whose_warmup_fails_is_unavailable(
        server: ServerProcess, repo: Repository) -> None:
    write_model(repo.root, "late_dtype", add_constant_model(1.0),
                config("late_dtype", warmup(data_type="TYPE_FP64")))
    assert index(server)["late_dtype"]["reason"] == "not loaded"
    status, doc = load(server, "late_dtype")
    assert status == 400 and "tensor(double)" in doc["error"], doc
    row = index(server)["late_dtype"]
    assert row["state"] == "UNAVAILABLE" and "warmup 'w' failed" in row["reason"], row
    assert request(server.url, "GET", "/v2/models/late_dtype/ready").status == 503
    assert_serves(server, "good", 1.0)


def test_a_reload_whose_warmup_fails_leaves_the_serving_version(server: ServerProcess) -> None:
    """A config sent with ``load`` whose warmup the model rejects fails that load; the
    version loaded before goes on serving (as any failed reload)."""
    override = {"max_batch_size": 8,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}],
                "model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {
                    "data_type": "TYPE_INT32", "dims": [4], "zero_data": True}}}]}
    status, doc = load(server, "good", override)
    assert status == 400 and "warmup 'w' failed" in doc["error"], doc
    assert index(server)["good"]["state"] == "READY"
    assert request(server.url, "GET", "/v2/models/good/ready").status == 200
    assert_serves(server, "good", 1.0)


# ------------------------------------------------------------------ symbolic links

def test_an_operator_symlink_to_a_shared_cache_loads(server: ServerProcess) -> None:
    """``linked/1/model.onnx`` and ``linked/warmup/row.bin`` are links into a cache
    outside the repository; ``linked_version/1`` is a linked version directory."""
    rows = index(server)
    for model in ("linked", "linked_version"):
        assert rows[model]["state"] == "READY", rows[model]
        assert request(server.url, "GET", f"/v2/models/{model}/ready").status == 200
        assert_serves(server, model, SHARED_CONSTANT)


@pytest.mark.parametrize(("model", "field"), [
    ("escape_dotdot", "default_model_filename"),
    ("escape_absolute", "default_model_filename"),
    ("escape_warmup", "input_data_file"),
])
def test_a_config_file_naming_a_path_out_of_its_model_is_refused(
        server: ServerProcess, model: str, field: str) -> None:
    row = index(server)[model]
    assert row["state"] == "UNAVAILABLE", row
    assert field in row["reason"] and "outside the model directory" in row["reason"], row
    status, doc = load(server, model)
    assert status == 400 and "outside the model directory" in doc["error"], doc


@pytest.mark.parametrize("override", [
    {"default_model_filename": "alias.onnx"},  # the operator's link, named by a client
    {"default_model_filename": "cachedir/add.onnx"},  # through a linked directory
    {"default_model_filename": "../../../cache/add.onnx"},
    {"default_model_filename": "ABSOLUTE"},
    {"model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {
        "data_type": "TYPE_FP32", "dims": [4], "input_data_file": "row.bin"}}}]},
], ids=["link", "linked-directory", "dotdot", "absolute", "warmup-link"])
def test_a_config_sent_with_load_cannot_follow_a_link_out(
        server: ServerProcess, repo: Repository, override: dict[str, Any]) -> None:
    if override.get("default_model_filename") == "ABSOLUTE":
        override = {"default_model_filename": str(repo.cache / "add.onnx")}
    status, doc = load(server, "linked", {"max_batch_size": 8, **override})
    assert status == 400, doc
    assert "outside the model directory" in doc["error"], doc
    assert index(server)["linked"]["state"] == "READY"
    assert_serves(server, "linked", SHARED_CONSTANT)


def test_a_config_sent_with_load_uses_the_operators_files(server: ServerProcess) -> None:
    """A config sent with ``load`` that names no file, or a plain file inside the model,
    loads the operator's linked model file."""
    overrides = [
        {"max_batch_size": 2, "instance_group": [{"count": 2, "kind": "KIND_CPU"}]},
        {"max_batch_size": 2, "model_warmup": [{"name": "w", "batch_size": 1, "inputs": {
            "INPUT0": {"data_type": "TYPE_FP32", "dims": [4],
                       "input_data_file": "inside.bin"}}}]},
    ]
    try:
        for override in overrides:
            status, doc = load(server, "linked", override)
            assert status == 200, doc
            config = request(server.url, "GET", "/v2/models/linked/config").json()
            assert config["max_batch_size"] == 2
            assert_serves(server, "linked", SHARED_CONSTANT)
    finally:
        status, doc = load(server, "linked")
        assert status == 200, doc
    assert request(server.url, "GET", "/v2/models/linked/config").json()["max_batch_size"] == 8
