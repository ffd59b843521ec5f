"""The command line: help with examples, one-line errors for user mistakes."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from tradeoff.cli import main


def test_every_command_has_examples_in_help() -> None:
    runner = CliRunner()
    for args in ([], ["serve"], ["models", "build"], ["demo"]):
        result = runner.invoke(main, [*args, "--help"])
        assert result.exit_code == 0, result.output
        assert "Examples:" in result.output


def test_models_build_writes_a_loadable_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["models", "build", str(tmp_path), "--model", "tiny"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "tiny" / "config.pbtxt").is_file()
    assert (tmp_path / "tiny" / "1" / "model.onnx").is_file()
    assert f"wrote {tmp_path / 'tiny'}" in result.output


def test_unknown_example_model_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["models", "build", str(tmp_path), "--model", "resnet"])
    assert result.exit_code == 1
    assert "unknown example models ['resnet']" in result.output
    assert "Traceback" not in result.output


def test_serve_without_a_repository_says_what_to_do(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
    assert "Traceback" not in result.output


def test_models_build_writes_generative_models(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tradeoff.models import available_generative_models

    result = CliRunner().invoke(main, ["models", "build", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in available_generative_models():
        settings = yaml.safe_load((tmp_path / name / "generate.yaml").read_text())
        assert settings["max_num_seqs"] >= 1, name
        assert f"wrote {tmp_path / name}" in result.output
    assert (tmp_path / "tinyllama" / "1" / "model.safetensors").is_file()
    if "smollm2-135m" in available_generative_models():
        settings = yaml.safe_load((tmp_path / "smollm2-135m" / "generate.yaml").read_text())
        assert settings["format"] == "gguf" and Path(settings["path"]).is_file()
