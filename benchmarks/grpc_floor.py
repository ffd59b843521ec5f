"""How fast can grpcio answer at all? `tradeoff serve` over HTTP and over gRPC beside
servers that answer ModelInfer with a fixed response and do nothing else: grpcio's
asyncio server (on asyncio's loop and on uvloop), its thread-pool server, and the
thread-pool server handing each request to an event loop and back (what serving our data
plane from it would cost at the least).

Every server on one core, perf_analyzer on the other (binary tensors, `tiny`), the modes
interleaved and repeated; medians. If the fixed answers are slower than a share of our HTTP
throughput, no change to our gRPC handler can reach that share on grpcio.

    .venv/bin/python benchmarks/grpc_floor.py --repeats 3 --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from grpc import aio

from tradeoff.models import build_repository
from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol import model_config_pb2 as mc
from tradeoff.server.process import ServerProcess, free_port

ROOT = Path(__file__).resolve().parents[1]
PERF_ANALYZER = ROOT / ".tools" / "bin" / "perf_analyzer"
SERVICE = "inference.GRPCInferenceService"
FIXED = {  # mode -> what the fixed-answer server runs
    "grpc.aio, asyncio loop": ["aio"],
    "grpc.aio, uvloop": ["aio-uvloop"],
    "grpc sync, 4 threads": ["sync", "4"],
    "grpc sync, 64 threads": ["sync", "64"],
    "grpc sync, 64 threads, via an event loop": ["bridge", "64"],
}


# ------------------------------------------------------------------ the fixed server


def _fixed_answers() -> dict[str, tuple[Any, Any, Any]]:
    """What perf_analyzer asks before it measures, and the one ModelInfer answer."""
    config = mc.ModelConfig(name="tiny", max_batch_size=32)
    config.input.add(name="INPUT0", data_type=mc.TYPE_FP32, dims=[4])
    config.output.add(name="OUTPUT0", data_type=mc.TYPE_FP32, dims=[4])
    metadata = pb.ModelMetadataResponse(name="tiny", platform="onnxruntime_onnx",
                                        versions=["1"])
    metadata.inputs.add(name="INPUT0", datatype="FP32", shape=[-1, 4])
    metadata.outputs.add(name="OUTPUT0", datatype="FP32", shape=[-1, 4])
    infer = pb.ModelInferResponse(model_name="tiny", model_version="1")
    infer.outputs.add(name="OUTPUT0", datatype="FP32", shape=[1, 4])
    infer.raw_output_contents.append(bytes(16))
    return {
        "ServerLive": (pb.ServerLiveRequest, pb.ServerLiveResponse(live=True)),
        "ServerReady": (pb.ServerReadyRequest, pb.ServerReadyResponse(ready=True)),
        "ModelReady": (pb.ModelReadyRequest, pb.ModelReadyResponse(ready=True)),
        "ServerMetadata": (pb.ServerMetadataRequest,
                           pb.ServerMetadataResponse(name="fixed", version="1")),
        "ModelMetadata": (pb.ModelMetadataRequest, metadata),
        "ModelConfig": (pb.ModelConfigRequest, pb.ModelConfigResponse(config=config)),
        "ModelInfer": (pb.ModelInferRequest, infer),
    }


def _handlers(asynchronous: bool, loop: asyncio.AbstractEventLoop | None
              ) -> grpc.GenericRpcHandler:
    def answer(response: Any) -> Any:
        if asynchronous:
            async def call(request: Any, context: Any) -> Any:
                return response
        elif loop is not None:  # the answer comes from the loop, as a data plane's would
            def call(request: Any, context: Any) -> Any:
                done: futures.Future[Any] = futures.Future()

                def start() -> None:
                    future = loop.create_future()
                    future.add_done_callback(lambda f: done.set_result(f.result()))
                    loop.call_soon(future.set_result, response)
                loop.call_soon_threadsafe(start)
                return done.result()
        else:
            def call(request: Any, context: Any) -> Any:
                return response
        return call

    methods = {name: grpc.unary_unary_rpc_method_handler(
        answer(response), request_deserializer=request_type.FromString,
        response_serializer=type(response).SerializeToString)
        for name, (request_type, response) in _fixed_answers().items()}
    return grpc.method_handlers_generic_handler(SERVICE, methods)


def serve_fixed(mode: str, port: int, threads: int) -> None:
    """Run one fixed-answer server until killed."""
    address = f"127.0.0.1:{port}"
    if mode in ("aio", "aio-uvloop"):
        async def main() -> None:
            server = aio.server()
            server.add_generic_rpc_handlers((_handlers(True, None),))
            server.add_insecure_port(address)
            await server.start()
            print("READY", flush=True)
            await server.wait_for_termination()
        if mode == "aio-uvloop":
            import uvloop
            uvloop.run(main())
        else:
            asyncio.run(main())
        return
    loop = None
    if mode == "bridge":
        import uvloop
        loop = uvloop.new_event_loop()
        threading.Thread(target=loop.run_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(threads))
    server.add_generic_rpc_handlers((_handlers(False, loop),))
    server.add_insecure_port(address)
    server.start()
    print("READY", flush=True)
    server.wait_for_termination()


class FixedServer:
    """A fixed-answer server in a child process, pinned to ``cpu``."""

    def __init__(self, args: list[str], cpu: int) -> None:
        self.port = free_port()
        mode, *threads = args
        self.process = subprocess.Popen(
            ["taskset", "-c", str(cpu), sys.executable, __file__, "--serve", mode,
             str(self.port), *(threads or ["1"])], stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        if self.process.stdout.readline().strip() != "READY":
            raise RuntimeError(f"the fixed server {args} did not start")

    def __enter__(self) -> FixedServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


# ------------------------------------------------------------------ measurement


def perf_analyzer(url: str, protocol: str, concurrency: int, cpu: int,
                  scratch: Path) -> float | None:
    """Infer/s of one closed-loop point (None: it did not stabilise)."""
    report = scratch / "pa.csv"
    report.unlink(missing_ok=True)
    done = subprocess.run(
        ["taskset", "-c", str(cpu), str(PERF_ANALYZER), "-m", "tiny", "-u", url, "-i", protocol,
         "--concurrency-range", str(concurrency), "-p", "2000", "-s", "20",
         "--max-trials", "8", "-f", str(report)],
        capture_output=True, text=True, check=False, timeout=600)
    if done.returncode != 0 or not report.exists():
        print(f"  perf_analyzer failed: {(done.stdout + done.stderr).strip()[-300:]}")
        return None
    with report.open() as handle:
        return float(next(csv.DictReader(handle))["Inferences/Second"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path,
                        default=ROOT / "benchmarks" / "results" / "grpc_floor.json")
    parser.add_argument("--serve", nargs=3, metavar=("MODE", "PORT", "THREADS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        mode, port, threads = args.serve
        serve_fixed(mode, int(port), int(threads))
        return
    if args.repeats < 1 or args.concurrency < 1:
        parser.error("--repeats and --concurrency must be at least 1")
    if not PERF_ANALYZER.exists():
        sys.exit(f"{PERF_ANALYZER} is missing: run "
                 "`bash scripts/get_perf_analyzer.sh .venv/bin/python` first")
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    points: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        build_repository(scratch / "models", ("tiny",))
        with ServerProcess(scratch / "models", cpus=str(server_cpu),
                           extra_args=("--no-metrics",)) as ours:
            for round_ in range(1, args.repeats + 1):
                for name, (url, protocol) in {
                        "tradeoff serve, HTTP": (ours.url.removeprefix("http://"), "http"),
                        "tradeoff serve, gRPC": (ours.grpc_url.removeprefix("grpc://"),
                                                 "grpc")}.items():
                    value = perf_analyzer(url, protocol, args.concurrency, client_cpu, scratch)
                    points.setdefault(name, []).append(value or 0.0)
                    print(f"round {round_} {name:42s} {value or 0:8,.0f} infer/s", flush=True)
                for name, mode in FIXED.items():
                    with FixedServer(mode, server_cpu) as fixed:
                        time.sleep(0.5)
                        value = perf_analyzer(f"127.0.0.1:{fixed.port}", "grpc",
                                              args.concurrency, client_cpu, scratch)
                    points.setdefault(name, []).append(value or 0.0)
                    print(f"round {round_} {name:42s} {value or 0:8,.0f} infer/s", flush=True)
    http = statistics.median(points["tradeoff serve, HTTP"])
    rows = [{"server": name, "infer_per_s": statistics.median(values), "runs": values,
             "vs_our_http": statistics.median(values) / http if http else None}
            for name, values in points.items()]
    print(f"\n| server (c={args.concurrency}, `tiny`) | infer/s (median of {args.repeats}) "
          "| vs tradeoff serve HTTP |\n|---|---:|---:|")
    for row in rows:
        print(f"| {row['server']} | {row['infer_per_s']:,.0f} | {row['vs_our_http']:.2f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.grpc_floor/1",
                                     "command": " ".join(["benchmarks/grpc_floor.py",
                                                          *sys.argv[1:]]),
                                     "concurrency": args.concurrency, "rows": rows},
                                    indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
