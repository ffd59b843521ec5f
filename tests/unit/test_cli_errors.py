"""The command line maps only the project's error tree to one-line errors: a file, folder
or certificate the user named that the machine refuses is a LocalResourceError raised where
it is touched, and no command catches a builtin exception to hide a bug."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from click.testing import CliRunner

import tradeoff.cli
from tradeoff.cli import main
from tradeoff.errors import LocalResourceError, TradeoffError, local_resource

CLI = Path(tradeoff.cli.__file__).parent
DATA = Path(__file__).parent.parent / "data" / "results"
BUILTIN = {"Exception", "BaseException", "OSError", "ValueError", "RuntimeError", "KeyError",
           "IOError", "EnvironmentError"}
# a flag's own text parsed with int(): the ValueError is int's, not a project error
PARSERS = {("tune.py", "_values")}


def _caught(handler: ast.ExceptHandler) -> set[str]:
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return {k.id for k in kinds if isinstance(k, ast.Name)}


def test_no_command_catches_a_builtin_exception() -> None:
    found = []
    for path in sorted(CLI.glob("*.py")):
        tree = ast.parse(path.read_text())
        for function in ast.walk(tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if (path.name, function.name) in PARSERS:
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.ExceptHandler) and _caught(node) & BUILTIN:
                    found.append(f"{path.name}:{node.lineno} {sorted(_caught(node))}")
    assert not found, f"the CLI catches builtin exceptions: {found}"


def test_local_resource_names_the_resource_and_the_reason(tmp_path: Path) -> None:
    with pytest.raises(LocalResourceError, match=r"^cannot read .*nothing\.txt: No such file"):
        with local_resource(f"cannot read {tmp_path / 'nothing.txt'}"):
            (tmp_path / "nothing.txt").read_text()
    assert issubclass(LocalResourceError, TradeoffError)
    with pytest.raises(KeyError), local_resource("not this"):
        raise KeyError("a bug stays a bug")


def _one_line_error(args: list[str]) -> str:
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 1, run.output
    assert run.exception is None or isinstance(run.exception, SystemExit), run.exception
    lines = run.output.strip().splitlines()
    assert lines[-1].startswith("Error: ") and "Traceback" not in run.output, run.output
    return lines[-1]


def test_an_output_path_under_a_file_is_one_line(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    line = _one_line_error(["diagnose", str(DATA / "bench-tensor.json"),
                            "--json", str(blocker / "out.json")])
    refused = ("Not a directory", "File exists")  # as the folder or the file is made
    assert f"cannot write {blocker / 'out.json'}: " in line and line.endswith(refused)
    line = _one_line_error(["report", str(DATA / "sweep.json"), "-o",
                            str(blocker / "report.html")])
    assert f"cannot write {blocker / 'report.html'}: " in line and line.endswith(refused)
    line = _one_line_error(["models", "build", str(blocker / "models"), "--model", "tiny"])
    assert f"cannot write models into {blocker / 'models'}" in line


def test_a_certificate_that_does_not_load_is_one_line(tmp_path: Path) -> None:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    line = _one_line_error(["serve", "--model-repository", str(tmp_path), "--tls-cert",
                            str(cert), "--tls-key", str(key)])
    assert line.startswith(f"Error: --tls-cert {cert} / --tls-key {key}: ")


@pytest.mark.parametrize("args", [
    ["plan", "MODEL", "--sla-p99-ms", "nan", "--rate", "10"],
    ["plan", "MODEL", "--sla-p99-ms", "5", "--rate", "10", "--max-drop", "inf"],
    ["sweep", "http://127.0.0.1:9", "--model", "m", "--sla-p99-ms", "nan"],
    ["tune", "serve", "http://127.0.0.1:9", "--model", "m", "--sla-p99-ms", "5",
     "--rate", "inf"]])
def test_a_float_flag_refuses_nan_and_inf(args: list[str], tmp_path: Path) -> None:
    args = [str(tmp_path) if a == "MODEL" else a for a in args]
    run = CliRunner().invoke(main, args)
    assert run.exit_code == 2 and "is not a finite number" in run.output, run.output
