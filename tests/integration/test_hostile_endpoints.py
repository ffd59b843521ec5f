"""The clients (`tradeoff bench`, `tradeoff top`) against a hostile endpoint on 127.0.0.1:
endless and dripping streams, a 1 GiB answer made as it is sent, metadata nested past any
parser's depth, huge and dripping ``/metrics``. Each must end in bounded time and memory
with one line that says what was exceeded, and count what failed.

The endpoint runs in a process of its own (``python this_file.py``), so the client's CPU
figures are the client's alone. The first path segment picks its behaviour.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

GIB = 1 << 30
MODEL = {"name": "m", "versions": ["1"], "platform": "onnxruntime_onnx",
         "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4]}],
         "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [1, 4]}]}
MODELS = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "hostile"}]}
ANSWER = {"model_name": "m", "outputs": [{"name": "OUTPUT0", "datatype": "FP32",
                                          "shape": [1, 4], "data": [1, 2, 3, 4]}]}
METRICS = (b'# TYPE tradeoff_model_ready gauge\n'
           b'tradeoff_model_ready{model="m",version="1"} 1\n')
EVENT = b'data: {"choices":[{"index":0,"text":"tok "}]}\n\n'


# ------------------------------------------------------------------ the endpoint

class Hostile:
    """``/{mode}/...``: what the endpoint does with each request (see ``_answer``)."""

    def __init__(self) -> None:
        self.seen: dict[str, int] = {}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                length = next((int(line.split(":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith("content-length:")), 0)
                if length:
                    await reader.readexactly(length)
                mode, _, rest = target.lstrip("/").partition("/")
                self.seen[mode] = self.seen.get(mode, 0) + 1
                await self._answer(writer, method, mode, "/" + rest, self.seen[mode])
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()

    async def _answer(self, writer: asyncio.StreamWriter, method: str, mode: str,
                      path: str, count: int) -> None:
        if path.endswith("/metrics"):
            await self._metrics(writer, mode, count)
        elif path.endswith("/models"):  # the OpenAI model listing
            await self._metadata(writer, mode, MODELS)
        elif path.endswith("/completions"):
            await self._stream(writer, mode)
        elif path.endswith("/infer"):
            await self._infer(writer, mode)
        elif path.endswith("/config"):
            send(writer, 200, json.dumps({"max_batch_size": 0}).encode())
        elif path.endswith("/m"):
            await self._metadata(writer, mode, MODEL)
        else:
            send(writer, 404, b'{"error": "not found"}')
        await writer.drain()

    async def _metadata(self, writer: asyncio.StreamWriter, mode: str, doc: Any) -> None:
        if mode == "meta-drip":  # a head, then one byte of the body a second
            await drip(writer, json.dumps(doc).encode() * 1000, 1.0)
        elif mode == "meta-nest":  # deeper than any JSON parser goes
            send(writer, 200, b"[" * 200_000)
        elif mode == "meta-huge":  # 1 GiB of "["
            await lazily(writer, GIB, b"[")
        else:
            send(writer, 200, json.dumps(doc).encode())

    async def _infer(self, writer: asyncio.StreamWriter, mode: str) -> None:
        if mode == "infer-huge":
            await lazily(writer, GIB, b"0")
        elif mode == "infer-chunked":  # 1 GiB in chunks: no length said before
            await lazily(writer, GIB, b"0", framing="chunked")
        elif mode == "infer-unended":  # 1 GiB without a length: the body ends at the close
            await lazily(writer, GIB, b"0", framing="close")
        elif mode == "infer-garbage":
            send(writer, 200, b"\x00\xffnot an answer")
        elif mode == "infer-drip":  # the answer, a byte every 10 ms
            await drip(writer, json.dumps(ANSWER).encode(), 0.01)
        else:
            send(writer, 200, json.dumps(ANSWER).encode())

    async def _stream(self, writer: asyncio.StreamWriter, mode: str) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")
        if mode == "sse-drip":  # events without end, one byte every 5 ms
            while True:
                for byte in EVENT:
                    writer.write(b"1\r\n%c\r\n" % byte)
                    await writer.drain()
                    await asyncio.sleep(0.005)
        batch = EVENT * 64  # sse-endless: events as fast as they are read, never [DONE]
        while True:
            writer.write(b"%x\r\n%s\r\n" % (len(batch), batch))
            await writer.drain()

    async def _metrics(self, writer: asyncio.StreamWriter, mode: str, count: int) -> None:
        if mode == "huge":
            await lazily(writer, GIB, b"# a comment line without end ")
        elif mode == "many":  # 300,000 series in about 7 MB
            send(writer, 200, b"".join(b"s{i=\"%d\"} 1\n" % i for i in range(300_000)))
        elif mode == "drip":
            await drip(writer, METRICS * 1000, 0.05)
        elif mode == "endless":  # chunked, never ends
            writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
            while True:
                writer.write(b"%x\r\n%s\r\n" % (len(METRICS), METRICS))
                await writer.drain()
        elif mode == "flaky" and count <= 2:  # too big twice, then right
            await lazily(writer, GIB, b"# too big ")
        else:
            send(writer, 200, METRICS)


def send(writer: asyncio.StreamWriter, status: int, body: bytes) -> None:
    writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (status, len(body), body))


async def drip(writer: asyncio.StreamWriter, body: bytes, every_s: float) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(body))
    for byte in body:
        writer.write(bytes((byte,)))
        await writer.drain()
        await asyncio.sleep(every_s)


async def lazily(writer: asyncio.StreamWriter, size: int, pattern: bytes,
                 framing: str = "length") -> None:
    """A body of ``size`` bytes, made a MiB at a time as the client reads it; ``framing``:
    a Content-Length, chunks, or nothing (the body ends when the connection closes)."""
    chunk = (pattern * (2**20 // len(pattern) + 1))[:2**20]
    head = {"length": b"Content-Length: %d\r\n" % size,
            "chunked": b"Transfer-Encoding: chunked\r\n",
            "close": b"Connection: close\r\n"}[framing]
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n%s\r\n" % head)
    if framing == "chunked":
        chunk = b"%x\r\n%s\r\n" % (len(chunk), chunk)
    for _ in range(size // 2**20):
        writer.write(chunk)
        await writer.drain()
    if framing == "chunked":
        writer.write(b"0\r\n\r\n")
    elif framing == "close":
        writer.close()


async def serve() -> None:
    hostile = Hostile()
    server = await asyncio.start_server(hostile.handle, "127.0.0.1", 0, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()


# ------------------------------------------------------------------------ the tests

pytestmark = pytest.mark.integration

SLACK_S = 6.0  # a CLI's start (imports) and a loaded machine: far below any hang


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    """The endpoint's base URL, ``http://127.0.0.1:PORT``."""
    process = subprocess.Popen([sys.executable, __file__], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout is not None:
            process.stdout.close()


# Started by a small interpreter of its own: a child's peak RSS (ru_maxrss) starts at its
# parent's RSS when it is forked, and this test process may hold a gigabyte by now.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    os.execv(sys.executable, [sys.executable, *sys.argv[2:]])
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(str(usage.ru_maxrss))
sys.exit(os.waitstatus_to_exitcode(status))
"""


def tradeoff(*args: str, limit_s: float = 60) -> tuple[subprocess.CompletedProcess, float]:
    """Run the CLI; (the finished process, its wall time). ``run.peak_rss_kib`` is that
    process's own peak RSS, taken by a small launcher (wait4) so that it does not start at
    this test process's."""
    started = time.monotonic()
    command = [sys.executable, "-m", "tradeoff", *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err, \
            tempfile.TemporaryDirectory() as tmp:
        peak = Path(tmp) / "peak"
        process = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(peak), "-m",
                                    "tradeoff", *args], stdout=out, stderr=err,
                                   start_new_session=True)
        # past its limit: the test fails
        killer = threading.Timer(limit_s, lambda: os.killpg(process.pid, 9))
        killer.start()
        try:
            process.wait()
        finally:
            killer.cancel()
        out.seek(0)
        err.seek(0)
        run = subprocess.CompletedProcess(command, process.returncode,
                                          out.read().decode(errors="replace"),
                                          err.read().decode(errors="replace"))
        run.peak_rss_kib = int(peak.read_text()) if peak.exists() else 10**9  # type: ignore[attr-defined]
    return run, time.monotonic() - started


