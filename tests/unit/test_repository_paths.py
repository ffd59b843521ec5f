"""File names in model configs: the operator's symbolic links are followed, a config sent
over the network stays inside its model directory, and no name climbs out with ``..``
or an absolute path (the rule in ``tradeoff.repository.repository.confined``)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from tradeoff.errors import ConfigError
from tradeoff.models.examples import tiny_model
from tradeoff.repository.repository import ModelRepository, confined

SOURCE = "models/m/config.pbtxt"
FIELD = "default_model_filename"


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """``repo/m/1`` holding a plain file, a link out to a cache, a link to a directory
    out, and a link to a file inside; the cache beside the repository."""
    cache = tmp_path / "cache"
    cache.mkdir()
    onnx.save(tiny_model(), str(cache / "shared.onnx"))
    version = tmp_path / "repo" / "m" / "1"
    version.mkdir(parents=True)
    onnx.save(tiny_model(), str(version / "plain.onnx"))
    (version / "model.onnx").symlink_to(cache / "shared.onnx")
    (version / "cachedir").symlink_to(cache, target_is_directory=True)
    (version / "inside.onnx").symlink_to(version / "plain.onnx")
    return version


@pytest.mark.parametrize("name", ["plain.onnx", "model.onnx", "cachedir/shared.onnx",
                                  "inside.onnx", "./plain.onnx"])
def test_the_operators_names_follow_links_anywhere(layout: Path, name: str) -> None:
    path = confined(layout, name, SOURCE, FIELD, from_network=False)
    assert path == layout / name and path.is_file()


@pytest.mark.parametrize("name", ["plain.onnx", "inside.onnx"])
def test_a_network_name_may_resolve_inside(layout: Path, name: str) -> None:
    assert confined(layout, name, SOURCE, FIELD, from_network=True) == layout / name


@pytest.mark.parametrize("name", ["model.onnx", "cachedir/shared.onnx"])
def test_a_network_name_may_not_follow_a_link_out(layout: Path, name: str) -> None:
    with pytest.raises(ConfigError) as info:
        confined(layout, name, SOURCE, FIELD, from_network=True)
    assert info.value.field == FIELD
    assert "outside the model directory" in str(info.value)
    assert "symbolic link" in str(info.value)


@pytest.mark.parametrize("from_network", [False, True])
@pytest.mark.parametrize("name", ["../../../cache/shared.onnx", "../1/plain.onnx",
                                  "cachedir/../plain.onnx", "ABSOLUTE"])
def test_nobody_climbs_out_with_dotdot_or_an_absolute_path(layout: Path, name: str,
                                                           from_network: bool) -> None:
    if name == "ABSOLUTE":
        name = str(layout / "plain.onnx")  # even one that points inside
    with pytest.raises(ConfigError) as info:
        confined(layout, name, SOURCE, FIELD, from_network=from_network)
    assert "outside the model directory" in str(info.value) and SOURCE in str(info.value)


@pytest.mark.parametrize("from_network", [False, True])
def test_a_nul_byte_is_refused(layout: Path, from_network: bool) -> None:
    with pytest.raises(ConfigError, match="NUL byte"):
        confined(layout, "plain.onnx\0.txt", SOURCE, FIELD, from_network=from_network)


def test_a_linked_model_file_loads_from_a_config_file_and_a_config_sent_with_load(
        layout: Path) -> None:
    repository = ModelRepository(layout.parent.parent)
    (layout.parent / "config.pbtxt").write_text('max_batch_size: 4\n')
    on_disk = repository.read("m")
    assert on_disk.versions == {1: layout / "model.onnx"} and not on_disk.from_network
    sent = repository.read("m", {"max_batch_size": 2})  # names no file: the operator's
    assert sent.versions == {1: layout / "model.onnx"} and sent.from_network
    assert sent.config.max_batch_size == 2
    inside = repository.read("m", {"default_model_filename": "inside.onnx"})
    assert inside.versions == {1: layout / "inside.onnx"}


@pytest.mark.parametrize("name", ["cachedir/shared.onnx", "../../../cache/shared.onnx"])
def test_a_config_sent_with_load_naming_a_file_out_is_refused(layout: Path, name: str) -> None:
    repository = ModelRepository(layout.parent.parent)
    with pytest.raises(ConfigError, match="outside the model directory"):
        repository.read("m", {"default_model_filename": name})


def test_a_config_file_naming_a_file_out_is_refused(layout: Path) -> None:
    (layout.parent / "config.pbtxt").write_text(
        'default_model_filename: "../../../cache/shared.onnx"\n')
    with pytest.raises(ConfigError) as info:
        ModelRepository(layout.parent.parent).read("m")
    assert info.value.field == FIELD and "config.pbtxt" in str(info.value)
