"""The command line: help with examples, one-line errors for user mistakes, and the same
flag with the same meaning and default in every command."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import click
import pytest
import yaml
from click.testing import CliRunner

from tradeoff.bench.load import LOAD_DEFAULTS, LoadSpec
from tradeoff.bench.sweep import SWEEP_WARMUP_S
from tradeoff.cli import main
from tradeoff.cli.options import seconds_text


def test_models_build_writes_a_loadable_repository(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["models", "build", str(tmp_path), "--model", "tiny"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "tiny" / "config.pbtxt").is_file()
    assert (tmp_path / "tiny" / "1" / "model.onnx").is_file()
    assert f"wrote {tmp_path / 'tiny'}" in result.output


def test_unknown_example_model_is_one_line(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["models", "build", str(tmp_path), "--model", "resnet"])
    assert result.exit_code == 1
    assert "unknown example models ['resnet']" in result.output
    assert "Traceback" not in result.output


def test_serve_without_a_repository_says_what_to_do(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path / "none")])
    assert result.exit_code == 2
    assert "does not exist" in result.output
    assert "Traceback" not in result.output


def test_models_build_writes_generative_models(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tradeoff.models import available_generative_models

    result = CliRunner().invoke(main, ["models", "build", str(tmp_path)])
    assert result.exit_code == 0, result.output
    for name in available_generative_models():
        settings = yaml.safe_load((tmp_path / name / "generate.yaml").read_text())
        assert settings["max_num_seqs"] >= 1, name
        assert f"wrote {tmp_path / name}" in result.output
    assert (tmp_path / "tinyllama" / "1" / "model.safetensors").is_file()
    if "smollm2-135m" in available_generative_models():
        settings = yaml.safe_load((tmp_path / "smollm2-135m" / "generate.yaml").read_text())
        assert settings["format"] == "gguf" and Path(settings["path"]).is_file()


def test_models_build_writes_the_synthetic_llm_only_when_named(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    result = CliRunner().invoke(main, ["models", "build", str(tmp_path / "named"),
                                       "--model", "synthetic-llm"])
    assert result.exit_code == 0, result.output
    settings = yaml.safe_load((tmp_path / "named" / "synthetic-llm" / "generate.yaml")
                              .read_text())
    assert settings["format"] == "synthetic" and settings["max_num_seqs"] == 64
    model = json.loads((tmp_path / "named" / "synthetic-llm" / "model.json").read_text())
    assert model["step_ms"] == 3.0
    from tradeoff.models import default_models

    assert "synthetic-llm" not in default_models()


# ------------------------------------------------------ one set of flags and defaults

LOAD_COMMANDS = ("bench", "sweep", "soak", "compare")
# The same name means a different thing here, by nature: one endpoint's price against a
# price per named endpoint, a searched SLA against a ranking filter, each command's schema.
DIFFERENT_BY_NATURE = {"--price-per-hour", "--price-per-1k-requests", "--sla-p99-ms",
                       "--json"}
URL = "http://127.0.0.1:9"
ARGV = {
    "bench": ["bench", URL, "--model", "m"],
    "sweep": ["sweep", URL, "--model", "m", "--concurrency-range", "1:4"],
    "soak": ["soak", URL, "--model", "m", "--max-rate", "10"],
    "compare": ["compare", "--endpoint", f"a={URL},model=m", "--endpoint", f"b={URL},model=n"],
}


class _Stop(Exception):
    """Raised by a spy once it has what it came for, so that nothing is measured."""


def _options(command: click.Command) -> dict[str, click.Option]:
    return {p.opts[0]: p for p in command.params if isinstance(p, click.Option)}


def _commands(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every command's words, groups' own included."""
    out = [prefix]
    for name, command in group.commands.items():
        if isinstance(command, click.Group):
            out += _commands(command, (*prefix, name))
        else:
            out.append((*prefix, name))
    return out


def test_every_command_has_examples_in_help_one_command_a_line() -> None:
    """Each example a line of its own, a long one continued with a backslash (a lone
    backslash in a docstring joined an example's lines into one)."""
    runner = CliRunner()
    for args in _commands(main):
        result = runner.invoke(main, [*args, "--help"], terminal_width=100)
        assert result.exit_code == 0, result.output
        text = result.output
        if args in ((), ("models", "build"), ("demo",), ("bench",), ("serve",), ("plan",)):
            assert "Examples:" in text, args
        examples = text.split("Examples:", 1)[1].split("\n\n", 1)[0] \
            if "Examples:" in text else ""
        for line in examples.splitlines():
            assert "   --" not in line.strip(), (args, line)  # joined continuation


