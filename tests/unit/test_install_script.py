"""scripts/install.py: uv is asked for what pip is configured to ask for."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

SCRIPT = Path(__file__).parents[2] / "scripts" / "install.py"


def install_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("install_script", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_pips_indexes_links_constraints_and_certificate_reach_uv() -> None:
    script = install_script()
    flags, env = script.uv_arguments({
        "index-url": "https://mirror.example/simple",
        "extra-index-url": "file:///opt/a/simple file:///opt/b/simple",
        "find-links": "/opt/wheels", "constraint": "/etc/pip/constraints.txt",
        "cert": "/etc/ssl/certs/ca.crt", "timeout": "180"})
    assert flags == ["--extra-index-url", "file:///opt/a/simple",
                     "--extra-index-url", "file:///opt/b/simple",
                     "--find-links", "/opt/wheels",
                     "--constraint", "/etc/pip/constraints.txt",
                     "--index-url", "https://mirror.example/simple",
                     "--index-strategy", "unsafe-best-match"]
    assert env == {"SSL_CERT_FILE": "/etc/ssl/certs/ca.crt"}
    assert script.uv_arguments({"no-index": "true"})[0][0] == "--no-index"


def test_a_pip_variable_wins_over_pips_files(monkeypatch: pytest.MonkeyPatch) -> None:
    script = install_script()
    monkeypatch.setenv("PIP_FIND_LINKS", "/from/the/environment")
    settings = script.pip_settings(sys.executable)
    assert settings["find-links"] == "/from/the/environment"
