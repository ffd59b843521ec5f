"""What the server serves, by model name: each model's state and versions, the version a
request gets, the repository index, and which models answer only through a router.

:class:`ModelCatalog` is read by the transports and the data plane; the model manager
(``server/models.py``) is the one writer, as it loads and unloads.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.errors import InvalidInput, NotFound, Unavailable
from tradeoff.generate.engine_client import EngineClient
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.repository import ModelRepository
from tradeoff.scheduling.executor import TensorExecutor
from tradeoff.scheduling.stats import ModelStats
from tradeoff.server.router import RoutedModel

__all__ = [
    "TUNE_MARKER",
    "TUNE_ORIGINAL",
    "ModelCatalog",
    "ModelEntry",
    "ModelState",
    "ModelVersion",
    "Served",
]

# config parameters that mark a config `tradeoff tune serve` loaded for a trial: who
# applied it (shown in the repository index), and the config it replaced
TUNE_MARKER = "tradeoff_tune"
TUNE_ORIGINAL = "tradeoff_tune_original"


class ModelState(enum.Enum):
    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass
class ModelVersion:
    """One served version: its config, executor (batcher and instances) and
    statistics."""

    name: str
    version: int
    config: ModelConfig
    executor: TensorExecutor
    stats: ModelStats
    path: Path
    check_bytes: Callable[[str, np.ndarray], None] | None = None  # the backend's
    # a request header (protocol/v2.py keeps them) found valid for this version -> what
    # the data plane derived from it (see DataPlane.prepare)
    checked: dict[Any, tuple] = field(default_factory=dict)

    def metadata(self, versions: list[str]) -> dict[str, Any]:
        """The v2 model metadata: platform and tensors (shapes with the batch dimension)."""
        config = self.config

        def tensor(t: Any) -> dict[str, Any]:
            return {"name": t.name, "datatype": t.datatype, "shape": config.full_shape(t)}

        return {"name": self.name, "versions": versions, "platform": config.platform,
                "inputs": [tensor(t) for t in config.inputs],
                "outputs": [tensor(t) for t in config.outputs]}

    def model_config(self) -> dict[str, Any]:
        """The model configuration extension's document: the config as Triton's JSON."""
        return self.config.to_dict()

    def begin_drain(self, timeout_s: float) -> None:
        """Shutdown begins: run what is queued now, without waiting for more."""
        self.executor.drain()

    async def stop(self, timeout_s: float | None = None) -> None:
        """Answer every accepted request, then release the instances."""
        await self.executor.stop()


# every served kind offers metadata(versions), model_config(), stats, begin_drain(), stop()
Served = ModelVersion | EngineClient | RoutedModel


@dataclass
class ModelEntry:
    name: str
    state: ModelState = ModelState.UNAVAILABLE
    reason: str = ""
    versions: dict[int, Served] = field(default_factory=dict)
    latest: Served | None = None


class ModelCatalog:
    """Every model of a repository that has been loaded once, by name, with its state."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.models: dict[str, ModelEntry] = {}
        # a model -> the serving router whose router.yaml hides it (hide_targets)
        self.hidden: dict[str, str] = {}

    def get(self, name: str, version: str | None = None) -> Served:
        """The version that serves a request, or NotFound/Unavailable saying why not."""
        entry = self.models.get(name)
        if entry is None:
            raise NotFound(f"unknown model {name!r}")
        if version:
            if not (version.isascii() and version.isdigit()):
                raise NotFound(f"model {name!r} has no version {version!r}")
            served = entry.versions.get(int(version))
            if served is None:
                if entry.state is ModelState.READY:
                    raise NotFound(f"model {name!r} has no version {version}; served: "
                                   f"{sorted(entry.versions)}")
                raise Unavailable(f"model {name!r} is not ready ({entry.state.value}"
                                  f"{': ' + entry.reason if entry.reason else ''})")
            return served
        if entry.latest is None:
            raise Unavailable(f"model {name!r} is not ready ({entry.state.value}"
                              f"{': ' + entry.reason if entry.reason else ''})")
        return entry.latest

    def loaded(self, name: str, version: int | None = None) -> Served | None:
        """A served version (the latest when ``version`` is None), or None if there is
        none now: what a router checks its targets against."""
        entry = self.models.get(name)
        if entry is None:
            return None
        return entry.latest if version is None else entry.versions.get(version)

    def index(self, ready_only: bool = False) -> list[dict[str, str]]:
        """The repository index: every model on disk with its state."""
        rows = []
        for name in self.repository.names():
            entry = self.models.get(name)
            if entry is None:
                rows.append({"name": name, "state": "UNAVAILABLE", "reason": "not loaded"})
                continue
            if entry.versions:
                for version, served in sorted(entry.versions.items()):
                    rows.append({"name": name, "version": str(version),
                                 "state": entry.state.value,
                                 "reason": entry.reason or _applied_by(served)})
            else:
                rows.append({"name": name, "state": entry.state.value, "reason": entry.reason})
        if ready_only:
            rows = [r for r in rows if r["state"] == "READY"]
        return rows

    def _hide_targets(self) -> None:
        """Which models answer only through a router: the targets of every serving
        router with ``hide_targets`` (after each load and unload)."""
        self.hidden = {model: entry.name for entry in self.models.values()
                       if isinstance(entry.latest, RoutedModel)
                       and entry.latest.config.hide_targets
                       for model in entry.latest.config.models()}

    def served_versions(self) -> list[Served]:
        return [v for e in self.models.values() for _, v in sorted(e.versions.items())]

    def tensor_versions(self) -> list[ModelVersion]:
        return [v for v in self.served_versions() if isinstance(v, ModelVersion)]

    def generative_versions(self) -> list[EngineClient]:
        return [v for v in self.served_versions() if isinstance(v, EngineClient)]

    def tensor(self, name: str, version: str | None = None) -> ModelVersion:
        """A tensor model's serving version; a generative model is a 400 saying where
        to send it."""
        return self.as_tensor(self.get(name, version))

    @staticmethod
    def as_tensor(served: Served) -> ModelVersion:
        """``served`` as a tensor model's version; a generative model is a 400."""
        if not isinstance(served, ModelVersion):
            raise InvalidInput(f"model {served.name!r} is generative: send it text at "
                               "/v1/completions or /v1/chat/completions")
        return served

    def generative(self, name: str) -> EngineClient:
        """A generative model's serving version; a tensor model is a 400."""
        served = self.get(name)
        if not isinstance(served, EngineClient):
            raise InvalidInput(f"model {name!r} takes tensors, not text: POST "
                               f"/v2/models/{name}/infer")
        return served


def _applied_by(served: Served) -> str:
    """The index's reason for a version on a config a tune serve applied ("" if not)."""
    parameters = getattr(getattr(served, "config", None), "parameters", None) or {}
    marker = parameters.get(TUNE_MARKER)
    return f"on a trial config applied by {marker}" if marker else ""