def test_a_flag_is_the_same_in_every_command() -> None:
    commands = {name: _options(main.commands[name]) for name in LOAD_COMMANDS}
    seen: dict[str, list[click.Option]] = {}
    for options in commands.values():
        for flag, option in options.items():
            seen.setdefault(flag, []).append(option)
    shared = {flag: options for flag, options in seen.items()
              if len(options) > 1 and flag not in DIFFERENT_BY_NATURE}
    assert {"--protocol", "--model", "--timeout", "--seed", "--arrival", "--duration",
            "--warmup", "--max-connections", "--concurrency", "--alpha",
            "--max-error-percent"} <= set(shared)
    for flag, options in shared.items():
        first = options[0]
        for other in options[1:]:
            assert other.opts == first.opts and other.help == first.help, flag
            assert repr(other.type) == repr(first.type), flag
            assert other.default == first.default, flag
            assert other.multiple == first.multiple and other.is_flag == first.is_flag, flag


def _spy_load(monkeypatch: pytest.MonkeyPatch, argv: list[str]) -> LoadSpec:
    """The LoadSpec the command builds for ``argv``; nothing is sent."""
    module = importlib.import_module(f"tradeoff.cli.{argv[0]}")
    built: list[LoadSpec] = []
    real = module.take_load

    def spy(options: dict[str, Any], **kwargs: Any) -> LoadSpec:
        built.append(real(options, **kwargs))
        raise _Stop

    monkeypatch.setattr(module, "take_load", spy)
    result = CliRunner().invoke(main, argv)
    assert isinstance(result.exception, _Stop), result.output
    return built[0]


def test_the_same_flag_has_the_same_default_in_every_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    specs = {name: _spy_load(monkeypatch, ARGV[name]) for name in LOAD_COMMANDS}
    d = LOAD_DEFAULTS
    for name, spec in specs.items():
        assert spec.concurrency == d.concurrency and spec.rate is None, name
        assert spec.arrival == d.arrival == "constant", name
        # no warmup unless asked, but for a sweep's levels (their first requests are cold)
        assert spec.warmup_s == (SWEEP_WARMUP_S if name == "sweep" else d.warmup_s), name
        assert spec.timeout_s == d.timeout_s and spec.seed == d.seed, name
        assert spec.max_connections == d.max_connections, name
        assert spec.stability_percent == d.stability_percent, name
        assert spec.max_windows == d.max_windows, name
    # --duration: until stable in bench; a fixed length per sweep level and compare round
    assert specs["bench"].duration_s is None and not specs["bench"].fixed_length
    assert specs["sweep"].duration_s == specs["compare"].duration_s == d.point_duration_s


def test_the_same_values_give_the_same_load_in_every_command(
        monkeypatch: pytest.MonkeyPatch) -> None:
    given = ["--arrival", "poisson", "--warmup", "2s", "--timeout", "500ms", "--seed", "7",
             "--max-connections", "64"]
    specs = {name: _spy_load(monkeypatch, [*ARGV[name], *given, "--duration", "90s"])
             for name in ("bench", "sweep", "compare")}
    specs["soak"] = _spy_load(monkeypatch, [*ARGV["soak"], *given[:2], *given[4:]])
    for name, spec in specs.items():
        assert spec.arrival == "poisson" and spec.timeout_s == 0.5, name
        assert spec.seed == 7 and spec.max_connections == 64, name
    for name in ("bench", "sweep", "compare"):
        assert specs[name].warmup_s == 2.0 and specs[name].duration_s == 90.0, name


def test_soak_plan_defaults_and_time_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    import tradeoff.bench.soak

    plans: list[Any] = []

    def spy(adapter: Any, plan: Any, base: LoadSpec, console: Any) -> None:
        plans.append((plan, base))
        raise _Stop

    monkeypatch.setattr(tradeoff.bench.soak, "run_soak", spy)
    runner = CliRunner()
    runner.invoke(main, ARGV["soak"])
    runner.invoke(main, [*ARGV["soak"], "--duration", "1h", "--window", "90",
                         "--probe-duration", "500ms", "--arrival", "poisson"])
    (default, _), (given, base) = plans
    assert default.duration_s == LOAD_DEFAULTS.soak_duration_s == 1800.0
    assert default.window_s == LOAD_DEFAULTS.soak_window_s == 60.0
    assert default.arrival == LOAD_DEFAULTS.arrival and default.probe_s == 5.0
    assert (given.duration_s, given.window_s, given.probe_s) == (3600.0, 90.0, 0.5)
    assert given.arrival == base.arrival == "poisson"


def test_help_states_each_command_s_own_length() -> None:
    runner = CliRunner()
    point = seconds_text(LOAD_DEFAULTS.point_duration_s)
    sweep = " ".join(runner.invoke(main, ["sweep", "--help"]).output.split())
    assert f"by default {point} per level" in sweep
    compare = " ".join(runner.invoke(main, ["compare", "--help"]).output.split())
    assert f"by default {point} (rounds" in compare
    soak = " ".join(runner.invoke(main, ["soak", "--help"]).output.split())
    assert (f"defaults to {seconds_text(LOAD_DEFAULTS.soak_duration_s)} here and --window "
            f"to {seconds_text(LOAD_DEFAULTS.soak_window_s)}") in soak
    bench = " ".join(runner.invoke(main, ["bench", "--help"]).output.split())
    assert (f"[default: bench until stable; sweep {point} per level; compare {point} per "
            f"round; soak 30m]") in bench