def bench(tmp_path: Path, url: str, *args: str, limit_s: float = 60
          ) -> tuple[dict[str, Any], str, float]:
    """``tradeoff bench`` to its end: (the result document, the output, the wall time)."""
    out = tmp_path / "result.json"
    out.unlink(missing_ok=True)
    run, wall = tradeoff("bench", url, "--model", "m", *args, "--json", str(out),
                         limit_s=limit_s)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(out.read_text()), run.stdout + run.stderr, wall


def one_line_error(run: subprocess.CompletedProcess) -> str:
    """The error a failed command printed: one line, no traceback."""
    assert run.returncode == 1, run.stdout + run.stderr
    assert "Traceback" not in run.stderr, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    return lines[0]


# ---- item 8: tradeoff top


@pytest.mark.parametrize(("mode", "said"), [
    ("huge", "a reading over 33,554,432 bytes"),
    ("many", "more than 100,000 series in one reading (300,000)"),
])
def test_top_skips_a_reading_past_a_bound_and_keeps_polling(hostile: str, mode: str,
                                                            said: str) -> None:
    run, wall = tradeoff("top", f"{hostile}/{mode}/metrics", "--interval", "0.2s",
                         "--iterations", "3", limit_s=30)
    assert run.returncode == 0 and "Traceback" not in run.stderr, run.stdout + run.stderr
    assert said in " ".join(run.stdout.split()), run.stdout
    assert wall < 5 * 1.0 + SLACK_S  # read to the bound and dropped, four times
    # top's peak RSS: nowhere near the 6 GiB the 1 GiB body once took
    assert run.peak_rss_kib < 1_000_000  # type: ignore[attr-defined]


