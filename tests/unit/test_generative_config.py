"""generate.yaml: defaults, types, and one clear error per wrong setting."""

from __future__ import annotations

from pathlib import Path

import pytest

from tradeoff.errors import ConfigError
from tradeoff.generate.config import GenerativeConfig


def read(tmp_path: Path, text: str) -> GenerativeConfig:
    path = tmp_path / "generate.yaml"
    path.write_text(text)
    return GenerativeConfig.read(path)


def test_defaults_and_values(tmp_path: Path) -> None:
    config = read(tmp_path, "format: gguf\nmax_num_seqs: 4\nprefix_caching: false\n"
                            "device: cuda:1\n")
    assert (config.format, config.max_num_seqs, config.prefix_caching, config.device) == \
        ("gguf", 4, False, "cuda:1")
    assert read(tmp_path, "").prefix_caching and read(tmp_path, "").batching == "continuous"
    assert read(tmp_path, "").precision == "fp32"
    assert read(tmp_path, "precision: int8").precision == "int8"
    assert read(tmp_path, "").threads == 0 and read(tmp_path, "threads: 2").threads == 2


@pytest.mark.parametrize("text, message", [
    ("max_num_seq: 4", "unknown setting; did you mean 'max_num_seqs'"),
    ("max_num_seqs: '4'", "expected int, got '4'"),
    ("batching: continous", "did you mean 'continuous'"),
    ("format: ggfu", "no backend reads .ggfu.; did you mean .gguf."),
    ("device: cuda:x", "auto, cpu, cuda or cuda:N"),
    ("path: [a]", "expected a string"),
    ("max_num_seqs: many", "expected int"),
    ("max_num_seqs: 0", "must be >= 1"),
    ("prefix_caching: maybe", "expected true or false"),
    ("batching: dynamic", "unsupported value 'dynamic'"),
    ("device: tpu", "unsupported value 'tpu'"),
    ("precision: fp16", "unsupported value 'fp16'.*fp32, bf16, int8"),
    ("precision: in8", "did you mean 'int8'"),
    ("threads: -1", "must be 0 .the server's cores. to 1024"),
    ("threads: 5000", "to 1024, got 5000"),
    ("[1, 2]", "must be a mapping"),
])
def test_wrong_settings_name_the_setting(tmp_path: Path, text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        read(tmp_path, text)


def test_the_error_names_file_and_field(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        read(tmp_path, "block_size: 0\n")
    assert info.value.source == str(tmp_path / "generate.yaml")
    assert info.value.field == "block_size" and "must be >= 1, got 0" in str(info.value)
