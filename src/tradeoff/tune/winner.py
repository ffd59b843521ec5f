"""The winner of ``tune serve`` written: its ``config.pbtxt`` beside the server's own, and
with ``--apply-to`` as the model's config in its repository; nothing is deleted or
overwritten.

    check_apply_target(Path("models/mlp"), "mlp")      # before the search: TuneError
    result = write_winner(result, original, Path("tune-mlp"), Path("models/mlp"))
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from tradeoff.errors import TradeoffError, TuneError, local_resource
from tradeoff.repository.edit import PBTXT, YAML_FILES, config_text
from tradeoff.results import ServeTune
from tradeoff.tune.knobs import Knobs

__all__ = ["WRITTEN_BY", "check_apply_target", "write_winner"]

WRITTEN_BY = "# written by tradeoff tune serve"


def check_apply_target(model_dir: Path, model: str) -> None:
    """TuneError unless ``model_dir`` is ``model``'s directory in a repository (named after
    it, holding its config or versions) or a new, empty directory."""
    where = f"--apply-to {model_dir}"
    if model_dir.exists() and not model_dir.is_dir():
        raise TuneError(f"{where}: not a directory")
    if not model_dir.exists() or not any(model_dir.iterdir()):
        return
    if model_dir.name != model:
        raise TuneError(f"{where}: not the directory of model {model!r} (a model's directory "
                        f"is named after it); give REPOSITORY/{model} or a new, empty "
                        "directory")
    configs = [model_dir / n for n in (PBTXT, *YAML_FILES) if (model_dir / n).is_file()]
    versions = [d for d in model_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    if not configs and not versions:
        raise TuneError(f"{where}: holds neither a config nor a version directory: not the "
                        f"directory of model {model!r}")
    from tradeoff.repository.config import load_config_file

    for path in configs:  # the loader refuses a name that is not the directory's
        try:
            load_config_file(path, default_name=model)
        except TradeoffError as exc:
            raise TuneError(f"{where}: {path.name} is not a config of model {model!r}: "
                            f"{exc}") from None


def _free_name(path: Path) -> Path:
    """``path`` + ``.orig``, or ``.orig.2``, ``.orig.3``... the first that does not exist."""
    candidate, n = path.with_name(path.name + ".orig"), 1
    while candidate.exists():
        n += 1
        candidate = path.with_name(f"{path.name}.orig.{n}")
    return candidate


def _ours(path: Path) -> bool:
    try:
        with path.open() as handle:
            return handle.readline().startswith(WRITTEN_BY)
    except (OSError, UnicodeDecodeError):
        return False


def write_winner(result: ServeTune, original: dict[str, Any], directory: Path,
                 model_dir: Path | None = None) -> ServeTune:
    """Write the winner's ``config.pbtxt`` (and the config the server had, as
    ``original.pbtxt``) into ``directory``, which holds no other files of those names;
    with ``model_dir`` (REPOSITORY/MODEL, see :func:`check_apply_target`) also as the
    model's config, each config file there kept under a new name (``.orig``, then
    ``.orig.2``...): nothing is deleted or overwritten. Returns ``result`` saying where
    the winner went."""
    trial = result.trial(result.winner)
    if trial is None:
        return result
    winner = Knobs(**trial.knobs).config(original)
    header = f"{WRITTEN_BY}: {trial.name} for model {result.model!r}\n"
    outputs = {directory / "config.pbtxt": header + config_text(winner),
               directory / "original.pbtxt": f"{WRITTEN_BY}: the config {result.model!r} "
                                            "had on the server\n" + config_text(original)}
    for path in outputs:
        if path.exists() and not _ours(path):
            raise TuneError(f"--output {directory}: {path.name} there was not written by "
                            "tune serve; give another directory")
    if model_dir is not None:
        check_apply_target(model_dir, result.model)
    with local_resource(f"cannot write the winner's config into {directory}"):
        directory.mkdir(parents=True, exist_ok=True)
        for path, text in outputs.items():
            path.write_text(text)
    written = directory / "config.pbtxt"
    if model_dir is not None:
        with local_resource(f"--apply-to {model_dir}: cannot write the winner's config"):
            model_dir.mkdir(parents=True, exist_ok=True)
            for name in (PBTXT, *YAML_FILES):
                current = model_dir / name
                if current.is_file():
                    current.rename(_free_name(current))
            written = model_dir / PBTXT
            written.write_text(outputs[directory / "config.pbtxt"])
    return dataclasses.replace(result, written=str(written))
