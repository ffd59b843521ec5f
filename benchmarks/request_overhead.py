"""Where the time of one small request goes: each stage timed alone, then HTTP as a whole.

In process, on one core: decode, validation, the scheduler's thread hand-off, ONNX
Runtime itself, encoding. Then over HTTP, server on one core and client on the other: a
bare ASGI app on the same uvicorn settings (the floor any ASGI server pays) next to
`tradeoff serve` on `tiny`. Medians of several runs.

    .venv/bin/python benchmarks/request_overhead.py
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import uvloop

from tradeoff.bench.adapters import Adapter, HttpJsonAdapter, V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.models import build_repository
from tradeoff.protocol.v2 import TensorOutput, decode_request, encode_response
from tradeoff.repository.repository import ModelRepository
from tradeoff.scheduling.request import Timings
from tradeoff.scheduling.scheduler import run_batch
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.models import ModelManager
from tradeoff.server.process import ServerProcess, free_port


async def hello_app(scope, receive, send):  # type: ignore[no-untyped-def]
    """The least an ASGI app can do: read the body, answer 2 bytes."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def per_call_us(fn: Callable[[], object], calls: int = 5000, runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


async def per_await_us(fn: Callable[[], object], calls: int = 2000, runs: int = 5) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        for _ in range(calls):
            await fn()  # type: ignore[misc]
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def in_process(repo: Path) -> dict[str, float]:
    x = np.random.default_rng(0).standard_normal((1, 16)).astype(np.float32)
    header = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 16],
                                       "parameters": {"binary_data_size": x.nbytes}}],
                           "parameters": {"binary_data_output": True}})
    body = header + x.tobytes()
    out: dict[str, float] = {}

    async def scenario() -> None:
        manager = ModelManager(ModelRepository(repo))
        await manager.load("tiny")
        dataplane = DataPlane(manager)
        served = manager.get("tiny")
        request = decode_request(body, len(header))
        backend = served.scheduler._instances[0]
        _, internal = dataplane.prepare("tiny", None, request)
        outputs = [TensorOutput("OUTPUT0", x, "FP32", True)]
        timings = Timings(1000, 2000, 3000, 4000, 1)
        out["decode request (binary)"] = per_call_us(lambda: decode_request(body, len(header)))
        out["validate against config"] = per_call_us(lambda: dataplane.prepare("tiny", None, request))
        out["ONNX Runtime run (1 row)"] = per_call_us(
            lambda: backend.run(internal.inputs, ["OUTPUT0"]))
        out["run_batch (concat, run, split)"] = per_call_us(
            lambda: run_batch(backend, served.config, [internal], ["OUTPUT0"]))
        out["encode response (binary)"] = per_call_us(
            lambda: encode_response("tiny", "1", None, outputs))
        out["Server-Timing header"] = per_call_us(timings.server_timing)
        loop = asyncio.get_running_loop()
        pool = concurrent.futures.ThreadPoolExecutor(1)
        out["thread hand-off round trip (no-op)"] = await per_await_us(
            lambda: loop.run_in_executor(pool, int))
        out["data plane infer, one at a time"] = await per_await_us(
            lambda: dataplane.infer("tiny", None, decode_request(body, len(header))))
        pool.shutdown()
        await manager.close()

    uvloop.run(scenario())
    return out


def over_http(repo: Path, server_cpu: int, client_cpu: int, duration: float,
              repeats: int) -> dict[str, dict[int, float]]:
    results: dict[str, dict[int, list[float]]] = {"bare ASGI app": {}, "tradeoff serve tiny": {}}
    hello_port = free_port()
    hello = subprocess.Popen(
        ["taskset", "-c", str(server_cpu), sys.executable, __file__, "--hello-server",
         str(hello_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    os.sched_setaffinity(0, {client_cpu})
    try:
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            targets: dict[str, Adapter] = {
                "bare ASGI app": HttpJsonAdapter(f"http://127.0.0.1:{hello_port}/"),
                "tradeoff serve tiny": V2Adapter(server.url, "tiny"),
            }
            for _ in range(repeats):
                for name, adapter in targets.items():
                    for concurrency in (1, 64):
                        result, _, _ = run_benchmark(adapter, LoadSpec(
                            concurrency=concurrency, duration_s=duration, warmup_s=0.5))
                        results[name].setdefault(concurrency, []).append(
                            result["summary"]["throughput_rps"])
    finally:
        hello.terminate()
        hello.wait()
    return {name: {c: statistics.median(v) for c, v in by_c.items()}
            for name, by_c in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hello-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/request_overhead.json"))
    args = parser.parse_args()
    if args.hello_server:
        import uvicorn
        uvicorn.run(hello_app, host="127.0.0.1", port=args.hello_server, loop="uvloop",
                    http="httptools", access_log=False, log_level="warning",
                    proxy_headers=False, server_header=False, date_header=False)
        return
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, ("tiny",))
        os.sched_setaffinity(0, {server_cpu})
        stages = in_process(repo)
        os.sched_setaffinity(0, set(cores))
        http = over_http(repo, server_cpu, client_cpu, args.duration, args.repeats)
    print("| stage (in process, one core) | µs per call (median) |")
    print("|---|---:|")
    for name, value in stages.items():
        print(f"| {name} | {value:.1f} |")
    print()
    print("| over HTTP, server core 0, client core 1 | c=1 req/s | c=64 req/s | "
          "µs of server core per request at c=64 |")
    print("|---|---:|---:|---:|")
    for name, by_c in http.items():
        print(f"| {name} | {by_c[1]:,.0f} | {by_c[64]:,.0f} | {1e6 / by_c[64]:.0f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.request_overhead/1",
                                     "command": " ".join(sys.argv), "stages_us": stages,
                                     "http_rps": http}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
