"""`tradeoff serve`'s flags take their defaults from the option dataclasses
(server/options.py ServeOptions, TransportLimits, RayOptions; protocol/limits.py
RequestLimits), written as a user would type them: with no flag given, what the command
builds must equal what the dataclasses say. The server start is replaced by a
function that keeps the options it was handed: the wiring, not a server, is under test."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tradeoff.cli import main


def built(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, *extra: str) -> dict[str, Any]:
    import tradeoff.server.ray_serve as ray_serve
    import tradeoff.server.runner as runner

    kept: dict[str, Any] = {}
    monkeypatch.setattr(runner, "serve", lambda options: kept.update(options=options))
    monkeypatch.setattr(ray_serve, "serve_on_ray",
                        lambda options, ray: kept.update(options=options, ray=ray))
    run = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path), *extra])
    assert run.exit_code == 0, run.output
    return kept


def test_serve_builds_the_dataclasses_defaults_when_no_flag_is_given(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from tradeoff.protocol.limits import DEFAULT_LIMITS
    from tradeoff.server.options import ServeOptions, TransportLimits

    options = built(monkeypatch, tmp_path)["options"]
    want = ServeOptions(model_repository=tmp_path)
    differ = [f.name for f in dataclasses.fields(ServeOptions)
              if f.name not in ("access", "limits", "transport")
              and getattr(options, f.name) != getattr(want, f.name)]
    assert not differ, {name: (getattr(options, name), getattr(want, name)) for name in differ}
    assert options.transport == TransportLimits()
    assert options.limits == DEFAULT_LIMITS


def test_serve_on_ray_builds_ray_options_defaults(monkeypatch: pytest.MonkeyPatch,
                                                  tmp_path: Path) -> None:
    from tradeoff.server.options import RayOptions

    assert built(monkeypatch, tmp_path, "--ray", "local")["ray"] == RayOptions()


def test_help_shows_each_default_as_a_user_would_write_it() -> None:
    from tradeoff.server.options import DEFAULT_MAX_REQUEST_BYTES

    text = CliRunner().invoke(main, ["serve", "--help"], terminal_width=200).output
    assert DEFAULT_MAX_REQUEST_BYTES == 64 << 20 and "[default: 64MiB]" in text
    for shown in ("[default: 5m]", "[default: 10m]", "[default: 30s]", "[default: 1GiB]",
                  "[default: 127.0.0.1]", "[default: 8000; 0<=x<=65535]"):
        assert shown in text, shown
