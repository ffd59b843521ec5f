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
from tradeoff.server.process import ServerProcess, free_ports

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


@pytest.mark.slow
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
        # the tensor router's (the page's other bench is of an OpenAI endpoint)
        [bench] = [argv for where, argv in documented_commands()
                   if where.startswith("routing.md") and argv[0] == "bench"
                   and "openai" not in argv]
        run_shell(shlex.join(["tradeoff", *shortened(bench, server)]), tmp_path)
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


# the README's measuring commands, shortened to run in seconds: (flag, value) -> value
# --max-latency-ms: a bound a busy machine's p99 crosses (batch 1 of mlp took 8.4 ms
# beside the parallel tests, against the docs' 5): the command runs, its bound loosened
SHORTER = {"--duration": "1s", "--warmup": "0.2s", "--concurrency-range": "1:4",
           "--rate-range": "250:500", "--concurrency": "4", "--rate": "200",
           "--probe-duration": "0.5s", "--rounds": "2", "--output-tokens": "4",
           "--bisect-steps": "1", "--max-latency-ms": "100"}
MEASURING = ("bench", "sweep", "soak", "compare", "diagnose", "report")


def shortened(argv: list[str], server: ServerProcess) -> list[str]:
    """``argv`` against ``server`` (ports 8000/8001/8002 as it has them), each long flag's
    value replaced by a short one; every other word as written."""
    ports = {"8000": str(server.http_port), "8001": str(server.grpc_port),
             "8002": str(server.metrics_port)}
    out = []
    for i, written in enumerate(argv):
        word = SHORTER[argv[i - 1]] if i and argv[i - 1] in SHORTER else written
        for default, port in ports.items():
            word = word.replace(f"127.0.0.1:{default}", f"127.0.0.1:{port}")
        out.append(word)
    if out[0] == "soak":  # a soak needs 6 windows for its trend test
        out[out.index("--duration") + 1] = "3s"
        out += ["--probe-duration", "0.5s", "--window", "0.5s"]
    return out


@pytest.mark.slow
def test_the_readmes_measuring_commands_run_as_written(tmp_path: Path) -> None:
    """bench, sweep, soak, compare, diagnose and report from the README, in order,
    against a served repository of the models they name (the README's SLA sweep used to
    find no load meeting its SLA; the LLM line runs when its weights are installed)."""
    repo = tmp_path / "models"
    from tradeoff.models import build_repository
    from tradeoff.models.generative import available_generative_models

    llm = "smollm2-135m" in available_generative_models()
    build_repository(repo, ("mlp", "mlp_nobatch", *(("smollm2-135m",) if llm else ())))
    commands = [argv for where, argv in documented_commands()
                if where.startswith("README.md") and argv[0] in MEASURING
                and (llm or "openai" not in argv) and "minilm" not in " ".join(argv)]
    first = ["bench", "bench", *(["bench"] if llm else []), "sweep", "sweep", "soak"]
    assert [argv[0] for argv in commands][:len(first)] == first
    server_gen = running_server(repo)
    server: ServerProcess = next(server_gen)
    try:
        for argv in commands:
            command = [sys.executable, "-m", "tradeoff", *shortened(argv, server)]
            run = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True,
                                 timeout=240, check=False)
            verdicts = (0, 3) if argv[0] == "soak" else (0,)  # 3: soak found it unstable
            assert run.returncode in verdicts, f"{' '.join(argv)}\n{run.stdout[-2000:]}" \
                                               f"{run.stderr[-2000:]}"
            if "--sla-p99-ms" in argv:  # a verdict on the SLA, whichever the load allows
                # (warm, the sweep finds a load meeting 20 ms on a quiet machine; beside
                # the parallel tests its first level's p99 reached 21 ms)
                assert "highest rate meeting it is" in run.stdout or \
                    "no load met the SLA" in run.stdout, run.stdout[-2000:]
        assert (tmp_path / "report.html").exists() and (tmp_path / "mlp.csv").exists()
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)


# docs pages in the order a reader's files flow: sweep.json, soak.json and compare.json
# are written before diagnose and report read them
PAGE_ORDER = ["bench.md", "cache.md", "cli.md", "sweeps.md", "soak.md", "reliability.md",
              "compare.md", "diagnose.md", "report.md", "optimize.md", "llm-bench.md",
              "tuning.md"]
