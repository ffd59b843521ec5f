"""Recording new versions in a model's config keeps what the operator wrote."""

from __future__ import annotations

from pathlib import Path

import yaml

from tradeoff.repository.config import load_config_file
from tradeoff.repository.edit import add_versions

NOTES = {2: {"precision": "int8", "method": 'int8-dynamic; "quoted" # not a comment'}}


def test_pbtxt_keeps_its_text_and_serves_every_version(tmp_path: Path) -> None:
    config = tmp_path / "config.pbtxt"
    config.write_text('name: "m"  # the model\nplatform: "onnxruntime_onnx"\n'
                      "version_policy: { latest { num_versions: 1 } }\n"
                      "# version_policy { specific { versions: [1] } } is an old comment\n"
                      'parameters { key: "k" value: { string_value: "v" } }\n')
    add_versions(tmp_path, NOTES)
    text = config.read_text()
    assert "# the model" in text and "is an old comment" in text
    assert "latest" not in text
    parsed = load_config_file(config, default_name="m")
    assert parsed.version_policy.kind == "all"
    assert parsed.parameters == {"k": "v", "version_2_precision": "int8",
                                 "version_2_method": NOTES[2]["method"]}


def test_a_config_without_a_policy_gets_one_and_yaml_is_edited_as_yaml(tmp_path: Path) -> None:
    (tmp_path / "config.pbtxt").write_text('platform: "onnxruntime_onnx"\n')
    add_versions(tmp_path, NOTES)
    assert load_config_file(tmp_path / "config.pbtxt",
                            default_name="m").version_policy.kind == "all"
    other = tmp_path / "yaml_model"
    other.mkdir()
    (other / "config.yaml").write_text("max_batch_size: 4\nversion_policy: {latest: {}}\n")
    add_versions(other, NOTES)
    data = yaml.safe_load((other / "config.yaml").read_text())
    assert data["version_policy"] == {"all": {}} and data["max_batch_size"] == 4
    assert data["parameters"]["version_2_precision"] == {"string_value": "int8"}


def test_a_model_without_a_config_gets_a_minimal_one(tmp_path: Path) -> None:
    written = add_versions(tmp_path, NOTES)
    assert written == tmp_path / "config.pbtxt"
    parsed = load_config_file(written, default_name="m")
    assert parsed.version_policy.kind == "all" and not parsed.max_batch_size_given
