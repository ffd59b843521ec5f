"""The pytorch backend in process: Triton's binding rules, its parameters, a failing
batch (a CUDA out-of-memory cannot be caused without a GPU, so its error is raised by a
stand-in module), torch.compile on an exported program, and tune batch-size through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tradeoff import dtypes  # noqa: E402
from tradeoff.backends.pytorch import (  # noqa: E402
    TorchBackend,
    batch_sizes_to_warm,
    check_code_file,
    describe,
    input_positions,
    output_keys,
    torchscript_quietly,
)
from tradeoff.errors import ConfigError, InferenceFailed, ModelLoadError  # noqa: E402
from tradeoff.models.torch_models import EncoderShape, encoder_module, write_encoder  # noqa: E402
from tradeoff.repository.repository import ModelRepository  # noqa: E402

SHAPE = EncoderShape(vocab=1000, hidden=16, layers=1, heads=2, intermediate=32, sequence=8,
                     max_batch=4)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("torch_unit")
    write_encoder(root, "pt", SHAPE)
    write_encoder(root, "pt2", SHAPE, exported=True)
    return root


def instance(repo: Path, name: str, **parameters: str) -> TorchBackend:
    source = ModelRepository(repo).read(name)
    config = source.config
    return TorchBackend(config.instance_spec(
        source.versions[1], intra_op_threads=1,
        parameters={**config.parameters, **parameters}))


def feed(rows: int, names: tuple[str, str] = ("INPUT__0", "INPUT__1")) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    return {names[0]: rng.integers(0, SHAPE.vocab, (rows, SHAPE.sequence)),
            names[1]: np.ones((rows, SHAPE.sequence), np.int64)}


def eager(rows: int) -> np.ndarray:
    with torch.inference_mode():
        return encoder_module(SHAPE)(*(torch.from_numpy(a) for a in feed(rows).values())).numpy()


def test_inputs_bind_by_index_suffix_then_by_forward_name_then_in_config_order() -> None:
    forward = ["input_ids", "attention_mask"]
    assert input_positions(["B__1", "A__0"], forward, "m") == [1, 0]
    assert input_positions(["attention_mask", "input_ids"], forward, "m") == [1, 0]
    assert input_positions(["x", "y"], forward, "m") == [0, 1]
    with pytest.raises(ConfigError, match="do not bind one to one"):
        input_positions(["x", "y", "z"], forward, "m")
    with pytest.raises(ConfigError, match="do not bind one to one"):
        input_positions(["A__0", "B__0"], forward, "m")


def test_outputs_are_found_by_index_suffix_or_in_config_order() -> None:
    assert output_keys(["OUTPUT__1", "OUTPUT__0"]) == [1, 0]
    assert output_keys(["logits", "pooled"]) == [0, 1]


def test_a_compiled_model_is_warmed_at_every_batch_size_the_batcher_forms() -> None:
    assert batch_sizes_to_warm(0) == [1]
    assert batch_sizes_to_warm(6) == [1, 2, 4, 6]
    assert batch_sizes_to_warm(8) == [1, 2, 4, 8]


def test_an_exported_program_says_its_tensors_and_torchscript_does_not(repo: Path) -> None:
    described = describe(repo / "pt2" / "1" / "model.pt2")
    assert described is not None
    inputs, outputs = described
    assert [(t.name, t.datatype, t.shape) for t in inputs] == [
        ("input_ids", "INT64", (-1, SHAPE.sequence)),
        ("attention_mask", "INT64", (-1, SHAPE.sequence))]
    assert [(t.name, t.datatype, t.shape) for t in outputs] == [
        ("OUTPUT__0", "FP32", (-1, SHAPE.hidden))]
    assert describe(repo / "pt" / "1" / "model.pt") is None
    assert dtypes.from_torch_name("bfloat16") == "BF16"
    assert dtypes.from_torch_name("complex64") is None


def test_both_formats_answer_like_eager_pytorch(repo: Path) -> None:
    np.testing.assert_allclose(instance(repo, "pt").run(feed(3), ["OUTPUT__0"])["OUTPUT__0"],
                               eager(3), rtol=1e-5, atol=1e-6)
    exported = instance(repo, "pt2").run(feed(3, ("input_ids", "attention_mask")),
                                         ["OUTPUT__0"])["OUTPUT__0"]
    np.testing.assert_allclose(exported, eager(3), rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["pt", "pt2"])
def test_on_a_cuda_device_both_formats_answer_like_eager_on_the_cpu(repo: Path,
                                                                     name: str) -> None:
    source = ModelRepository(repo).read(name)
    config = source.config
    on_gpu = TorchBackend(config.instance_spec(source.versions[1], intra_op_threads=1,
                                               kind="KIND_GPU", device_id=0,
                                               parameters=dict(config.parameters)))
    assert on_gpu.device.type == "cuda"
    names = ("INPUT__0", "INPUT__1") if name == "pt" else ("input_ids", "attention_mask")
    got = on_gpu.run(feed(3, names), ["OUTPUT__0"])["OUTPUT__0"]
    np.testing.assert_allclose(got, eager(3), rtol=1e-3, atol=1e-4)  # TF32 matmuls


@pytest.mark.parametrize(("precision", "mode"), [("bf16", "cast"), ("bf16", "autocast"),
                                                 ("fp16", "cast")])
def test_reduced_precision_answers_in_fp32_close_to_fp32(repo: Path, precision: str,
                                                         mode: str) -> None:
    got = instance(repo, "pt", precision=precision, precision_mode=mode).run(
        feed(4), ["OUTPUT__0"])["OUTPUT__0"]
    want = eager(4)
    assert got.dtype == np.float32 and not np.array_equal(got, want)
    cosine = (got * want).sum(1) / np.linalg.norm(got, axis=1) / np.linalg.norm(want, axis=1)
    assert cosine.min() > 0.99


@pytest.mark.parametrize(("field", "value"), [("precision", "fp8"),
                                              ("precision_mode", "dynamic"),
                                              ("compile", "fastest")])
def test_an_unknown_parameter_value_is_refused_by_name(repo: Path, field: str,
                                                       value: str) -> None:
    with pytest.raises(ConfigError, match=f"parameters.{field}"):
        instance(repo, "pt", **{field: value})


def test_torch_compile_needs_an_exported_program(repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"torch\.export program"):
        instance(repo, "pt", compile="default")


class RunsOutOfMemory:
    """A module that fails as PyTorch does when a batch is larger than ``rows``."""

    def __init__(self, module: object, rows: int, error: type[Exception],
                 message: str) -> None:
        self.module, self.rows, self.error, self.message = module, rows, error, message

    def __call__(self, *args: object) -> object:
        if args[0].shape[0] > self.rows:  # type: ignore[attr-defined]
            raise self.error(self.message)
        return self.module(*args)  # type: ignore[operator]


@pytest.mark.parametrize(("error", "message"), [
    (torch.cuda.OutOfMemoryError, "CUDA out of memory. Tried to allocate 2.00 GiB"),
    # the TorchScript interpreter re-raises it as a RuntimeError with a traceback
    (RuntimeError, "The following operation failed in the TorchScript interpreter.\n"
                   "RuntimeError: CUDA out of memory. Tried to allocate 256.00 MiB."),
])
def test_out_of_memory_fails_that_batch_alone(repo: Path, monkeypatch: pytest.MonkeyPatch,
                                               error: type[Exception], message: str) -> None:
    backend = instance(repo, "pt")
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    backend.module = RunsOutOfMemory(backend.module, 2, error, message)
    with pytest.raises(InferenceFailed) as failed:
        backend.run(feed(4), ["OUTPUT__0"])
    text = str(failed.value)
    assert "out of memory" in text and "batch of 4" in text and "\n" not in text
    np.testing.assert_allclose(backend.run(feed(2), ["OUTPUT__0"])["OUTPUT__0"], eager(2),
                               rtol=1e-5, atol=1e-6)


def test_another_runtime_error_is_not_taken_for_out_of_memory(repo: Path) -> None:
    backend = instance(repo, "pt")
    backend.module = RunsOutOfMemory(backend.module, 0, RuntimeError, "shape mismatch")
    with pytest.raises(RuntimeError, match="shape mismatch"):
        backend.run(feed(1), ["OUTPUT__0"])


@pytest.mark.slow
def test_torch_compile_warms_up_and_answers_like_eager(repo: Path) -> None:
    backend = instance(repo, "pt2", compile="default")
    assert backend.compile_seconds is not None and backend.compile_seconds > 0
    got = backend.run(feed(2, ("input_ids", "attention_mask")), ["OUTPUT__0"])["OUTPUT__0"]
    np.testing.assert_allclose(got, eager(2), rtol=1e-4, atol=1e-5)


def test_tune_batch_size_runs_through_the_pytorch_backend(repo: Path) -> None:
    from tradeoff.tune.batch_size import BatchSizePlan, tune_batch_size

    result = tune_batch_size(repo / "pt", BatchSizePlan(seconds_per_batch=0.05, max_batch=16))
    assert result.recommended >= 1
    # the search doubles from 1 (where it stops moves with the machine's load: beside
    # the parallel tests, batch 2 once gained too little and the search stopped there)
    doubling = [p.batch_size for p in result.points if p.role == "doubling"]
    assert doubling[:2] == [1, 2] and doubling == [2 ** i for i in range(len(doubling))]
    assert all(p.error is None for p in result.points)
    assert result.memory.weights_bytes >= 0


@pytest.mark.parametrize("name", ["pt", "pt2"])
def test_optimize_writes_fp16_and_bf16_versions_that_load_and_are_graded(
        tmp_path: Path, name: str) -> None:
    """Each version a file of 16-bit weights in the source's own form; the FP32 config
    serves them all (FP32 in and out), and each is graded against version 1."""
    from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
    from tradeoff.optimize.variants import Variant

    write_encoder(tmp_path, name, SHAPE, exported=name == "pt2")
    result = optimize_model(tmp_path / name, OptimizePlan(
        variants=(Variant("fp16"), Variant("bf16")), seconds_per_version=0.2))
    assert [(v.version, v.precision, v.created) for v in result.versions] == [
        (1, "fp32", False), (2, "fp16", True), (3, "bf16", True)]
    assert "torch" in result.environment
    for report in result.versions[1:]:
        assert "the weights cast once" in report.method
        [graded] = report.accuracy
        assert graded.samples > 0 and graded.drop < 0.05, graded
    source = ModelRepository(tmp_path).read(name)
    assert sorted(source.versions) == [1, 2, 3]
    names = tuple(t.name for t in source.config.inputs)
    for version in (2, 3):
        backend = TorchBackend(source.config.instance_spec(source.versions[version],
                                                           intra_op_threads=1))
        got = backend.run(feed(3, names), ["OUTPUT__0"])["OUTPUT__0"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, eager(3), atol=0.05)


def test_optimize_refuses_int8_for_a_pytorch_model_and_says_why(tmp_path: Path) -> None:
    from tradeoff.errors import OptimizeError
    from tradeoff.optimize.optimizer import OptimizePlan, optimize_model
    from tradeoff.optimize.variants import Variant

    write_encoder(tmp_path, "pt", SHAPE)
    with pytest.raises(OptimizeError, match="quantize_dynamic"):
        optimize_model(tmp_path / "pt", OptimizePlan(variants=(Variant("int8-dynamic"),)))
    assert sorted(p.name for p in (tmp_path / "pt").iterdir()) == ["1", "config.pbtxt"]


def test_a_thread_count_that_is_not_a_number_is_refused_by_name(repo: Path) -> None:
    with pytest.raises(ConfigError, match=r"parameters\.intra_op_thread_count"):
        instance(repo, "pt", intra_op_thread_count="many")


class _AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


@pytest.mark.parametrize("what", ["file", "version folder", "model folder"])
def test_a_model_file_others_can_write_is_refused_naming_the_fix(tmp_path: Path,
                                                                 what: str) -> None:
    """Loading TorchScript runs its code: a file any user could have replaced is refused."""
    model_dir = tmp_path / "reader"
    (model_dir / "1").mkdir(parents=True)
    path = model_dir / "1" / "model.pt"
    with torchscript_quietly():
        torch.jit.save(torch.jit.script(_AddOne()), str(path))
    (model_dir / "config.pbtxt").write_text(
        'backend: "pytorch"\nmax_batch_size: 4\n'
        'input [{ name: "INPUT__0" data_type: TYPE_FP32 dims: [2] }]\n'
        'output [{ name: "OUTPUT__0" data_type: TYPE_FP32 dims: [2] }]\n')
    writable = {"file": path, "version folder": path.parent, "model folder": model_dir}[what]
    writable.chmod(writable.stat().st_mode | 0o002)
    with pytest.raises(ModelLoadError, match=rf"{writable}.* is writable by every user .*"
                                             r"`chmod o-w`"):
        instance(tmp_path, "reader")
    with pytest.raises(ModelLoadError, match="writable by every user"):
        check_code_file(path)
    writable.chmod(writable.stat().st_mode & ~0o002)
    answer = instance(tmp_path, "reader").run({"INPUT__0": np.zeros((1, 2), np.float32)},
                                              ["OUTPUT__0"])
    assert answer["OUTPUT__0"].tolist() == [[1.0, 1.0]]
