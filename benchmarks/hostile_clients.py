"""What one hostile client costs everyone else: each attack of docs/reliability.md's
round-two table against one `tradeoff serve` (default limits, pinned to core 0), with a
normal client (core 1) timing `mlp` inferences while the attack runs, and the server's
RSS sampled every 20 ms. Prints a table (normal client's median and worst latency,
answers that failed, RSS growth, what the attacker got) and writes JSON.

    .venv/bin/python benchmarks/hostile_clients.py
    .venv/bin/python benchmarks/hostile_clients.py --only stalled-bodies huge-header
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import socket
import statistics
import struct
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import onnx
from onnx import TensorProto, helper
from slow_clients import HeadDrip, connect, head

from tradeoff.bench.soak import read_rss
from tradeoff.models import build_repository
from tradeoff.models.examples import make_model
from tradeoff.models.generative import write_generative
from tradeoff.server.process import ServerProcess

MiB = 1 << 20
ROW = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                              "data": [0.5] * 256}]}).encode()


def write_repository(root: Path) -> Path:
    build_repository(root, ("mlp",))
    write_generative(root, "tinyllama")
    strings = root / "strings"
    (strings / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], "strings",
        [helper.make_tensor_value_info("INPUT0", TensorProto.STRING, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.STRING, ["batch", "n"])])
    onnx.save(make_model(graph, producer="tradeoff-bench"), str(strings / "1" / "model.onnx"))
    return root


class RssSampler:
    """The server's resident memory, sampled in a thread: its baseline and peak."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.baseline = self.peak = self.read()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def read(self) -> int:
        rss = read_rss(self.pid, None)
        if rss is None:
            raise RuntimeError(f"cannot read the server's memory from /proc/{self.pid}")
        return int(rss)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self.read())

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def normal_client(url: str, seconds: float) -> tuple[list[float], int]:
    """Sequential mlp inferences for ``seconds``: latencies and failures."""
    latencies, failures = [], 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(urllib.request.Request(
                    f"{url}/v2/models/mlp/infer", ROW,
                    {"Content-Type": "application/json"}), timeout=10) as response:
                response.read()
            latencies.append(time.perf_counter() - started)
        except Exception:
            failures += 1
        time.sleep(0.05)
    return latencies, failures


def reply_of(sock: socket.socket, timeout: float = 60.0) -> str:
    sock.settimeout(timeout)
    data = b""
    with contextlib.suppress(OSError):
        while chunk := sock.recv(65536):
            data += chunk
    return data.split(b"\r\n", 1)[0].decode(errors="replace") or "closed"


def post(server: ServerProcess, path: str, body: bytes, headers: dict[str, str]) -> str:
    request = urllib.request.Request(f"{server.url}{path}", body,
                                     {"Content-Type": "application/json", **headers})
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return str(response.status)
    except urllib.error.HTTPError as error:
        return f"{error.code} {json.loads(error.read()).get('error', '')!s:.60}"
    except OSError as error:
        return f"{type(error).__name__}"


# ------------------------------------------------------------------------- attacks
# each holds its sockets open (or runs its request) while the normal client measures,
# and returns what the attacker saw

@contextlib.contextmanager
def stalled_bodies(server: ServerProcess) -> Iterator[Callable[[], str]]:
    socks = []
    for _ in range(1024):
        sock = connect(server, "127.0.0.2")
        sock.sendall(head("/v2/models/mlp/infer", 100_000) + b"{")
        socks.append(sock)
    yield lambda: f"{sum(reply_of(s).startswith('HTTP/1.1 408') for s in socks)}/1024 got 408"
    for sock in socks:
        sock.close()


def _background(call: Callable[[], str]) -> Iterator[Callable[[], str]]:
    result: list[str] = []
    thread = threading.Thread(target=lambda: result.append(call()))
    thread.start()
    yield lambda: (thread.join(), result[0])[1]


def _streamed_head(server: ServerProcess, start: bytes) -> str:
    sock = connect(server)
    with contextlib.suppress(OSError):
        sock.sendall(start)
        for _ in range(128):
            sock.sendall(b"a" * MiB)
    reply = reply_of(sock)
    sock.close()
    return reply


@contextlib.contextmanager
def huge_header(server: ServerProcess) -> Iterator[Callable[[], str]]:
    start = b"GET /v2/health/ready HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
    yield from _background(lambda: _streamed_head(server, start))


@contextlib.contextmanager
def huge_url(server: ServerProcess) -> Iterator[Callable[[], str]]:
    yield from _background(lambda: _streamed_head(server, b"GET /v2/health/ready?q="))


@contextlib.contextmanager
def idle_and_slow(server: ServerProcess) -> Iterator[Callable[[], str]]:
    idle = [connect(server, "127.0.0.2") for _ in range(2000)]
    slow = [connect(server, "127.0.0.3") for _ in range(500)]
    with HeadDrip(slow, head("/v2/models/mlp/infer", 2), every_s=1.0) as drip:

        def outcome() -> str:
            started = time.monotonic()
            closed = sum(reply_of(s, 30) == "closed" for s in idle)
            timed_out = sum(reply_of(s, 30).startswith("HTTP/1.1 408") for s in slow)
            drip.stop()
            return (f"{closed}/2000 idle closed, {timed_out}/500 slow got 408, all within "
                    f"{time.monotonic() - started:.0f} s of the end of the measurement")

        yield outcome
    for sock in idle + slow:
        sock.close()


