"""`tradeoff serve`'s flags spell out defaults that live in the option dataclasses
(ServeOptions, TransportLimits, RequestLimits, RayOptions): with no flag given, what the
command builds must equal what the dataclasses say. The server start is replaced by a
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
    from tradeoff.protocol.v2 import DEFAULT_LIMITS
    from tradeoff.server.runner import ServeOptions
    from tradeoff.server.transport import TransportLimits

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
    from tradeoff.server.ray_serve import RayOptions

    assert built(monkeypatch, tmp_path, "--ray", "local")["ray"] == RayOptions()
