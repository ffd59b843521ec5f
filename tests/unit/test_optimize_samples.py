"""Validation and calibration sample files: what fits a model, and one clear line when
one does not."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tradeoff.errors import OptimizeError
from tradeoff.optimize.samples import builtin_samples, load_samples
from tradeoff.repository.config import parse_config_text

MLP = parse_config_text("""
name: "mlp" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
""", source="mlp", default_name="mlp")
TWO_INPUTS = parse_config_text("""
name: "pair" platform: "onnxruntime_onnx" max_batch_size: 8
input [ { name: "A" data_type: TYPE_INT64 dims: [ -1 ] },
        { name: "B" data_type: TYPE_FP32 dims: [ 3 ] } ]
output [ { name: "Y" data_type: TYPE_FP32 dims: [ 3 ] } ]
""", source="pair", default_name="pair")
TEXT = parse_config_text("""
name: "text" backend: "onnxruntime_text" max_batch_size: 8
input [ { name: "text" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "embedding" data_type: TYPE_FP32 dims: [ 4 ] } ]
""", source="text", default_name="text")


def test_npy_npz_and_text_files_become_the_model_inputs(tmp_path: Path) -> None:
    np.save(tmp_path / "x.npy", np.ones((5, 4), np.float32))
    assert load_samples(tmp_path / "x.npy", MLP)["INPUT0"].shape == (5, 4)
    np.savez(tmp_path / "pair.npz", A=np.ones((3, 7), np.int32), B=np.zeros((3, 3)))
    pair = load_samples(tmp_path / "pair.npz", TWO_INPUTS)
    assert pair["A"].dtype == np.int64 and pair["A"].shape == (3, 7)  # int32 widened
    assert pair["B"].dtype == np.float32
    (tmp_path / "t.txt").write_text("first sentence\n\nsecond one é\n")
    text = load_samples(tmp_path / "t.txt", TEXT)["text"]
    assert text.shape == (2, 1) and text[1, 0] == "second one é".encode()


@pytest.mark.parametrize(("name", "content", "config", "message"), [
    ("gone.npy", None, MLP, "--validation .*gone.npy: no such file"),
    ("x.csv", "1,2", MLP, r"expected a \.npz, \.npy, \.txt file"),
    ("x.npy", np.ones((5, 3), np.float32), MLP,
     r"input 'INPUT0' is \[5, 3\]; expected \[N, 4\]"),
    ("x.npy", np.ones((5,), np.float32), MLP, r"is \[5\]; expected \[N, 4\]"),
    ("x.npy", np.ones((5, 4), np.complex64), MLP, "is FP32 but the file holds complex64"),
    ("x.npy", np.ones((0, 4), np.float32), MLP, "holds no samples"),
    ("x.npy", np.ones((2, 3)), TWO_INPUTS, "an .npy file holds one input"),
    ("x.txt", "a sentence\n", MLP, "a text file fits a model with one BYTES input"),
    ("x.npz", {"INPUT1": np.ones((2, 4))}, MLP,
     r"holds \['INPUT1'\] but the model's inputs are \['INPUT0'\]"),
    ("x.npz", {"A": np.ones((2, 5), np.int64), "B": np.ones((3, 3))}, TWO_INPUTS,
     "different numbers of samples"),
    ("x.npz", b"not a zip", MLP, "not readable"),
])
def test_a_file_that_does_not_fit_is_one_line(tmp_path: Path, name: str, content: object,
                                              config: object, message: str) -> None:
    path = tmp_path / name
    if isinstance(content, np.ndarray):
        np.save(path, content)
        path = path.with_suffix(".npy") if path.suffix != ".npy" else path
    elif isinstance(content, dict):
        np.savez(path, **content)
    elif isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    with pytest.raises(OptimizeError, match=message) as caught:
        load_samples(path, config)  # type: ignore[arg-type]
    assert "\n" not in str(caught.value)


def test_generated_samples_follow_the_config_and_differ_by_purpose(tmp_path: Path) -> None:
    validation, where = builtin_samples(tmp_path, TWO_INPUTS, "validation", count=6)
    calibration, _ = builtin_samples(tmp_path, TWO_INPUTS, "calibration", count=6)
    assert where.startswith("generated")
    assert validation["A"].shape == (6, 8) and validation["A"].dtype == np.int64
    assert validation["B"].shape == (6, 3) and validation["B"].dtype == np.float32
    assert not np.array_equal(validation["B"], calibration["B"])
    again, _ = builtin_samples(tmp_path, TWO_INPUTS, "validation", count=6)
    assert np.array_equal(again["B"], validation["B"])  # seeded
    texts, _ = builtin_samples(tmp_path, TEXT, "validation", count=3)
    assert texts["text"].shape == (3, 1) and texts["text"][0, 0].endswith(b".")


def test_a_model_directory_s_own_samples_come_first(tmp_path: Path) -> None:
    (tmp_path / "samples").mkdir()
    np.save(tmp_path / "samples" / "validation.npy", np.full((2, 4), 7.0, np.float32))
    samples, where = builtin_samples(tmp_path, MLP, "validation")
    assert where.endswith("samples/validation.npy")
    assert (samples["INPUT0"] == 7.0).all()
