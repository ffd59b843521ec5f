"""Triton's model repository layout on disk.

    <root>/<model>/config.pbtxt            (or config.yaml, or nothing: auto-complete)
    <root>/<model>/<version>/model.onnx    (versions are positive integers; the file
                                            name is the backend's, see backends.registry)
    <root>/<model>/generate.yaml           (a generative model instead: generate/config.py)
    <root>/<model>/router.yaml             (a router over other models: repository/router.py)

Model names and versions from clients are checked against what is on disk, so they can
never name a path outside the repository. File names inside a config follow the rule of
:func:`confined`: the operator's symbolic links are followed, a config sent over the
network stays inside its model directory.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradeoff.backends.registry import (
    GENERATIVE,
    TENSOR,
    BackendRegistry,
    default_registry,
)
from tradeoff.errors import ConfigError, ModelLoadError, NotFound
from tradeoff.repository.autocomplete import autocomplete
from tradeoff.repository.config import (
    ModelConfig,
    load_config_file,
    parse_config_mapping,
    validate_against_model,
)

CONFIG_FILES = ("config.pbtxt", "config.yaml", "config.yml")
GENERATIVE_FILE = "generate.yaml"
ROUTER_FILE = "router.yaml"
ROUTER = "router"


@dataclass(frozen=True)
class ModelSource:
    """A model as found on disk: its effective config and the files of its versions."""

    config: ModelConfig
    versions: dict[int, Path]
    config_path: Path | None
    from_network: bool = False  # the config came with a load request: see confined()


class ModelRepository:
    """Reads models from a repository directory."""

    def __init__(self, root: Path, default_max_batch_size: int = 4,
                 backends: BackendRegistry | None = None) -> None:
        self.root = Path(root)
        self.default_max_batch_size = default_max_batch_size
        self.backends = backends or default_registry()
        if not self.root.is_dir():
            raise FileNotFoundError(f"model repository {self.root} is not a directory")

    def names(self) -> list[str]:
        """Every model directory in the repository, sorted."""
        return sorted(p.name for p in self.root.iterdir() if p.is_dir()
                      and not p.name.startswith("."))

    def model_dir(self, name: str) -> Path:
        if name not in self.names():
            raise NotFound(f"model {name!r} is not in the model repository")
        return self.root / name

    def kind(self, name: str) -> str:
        """``router`` for a directory with a ``router.yaml``, ``generative`` for one with a
        ``generate.yaml``, else ``tensor``."""
        directory = self.model_dir(name)
        if (directory / ROUTER_FILE).is_file():
            return ROUTER
        return GENERATIVE if (directory / GENERATIVE_FILE).is_file() else TENSOR

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
            config = parse_config_mapping(config_override, source=source, default_name=name,
                                          backends=self.backends)
            config_path = None
        elif config_path is not None:
            config = load_config_file(config_path, default_name=name, backends=self.backends)
        else:
            config = parse_config_mapping({}, source=source, default_name=name,
                                          backends=self.backends)
        on_disk = {int(p.name): p for p in directory.iterdir()
                   if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) > 0}
        selected = config.version_policy.select(sorted(on_disk))
        if not selected:
            raise ModelLoadError(f"{directory}: no version directory matches the version "
                                 f"policy (found: {sorted(on_disk) or 'none'})")
        # The backend's own file name is the operator's choice even when a load request
        # sends the config; only a name the request gives is held inside the directory.
        named_by_request = config_override is not None and \
            config.default_model_filename != self.backends.tensor(config.backend).default_filename
        files = {}
        for version in selected:
            path = confined(on_disk[version], config.default_model_filename, source,
                            "default_model_filename", from_network=named_by_request)
            if not path.is_file():
                raise ModelLoadError(f"{path}: model file not found")
            files[version] = path
        declared = self.backends.tensor(config.backend).describe(files[max(files)])
        config = autocomplete(config, declared, source=source,
                              default_max_batch_size=self.default_max_batch_size)
        validate_against_model(config, source)
        return ModelSource(config, files, config_path, from_network=config_override is not None)


def confined(base: Path, relative: str, source: str, field: str, *,
             from_network: bool) -> Path:
    """``base / relative`` for a file name a model config gives (``default_model_filename``
    under a version directory, a warmup ``input_data_file`` under ``warmup/``).

    The rule, by who wrote the name:

    * **Every name** is relative and goes down only: an absolute path, a ``..`` part or a
      NUL byte is refused, whoever wrote it. A ``config.pbtxt`` naming
      ``../../etc/passwd`` is a mistake to report, not a way to reach a shared file.
    * **Names the operator wrote** (the config file on disk, or the backend's own file
      name such as ``model.onnx``): symbolic links are followed wherever they lead. Only
      someone who can write the repository can place a link, and shared model caches
      link ``model.onnx`` (or a whole directory) out of the version directory.
    * **Names a network client wrote** (``from_network``: a config sent with the
      repository extension's ``load``): the file must also stay inside ``base`` once every
      symbolic link is resolved, so a client cannot walk through a link the operator
      placed for another purpose (a link to ``/``, say) to reach files outside the model.

    Raises ConfigError naming ``field`` ("... is outside the model directory").

        confined(Path("models/m/1"), "model.onnx", "models/m/config.pbtxt",
                 "default_model_filename", from_network=False)
    """
    if "\0" in relative:
        raise ConfigError(source, field, f"{relative!r} holds a NUL byte")
    if Path(relative).is_absolute() or ".." in Path(relative).parts:
        raise ConfigError(source, field, f"{relative!r} is outside the model directory")
    path = base / relative
    if from_network and not path.resolve().is_relative_to(base.resolve()):
        raise ConfigError(source, field, f"{relative!r} is outside the model directory "
                          "(a config sent with load may not follow a symbolic link out)")
    return path


__all__ = ["ModelRepository", "ModelSource", "confined"]