# lines of those pages that cannot run here, each with why; anything else must run
NOT_HERE = {
    "http://host:9000/predict": "a reader's own HTTP endpoint and body",
    "https://api.example.com": "a hosted provider and its key",
    "export PROVIDER_KEY": "a hosted provider and its key",
    "/v1,model=a": "placeholders for the reader's two LLM configurations",
    "--device cuda": "needs a GPU (docs/tuning.md says what is verified where)",
    "--duration 60 --input-tokens": "an LLM served (the README test runs its LLM bench)",
    "--profile 6": "an LLM served (the README test runs its LLM bench)",
    "--restore": "puts back a killed tuner's config (test_hostile_tune kills one first)",
}
# files a reader made earlier with commands of their own (`bench ... --json a.json`)
EARLIER = {"a.json": ["bench", "--model", "mlp"], "b.json": ["bench", "--model", "mlp_nobatch"],
           "sweep-mlp.json": ["sweep", "--model", "mlp", "--concurrency-range", "1:2"],
           "sweep-mlp_nobatch.json": ["sweep", "--model", "mlp_nobatch",
                                      "--concurrency-range", "1:2"]}
LONGER_RUNS = {"--budget": "5s", "--seconds": "0.2", "--interval": "0.3s",
               "--window": "0.5s", "--duration": "0.5s", "--concurrency-range": "1:2",
               "--rate-range": "250:400", "--rounds": "1"}
# a run the page leaves at its default length (until stable, 5 s rounds) made short too
SHORT_DEFAULTS = {"bench": ["--duration", "0.5s"],
                  "sweep": ["--duration", "0.5s", "--warmup", "0s"],
                  "compare": ["--duration", "0.5s", "--rounds", "1", "--warmup", "0s"],
                  "tune batch-size": ["--seconds", "0.2"],
                  "tune serve": ["--duration", "0.5s", "--budget", "5s"]}


def page_script(page: str, server: ServerProcess, skipped: list[str]) -> str:
    """docs/``page``'s shell blocks as one script that runs here: ports are ``server``'s,
    long runs shortened, a `serve ... &` given ports of its own and waited for, and the
    lines of NOT_HERE dropped (appended to ``skipped``)."""
    lines = ["set -e"]
    ports = {"8000": server.http_port, "8001": server.grpc_port,
             "8002": server.metrics_port}
    for match in FENCE.finditer((DOCS / page).read_text()):
        block = match.group(2).replace("\\\n", " ")
        if match.group(1) != "sh" or "\ntradeoff " not in "\n" + block:
            continue  # not a reader's commands (the developer's own are run by the suite)
        for raw in block.splitlines():
            line = raw.split("  #")[0].rstrip()
            if not line or line.startswith("#"):
                continue
            why = next((w for key, w in NOT_HERE.items() if key in line), None)
            if why:
                skipped.append(f"{page}: {why}")
                continue
            if not line.startswith("tradeoff "):
                lines.append(line)
                continue
            command = line.replace('"$(pgrep -f \'tradeoff serve\')"', str(server.process.pid))
            for default, port in ports.items():
                command = command.replace(f"127.0.0.1:{default}", f"127.0.0.1:{port}")
            argv = shortened(shlex.split(command)[1:], server)
            argv = [LONGER_RUNS.get(argv[i - 1], word)
                    if i and (argv[0], argv[i - 1]) != ("soak", "--duration") else word
                    for i, word in enumerate(argv)]
            if argv[0] == "serve":
                assert line.endswith("&"), f"{page}: a serve in the foreground never ends"
                http, grpc, metrics = free_ports(3)
                own = [*argv[:-1], "--http-port", str(http), "--grpc-port", str(grpc),
                       "--metrics-port", str(metrics)]
                lines += [shlex.join(["tradeoff", *own]) + " &",
                          "serving=$!; trap 'kill $serving; wait $serving' EXIT",
                          f"for _ in $(seq 300); do python -c \"import urllib.request as u;"
                          f"u.urlopen('http://127.0.0.1:{http}/v2/health/ready')\" "
                          f"2>/dev/null && break; sleep 0.2; done"]
                ports = {"8000": http, "8001": grpc, "8002": metrics}
                continue
            defaults = SHORT_DEFAULTS.get(" ".join(argv[:2]) if argv[0] == "tune" else argv[0],
                                          [])
            for flag, value in zip(defaults[::2], defaults[1::2], strict=True):
                if flag not in argv and not argv[1].endswith(".json") and \
                        "--restore" not in argv:
                    argv += [flag, value]
            if argv[0] == "top":
                argv += ["--iterations", "2"]
            # soak's exit status 3 is its verdict "unstable" (docs/cli.md): a result, which
            # a few half-second windows on a busy machine may give
            lines.append(shlex.join(["tradeoff", *argv])
                         + (" || test $? -eq 3" if argv[0] == "soak" else ""))
    return "\n".join(lines)


