"""The one reader of the YAML files tradeoff reads (``config.yaml``, ``router.yaml``,
``generate.yaml``), with bounds a hostile file cannot pass:

* aliases may repeat at most ``MAX_ALIAS_NODES`` nodes in all (an alias to a list of 9
  aliases, nine times over, is a few hundred bytes that expand to hundreds of millions),
  and an alias may not refer to a node that holds it;
* nothing nests deeper than ``MAX_DEPTH`` levels (20,000 ``[`` would otherwise end in a
  RecursionError).

Every failure, malformed YAML included, is one ConfigError naming the file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tradeoff.errors import ConfigError

__all__ = ["MAX_ALIAS_NODES", "MAX_DEPTH", "parse_yaml", "read_yaml"]

MAX_DEPTH = 64
MAX_ALIAS_NODES = 10_000


class _BoundedLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that counts, as it composes, each node's size with its aliases
    expanded, and the depth it is at."""

    def __init__(self, text: str, source: str) -> None:
        super().__init__(text)
        self.source = source
        self.depth = 0
        self.repeated = 0  # nodes that aliases repeat
        self.sizes: dict[int, int] = {}  # id(node) -> its size, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        line = self.peek_event().start_mark.line + 1
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            size = self.sizes.get(id(node))
            if size is None:
                raise ConfigError(self.source, "", f"line {line}: an alias refers to a node "
                                  "that holds it")
            self.repeated += size
            if self.repeated > MAX_ALIAS_NODES:
                raise ConfigError(self.source, "", f"line {line}: aliases repeat more than "
                                  f"{MAX_ALIAS_NODES:,} nodes")
            return node
        if self.depth >= MAX_DEPTH:
            raise ConfigError(self.source, "", f"line {line}: nested deeper than {MAX_DEPTH} "
                              "levels")
        self.depth += 1
        try:
            node = super().compose_node(parent, index)
        finally:
            self.depth -= 1
        if isinstance(node, yaml.SequenceNode):
            children = node.value
        elif isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = []
        self.sizes[id(node)] = 1 + sum(self.sizes[id(child)] for child in children)
        return node


def parse_yaml(text: str, source: str) -> Any:
    """The document in ``text`` (None when empty); ConfigError naming ``source``."""
    loader = _BoundedLoader(text, source)
    try:
        return loader.get_single_data()
    except (yaml.YAMLError, ValueError, RecursionError) as exc:  # ValueError: 5,000 digits
        raise ConfigError(source, "", f"not valid YAML{_where(exc)}") from None
    finally:
        loader.dispose()


def _where(exc: Exception) -> str:
    """``at line L, column C: problem`` on one line, for an error PyYAML placed."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f"{exc.context}, " if exc.context else ""
        return f" at line {mark.line + 1}, column {mark.column + 1}: {context}{exc.problem}"
    return f": {exc}"


def read_yaml(path: Path) -> Any:
    """The document in the file at ``path`` (None when empty); ConfigError naming it."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(str(path), "", f"cannot be read: {reason}") from None
    return parse_yaml(text, str(path))