def test_top_shows_the_models_again_once_the_readings_are_right(hostile: str) -> None:
    # twice too big, then right: the rows come back, the command did not stop
    run, _ = tradeoff("top", f"{hostile}/flaky/metrics", "--interval", "0.2s",
                      "--iterations", "3", limit_s=30)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "req/s" in run.stdout and " m " in run.stdout, run.stdout


@pytest.mark.parametrize("mode", ["drip", "endless"])
def test_a_reading_has_one_deadline_not_one_per_read(hostile: str, mode: str) -> None:
    from tradeoff.bench.scrape import ScrapeError, scrape

    started = time.monotonic()
    with pytest.raises(ScrapeError, match=r"within 1 s|over 1,048,576 bytes"):
        scrape(f"{hostile}/{mode}/metrics", timeout_s=1.0, max_bytes=1 << 20)
    assert time.monotonic() - started < 1.0 + 2.0


# ---- item 9: bench --protocol openai, and the set-up


@pytest.mark.parametrize("mode", ["sse-endless", "sse-drip"])
def test_an_endless_or_dripping_stream_ends_with_the_run(hostile: str, tmp_path: Path,
                                                         mode: str) -> None:
    result, out, wall = bench(tmp_path, f"{hostile}/{mode}/v1", "--protocol", "openai",
                              "--duration", "2s", "--timeout", "2s", "--concurrency", "2",
                              limit_s=40)
    # the cold start (its --timeout), the run, the grace (its --timeout): then it ends
    assert wall < 2 + 2 + 2 + SLACK_S, (wall, out)
    summary = result["summary"]
    assert summary["requests"] >= 2 and summary["successes"] == 0
    # a stream read as fast as it comes passes --max-response-size in time: too_large
    assert sum(summary["errors_by_class"].get(kind, 0)
               for kind in ("timeout", "other", "too_large")) == summary["requests"]


