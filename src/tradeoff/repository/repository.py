"""Triton's model repository layout on disk.

    <root>/<model>/config.pbtxt            (or config.yaml, or nothing: auto-complete)
    <root>/<model>/<version>/model.onnx    (versions are positive integers)

Model names and versions from clients are checked against what is on disk, so they can
never name a path outside the repository.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradeoff.backends import onnxruntime as ort_backend
from tradeoff.errors import ConfigError, ModelLoadError, NotFound
from tradeoff.repository.autocomplete import autocomplete
from tradeoff.repository.config import (
    ModelConfig,
    load_config_file,
    parse_config_mapping,
    validate_against_model,
)

CONFIG_FILES = ("config.pbtxt", "config.yaml", "config.yml")


@dataclass(frozen=True)
class ModelSource:
    """A model as found on disk: its effective config and the files of its versions."""

    config: ModelConfig
    versions: dict[int, Path]
    config_path: Path | None


class ModelRepository:
    """Reads models from a repository directory."""

    def __init__(self, root: Path, default_max_batch_size: int = 4) -> None:
        self.root = Path(root)
        self.default_max_batch_size = default_max_batch_size
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")

    def names(self) -> list[str]:
        """Every tensor-model directory in the repository, sorted (generative models,
        marked by a ``generate.yaml``, are listed by :meth:`generative_names`)."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()
                      and not p.name.startswith(".") and not (p / GENERATIVE_FILE).is_file())

    def generative_names(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()
                      and not p.name.startswith(".") and (p / GENERATIVE_FILE).is_file())

    def model_dir(self, name: str) -> Path:
        if name not in self.names():
            raise NotFound(f"model {name!r} is not in the model repository")
        return self.root / name

    def read(self, name: str, config_override: dict[str, Any] | None = None) -> ModelSource:
        """Config (auto-completed) and version files of one model.

        ``config_override`` (Triton's JSON config, as the repository extension's ``load``
        may send) replaces the model's config file. Raises ConfigError or ModelLoadError
        naming the file and what is wrong.
        """
        directory = self.model_dir(name)
        config_path = next((directory / f for f in CONFIG_FILES if (directory / f).is_file()),
                           None)
        source = str(config_path or directory)
        if config_override is not None:
            source = f"load request config for {name!r}"
            config = parse_config_mapping(config_override, source=source, default_name=name)
            config_path = None
        elif config_path is not None:
            config = load_config_file(config_path, default_name=name)
        else:
            config = ModelConfig(name=name, max_batch_size_given=False)
        on_disk = {int(p.name): p for p in directory.iterdir()
                   if p.is_dir() and p.name.isdigit() and int(p.name) > 0}
        selected = config.version_policy.select(sorted(on_disk))
        if not selected:
            raise ModelLoadError(f"{directory}: no version directory matches the version "
                                 f"policy (found: {sorted(on_disk) or 'none'})")
        files = {}
        for version in selected:
            path = confined(on_disk[version], config.default_model_filename, source,
                            "default_model_filename")
            if not path.is_file():
                raise ModelLoadError(f"{path}: model file not found")
            files[version] = path
        inputs, outputs = ort_backend.describe(files[max(files)])
        config = autocomplete(config, inputs, outputs, source=source,
                              default_max_batch_size=self.default_max_batch_size)
        validate_against_model(config, source)
        return ModelSource(config, files, config_path)


GENERATIVE_FILE = "generate.yaml"


def confined(base: Path, relative: str, source: str, field: str) -> Path:
    """``base / relative``, refused unless it stays inside ``base`` (no absolute paths,
    no ``..``, no symbolic link out): a config, which ``load`` may send over the network,
    must never name a file outside its model's directory."""
    path = base / relative
    if Path(relative).is_absolute() or not path.resolve().is_relative_to(base.resolve()):
        raise ConfigError(source, field, f"{relative!r} is outside the model directory")
    return path


__all__ = ["ModelRepository", "ModelSource", "ConfigError", "ModelLoadError", "confined"]
