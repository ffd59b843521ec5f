"""The docs' examples run as written: their fenced shell blocks against a fresh example
repository, and the files they show loaded by a real server."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest

from tradeoff.cli import main
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, post_json, running_server

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.MULTILINE | re.DOTALL)


def fenced(page: str, language: str, after: str) -> str:
    """The first ``language`` block of docs/``page`` that follows the text ``after``."""
    text = (DOCS / page).read_text()
    start = text.index(after)
    for match in FENCE.finditer(text, start):
        if match.group(1) == language:
            return match.group(2)
    raise AssertionError(f"no {language} block after {after!r} in {page}")


def run_shell(block: str, cwd: Path) -> None:
    """Run a block line by line (comments dropped) with this interpreter's ``tradeoff``
    first on PATH."""
    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=bin_dir + os.pathsep + os.environ.get("PATH", ""))
    script = "set -e\n" + "\n".join(line.split("  #")[0] for line in block.splitlines())
    run = subprocess.run(["bash", "-c", script], cwd=cwd, env=env, capture_output=True,
                         text=True, timeout=300, check=False)
    assert run.returncode == 0, f"{block}\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"


def test_the_routing_example_builds_loads_and_routes(tmp_path: Path) -> None:
    run_shell(fenced("routing.md", "sh", "The example below routes"), tmp_path)
    repo = tmp_path / "models"
    (repo / "front" / "router.yaml").write_text(
        fenced("routing.md", "yaml", "The example below routes"))
    server_gen = running_server(repo)
    server: ServerProcess = next(server_gen)
    try:
        index = {m["name"]: m for m in post_json(server.url, "/v2/repository/index", {})
                 .json()}
        assert index["front"]["state"] == "READY", index["front"]
        row = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                "data": [0.5] * 256}]
        for extra in ({}, {"parameters": {"class": "latency"}},
                      {"parameters": {"user": "alice"}}):
            answer = infer_json(server.url, "front", row, **extra)
            assert answer.status == 200, answer.body
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)


def test_every_relative_link_in_the_docs_names_a_file_that_exists() -> None:
    """docs/tuning.md linked a docs/cost.md that was never written."""
    link = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)|\(docs/([\w./-]+\.md)\)")
    pages = [*DOCS.glob("*.md"), DOCS.parent / "README.md"]
    missing = []
    for page in pages:
        for match in link.finditer(page.read_text()):
            target = match.group(1) or match.group(2)
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            base = DOCS if match.group(2) else page.parent
            if not (base / target).exists():
                missing.append(f"{page.name}: {target}")
    assert not missing, missing


def documented_commands() -> list[tuple[str, list[str]]]:
    """Every `tradeoff` command in the shell blocks of README and docs: (where, argv),
    continuation lines joined, comments and a trailing ``&`` dropped."""
    found = []
    for page in [DOCS.parent / "README.md", *sorted(DOCS.glob("*.md"))]:
        for match in FENCE.finditer(page.read_text()):
            if match.group(1) not in ("sh", "bash", ""):
                continue
            text = match.group(2).replace("\\\n", " ")
            for raw in text.splitlines():
                line = raw.strip()
                if not line.startswith(("tradeoff ", ".venv/bin/tradeoff ")) or \
                        " [--" in line:  # a synopsis, not a command
                    continue
                words = [re.sub(r"^\$\(.*\)$", "12345", w)  # $(pgrep ...): a pid
                         for w in shlex.split(line, comments=True)]
                if words[-1] == "&":
                    words.pop()
                found.append((f"{page.name}: {line[:80]}", words[1:]))
    return found


def parse_only(argv: list[str]) -> None:
    """Parse ``argv`` as `tradeoff` would, every flag's type and check included, without
    running the command."""
    command: click.Command = main
    context = click.Context(main, info_name="tradeoff")
    while isinstance(command, click.Group):
        name, sub, argv = command.resolve_command(context, list(argv))
        assert name is not None and sub is not None
        context = click.Context(sub, info_name=name, parent=context)
        command = sub
    command.make_context(context.info_name, list(argv), parent=context.parent)


MISSING = re.compile(r"(File|Directory) '([^']+)' does not exist")


def test_every_documented_command_parses_as_written(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each `tradeoff ...` line of README and docs names a command and flags that exist,
    with values their types take (the flags a page promised and the CLI renamed used to
    fail only when a reader tried them). The files a page's earlier steps would have
    made (./models, sweep.json) are made empty first."""
    monkeypatch.chdir(tmp_path)
    commands = documented_commands()
    assert len(commands) > 50
    failures = []
    for where, argv in commands:
        for _ in range(8):  # one missing file at a time
            try:
                parse_only(argv)
            except click.exceptions.Exit:
                pass  # --help
            except click.ClickException as exc:
                message = exc.format_message()
                missing = MISSING.search(message)
                if missing and not missing.group(2).startswith("/"):
                    path = tmp_path / missing.group(2)
                    if missing.group(1) == "Directory":
                        path.mkdir(parents=True, exist_ok=True)
                    else:
                        path.parent.mkdir(parents=True, exist_ok=True)
                        path.write_text("{}")
                    continue
                if not missing:  # an absolute path of the reader's machine: not ours
                    failures.append(f"{where}: {message}")
            break
    assert not failures, "\n".join(failures)