def test_requests_in_flight_are_cut_at_the_grace_and_counted(hostile: str) -> None:
    from tradeoff.bench.endpoint import EndpointSpec, make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.records import TIMEOUT
    from tradeoff.bench.runner import Runner, run_coroutine

    adapter = make_adapter(EndpointSpec(f"{hostile}/sse-drip/v1", "openai", "m"))
    requests = adapter.prepare()
    # a timeout far longer than the test: the grace ends the run, and one connection
    # makes the rest wait for it (never sent: cut too)
    spec = LoadSpec(rate=10, duration_s=1.0, timeout_s=600, stop_grace_s=1.0,
                    max_connections=1)
    started = time.monotonic()
    outcome = run_coroutine(Runner(adapter, requests, spec).run(cold_start=False))
    assert time.monotonic() - started < 1.0 + 1.0 + 3.0
    records = outcome.records
    assert len(records) >= 5 and (records.outcome == TIMEOUT).all()
    cut = next(note for note in outcome.notes if "cut" in note)
    assert cut.startswith(f"{len(records)} request(s) still in flight 1 s after"), cut
    assert any("waited for a free connection" in note for note in outcome.notes)


def test_a_stream_has_the_timeout_in_all_not_per_piece() -> None:
    from tradeoff.bench.adapters import split_url
    from tradeoff.bench.openai_stream import generation_body, generation_request, stream_once

    from .streaming_server import StreamingServer

    with StreamingServer() as streaming:
        host, port, base = split_url(streaming.url(first=50, every=250))
        raw = generation_request(host, base, generation_body("test-model", prompt="x",
                                                             max_tokens=4), chat=False)
        # 4 tokens 250 ms apart: never idle 0.4 s, yet longer than 0.4 s in all
        timing = asyncio.run(stream_once(host, port, raw, chat=False, timeout_s=0.4))
        assert "TimeoutError" in str(timing.error) and timing.latency_s < 1.5
        timing = asyncio.run(stream_once(host, port, raw, chat=False, timeout_s=3))
        assert timing.error is None


@pytest.mark.parametrize("protocol", ["v2", "openai"])
def test_a_dripping_metadata_endpoint_cannot_hang_the_set_up(hostile: str,
                                                              protocol: str) -> None:
    url = f"{hostile}/meta-drip" + ("/v1" if protocol == "openai" else "")
    run, wall = tradeoff("bench", url, "--protocol", protocol, "--model", "m",
                         "--duration", "1s", "--timeout", "2s", limit_s=30)
    assert "no whole answer within 2 s" in one_line_error(run)
    assert wall < 2 + SLACK_S


# ---- item 10: the size of answers, bodies that cannot be read, client-bound


def test_a_huge_answer_is_an_error_and_is_not_held(hostile: str, tmp_path: Path) -> None:
    out = tmp_path / "huge.json"
    run, _ = tradeoff("bench", f"{hostile}/infer-huge", "--model", "m", "--requests", "2",
                      "--json", str(out))
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text())
    summary = result["summary"]
    assert summary["successes"] == 0 and summary["errors_by_class"] == {"too_large": 2}
    assert any("passed 67,108,864 bytes (--max-response-size)" in note
               for note in result["client"]["notes"]), result["client"]
    assert run.peak_rss_kib < 1_000_000  # type: ignore[attr-defined]  # KiB, 1 GiB sent
    # the flag sets the bound
    result, _, _ = bench(tmp_path, f"{hostile}/infer-huge", "--requests", "2",
                         "--max-response-size", "1MiB")
    assert any("passed 1,048,576 bytes" in note for note in result["client"]["notes"])


