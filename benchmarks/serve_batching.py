"""Served throughput and latency with dynamic batching on and off, next to the ceiling.

For `tiny` and `mlp`, at each concurrency, measures `tradeoff serve` (pinned to one core)
from a closed-loop client (pinned to another), with batching on (`<model>`) and off
(`<model>_nobatch`), interleaved and repeated; then the in-process ONNX Runtime ceiling on
the server's core at its best batch size. Prints a table of medians and ratios and writes
JSON.

    .venv/bin/python benchmarks/serve_batching.py --duration 5 --repeats 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from harness import server_and_client_cores, write_results

from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.v2 import model_stats, stats_delta
from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

INPUT_WIDTH = {"tiny": 16, "mlp": 256}


def ceiling(model_path: Path, width: int, cpu: int, seconds: float = 1.0) -> tuple[float, int]:
    """Best samples/s of a bare InferenceSession over batch sizes 1..64, on one core."""
    previous = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    try:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        session = ort.InferenceSession(str(model_path), options)
        best = (0.0, 1)
        for batch in (1, 2, 4, 8, 16, 32, 64):
            x = np.random.default_rng(0).standard_normal((batch, width)).astype(np.float32)
            for _ in range(20):
                session.run(None, {"INPUT0": x})
            runs = 0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                session.run(None, {"INPUT0": x})
                runs += 1
            rate = runs * batch / (time.perf_counter() - start)
            best = max(best, (rate, batch))
        return best
    finally:
        os.sched_setaffinity(0, previous)


def measure(server: ServerProcess, model: str, concurrency: int, duration: float) -> dict:
    before = model_stats(server.url, model)
    result, _, _ = run_benchmark(V2Adapter(server.url, model, seed=1),
                                 LoadSpec(concurrency=concurrency, duration_s=duration,
                                          warmup_s=1.0))
    requests, executions = stats_delta(before, model_stats(server.url, model))
    summary = result.summary
    return {"throughput": summary.throughput_rps, "p50_ms": summary.latency("p50"),
            "p99_ms": summary.latency("p99"), "errors": summary.errors,
            "mean_batch": requests / executions if executions else 0.0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--models", default="tiny,mlp")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/serve_batching.json"))
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    models = args.models.split(",")
    server_cpu, client_cpu = server_and_client_cores()

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo)
        ceilings = {m: ceiling(repo / m / "1" / "model.onnx", INPUT_WIDTH[m], server_cpu)
                    for m in models}
        runs: dict[tuple[str, int], list[dict]] = {}
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            os.sched_setaffinity(0, {client_cpu})
            for repeat in range(args.repeats):
                for model in models:
                    for concurrency in levels:
                        for variant in (model, f"{model}_nobatch"):
                            point = measure(server, variant, concurrency, args.duration)
                            runs.setdefault((variant, concurrency), []).append(point)
                            print(f"[{repeat + 1}/{args.repeats}] {variant:13s} c={concurrency:<3d}"
                                  f" {point['throughput']:8.0f}/s p50 {point['p50_ms']:.2f} ms"
                                  f" p99 {point['p99_ms']:.2f} ms batch {point['mean_batch']:.1f}",
                                  flush=True)
            exit_code = server.stop()

    def median(variant: str, concurrency: int, key: str) -> float:
        return statistics.median(p[key] for p in runs[(variant, concurrency)])

    rows = []
    for model in models:
        best, best_batch = ceilings[model]
        for concurrency in levels:
            on = {k: median(model, concurrency, k)
                  for k in ("throughput", "p50_ms", "p99_ms", "mean_batch", "errors")}
            off = {k: median(f"{model}_nobatch", concurrency, k)
                   for k in ("throughput", "p50_ms", "p99_ms", "mean_batch", "errors")}
            rows.append({"model": model, "concurrency": concurrency, "on": on, "off": off,
                         "ceiling": best, "ceiling_batch": best_batch,
                         "on_over_off": on["throughput"] / off["throughput"],
                         "on_over_ceiling": on["throughput"] / best})
    print()
    print("| model | conc | on infer/s | on p50 / p99 ms | mean batch | off infer/s | "
          "off p50 / p99 ms | on/off | on/ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['model']} | {r['concurrency']} | {r['on']['throughput']:,.0f} | "
              f"{r['on']['p50_ms']:.2f} / {r['on']['p99_ms']:.2f} | {r['on']['mean_batch']:.1f} | "
              f"{r['off']['throughput']:,.0f} | "
              f"{r['off']['p50_ms']:.2f} / {r['off']['p99_ms']:.2f} | "
              f"{r['on_over_off']:.2f}x | {r['on_over_ceiling']:.3f} |")
    for model in models:
        best, batch = ceilings[model]
        print(f"ceiling {model}: {best:,.0f} samples/s at batch {batch} (in-process, one core)")
    print(f"server exit code after SIGTERM: {exit_code}")
    write_results(args.json, {"schema": "tradeoff.bench.serve_batching/1",
                              "command": " ".join(sys.argv), "rows": rows,
                              "ceilings": {m: {"samples_per_s": c[0], "batch": c[1]}
                                           for m, c in ceilings.items()}}, indent=2)


if __name__ == "__main__":
    main()
