"""What the response cache buys under Zipf traffic: no cache vs local vs Redis.

For `mlp` and `minilm`, three servers side by side (pinned to core 0 with redis-server):
no --cache, --cache local sized for a tenth of the distinct answers, and --cache redis://
(which holds everything). `tradeoff bench` (core 1) sends the same Zipf mixes of 2,000
distinct inputs at s = 0.8, 1.0, 1.2 to each in turn, closed loop; the server-side hit
ratio is set against what the law predicts (Che's approximation for the LRU; first-sight
misses only for Redis). With --pytriton-python, Triton (through PyTriton, in its own
venv: benchmarks/peers/pytriton_cached.py) serves `mlp` the same way without a cache and
with its local cache given the same bytes. Then two servers share one Redis: the second
one's hits on the first one's entries. Writes benchmarks/results/cache.json.

    .venv/bin/python benchmarks/cache.py --pytriton-python /tmp/pytriton-venv/bin/python
    .venv/bin/python benchmarks/cache.py --models mlp --duration 4
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import redis
from harness import command_line, write_results
from peers import pytriton_env
from rich.console import Console
from rich.table import Table

from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.dtypes import numpy_dtype
from tradeoff.models import build_repository
from tradeoff.protocol.v2 import TensorOutput
from tradeoff.results import BenchResult
from tradeoff.server.cache.keys import CHECK_BYTES, KEY_BYTES
from tradeoff.server.cache.stores import LocalStore
from tradeoff.server.cache.values import encode_outputs
from tradeoff.server.process import ServerProcess, free_port
from tradeoff.stats.popularity import first_sight_ratio, lru_hit_ratio, zipf_probabilities

EXPONENTS = (0.8, 1.0, 1.2)
KINDS = ("none", "local", "redis")
PEER_KINDS = ("triton none", "triton local")  # mlp only: PyTriton binds ONNX FP32 models
TRITON_TOKEN = {"triton-access-token": "tradeoff-bench"}  # PyTriton guards the statistics


class PyTriton:
    """benchmarks/peers/pytriton_cached.py on core 0, serving one ONNX model."""

    def __init__(self, python: str, model_file: Path, name: str, cache_bytes: int) -> None:
        self.http_port = free_port()
        self.url = f"http://127.0.0.1:{self.http_port}"
        env = dict(os.environ, **pytriton_env(python))
        self.log = tempfile.NamedTemporaryFile(prefix="pytriton-", suffix=".log", delete=False)
        self.process = subprocess.Popen(
            ["taskset", "-c", "0", python, str(Path(__file__).parent / "peers" /
                                              "pytriton_cached.py"), str(model_file), name,
             str(self.http_port), str(free_port()), str(cache_bytes)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env)
        for _ in range(240):
            if b"PYTRITON_READY" in Path(self.log.name).read_bytes():
                return
            if self.process.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"PyTriton did not start: see {self.log.name}")

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def answer_bytes(server: ServerProcess, model: str) -> int:
    """What one answer of ``model`` costs the local cache (binary outputs, one row)."""
    import urllib.request

    with urllib.request.urlopen(f"{server.url}/v2/models/{model}") as response:
        meta = json.loads(response.read())
    outputs = [TensorOutput(o["name"], np.zeros([1, *o["shape"][1:]],
                                                numpy_dtype(o["datatype"])), o["datatype"],
                            True) for o in meta["outputs"]]
    return LocalStore.cost(b"k" * KEY_BYTES, b"c" * CHECK_BYTES + encode_outputs(outputs))


def bench(server: ServerProcess | PyTriton, model: str, s: float, seed: int, distinct: int,
          args: argparse.Namespace) -> BenchResult:
    headers = TRITON_TOKEN if isinstance(server, PyTriton) else {}
    spec = EndpointSpec(server.url, model=model, distinct_inputs=distinct, zipf=s, seed=seed,
                        headers=headers)
    load = LoadSpec(concurrency=args.concurrency, duration_s=args.duration,
                    warmup_s=args.warmup, seed=seed)
    result, _, _ = run_benchmark(make_adapter(spec), load)
    return result


def row(result: BenchResult, predicted: float | None) -> dict[str, Any]:
    s = result.summary
    counts = s.server_counts
    return {"throughput_rps": s.throughput_rps, "p50_ms": s.latency("p50"),
            "p99_ms": s.latency("p99"), "errors": s.errors,
            "hit_ratio": counts.cache_hit_ratio if counts else None,
            "predicted_hit_ratio": predicted,
            "requests_before_measuring": result.total_requests_sent - s.requests}


def start_redis(port: int) -> subprocess.Popen:
    process = subprocess.Popen(["taskset", "-c", "0", shutil.which("redis-server") or "redis",
                                "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                                "--appendonly", "no"], stdout=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return process
        except redis.ConnectionError:
            time.sleep(0.1)
    raise RuntimeError("redis-server did not start")


def measure_model(root: Path, model: str, redis_url: str, args: argparse.Namespace,
                  console: Console) -> dict[str, Any]:
    probe = ServerProcess(root, cpus="0").start()
    entry = answer_bytes(probe, model)
    probe.stop()
    capacity = args.distinct // 10
    flags = {"none": (), "local": ("--cache", f"local,size={capacity * entry}"),
             "redis": ("--cache", redis_url)}
    servers: dict[str, ServerProcess | PyTriton] = {
        kind: ServerProcess(root, cpus="0", extra_args=flags[kind]).start() for kind in KINDS}
    kinds = list(KINDS)
    if args.pytriton_python and model == "mlp":
        for kind in PEER_KINDS:
            servers[kind] = PyTriton(args.pytriton_python, root / model / "1" / "model.onnx",
                                     model, capacity * entry if kind == "triton local" else 0)
        kinds += PEER_KINDS
    store = redis.Redis.from_url(redis_url)
    out: dict[str, Any] = {"entry_bytes": entry, "local_capacity_answers": capacity,
                           "points": []}
    try:
        os.sched_setaffinity(0, {1})
        for index, s in enumerate(EXPONENTS):
            p = zipf_probabilities(args.distinct, s)
            store.flushall()
            point: dict[str, Any] = {"zipf_s": s}
            for kind in kinds:
                result = bench(servers[kind], model, s, index + 1, args.distinct, args)
                if kind in ("none", "triton none"):
                    predicted: float | None = 0.0
                elif kind in ("local", "triton local"):
                    predicted = lru_hit_ratio(p, capacity)
                else:  # holds everything: only first requests of an input miss
                    before = result.total_requests_sent - result.summary.requests
                    predicted = 1 - first_sight_ratio(p, result.summary.requests, before)
                point[kind] = row(result, predicted)
                console.print(f"{model} s={s} {kind}: {point[kind]}")
            out["points"].append(point)
        out["shared"] = shared_redis(root, model, redis_url, store, args)
    finally:
        os.sched_setaffinity(0, {0, 1})
        for server in servers.values():
            server.stop()
    return out


def shared_redis(root: Path, model: str, redis_url: str, store: redis.Redis,
                 args: argparse.Namespace) -> dict[str, Any]:
    """Server A warms the shared cache; server B then serves the same traffic."""
    store.flushall()
    first = ServerProcess(root, cpus="0", extra_args=("--cache", redis_url)).start()
    second = ServerProcess(root, cpus="0", extra_args=("--cache", redis_url)).start()
    try:
        a = bench(first, model, 1.0, 9, args.distinct, args)
        b = bench(second, model, 1.0, 9, args.distinct, args)
    finally:
        first.stop()
        second.stop()
    return {"zipf_s": 1.0, "first_server": row(a, None), "second_server": row(b, None),
            "entries_in_redis": store.dbsize()}


def table(model: str, result: dict[str, Any]) -> Table:
    t = Table(title=f"{model}: 2,000 distinct inputs, local cache holds "
                    f"{result['local_capacity_answers']}")
    for column in ("s", "cache", "req/s", "p50 ms", "p99 ms", "hit ratio", "predicted"):
        t.add_column(column, justify="right")
    for point in result["points"]:
        for kind in [k for k in (*KINDS, *PEER_KINDS) if k in point]:
            r = point[kind]
            t.add_row(f"{point['zipf_s']:g}", kind, f"{r['throughput_rps']:,.0f}",
                      f"{r['p50_ms']:.2f}", f"{r['p99_ms']:.2f}",
                      "-" if r["hit_ratio"] is None else f"{r['hit_ratio']:.3f}",
                      f"{r['predicted_hit_ratio']:.3f}")
    return t


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "minilm"])
    parser.add_argument("--distinct", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=4.0)
    parser.add_argument("--pytriton-python",
                        help="the python of a venv with nvidia-pytriton and onnxruntime: adds "
                             "Triton without and with its local cache for mlp")
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "cache.json")
    args = parser.parse_args()
    console = Console(width=120)
    out: dict[str, Any] = {"command": command_line(),
                           "models": {}}
    port = free_port()
    redis_server = start_redis(port)
    try:
        with tempfile.TemporaryDirectory(prefix="tradeoff-cache-") as scratch:
            root = Path(scratch)
            for model in args.models:
                build_repository(root, (model,))
                config = root / model / "config.pbtxt"
                config.write_text(config.read_text() + "response_cache { enable: true }\n")
                secret = Path(scratch) / "cache.key"
                secret.write_text(os.urandom(32).hex())
                result = measure_model(root, model, f"redis://127.0.0.1:{port}/0,"
                                       f"secret_file={secret}", args, console)
                shutil.rmtree(root / model)
                out["models"][model] = result
                console.print(table(model, result))
                console.print(f"shared Redis: {result['shared']}")
    finally:
        redis_server.kill()
    write_results(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
