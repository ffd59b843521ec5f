"""Markers by folder: every test under ``integration/`` and ``compat/`` starts real
servers on 127.0.0.1, so each is marked ``integration`` here rather than file by file
(``pytest -m "not integration"`` runs the unit tests alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

SERVER_FOLDERS = tuple(Path(__file__).parent / name for name in ("integration", "compat"))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if any(folder in item.path.parents for folder in SERVER_FOLDERS):
            item.add_marker(pytest.mark.integration)