@pytest.mark.parametrize("mode", ["infer-huge", "infer-chunked", "infer-unended"])
def test_answers_over_the_bound_are_too_large_and_memory_stays_bounded(
        hostile: str, tmp_path: Path, mode: str) -> None:
    """Twenty answers of 1 GiB (a Content-Length, chunks, or a body that ends at the
    close): each is a ``too_large`` error, and the client's peak memory is its start
    (about 65 MB) and a few --max-response-size at most, whatever the count of them."""
    out = tmp_path / "huge.json"
    run, wall = tradeoff("bench", f"{hostile}/{mode}", "--model", "m", "--requests", "20",
                         "--json", str(out), limit_s=60)
    assert run.returncode == 0, run.stdout + run.stderr
    summary = json.loads(out.read_text())["summary"]
    assert summary["successes"] == 0 and summary["errors_by_class"] == {"too_large": 20}
    shown = " ".join(run.stdout.split())
    assert "too_large: 20 (answers over --max-response-size)" in shown, run.stdout
    # 64 MiB held for every answer that failed made 1.4 GB of twenty
    assert run.peak_rss_kib < 400_000  # type: ignore[attr-defined]
    assert wall < 20 + SLACK_S


def test_an_announced_length_over_the_bound_fails_before_the_body(hostile: str,
                                                                  tmp_path: Path) -> None:
    result, _, _ = bench(tmp_path, f"{hostile}/infer-huge", "--requests", "2")
    notes = result["client"]["notes"]
    assert any("its Content-Length is 1,073,741,824" in note for note in notes), notes


def test_a_grpc_answer_over_the_bound_is_refused_from_its_length() -> None:
    """The channel's largest message is --max-response-size: a 2 MiB answer against a
    1 MiB bound fails as too large, and so its class is ``too_large``."""
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    from tradeoff.bench.grpc_adapter import GrpcConnection
    from tradeoff.bench.records import OUTCOME_NAMES, classify
    from tradeoff.protocol.http_client import ResponseTooLarge

    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ModelInfer": grpc.unary_unary_rpc_method_handler(lambda _, __: b"0" * (2 << 20))})
    server = grpc.server(ThreadPoolExecutor(1))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()

    async def once() -> BaseException:
        connection = GrpcConnection(f"127.0.0.1:{port}", 10.0, max_bytes=1 << 20)
        try:
            with pytest.raises(ResponseTooLarge, match="passed 1,048,576 bytes") as raised:
                await connection.request(b"")
            return raised.value
        finally:
            assert connection.channel is not None
            await connection.channel.close()

    try:
        assert OUTCOME_NAMES[classify(asyncio.run(once()))] == "too_large"
    finally:
        server.stop(None)


def test_an_undecodable_answer_is_an_error(hostile: str, tmp_path: Path) -> None:
    result, _, _ = bench(tmp_path, f"{hostile}/infer-garbage", "--requests", "20")
    assert result["summary"]["successes"] == 0
    assert result["summary"]["errors_by_class"] == {"other": 20}
    assert any("undecodable answer" in note for note in result["client"]["notes"])


@pytest.mark.parametrize(("mode", "said"), [
    ("meta-nest", "the answer is not JSON (depth limit exceeded"),
    ("meta-huge", "the answer passed 67,108,864 bytes"),
])
@pytest.mark.parametrize("protocol", ["v2", "openai"])
def test_hostile_metadata_is_one_line(hostile: str, mode: str, said: str,
                                      protocol: str) -> None:
    url = f"{hostile}/{mode}" + ("/v1" if protocol == "openai" else "")
    run, _ = tradeoff("bench", url, "--protocol", protocol, "--model", "m",
                      "--requests", "1", limit_s=30)
    assert said in one_line_error(run)


@pytest.mark.timing  # the verdict reads the client's lag: a loaded machine adds to it
def test_a_dripping_endpoint_is_not_diagnosed_client_bound(hostile: str,
                                                          tmp_path: Path) -> None:
    result, _, _ = bench(tmp_path, f"{hostile}/infer-drip", "--rate", "20", "--duration",
                         "2s", "--timeout", "5s")
    assert result["summary"]["successes"] > 0
    run, _ = tradeoff("diagnose", str(tmp_path / "result.json"), "--json",
                      str(tmp_path / "findings.json"))
    assert run.returncode == 0, run.stdout + run.stderr
    findings = json.loads((tmp_path / "findings.json").read_text())
    rules = {f["rule"] for f in findings.get("findings", findings)}
    assert "client_bound" not in rules, findings


if __name__ == "__main__":
    asyncio.run(serve())
