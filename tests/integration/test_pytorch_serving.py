"""The ``pytorch`` backend in a real `tradeoff serve`: a small BERT-shaped encoder as
TorchScript (``model.pt``, ``pytorch_libtorch``) and as a torch.export program
(``model.pt2``, ``torch_export``), and a small ResNet-shaped classifier. Answers are
checked against eager PyTorch in this process on the same module (same seed, same
weights); Triton's tensor naming rules, dynamic batching, two CPU instances, the official
tritonclient (HTTP and gRPC) and perf_analyzer, reduced precision, and the configs and
files that must fail to load, each with a one-line reason, while the rest keep serving."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tradeoff.models.torch_models import (
    EncoderShape,
    ResNetShape,
    encoder_module,
    resnet_module,
    write_encoder,
    write_resnet,
)
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, post_json, request, running_server
from .test_batching_stats import together

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.integration

SHAPE = EncoderShape(vocab=100, hidden=32, layers=2, heads=4, intermediate=64, sequence=16,
                     max_batch=8)
RESNET = ResNetShape(blocks=(1, 1), width=8, classes=10, image=32, max_batch=4)
PERF_ANALYZER = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "perf_analyzer"
RTOL, ATOL = 1e-4, 1e-5

GOOD = ("enc_ts", "enc_ex", "enc_named", "enc_two", "enc_bf16", "res_ts")
# model -> what its one-line reason must say (besides the model's own name or path)
BROKEN = {
    "enc_unbound": ("do not bind one to one", "'tokens'", "'mask'", "'segments'",
                    "'input_ids'", "'attention_mask'"),
    "enc_untyped": ("list every input",),
    "enc_gpu": ("KIND_GPU", "sees no CUDA device"),
    "enc_damaged": ("model.pt", "not a readable TorchScript model"),
    "enc_badprec": ("parameters.precision", "'fp8'"),
}


TWO_INPUTS = ('{ name: "INPUT__0" data_type: TYPE_INT64 dims: [ 16 ] },\n'
              '  { name: "INPUT__1" data_type: TYPE_INT64 dims: [ 16 ] }')


def tensors_named(*names: str) -> dict[str, str]:
    """A replacement of enc_ts's two inputs by INT64 [16] inputs named ``names``."""
    return {TWO_INPUTS: ",\n  ".join(f'{{ name: "{n}" data_type: TYPE_INT64 dims: [ 16 ] }}'
                                     for n in names)}


def precision(value: str) -> dict[str, str]:
    return {"dynamic_batching": 'parameters { key: "precision" value: { string_value: '
                                f'"{value}" }} }}\ndynamic_batching'}


def variant(root: Path, source: str, name: str, replace: dict[str, str] | None = None, *,
            config: str | None = None) -> Path:
    """A copy of model ``source`` as ``name``: its config renamed and ``replace``d (old ->
    new), or ``config`` instead."""
    directory = root / name
    shutil.copytree(root / source, directory)
    text = config if config is not None else \
        (directory / "config.pbtxt").read_text().replace(f'"{source}"', f'"{name}"')
    for old, new in (replace or {}).items():
        assert old in text, (old, text)
        text = text.replace(old, new)
    (directory / "config.pbtxt").write_text(text)
    return directory


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pytorch_models")
    write_encoder(root, "enc_ts", SHAPE)
    write_encoder(root, "enc_ex", SHAPE, exported=True)
    write_resnet(root, "res_ts", RESNET)
    # the forward's own argument names, listed in the other order: bound by name
    variant(root, "enc_ts", "enc_named", tensors_named("attention_mask", "input_ids"))
    variant(root, "enc_ts", "enc_two", {"count: 1": "count: 2"})
    variant(root, "enc_ts", "enc_bf16", precision("bf16"))
    # three names that are neither INPUT__i nor the forward's, for two arguments
    variant(root, "enc_ts", "enc_unbound", tensors_named("tokens", "mask", "segments"))
    variant(root, "enc_ts", "enc_untyped",
            config='name: "enc_untyped"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n')
    variant(root, "enc_ts", "enc_gpu", {"KIND_CPU": "KIND_GPU"})
    damaged = variant(root, "enc_ts", "enc_damaged")
    (damaged / "1" / "model.pt").write_bytes(np.random.default_rng(7).bytes(4096))
    variant(root, "enc_ts", "enc_badprec", precision("fp8"))
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo)


