"""The backend registry: built-in backends, config resolution, a new backend added as
one module, and clear errors when a backend is missing."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path

import numpy as np
import pytest

from tradeoff.backends.registry import BUILTIN_MODULES, BackendRegistry, default_registry
from tradeoff.errors import ConfigError, ModelLoadError
from tradeoff.protocol.v2 import TensorInput, V2Request
from tradeoff.repository.repository import ModelRepository
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.models import ModelManager

SOURCE = "models/m/config.pbtxt"


def test_builtin_backends() -> None:
    registry = default_registry()
    onnx = registry.tensor("onnxruntime")
    assert onnx.platforms == ("onnxruntime_onnx",) and onnx.default_filename == "model.onnx"
    assert registry.resolve("", "", SOURCE) is onnx  # neither named: the first one
    assert registry.resolve("", "onnxruntime_onnx", SOURCE) is onnx
    assert registry.resolve("onnxruntime", "onnxruntime_onnx", SOURCE) is onnx


@pytest.mark.parametrize(("backend", "platform", "field", "says"), [
    ("python", "", "backend", "tradeoff serves onnxruntime"),
    ("", "tensorrt_plan", "platform", "tradeoff serves onnxruntime_onnx"),
    ("onnxruntime", "tensorflow_savedmodel", "platform", "does not match backend"),
])
def test_a_config_naming_no_served_backend_is_refused(backend: str, platform: str,
                                                       field: str, says: str) -> None:
    with pytest.raises(ConfigError) as info:
        default_registry().resolve(backend, platform, SOURCE)
    assert info.value.field == field and says in str(info.value)


def test_generative_formats() -> None:
    pytest.importorskip("torch")
    registry = default_registry()
    assert registry.generative("hf").name == "llama" and registry.generative("gguf").name == "llama"
    with pytest.raises(ModelLoadError, match="no backend reads generative format 'onnx'"):
        registry.generative("onnx")


def test_a_module_that_cannot_be_imported_is_named() -> None:
    registry = BackendRegistry(
        modules={"tensor": ("tradeoff.backends.onnxruntime", "no_such_backend")},
        entry_points=False)
    assert registry.tensor_names() == ["onnxruntime"]
    with pytest.raises(ModelLoadError, match="no_such_backend: ModuleNotFoundError"):
        registry.tensor("echo")


ECHO_BACKEND = '''
    """A backend for tests: y = x, read from a text file naming the tensor."""
    from pathlib import Path

    from tradeoff.backends.base import Backend, TensorSpec
    from tradeoff.backends.registry import InstanceSpec, TensorBackendType


    def describe(path: Path):
        name = path.read_text().strip()
        return [TensorSpec(name, "FP32", (-1, 3))], [TensorSpec("echo", "FP32", (-1, 3))]


    class Echo(Backend):
        def __init__(self, spec: InstanceSpec) -> None:
            self.spec = spec

        def run(self, inputs, output_names):
            return {"echo": next(iter(inputs.values())) * float(self.spec.parameters["gain"])}


    BACKEND = TensorBackendType(name="echo", platforms=("echo_text",),
                                default_filename="model.txt", describe=describe, create=Echo)
'''


def test_a_new_backend_is_one_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A module declaring BACKEND serves a model from the repository, with batching,
    through the same data plane as the built-in backends."""
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "echo_backend.py").write_text(textwrap.dedent(ECHO_BACKEND))
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    model = tmp_path / "repo" / "echo"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.txt").write_text("x\n")
    (model / "config.pbtxt").write_text('platform: "echo_text"\nmax_batch_size: 4\n'
                                        'dynamic_batching { }\n'
                                        'parameters { key: "gain" value: { string_value: "2" } }\n')
    registry = BackendRegistry(modules={"tensor": (*BUILTIN_MODULES["tensor"], "echo_backend")},
                               entry_points=False)
    repository = ModelRepository(tmp_path / "repo", backends=registry)
    source = repository.read("echo")
    assert (source.config.backend, source.config.default_model_filename) == ("echo", "model.txt")
    assert [t.name for t in source.config.inputs] == ["x"]

    async def serve_one() -> np.ndarray:
        manager = ModelManager(repository)
        await manager.load("echo")
        try:
            x = np.arange(6, dtype=np.float32).reshape(2, 3)
            _, _, outputs = await DataPlane(manager).infer(
                "echo", None, V2Request(None, [TensorInput("x", "FP32", (2, 3), x)], None))
            return outputs[0].array
        finally:
            await manager.close()

    np.testing.assert_array_equal(asyncio.run(serve_one()),
                                  np.arange(6, dtype=np.float32).reshape(2, 3) * 2)


def test_a_tensor_server_does_not_import_torch(tmp_path: Path) -> None:
    """Generative backends are imported only when a generative model asks for one:
    importing torch slows a tensor server down."""
    import subprocess
    import sys

    code = ("import sys; from tradeoff.backends.registry import BackendRegistry; "
            "r = BackendRegistry(); r.resolve('', '', 'x'); r.tensor('onnxruntime'); "
            "print('torch' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_a_backend_from_an_installed_package(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A package names its backend under the entry point group; both forms load:
    ``module`` and ``module:BACKEND``; one that fails is named, not fatal."""
    (tmp_path / "echo_backend.py").write_text(textwrap.dedent(ECHO_BACKEND))
    info = tmp_path / "echo_backend-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-backend\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[tradeoff.backends.tensor]\necho = echo_backend:BACKEND\n"
        "broken = echo_backend:NOTHING\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = BackendRegistry()
    assert registry.tensor("echo").platforms == ("echo_text",)
    assert "onnxruntime" in registry.tensor_names()
    assert "echo_backend:NOTHING" in registry.failures["tensor"]
