"""A generative model whose engine runs in a process of its own (``process: true``):
the same answers, statistics and metrics as in the server's process; killed, its
requests in flight end with 503 or an error event at once, readiness goes false, and a
new engine process serves again; stopped or orphaned, it leaves no process behind."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess

from .helpers import get_text, post_json, request, running_server, wait_for
from .test_generative_dataplane import Stream

pytestmark = pytest.mark.integration

SETTINGS = {"max_num_seqs": 8}


def engine_children(server_pid: int) -> list[int]:
    """The server's engine processes (multiprocessing's spawned children)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as cmdline:
                command = cmdline.read()
        except (OSError, ValueError):
            continue
        if parent == server_pid and b"spawn_main" in command and \
                b"resource_tracker" not in command:
            found.append(int(entry))
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def repository(root: Path) -> Path:
    for name, process in (("inline", False), ("apart", True)):
        model = write_synthetic_llm(root, name, model={"step_ms": 2.0}, **SETTINGS)
        if process:
            with open(model / "generate.yaml", "a") as config:
                config.write("process: true\n")
    return root


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from running_server(repository(tmp_path_factory.mktemp("engine-process")))


def complete(url: str, model: str, prompt: str, tokens: int = 12) -> Any:
    response = post_json(url, "/v1/completions", {
        "model": model, "prompt": prompt, "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True})
    return response.status, response.json()


def ready(server: ServerProcess, model: str) -> int:
    return request(server.url, "GET", f"/v2/models/{model}/ready").status


def test_answers_statistics_and_metrics_match_the_engine_in_the_server(
        server: ServerProcess) -> None:
    assert server.process is not None and len(engine_children(server.process.pid)) == 1
    prompts = ["hello there", "a longer prompt, with a comma", "x" * 40]
    for prompt in prompts:
        inline, apart = complete(server.url, "inline", prompt), \
            complete(server.url, "apart", prompt)
        assert inline[0] == apart[0] == 200, apart
        assert apart[1]["choices"][0]["text"] == inline[1]["choices"][0]["text"]
        assert apart[1]["usage"] == inline[1]["usage"]
    text = get_text(server.metrics_url)
    for model in ("inline", "apart"):
        assert f'tradeoff_generation_requests_finished_total{{model="{model}"}} 3.0' in text
        assert f'tradeoff_generation_generation_tokens_total{{model="{model}"}} 36.0' in text
    stats = request(server.url, "GET", "/v2/models/apart/stats").json()["model_stats"][0]
    assert stats["inference_count"] == 3 and stats["execution_count"] > 0
    # refused in the front end, as in process: tokens the model lacks, a too long prompt
    status, body = complete(server.url, "apart", "y" * 5000, tokens=4)
    assert status == 400, body


def test_a_killed_engine_fails_its_requests_at_once_and_comes_back(server: ServerProcess
                                                                   ) -> None:
    assert server.process is not None
    (engine,) = engine_children(server.process.pid)
    streams = [Stream(server.url, tokens=2000, model="apart") for _ in range(3)]
    for stream in streams:
        assert stream.next_event() is not None  # each is generating
    whole: list[Any] = []
    blocked = threading.Thread(target=lambda: whole.append(
        complete(server.url, "apart", "never mind", tokens=2000)))
    blocked.start()
    time.sleep(0.2)
    os.kill(engine, signal.SIGKILL)
    killed = time.monotonic()
    ends = [stream.read_all() for stream in streams]
    blocked.join(30)
    ended_in = time.monotonic() - killed
    for events in ends:  # each stream ends with an error event, then [DONE]
        assert events[-1] == "[DONE]" and "error" in events[-2], events[-3:]
        assert "engine process ended" in events[-2]["error"]["message"]
    assert whole and whole[0][0] == 503 and "engine process ended" in str(whole[0][1])
    assert ended_in < 10, ended_in  # nothing hangs (about 0.1 s here)
    wait_for(lambda: ready(server, "apart") == 200, "a new engine process", timeout=60)
    assert engine not in engine_children(server.process.pid)
    assert complete(server.url, "apart", "hello there")[0] == 200
    assert ready(server, "inline") == 200  # the other model never noticed


def test_a_stopped_or_orphaned_server_leaves_no_engine_behind(tmp_path: Path) -> None:
    root = repository(tmp_path / "models")
    with ServerProcess(root) as stopped:
        assert stopped.process is not None
        engines = engine_children(stopped.process.pid)
        assert len(engines) == 1 and complete(stopped.url, "apart", "hi")[0] == 200
    wait_for(lambda: not any(map(alive, engines)), "the engine to exit with the server")
    with ServerProcess(root) as killed:
        assert killed.process is not None
        engines = engine_children(killed.process.pid)
        killed.process.send_signal(signal.SIGKILL)
        killed.process.wait(30)
        # its pipe closed: the orphan stops on its own
        wait_for(lambda: not any(map(alive, engines)), "the orphaned engine to exit")


def test_sigterm_drains_the_engine_process_and_ends_what_still_runs(tmp_path: Path) -> None:
    """At SIGTERM the drain reaches the child: a short generation finishes, one too long
    for the drain ends with an error event and [DONE], and the engine exits with the
    server."""
    root = repository(tmp_path / "models")
    server = ServerProcess(root, extra_args=("--shutdown-timeout", "1"))
    with server:
        assert server.process is not None
        engines = engine_children(server.process.pid)
        short, long = Stream(server.url, tokens=40, model="apart"), \
            Stream(server.url, tokens=1000, model="apart")  # 2 s of steps at least
        assert short.next_event() is not None and long.next_event() is not None
        server.process.send_signal(signal.SIGTERM)
        ends = {}
        readers = [threading.Thread(target=lambda n=n, s=s: ends.__setitem__(n, s.read_all()))
                   for n, s in (("short", short), ("long", long))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(60)
        assert server.process.wait(60) == 0
    assert ends["short"][-1] == "[DONE]"
    assert ends["short"][-2]["choices"][0]["finish_reason"] == "length"
    assert ends["long"][-1] == "[DONE]" and "shutdown drain" in \
        ends["long"][-2]["error"]["message"], ends["long"][-3:]
    wait_for(lambda: not any(map(alive, engines)), "the engine to exit with the server")