@pytest.fixture(scope="module")
def eager() -> Any:
    return encoder_module(SHAPE)


def encoder_inputs(rows: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Token ids and a mask with some padding at the end of each row but the first."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(0, SHAPE.vocab, (rows, SHAPE.sequence), dtype=np.int64)
    mask = np.ones((rows, SHAPE.sequence), np.int64)
    for row in range(1, rows):
        mask[row, SHAPE.sequence - row % SHAPE.sequence:] = 0
    return ids, mask


def reference(module: Any, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
    with torch.inference_mode():
        return module(torch.from_numpy(ids), torch.from_numpy(mask)).numpy()


def json_tensor(name: str, array: np.ndarray) -> dict[str, Any]:
    datatype = {np.dtype(np.int64): "INT64", np.dtype(np.float32): "FP32"}[array.dtype]
    return {"name": name, "datatype": datatype, "shape": list(array.shape),
            "data": array.ravel().tolist()}


def infer_encoder(server: ServerProcess, model: str, ids: np.ndarray, mask: np.ndarray,
                  names: tuple[str, str] = ("INPUT__0", "INPUT__1")) -> np.ndarray:
    response = infer_json(server.url, model, [json_tensor(names[0], ids),
                                              json_tensor(names[1], mask)])
    assert response.status == 200, response.body
    [output] = response.json()["outputs"]
    assert output["name"] == "OUTPUT__0" and output["datatype"] == "FP32", output
    assert output["shape"] == [len(ids), SHAPE.hidden], output
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    response = post_json(server.url, "/v2/repository/index", {})
    assert response.status == 200, response.body
    return {row["name"]: row for row in response.json()}


def stats(server: ServerProcess, model: str) -> dict[str, Any]:
    response = request(server.url, "GET", f"/v2/models/{model}/stats")
    assert response.status == 200, response.body
    [entry] = response.json()["model_stats"]
    return entry


# -- 1. both formats load, describe themselves and answer as eager PyTorch -------------


@pytest.mark.parametrize("model,platform,names", [
    ("enc_ts", "pytorch_libtorch", ("INPUT__0", "INPUT__1")),
    ("enc_ex", "torch_export", ("input_ids", "attention_mask"))])
def test_encoder_formats_are_ready_described_and_match_eager(
        server: ServerProcess, eager: Any, model: str, platform: str,
        names: tuple[str, str]) -> None:
    rows = index(server)
    assert rows[model]["state"] == "READY", rows[model]
    response = request(server.url, "GET", f"/v2/models/{model}")
    assert response.status == 200, response.body
    metadata = response.json()
    assert metadata["name"] == model and metadata["platform"] == platform, metadata
    assert metadata["inputs"] == [
        {"name": name, "datatype": "INT64", "shape": [-1, SHAPE.sequence]} for name in names]
    assert metadata["outputs"] == [
        {"name": "OUTPUT__0", "datatype": "FP32", "shape": [-1, SHAPE.hidden]}]

    ids, mask = encoder_inputs(5)
    np.testing.assert_allclose(infer_encoder(server, model, ids, mask, names),
                               reference(eager, ids, mask), rtol=RTOL, atol=ATOL)
    one = infer_encoder(server, model, ids[3:4], mask[3:4], names)  # padded row alone
    np.testing.assert_allclose(one, reference(eager, ids[3:4], mask[3:4]),
                               rtol=RTOL, atol=ATOL)


# -- 2. Triton's naming rules ----------------------------------------------------------


def test_inputs_named_like_the_forwards_arguments_bind_by_name(
        server: ServerProcess, eager: Any) -> None:
    """enc_named lists attention_mask first: binding by position would swap them."""
    assert index(server)["enc_named"]["state"] == "READY"
    ids, mask = encoder_inputs(4, seed=1)
    response = infer_json(server.url, "enc_named", [json_tensor("attention_mask", mask),
                                                    json_tensor("input_ids", ids)])
    assert response.status == 200, response.body
    [output] = response.json()["outputs"]
    got = np.asarray(output["data"], np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, reference(eager, ids, mask), rtol=RTOL, atol=ATOL)


def test_unbindable_input_names_fail_with_a_one_line_reason_and_others_serve(
        server: ServerProcess, eager: Any) -> None:
    reason = index(server)["enc_unbound"]
    assert reason["state"] == "UNAVAILABLE", reason
    for says in BROKEN["enc_unbound"]:
        assert says in reason["reason"], reason
    loaded = post_json(server.url, "/v2/repository/models/enc_unbound/load", {})
    assert loaded.status == 400, loaded.body
    error = loaded.json()["error"]
    assert "\n" not in error and "do not bind one to one" in error, error
    assert "['tokens', 'mask', 'segments']" in error, error
    ids, mask = encoder_inputs(2)
    np.testing.assert_allclose(infer_encoder(server, "enc_ts", ids, mask),
                               reference(eager, ids, mask), rtol=RTOL, atol=ATOL)
    assert index(server)["enc_ts"]["state"] == "READY"


# -- 3. dynamic batching and two instances --------------------------------------------


def row_sender(model: str, ids: np.ndarray, mask: np.ndarray) -> Any:
    """A ``send(client, i)`` for ``together``: row i of ``ids``/``mask`` to ``model``
    through tritonclient, its pooled vector back."""
    def send(client: triton_http.InferenceServerClient, i: int) -> np.ndarray:
        tensors = [triton_http.InferInput("INPUT__0", [1, SHAPE.sequence], "INT64"),
                   triton_http.InferInput("INPUT__1", [1, SHAPE.sequence], "INT64")]
        tensors[0].set_data_from_numpy(ids[i:i + 1])
        tensors[1].set_data_from_numpy(mask[i:i + 1])
        return client.infer(model, tensors).as_numpy("OUTPUT__0")

    return send


def test_concurrent_requests_are_batched_and_each_answered_right(
        server: ServerProcess, eager: Any) -> None:
    count = 32
    ids, mask = encoder_inputs(count, seed=2)
    expected = reference(eager, ids, mask)
    before = stats(server, "enc_ts")

    answers = together(server, count, row_sender("enc_ts", ids, mask))
    for i, answer in enumerate(answers):
        np.testing.assert_allclose(answer, expected[i:i + 1], rtol=RTOL, atol=ATOL,
                                   err_msg=f"request {i}")
    after = stats(server, "enc_ts")
    inferences = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert inferences == count, (before, after)
    assert 1 <= executions < inferences, f"{count} concurrent requests never shared a batch"


def test_two_cpu_instances_load_and_serve(server: ServerProcess, eager: Any) -> None:
    assert index(server)["enc_two"]["state"] == "READY"
    config = request(server.url, "GET", "/v2/models/enc_two/config").json()
    assert [(g["count"], g["kind"]) for g in config["instance_group"]] == [(2, "KIND_CPU")]
    count = 16
    ids, mask = encoder_inputs(count, seed=3)
    expected = reference(eager, ids, mask)

    for i, answer in enumerate(together(server, count, row_sender("enc_two", ids, mask))):
        np.testing.assert_allclose(answer, expected[i:i + 1], rtol=RTOL, atol=ATOL,
                                   err_msg=f"request {i}")
    assert stats(server, "enc_two")["inference_count"] >= count


# -- 4. official clients --------------------------------------------------------------


def test_tritonclient_http_and_grpc_get_the_eager_answer(server: ServerProcess,
                                                         eager: Any) -> None:
    ids, mask = encoder_inputs(3, seed=4)
    expected = reference(eager, ids, mask)
    with triton_http.InferenceServerClient(server.url.removeprefix("http://")) as client:
        assert client.is_model_ready("enc_ex")
        for binary in (True, False):
            tensors = [triton_http.InferInput("input_ids", list(ids.shape), "INT64"),
                       triton_http.InferInput("attention_mask", list(mask.shape), "INT64")]
            tensors[0].set_data_from_numpy(ids, binary_data=binary)
            tensors[1].set_data_from_numpy(mask, binary_data=binary)
            result = client.infer("enc_ex", tensors)
            np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected,
                                       rtol=RTOL, atol=ATOL)
        # the classifier, FP32 images in binary
        images = np.random.default_rng(5).standard_normal(
            (2, 3, RESNET.image, RESNET.image)).astype(np.float32)
        tensor = triton_http.InferInput("INPUT__0", list(images.shape), "FP32")
        tensor.set_data_from_numpy(images)
        logits = client.infer("res_ts", [tensor]).as_numpy("OUTPUT__0")
        with torch.inference_mode():
            want = resnet_module(RESNET)(torch.from_numpy(images)).numpy()
        np.testing.assert_allclose(logits, want, rtol=RTOL, atol=ATOL)
    client = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        assert client.is_model_ready("enc_ts")
        assert [t.name for t in client.get_model_metadata("enc_ts").inputs] == \
            ["INPUT__0", "INPUT__1"]
        tensors = [triton_grpc.InferInput("INPUT__0", list(ids.shape), "INT64"),
                   triton_grpc.InferInput("INPUT__1", list(mask.shape), "INT64")]
        tensors[0].set_data_from_numpy(ids)
        tensors[1].set_data_from_numpy(mask)
        result = client.infer("enc_ts", tensors)
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected,
                                   rtol=RTOL, atol=ATOL)
    finally:
        client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_perf_analyzer_measures_the_encoder(server: ServerProcess, protocol: str) -> None:
    if not PERF_ANALYZER.exists() or not shutil.which("taskset"):
        pytest.skip("perf_analyzer is not installed: run scripts/get_perf_analyzer.sh "
                    "(make test does)")
    url = server.grpc_url if protocol == "grpc" else server.url.removeprefix("http://")
    # zeros: perf_analyzer's random INT64 data would index past the vocabulary
    run = subprocess.run([str(PERF_ANALYZER), "-m", "enc_ts", "-u", url, "-i", protocol,
                          "--input-data", "zero", "--concurrency-range", "2",
                          "--measurement-interval", "1000", "--max-trials", "10",
                          "--stability-percentage", "999"],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    match = re.search(r"Concurrency: 2, throughput: ([\d.]+) infer/sec", run.stdout)
    assert match and float(match.group(1)) > 0, run.stdout


# -- 5. and 6. configs and files that must fail; reduced precision ---------------------


@pytest.mark.parametrize("model", sorted(BROKEN))
def test_a_broken_model_fails_alone_with_a_one_line_reason(server: ServerProcess,
                                                           repo: Path, model: str) -> None:
    rows = index(server)
    row = rows[model]
    assert row["state"] == "UNAVAILABLE", row
    reason = row["reason"]
    assert reason and "\n" not in reason, reason
    assert model in reason or str(repo / model) in reason, reason
    for says in BROKEN[model]:
        assert says in reason, reason
    if model == "enc_damaged":
        assert str(repo / model / "1" / "model.pt") in reason, reason
    loaded = post_json(server.url, f"/v2/repository/models/{model}/load", {})
    assert loaded.status == 400, loaded.body
    error = loaded.json()["error"]
    assert "\n" not in error and all(says in error for says in BROKEN[model]), error
    ids, mask = encoder_inputs(1)
    refused = infer_json(server.url, model, [json_tensor("INPUT__0", ids),
                                             json_tensor("INPUT__1", mask)])
    assert refused.status != 200, refused.body
    assert all(index(server)[good]["state"] == "READY" for good in GOOD)


def test_bf16_precision_serves_close_to_fp32(server: ServerProcess, eager: Any) -> None:
    assert index(server)["enc_bf16"]["state"] == "READY"
    ids, mask = encoder_inputs(6, seed=6)
    got = infer_encoder(server, "enc_bf16", ids, mask)
    want = reference(eager, ids, mask)
    assert np.isfinite(got).all()
    cosine = (got * want).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert (cosine > 0.99).all(), cosine
    assert not np.array_equal(got, want), "bf16 gave fp32's exact numbers: was it applied?"
