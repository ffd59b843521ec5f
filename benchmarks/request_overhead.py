"""Where the time of one small request goes: each stage timed alone, then HTTP as a whole.

In process, on one core: decode, validation, the scheduler's thread hand-off, ONNX
Runtime itself, encoding. Then over HTTP, server on one core and client on the other: a
bare ASGI app on the same uvicorn settings (the floor any ASGI server pays) next to
`tradeoff serve` on `tiny`. Each in-process stage is the least of ``--repeats`` runs in
child processes (other work on a shared core only ever adds time); the HTTP figures are
medians.

With ``--baseline-src DIR`` (the ``src`` of another checkout, e.g. a ``git worktree`` of
an older commit) the same stages and the same HTTP load run against that code too, in
the same run, interleaved (a child of this tree, then one of the baseline, and again), so
a change's per-request cost is measured before and after:

    .venv/bin/python benchmarks/request_overhead.py
    git worktree add /tmp/before <commit>
    .venv/bin/python benchmarks/request_overhead.py --baseline-src /tmp/before/src

``--http-only`` skips the in-process stages (they reach into the server's internals,
which an older tree may lay out differently). ``--workers N`` adds `tradeoff serve
--workers N` on `tiny` to the HTTP targets, every process of it on the server's core.
Each HTTP target's row has its req/s, its p50 and the server's CPU per request (every
process of the server: front ends, executor, supervisor).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import uvloop
from harness import cpu_seconds

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
from tradeoff.server.process import ServerProcess, free_port, source_tree


def checker(dataplane: DataPlane, request: Any) -> Callable[[], Any]:
    """The model's lookup and the request's checks against its config, as this tree or a
    baseline tree from before server/validation.py (DataPlane.prepare) runs them."""
    try:
        from tradeoff.server.validation import validate
    except ImportError:
        return lambda: dataplane.prepare("tiny", None, request)[1]  # type: ignore[attr-defined]
    return lambda: validate(dataplane.manager.tensor("tiny", None), request)


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
        backend = served.executor._instances[0]
        check = checker(dataplane, request)
        internal = check()
        outputs = [TensorOutput("OUTPUT0", x, "FP32", True)]
        timings = Timings(1000, 2000, 3000, 4000, 1)
        out["decode request (binary)"] = per_call_us(lambda: decode_request(body, len(header)))
        out["validate against config"] = per_call_us(check)
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
    for connections, rounds in ((1, 2000), (64, 100)):
        out[f"HTTP infer through the connection, c={connections} (CPU µs)"] = \
            connection_cpu_us(repo, "tiny", body, len(header), connections, rounds)
    return out


class _Connection:
    """A transport that takes the place of a socket: counts whole responses written."""

    def __init__(self, on_response: Callable[[], None]) -> None:
        self.on_response = on_response
        self.buffer = b""
        self.closing = False

    def write(self, data: bytes) -> None:
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.on_response()

    def get_extra_info(self, name: str, default: object = None) -> object:
        return {"sockname": ("127.0.0.1", 8000),
                "peername": ("127.0.0.1", 40000)}.get(name, default)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def pause_reading(self) -> None: ...
    def resume_reading(self) -> None: ...
    def write_eof(self) -> None: ...


def connection_cpu_us(repo: Path, model: str, body: bytes, header_length: int,
                      connections: int, rounds: int = 200, runs: int = 5) -> float:
    """Server CPU per infer request through `tradeoff serve`'s own HTTP protocol, app and
    data plane, without sockets: ``connections`` connections send one request each, the
    loop answers them all, again (median over ``runs`` of CPU time, all threads)."""
    import uvicorn
    from uvicorn.server import ServerState

    from tradeoff.server import transport
    from tradeoff.server.options import ServeOptions
    from tradeoff.server.runner import make_app, make_dataplane

    request = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
               f"Accept: */*\r\nContent-Type: application/octet-stream\r\n"
               f"Inference-Header-Content-Length: {header_length}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    samples: list[float] = []

    async def scenario() -> None:
        options = ServeOptions(model_repository=repo, metrics_port=None, grpc_port=None)
        dataplane = make_dataplane(options)

        async def nothing() -> None: ...

        app = make_app(options, dataplane, options.transport, None, nothing, nothing)
        await dataplane.manager.load_all()
        try:  # what `tradeoff serve` does once its models are loaded
            from tradeoff.server.runner import settle_heap
        except ImportError:  # a tree before it did
            pass
        else:
            settle_heap()
        dataplane.started = True
        config = uvicorn.Config(app, loop="none", lifespan="off", log_config=None,
                                access_log=False, server_header=False, date_header=False)
        config.load()
        try:  # a tree before the direct path took only the limits
            protocol_class = transport.guarded_protocol(options.transport, app)
        except TypeError:
            protocol_class = transport.guarded_protocol(options.transport)
        loop = asyncio.get_running_loop()
        state = ServerState()
        waiting = [0]
        all_answered: list[asyncio.Future[None]] = []

        def answered() -> None:
            waiting[0] -= 1
            if not waiting[0]:
                all_answered[-1].set_result(None)

        protocols = []
        for _ in range(connections):
            protocol = protocol_class(config=config, server_state=state, app_state={},
                                      _loop=loop)
            protocol.connection_made(_Connection(answered))
            protocols.append(protocol)

        async def one_round() -> None:
            waiting[0] = connections
            all_answered.append(loop.create_future())
            for protocol in protocols:
                protocol.data_received(request)
            await all_answered[-1]
            all_answered.clear()

        for _ in range(rounds // 4):
            await one_round()
        for _ in range(runs):
            start = time.process_time()
            for _ in range(rounds):
                await one_round()
            samples.append((time.process_time() - start) / (rounds * connections) * 1e6)
        for protocol in protocols:
            protocol.connection_lost(None)
        await dataplane.close()

    uvloop.run(scenario())
    return statistics.median(samples)


def stages_in_child(repo: Path, src: Path | None, cpu: int) -> dict[str, float]:
    """The in-process stages, measured by a child process on core ``cpu`` that imports
    the code under ``src`` (this tree when None)."""
    env = dict(os.environ)
    if src is not None:
        env["PYTHONPATH"] = str(src)
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(["taskset", "-c", str(cpu), sys.executable, __file__, "--stages-only",
                        str(repo), "--json", out.name], check=True, env=env)
        stages: dict[str, float] = json.loads(Path(out.name).read_text())
    return stages


def interleaved_stages(repo: Path, baseline_src: Path | None, cpu: int, repeats: int
                       ) -> tuple[dict[str, float], dict[str, float] | None]:
    """Each stage's least figure over ``repeats`` child runs of this tree (and of the
    baseline, alternating with it): on a shared VM a run is only ever slowed down by
    other work, so the least is the one that other work touched least."""
    runs: list[dict[str, float]] = []
    baseline_runs: list[dict[str, float]] = []
    for _ in range(repeats):
        runs.append(stages_in_child(repo, None, cpu))
        if baseline_src is not None:
            baseline_runs.append(stages_in_child(repo, baseline_src, cpu))

    def least(of: list[dict[str, float]]) -> dict[str, float]:
        return {name: min(run[name] for run in of) for name in of[0]}

    return least(runs), least(baseline_runs) if baseline_runs else None


FIGURES = ("req_s", "p50_ms", "cpu_us")  # per request: the server's CPU, all processes


def over_http(repo: Path, server_cpu: int, client_cpu: int, duration: float,
              repeats: int, baseline_src: Path | None = None, workers: int = 0
              ) -> dict[str, dict[int, dict[str, float]]]:
    """Each target's req/s, p50 and server CPU µs per request at concurrency 1 and 64:
    medians over ``repeats`` rounds, the targets interleaved in each."""
    results: dict[str, dict[int, dict[str, list[float]]]] = {}
    hello_port = free_port()
    hello = subprocess.Popen(
        ["taskset", "-c", str(server_cpu), sys.executable, __file__, "--hello-server",
         str(hello_port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(2)
    os.sched_setaffinity(0, {client_cpu})
    servers = {"tradeoff serve tiny": ServerProcess(repo, cpus=str(server_cpu))}
    if baseline_src:
        servers["tradeoff serve tiny (baseline)"] = ServerProcess(
            repo, cpus=str(server_cpu), env={"PYTHONPATH": str(baseline_src)})
    if workers:
        servers[f"tradeoff serve tiny --workers {workers}"] = ServerProcess(
            repo, cpus=str(server_cpu), extra_args=("--workers", str(workers)))
    try:
        with contextlib.ExitStack() as running:
            for server in servers.values():
                running.enter_context(server)
            targets: dict[str, tuple[Adapter, int]] = {
                "bare ASGI app": (HttpJsonAdapter(f"http://127.0.0.1:{hello_port}/"),
                                  hello.pid)}
            for name, server in servers.items():
                assert server.process is not None
                targets[name] = (V2Adapter(server.url, "tiny"), server.process.pid)
            for _ in range(repeats):
                for name, (adapter, pid) in targets.items():
                    for concurrency in (1, 64):
                        before = cpu_seconds(pid)
                        result, _, _ = run_benchmark(adapter, LoadSpec(
                            concurrency=concurrency, duration_s=duration, warmup_s=0.5))
                        summary = result.summary
                        # the warmup's requests are not in the summary: the CPU over
                        # the whole run is shared by the measured requests alone
                        share = summary.duration_s / (summary.duration_s + 0.5)
                        figures = results.setdefault(name, {}).setdefault(
                            concurrency, {figure: [] for figure in FIGURES})
                        figures["req_s"].append(summary.throughput_rps)
                        figures["p50_ms"].append(summary.latency("p50") or float("nan"))
                        figures["cpu_us"].append(
                            (cpu_seconds(pid) - before) * share / summary.successes * 1e6)
    finally:
        hello.terminate()
        hello.wait()
    return {name: {c: {figure: statistics.median(values) for figure, values in by.items()}
                   for c, by in by_c.items()}
            for name, by_c in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hello-server", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--stages-only", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--baseline-src", type=source_tree,
                        help="also measure the code in this src folder, side by side")
    parser.add_argument("--http-only", action="store_true",
                        help="skip the in-process stages (an older tree's internals differ)")
    parser.add_argument("--workers", type=int, default=0,
                        help="also measure serve --workers N over HTTP")
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/request_overhead.json"))
    args = parser.parse_args()
    if args.stages_only:
        args.json.write_text(json.dumps(in_process(args.stages_only)))
        return
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
        stages, before = ({}, None) if args.http_only else \
            interleaved_stages(repo, args.baseline_src, server_cpu, args.repeats)
        http = over_http(repo, server_cpu, client_cpu, args.duration, args.repeats,
                         args.baseline_src, args.workers)
    if args.http_only:
        pass
    elif before is None:
        print("| stage (in process, one core) | µs per call (least of the runs) |")
        print("|---|---:|")
        for name, value in stages.items():
            print(f"| {name} | {value:.1f} |")
    else:
        print("| stage (in process, one core) | baseline µs | this tree µs | ratio |")
        print("|---|---:|---:|---:|")
        for name, value in stages.items():
            print(f"| {name} | {before[name]:.1f} | {value:.1f} | {value / before[name]:.2f} |")
    print()
    print("| over HTTP, server core 0, client core 1 | c=1 req/s | c=1 p50 ms | "
          "c=64 req/s | c=64 p50 ms | server CPU µs per request at c=1 | at c=64 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, by_c in http.items():
        one, many = by_c[1], by_c[64]
        print(f"| {name} | {one['req_s']:,.0f} | {one['p50_ms']:.3f} | {many['req_s']:,.0f} "
              f"| {many['p50_ms']:.3f} | {one['cpu_us']:.0f} | {many['cpu_us']:.0f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.request_overhead/2",
                                     "command": " ".join(sys.argv), "stages_us": stages,
                                     "baseline_stages_us": before,
                                     "http": http}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
