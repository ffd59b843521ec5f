"""The docs' examples run as written: their fenced shell blocks against a fresh example
repository, and the files they show loaded by a real server."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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