@pytest.mark.parametrize("flag", ["--duration", "--warmup", "--timeout"])
@pytest.mark.parametrize("command", ["bench", "sweep", "compare"])
def test_a_bad_time_is_one_line_in_every_command(command: str, flag: str) -> None:
    for value in ("5x", "-3", "nan", ""):
        result = CliRunner().invoke(main, [*ARGV[command], flag, value])
        assert result.exit_code == 2, result.output
        last = result.output.strip().splitlines()[-1]
        assert last.startswith(f"Error: Invalid value for '{flag}': "), last
        assert "write 90 (seconds)" in last or "must be" in last
        assert "Traceback" not in result.output


@pytest.mark.parametrize(("argv", "flag"), [
    (["soak", URL, "--window", "1 hour"], "--window"),
    (["soak", URL, "--probe-duration", "0"], "--probe-duration"),
    (["bench", URL, "--window", "-1"], "--window"),
    (["demo", "--duration", "100ms"], "--duration"),
    (["serve", "--model-repository", ".", "--shutdown-timeout", "soon"],
     "--shutdown-timeout"),
])
def test_every_time_flag_reads_durations(argv: list[str], flag: str) -> None:
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output
    assert "Traceback" not in result.output


def test_request_option_mistakes_are_one_line() -> None:
    for extra, message in ((["--shape", "INPUT0"], "--shape 'INPUT0': use NAME:d1,d2"),
                           (["--header", "nocolon"], "--header 'nocolon': use KEY:VALUE")):
        result = CliRunner().invoke(main, [*ARGV["bench"], *extra])
        assert result.exit_code == 1, result.output
        assert result.output == f"Error: {message}" + (
            " (for example INPUT0:3,224)\n" if extra[0] == "--shape" else "\n")


def test_shape_and_header_values_become_the_endpoint_spec_s() -> None:
    from tradeoff.bench.endpoint import parse_headers, parse_shapes

    assert parse_shapes(["INPUT0:3,224", "MASK:"]) == {"INPUT0": [3, 224], "MASK": []}
    assert parse_headers([" X-Key : a:b ", "Empty:"]) == {"X-Key": "a:b", "Empty": ""}


def test_every_import_the_commands_make_when_run_resolves() -> None:
    """Commands import their domain modules when they run (a fast --help); a module that
    moves must not break a command only when it is used."""
    import ast

    package = Path(importlib.import_module("tradeoff.cli").__file__ or "").parent
    names = []
    for source in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(source.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tradeoff"):
                names += [(node.module or "", alias.name) for alias in node.names]
    assert len(names) > 20
    for module, name in names:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"


def test_one_size_type_and_one_duration_type_everywhere(tmp_path: Path) -> None:
    """serve's byte flags took integers only, tune's and optimize's --seconds refused
    500ms, top --window took any text."""
    runner = CliRunner()
    help_text = runner.invoke(main, ["serve", "--help"], terminal_width=200).output
    for shown in ("[default: 64MiB]", "[default: 1GiB]", "[default: 16MiB]",
                  "[default: 64KiB]"):
        assert shown in help_text, shown
    refused = runner.invoke(main, ["serve", "--model-repository", str(tmp_path),
                                   "--max-body-memory", "lots"])
    assert refused.exit_code == 2 and "'lots' is not a size" in refused.output
    small = runner.invoke(main, ["serve", "--model-repository", str(tmp_path),
                                 "--max-header-bytes", "100"])
    assert small.exit_code == 2 and "at least 1KiB" in small.output
    for argv in (["tune", "batch-size", str(tmp_path / "nope"), "--seconds", "500ms"],
                 ["optimize", str(tmp_path / "nope"), "--fp16", "--seconds", "500ms"]):
        run = runner.invoke(main, argv)
        assert run.exit_code != 0 and "--seconds" not in run.output, run.output
    profile = runner.invoke(main, ["sweep", "http://127.0.0.1:9", "--profile", "1000000"])
    assert profile.exit_code == 2 and "--profile" in profile.output  # one list of rates
    window = runner.invoke(main, ["top", "--prometheus-url", "http://127.0.0.1:9",
                                  "--window", "5x"])
    assert window.exit_code == 2 and "not a PromQL range" in window.output


def test_help_shows_only_the_flags_a_command_can_use() -> None:
    runner = CliRunner()
    tune_help = runner.invoke(main, ["tune", "serve", "--help"]).output
    assert "--chat" not in tune_help and "--method" not in tune_help
    assert "--model" in tune_help and "--shape" in tune_help
    assert "--requests" not in runner.invoke(main, ["sweep", "--help"]).output
    build = runner.invoke(main, ["models", "build", "--help"]).output
    assert "minilm" in build and "resnet50" in build