@pytest.mark.slow
def test_the_docs_pages_commands_run_as_written(tmp_path: Path) -> None:
    """Every shell block of the docs pages that measure, tune or report, run in order
    against a served example repository with shortened durations; a line that cannot run
    on this machine is named in NOT_HERE with why (docs/optimize.md used a sentences.json
    it never made, docs/routing.md named models `models build` does not make)."""
    # built by the command (not in this process, whose memory later tests measure from)
    run_shell("tradeoff models build ./models --model mlp --model mlp_nobatch --model minilm",
              tmp_path)
    server_gen = running_server(tmp_path / "models")
    server: ServerProcess = next(server_gen)
    skipped: list[str] = []
    try:
        for name, argv in EARLIER.items():
            run_shell(shlex.join(["tradeoff", *shortened(
                [argv[0], server.url, *argv[1:], "--duration", "0.5s", "--json", name],
                server)]), tmp_path)
        for page in PAGE_ORDER:
            script = page_script(page, server, skipped)
            run = subprocess.run(["bash", "-c", script], cwd=tmp_path, capture_output=True,
                                 text=True, timeout=600, check=False,
                                 env=dict(os.environ, PATH=str(Path(sys.executable).parent)
                                          + os.pathsep + os.environ.get("PATH", "")))
            assert run.returncode == 0, f"{page}\n{script}\n{run.stdout[-3000:]}\n" \
                                        f"{run.stderr[-3000:]}"
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)
    assert sorted(set(skipped)) == sorted(set(
        f"{page}: {why}" for page, why in [
            ("bench.md", NOT_HERE["http://host:9000/predict"]),
            ("llm-bench.md", NOT_HERE["https://api.example.com"]),
            ("llm-bench.md", NOT_HERE["/v1,model=a"]),
            ("llm-bench.md", NOT_HERE["--duration 60 --input-tokens"]),
            ("sweeps.md", NOT_HERE["--profile 6"]),
            ("tuning.md", NOT_HERE["--restore"]),
            ("tuning.md", NOT_HERE["--device cuda"])])), skipped
    assert (tmp_path / "findings.json").exists() and (tmp_path / "tune.json").exists()


# pages whose shell blocks the test above does not run, and what runs them instead
PAGES_RUN_ELSEWHERE = {
    "routing.md": "test_the_routing_example_builds_loads_and_routes",
    "serving.md": "a server in the foreground; every test's running_server serves so",
    "generative.md": "a server in the foreground; tests/integration/test_generative*.py",
    "scale-out.md": "other hosts (HEAD:6379); tests/integration/test_ray*.py on loopback",
    "pytorch.md": "540 MB of example models; test_pytorch_serving.py serves them small",
    "plan.md": "a plan serves and replays for minutes; tests/integration/test_plan.py runs "
               "plans end to end on short replays",
}


def test_every_page_with_commands_is_run_here_or_names_what_runs_it() -> None:
    with_commands = {page.name for page in DOCS.glob("*.md")
                     if any(m.group(1) == "sh" and "\ntradeoff " in "\n" + m.group(2)
                            for m in FENCE.finditer(page.read_text()))}
    assert with_commands <= set(PAGE_ORDER) | set(PAGES_RUN_ELSEWHERE), \
        sorted(with_commands - set(PAGE_ORDER) - set(PAGES_RUN_ELSEWHERE))
