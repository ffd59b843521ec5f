"""`tradeoff optimize` on real ONNX models: every path makes a version the repository
loads and the server serves, and the report grades it against the original."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.integration.helpers import infer_json, post_json, request, running_server
from tradeoff.backends.registry import InstanceSpec, default_registry
from tradeoff.errors import OptimizeError
from tradeoff.models import build_repository
from tradeoff.optimize import OptimizePlan, Variant, optimize_model
from tradeoff.repository.repository import ModelRepository
from tradeoff.results import OptimizeResult, load_result
from tradeoff.server.process import ServerProcess

ALL_PATHS = (Variant("int8-dynamic"), Variant("int8-dynamic", per_channel=True),
             Variant("int8-static", per_channel=True), Variant("fp16"), Variant("graph-opt"))


@pytest.fixture(scope="module")
def optimized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, OptimizeResult]:
    root = tmp_path_factory.mktemp("optimize")
    build_repository(root, ("mlp", "tiny"))
    result = optimize_model(root / "mlp", OptimizePlan(ALL_PATHS, seconds_per_version=0.2))
    return root, result


def test_each_quantization_path_makes_a_version_that_loads_and_runs(
        optimized: tuple[Path, OptimizeResult]) -> None:
    root, _ = optimized
    source = ModelRepository(root).read("mlp")
    assert sorted(source.versions) == [1, 2, 3, 4, 5, 6]
    x = np.random.default_rng(0).standard_normal((3, 256)).astype(np.float32)
    outputs = {}
    for version, path in source.versions.items():
        backend = default_registry().tensor("onnxruntime").create(InstanceSpec("mlp", path))
        outputs[version] = backend.run({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        backend.close()
    for version in (2, 3, 4, 5, 6):
        assert outputs[version].shape == (3, 10)
        assert not np.array_equal(outputs[version], np.zeros_like(outputs[version]))
    np.testing.assert_allclose(outputs[6], outputs[1], rtol=1e-4, atol=1e-4)  # graph-opt
    params = source.config.parameters
    assert params["version_2_precision"] == "int8"
    assert params["version_4_method"].startswith("int8-static; per-channel")
    assert params["version_5_precision"] == "fp16"
    assert "from version 1" in params["version_6_method"]


def test_the_report_grades_each_version_against_the_original(
        optimized: tuple[Path, OptimizeResult]) -> None:
    _, result = optimized
    assert [v.version for v in result.versions] == [1, 2, 3, 4, 5, 6]
    assert [v.precision for v in result.versions] == ["fp32", "int8", "int8", "int8",
                                                      "fp16", "fp32"]
    original = result.original
    assert original.accuracy == [] and not original.created
    for v in result.versions[1:]:
        assert v.created
        (graded,) = v.accuracy
        assert graded.output == "OUTPUT0" and graded.kind == "tensor"
        assert graded.samples == result.validation["samples"] == 64
        assert v.latency_ms["p50"] > 0 and set(v.throughput_by_batch) == {
            1, 2, 4, 8, 16, 32, 64}
    int8, fp16, graph = result.versions[1], result.versions[4], result.versions[5]
    assert int8.size_bytes < original.size_bytes / 3  # weights in one byte instead of four
    assert fp16.size_bytes < original.size_bytes * 0.6
    assert graph.drop < 1e-4 and fp16.drop < 0.01
    assert int8.drop > 0  # quantization changes the answer; how much is what is reported
    document = json.loads(json.dumps(result.to_dict()))
    assert document["schema"] == "tradeoff.optimize/1"
    assert document["versions"][1]["over_max_drop"] == (int8.drop > result.max_drop)
    assert load_result(document).to_dict() == result.to_dict()


def test_the_server_serves_the_new_versions_beside_the_original(
        optimized: tuple[Path, OptimizeResult]) -> None:
    root, _ = optimized
    x = np.random.default_rng(1).standard_normal((2, 256)).astype(np.float32)
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 256],
               "data": x.ravel().tolist()}]
    server_gen: Iterator[ServerProcess] = running_server(root)
    server = next(server_gen)
    try:
        answers = {}
        for version in ("1", "2", "5"):
            response = infer_json(server.url, "mlp", inputs, version=version)
            assert response.status == 200, response.body
            assert response.json()["model_version"] == version
            answers[version] = np.array(response.json()["outputs"][0]["data"])
        assert not np.array_equal(answers["1"], answers["2"])
        config = request(server.url, "GET", "/v2/models/mlp/config").json()
        assert config["parameters"]["version_2_precision"] == {"string_value": "int8"}
    finally:
        next(server_gen, None)


def test_a_model_with_nothing_to_quantize_says_so(
        optimized: tuple[Path, OptimizeResult]) -> None:
    root, _ = optimized
    with pytest.raises(OptimizeError, match="no MatMul, Gemm, Conv node to quantize"):
        optimize_model(root / "tiny", OptimizePlan((Variant("int8-dynamic"),)))
    assert sorted(p.name for p in (root / "tiny").iterdir() if p.is_dir()) == ["1"]


def _tradeoff(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tradeoff", *args], capture_output=True,
                          text=True, timeout=300, check=False)


def test_the_command_writes_the_table_and_json_and_user_mistakes_are_one_line(
        tmp_path: Path) -> None:
    build_repository(tmp_path, ("mlp",))
    np.save(tmp_path / "bad.npy", np.ones((4, 255), np.float32))
    run = _tradeoff("optimize", str(tmp_path / "mlp"), "--int8", "dynamic",
                    "--validation", str(tmp_path / "bad.npy"))
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "input 'INPUT0' is [4, 255]; expected [N, 256]" in run.stderr
    assert not (tmp_path / "mlp" / "2").exists()  # checked before anything is made
    run = _tradeoff("optimize", str(tmp_path / "mlp"), "--int8", "static", "--calibration",
                    str(tmp_path / "missing.npz"))
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert "--calibration" in run.stderr and "no such file" in run.stderr
    run = _tradeoff("optimize", str(tmp_path / "mlp"))
    assert run.returncode == 2
    assert "--int8 dynamic|static, --fp16, --bf16 or --graph-opt" in run.stderr
    np.save(tmp_path / "good.npy", np.ones((4, 256), np.float32))
    out = tmp_path / "opt.json"
    run = _tradeoff("optimize", str(tmp_path / "mlp"), "--int8", "dynamic", "--per-channel",
                    "--validation", str(tmp_path / "good.npy"), "--seconds", "0.2",
                    "--json", str(out))
    assert run.returncode == 0, run.stderr
    assert "mlp: versions in process" in run.stdout and "int8" in run.stdout
    assert f"optimize result: {out}" in run.stdout.replace("\n", "")
    document = load_result(out)
    assert isinstance(document, OptimizeResult)
    assert document.validation == {"source": str(tmp_path / "good.npy"), "samples": 4}


def test_a_generative_model_gets_a_sibling_per_precision_that_the_server_serves(
        tmp_path: Path) -> None:
    pytest.importorskip("torch")
    build_repository(tmp_path, ("tinyllama",))
    with pytest.raises(OptimizeError, match="--fp16, --graph-opt, --int8 static"):
        optimize_model(tmp_path / "tinyllama", OptimizePlan((Variant("fp16"),)))
    result = optimize_model(tmp_path / "tinyllama", OptimizePlan(
        (Variant("int8-dynamic"), Variant("bf16")), seconds_per_version=0.3))
    assert [(v.model, v.precision, v.created) for v in result.versions] == [
        ("tinyllama", "fp32", False), ("tinyllama-int8", "int8", True),
        ("tinyllama-bf16", "bf16", True)]
    for v in result.versions[1:]:
        (graded,) = v.accuracy
        assert graded.kind == "generative" and graded.samples > 100
        assert 0 <= graded.metrics["greedy_agreement"] <= 1
        assert graded.drop == pytest.approx(1 - graded.metrics["greedy_agreement"])
        assert graded.metrics["perplexity"] > 1 and v.size_bytes < result.original.size_bytes
        assert set(v.throughput_by_batch) == {1, 2, 4, 8}  # up to max_num_seqs
    assert load_result(result.to_dict()).to_dict() == result.to_dict()
    import yaml

    sibling = yaml.safe_load((tmp_path / "tinyllama-int8" / "generate.yaml").read_text())
    assert sibling["precision"] == "int8"
    assert Path(sibling["path"]) == (tmp_path / "tinyllama" / "1").resolve()
    server_gen: Iterator[ServerProcess] = running_server(tmp_path)
    server = next(server_gen)
    try:
        for model in ("tinyllama", "tinyllama-int8", "tinyllama-bf16"):
            response = post_json(server.url, "/v1/completions", {
                "model": model, "prompt": "hello", "max_tokens": 4, "temperature": 0})
            assert response.status == 200, response.body
            assert response.json()["usage"]["completion_tokens"] == 4
    finally:
        next(server_gen, None)
