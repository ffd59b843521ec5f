"""Do the heads real clients send take the fast path? The same infer request, one
keep-alive connection, closed loop, sent with the head of each client, rounds interleaved:
requests per second for each head (medians), and each against the plain head.

`tradeoff serve` (pinned to core 0) serves `mlp`; this process (core 1) sends binary
tensors with the header lines perf_analyzer (libcurl: ``Content-Length: 1208 ``, with a
trailing space), curl (``Expect: 100-continue``) and tradeoff bench send.

    .venv/bin/python benchmarks/request_heads.py --rounds 5 --requests 3000
    # the same against another checkout's server (before a change):
    PYTHONPATH=/path/to/old/src .venv/bin/python benchmarks/request_heads.py
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

HEADS = {
    "plain": b"Content-Length: %d\r\n",
    "trailing space (perf_analyzer)": b"Content-Length: %d \r\n",
    "Expect: 100-continue (curl)": b"Content-Length: %d\r\nExpect: 100-continue\r\n",
}


def request_bytes(path: bytes, extra: bytes) -> tuple[bytes, bytes]:
    """(head, body) of one binary-tensor infer request of ``mlp``."""
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                                     "parameters": {"binary_data_size": 1024}}],
                         "outputs": [{"name": "OUTPUT0",
                                      "parameters": {"binary_data": True}}]}).encode()
    body = header + np.ones(256, np.float32).tobytes()
    head = (b"POST %s HTTP/1.1\r\nHost: 127.0.0.1\r\nInference-Header-Content-Length: %d\r\n"
            % (path, len(header))) + extra % len(body) + b"\r\n"
    return head, body


def read_response(sock: socket.socket, pending: bytearray) -> None:
    """Read one whole response (after any 100 Continue) off ``sock``."""
    while True:
        end = pending.find(b"\r\n\r\n")
        while end < 0:
            pending += sock.recv(65536)
            end = pending.find(b"\r\n\r\n")
        head = bytes(pending[:end]).lower()
        del pending[:end + 4]
        if head.startswith(b"http/1.1 100"):
            continue
        length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                      if line.startswith(b"content-length:"))
        while len(pending) < length:
            pending += sock.recv(65536)
        del pending[:length]
        return


def rate(port: int, head: bytes, body: bytes, count: int) -> float:
    """Requests per second of ``count`` requests on one connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        pending = bytearray()
        expect = b"expect:" in head.lower()
        started = time.perf_counter()
        for _ in range(count):
            if expect:  # as curl does: the head, the 100, then the body
                sock.sendall(head)
                while b"\r\n\r\n" not in pending:
                    pending += sock.recv(65536)
                assert pending.startswith(b"HTTP/1.1 100"), bytes(pending[:80])
                del pending[:pending.find(b"\r\n\r\n") + 4]
                sock.sendall(body)
            else:
                sock.sendall(head + body)
            read_response(sock, pending)
        return count / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {1})
    results: dict[str, list[float]] = {name: [] for name in HEADS}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, ("mlp",))
        with ServerProcess(repo, cpus="0") as server:
            for round_no in range(args.rounds):
                order = list(HEADS) if round_no % 2 == 0 else list(reversed(HEADS))
                for name in order:
                    head, body = request_bytes(b"/v2/models/mlp/infer", HEADS[name])
                    rate(server.http_port, head, body, 200)  # warm the connection path
                    results[name].append(rate(server.http_port, head, body, args.requests))
                print(f"round {round_no + 1}: " + ", ".join(
                    f"{n} {results[n][-1]:,.0f}/s" for n in HEADS), flush=True)
    plain = statistics.median(results["plain"])
    print("\n| head | req/s (median) | against plain |\n|---|---:|---:|")
    for name, values in results.items():
        print(f"| {name} | {statistics.median(values):,.0f} | "
              f"{statistics.median(values) / plain:.2f} |")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"schema": "tradeoff.request_heads/1",
                                         "command": " ".join(sys.argv), "runs": results},
                                        indent=2))


if __name__ == "__main__":
    main()
