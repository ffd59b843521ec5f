"""Per-request cost of each protocol: HTTP with JSON tensors, HTTP with binary tensors,
and gRPC, on `tiny` (where request handling is all the cost), side by side.

`tradeoff serve` on one core, `tradeoff bench` on the other, closed loop at concurrency
1 and 16, interleaved and repeated; medians. The server's own time per request is read
from its Server-Timing (HTTP header, gRPC trailing metadata), so "overhead" is everything
else: transport, framing, (de)serialization, the framework.

    .venv/bin/python benchmarks/protocols.py --duration 5 --repeats 3
    .venv/bin/python benchmarks/protocols.py --baseline-src /tmp/before/src  # before/after
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import write_results

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess, source_tree

VARIANTS = {
    "HTTP, JSON tensors": ["--protocol", "v2", "--json-tensors"],
    "HTTP, binary tensors": ["--protocol", "v2"],
    "gRPC, raw tensors": ["--protocol", "v2-grpc"],
}


def bench(target: str, extra: list[str], concurrency: int, cpu: int, seconds: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-m", "tradeoff", "bench",
                        target, "--model", "tiny", "--concurrency", str(concurrency),
                        "--duration", f"{seconds:g}", "--warmup", "1", *extra,
                        "--json", out.name], check=True, capture_output=True, timeout=600)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", default="1,16")
    parser.add_argument("--baseline-src", type=source_tree,
                        help="also serve from this source tree (PYTHONPATH), in the same "
                             "rounds: before and after a change, with the same client")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/protocols.json"))
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    levels = [int(c) for c in args.concurrency.split(",")]
    trees = {"this tree": {}}
    if args.baseline_src is not None:
        trees["baseline"] = {"PYTHONPATH": str(args.baseline_src.resolve())}
    runs: dict[tuple[str, str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        repo = Path(tmp) / "models"
        build_repository(repo, ("tiny",))
        servers = {tree: stack.enter_context(ServerProcess(repo, cpus=str(server_cpu), env=env))
                   for tree, env in trees.items()}
        for _ in range(args.repeats):
            for concurrency in levels:
                for name, extra in VARIANTS.items():
                    for tree, server in servers.items():
                        target = server.grpc_url if "gRPC" in name else server.url
                        result = bench(target, extra, concurrency, client_cpu, args.duration)
                        s = result["summary"]
                        point = {"throughput": s["throughput_rps"],
                                 "p50_ms": s["latency_ms"]["p50"],
                                 "server_ms": s["server_ms"]["server_total"]["mean"],
                                 "overhead_ms": s["server_ms"]["overhead"]["mean"]}
                        runs.setdefault((tree, name, concurrency), []).append(point)
                        print(f"{tree:9s} {name:22s} c={concurrency:<3d} {point}", flush=True)
    print()
    print("| tree | protocol | conc | req/s | p50 ms | server ms (mean) | overhead ms (mean) | "
          "req/s vs HTTP binary | req/s vs baseline |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for concurrency in levels:
        for tree in trees:
            base = statistics.median(p["throughput"]
                                     for p in runs[(tree, "HTTP, binary tensors", concurrency)])
            for name in VARIANTS:
                points = runs[(tree, name, concurrency)]
                med = {k: statistics.median(p[k] for p in points) for k in points[0]}
                before = runs.get(("baseline", name, concurrency))
                versus = med["throughput"] / statistics.median(
                    p["throughput"] for p in before) if before else None
                rows.append({"tree": tree, "protocol": name, "concurrency": concurrency, **med,
                             "vs_baseline": versus})
                print(f"| {tree} | {name} | {concurrency} | {med['throughput']:,.0f} | "
                      f"{med['p50_ms']:.2f} | {med['server_ms']:.3f} | "
                      f"{med['overhead_ms']:.3f} | {med['throughput'] / base:.2f} | "
                      + (f"{versus:.2f}" if versus else "") + " |")
    write_results(args.json, {"schema": "tradeoff.bench.protocols/2",
                              "command": " ".join(sys.argv), "rows": rows}, indent=2)


if __name__ == "__main__":
    main()
