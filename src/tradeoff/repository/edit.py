"""Changes tradeoff writes into a model's config file, keeping the rest as the operator
wrote it (comments, field order, fields tradeoff ignores).

:func:`add_versions` records new versions of a model (``tradeoff optimize`` makes them):
their notes go into ``parameters`` as ``version_<N>_<key>`` entries, and the version
policy becomes ``all`` so the server serves them next to the original.

    add_versions(Path("models/minilm"), {2: {"precision": "int8", "method": "..."}})
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from pathlib import Path

import yaml

from tradeoff.errors import ConfigError
from tradeoff.repository.safe_yaml import read_yaml

__all__ = ["add_versions", "config_text", "version_parameter", "write_config"]

PBTXT, YAML_FILES = "config.pbtxt", ("config.yaml", "config.yml")
_POLICY = re.compile(r"\bversion_policy\s*:?\s*\{")


def version_parameter(version: int, key: str) -> str:
    """The ``parameters`` key under which a note about ``version`` is kept."""
    return f"version_{version}_{key}"


def add_versions(model_dir: Path, notes: Mapping[int, Mapping[str, str]]) -> Path:
    """Record ``notes`` ({version: {key: text}}) in the model's config and serve every
    version; returns the config file written (``config.pbtxt`` when there was none)."""
    parameters = {version_parameter(v, k): text for v, kv in notes.items()
                  for k, text in kv.items()}
    for name in YAML_FILES:
        path = model_dir / name
        if path.is_file():
            data = read_yaml(path) or {}
            data["version_policy"] = {"all": {}}
            existing = data.setdefault("parameters", {})
            existing.update({k: {"string_value": v} for k, v in parameters.items()})
            path.write_text(yaml.safe_dump(data, sort_keys=False))
            return path
    path = model_dir / PBTXT
    text = path.read_text() if path.is_file() else ""
    text = _serve_all_versions(text, str(path))
    lines = [f"parameters {{ key: {json.dumps(k)} value: {{ string_value: {json.dumps(v)} }} }}"
             for k, v in parameters.items()]
    path.write_text(text.rstrip("\n") + ("\n" if text.strip() else "") + "\n".join(lines) + "\n")
    return path


def _serve_all_versions(text: str, source: str) -> str:
    """``text`` with its version_policy block replaced by ``all`` (or one added)."""
    all_versions = "version_policy: { all: {} }"
    match = _POLICY.search(_without_comments(text))
    if match is None:
        return text.rstrip("\n") + ("\n" if text.strip() else "") + all_versions + "\n"
    depth, end = 0, None
    for index in range(match.end() - 1, len(text)):
        depth += {"{": 1, "}": -1}.get(text[index], 0)
        if depth == 0:
            end = index + 1
            break
    if end is None:
        raise ConfigError(source, "version_policy", "its braces are not balanced")
    return text[:match.start()] + all_versions + text[end:]


def _without_comments(text: str) -> str:
    """``text`` with ``#`` comments blanked, same length (so offsets still match)."""
    return re.sub(r"#[^\n]*", lambda m: " " * len(m.group()), text)


def config_text(config: Mapping[str, object]) -> str:
    """A Triton JSON config (as ``GET /v2/models/{m}/config`` returns it) as
    ``config.pbtxt`` text; ConfigError when it is not a model config."""
    from google.protobuf import json_format, text_format

    from tradeoff.protocol import model_config_pb2

    message = model_config_pb2.ModelConfig()
    try:
        json_format.ParseDict(dict(config), message)
    except json_format.ParseError as exc:
        raise ConfigError("config", "", f"not a model config: {exc}") from None
    return str(text_format.MessageToString(message))


def write_config(model_dir: Path, config: Mapping[str, object]) -> tuple[Path, Path | None]:
    """Write ``config`` as the model's ``config.pbtxt``, keeping the config file that was
    there as ``<name>.orig`` (an ``.orig`` already there is kept: it is the first
    original). Returns (written, kept original or None)."""
    text = config_text(config)
    kept = None
    for name in (PBTXT, *YAML_FILES):
        current = model_dir / name
        if current.is_file():
            kept = current.with_name(current.name + ".orig")
            if not kept.exists():
                current.rename(kept)
            else:
                current.unlink()
    path = model_dir / PBTXT
    path.write_text(text)
    return path, kept