@contextlib.contextmanager
def huge_prompt(server: ServerProcess) -> Iterator[Callable[[], str]]:
    body = json.dumps({"model": "tinyllama", "prompt": "z" * (16 * MiB),
                       "max_tokens": 4}).encode()
    yield from _background(lambda: post(server, "/v1/completions", body, {}))


@contextlib.contextmanager
def huge_chat(server: ServerProcess) -> Iterator[Callable[[], str]]:
    body = json.dumps({"model": "tinyllama", "max_tokens": 4,
                       "messages": [{"role": "user", "content": "hi"}] * 200_000}).encode()
    yield from _background(lambda: post(server, "/v1/chat/completions", body, {}))


@contextlib.contextmanager
def bytes_elements(server: ServerProcess) -> Iterator[Callable[[], str]]:
    count = 16_000_000
    # no batch dimension: decoded in full, then refused (400) by the model's shape
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES",
                                     "shape": [count],
                                     "parameters": {"binary_data_size": 4 * count}}]}).encode()
    body = header + struct.pack("<I", 0) * count
    yield from _background(lambda: post(server, "/v2/models/strings/infer", body, {
        "Inference-Header-Content-Length": str(len(header))}))


def _json_tensor(megabytes: float) -> bytes:
    count = int(megabytes * MiB) // 2
    return (b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, %d], '
            b'"data": [' % count) + b"0," * (count - 1) + b"0]}]}"


@contextlib.contextmanager
def huge_json(server: ServerProcess) -> Iterator[Callable[[], str]]:
    body = _json_tensor(57)
    yield from _background(lambda: post(server, "/v2/models/mlp/infer", body, {}))


@contextlib.contextmanager
def largest_json(server: ServerProcess) -> Iterator[Callable[[], str]]:
    body = _json_tensor(15.9)  # just under --max-json-bytes: decoded in full
    yield from _background(lambda: post(server, "/v2/models/mlp/infer", body, {}))


@contextlib.contextmanager
def stalled_big_bodies(server: ServerProcess) -> Iterator[Callable[[], str]]:
    socks, refused = [], 0
    for index in range(30):
        sock = connect(server, f"127.0.0.{2 + index}")
        try:
            sock.sendall(head("/v1/completions", 48 * MiB) + b" " * (40 * MiB))
        except OSError:
            refused += 1
        socks.append(sock)
    yield lambda: (f"{refused} refused while sending, replies: "
                   f"{sorted(set(reply_of(s)[:12] for s in socks))}")
    for sock in socks:
        sock.close()


ATTACKS = {
    "stalled-bodies": (stalled_bodies, "1,024 infer bodies stalled after 1 byte"),
    "huge-header": (huge_header, "a header value streamed up to 128 MB"),
    "huge-url": (huge_url, "a URL streamed up to 128 MB"),
    "idle-and-slow": (idle_and_slow, "2,000 idle sockets + 500 heads at 1 byte/s"),
    "huge-prompt": (huge_prompt, "a 16 MB prompt"),
    "huge-chat": (huge_chat, "a chat of 200,000 messages"),
    "bytes-elements": (bytes_elements, "16 million empty BYTES elements"),
    "huge-json": (huge_json, "a 57 MB JSON tensor"),
    "largest-json": (largest_json, "a 15.9 MB JSON tensor (decoded in full)"),
    "stalled-big-bodies": (stalled_big_bodies, "30 bodies of 48 MB stalled at 40 MB"),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="*", choices=list(ATTACKS), default=list(ATTACKS))
    parser.add_argument("--seconds", type=float, default=4.0,
                        help="how long the normal client measures during each attack")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/hostile.json"))
    args = parser.parse_args()
    _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(8192, hard), hard))
    cores = sorted(os.sched_getaffinity(0))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp) / "models")
        with ServerProcess(repo, cpus=str(cores[0])) as server:
            assert server.process is not None
            if len(cores) > 1:
                os.sched_setaffinity(0, set(cores[1:]))
            quiet, _ = normal_client(server.url, args.seconds)
            for name in args.only:
                attack, what = ATTACKS[name]
                sampler = RssSampler(server.process.pid)
                with sampler, attack(server) as outcome:
                    time.sleep(0.3)
                    latencies, failures = normal_client(server.url, args.seconds)
                    got = outcome()
                rows.append({"attack": name, "what": what, "median_ms":
                             1000 * statistics.median(latencies) if latencies else None,
                             "worst_ms": 1000 * max(latencies) if latencies else None,
                             "answered": len(latencies), "failed": failures,
                             "rss_growth_mib": (sampler.peak - sampler.baseline) / MiB,
                             "attacker_got": got})
                print(f"{name:20} median {rows[-1]['median_ms'] or 0:7.1f} ms  worst "
                      f"{rows[-1]['worst_ms'] or 0:7.1f} ms  failed {failures:3}  RSS "
                      f"+{rows[-1]['rss_growth_mib']:6.0f} MiB  attacker: {got}", flush=True)
                time.sleep(1.0)
    doc = {"version": 1, "command": "benchmarks/hostile_clients.py", "quiet_median_ms":
           1000 * statistics.median(quiet), "attacks": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2))
    print(f"no attack: median {doc['quiet_median_ms']:.1f} ms; JSON written to {args.out}")


if __name__ == "__main__":
    main()
