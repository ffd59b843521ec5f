"""Per-request cost of each protocol: HTTP with JSON tensors, HTTP with binary tensors,
and gRPC, on `tiny` (where request handling is all the cost), side by side.

`tradeoff serve` on one core, `tradeoff bench` on the other, closed loop at concurrency
1 and 16, interleaved and repeated; medians. The server's own time per request is read
from its Server-Timing (HTTP header, gRPC trailing metadata), so "overhead" is everything
else: transport, framing, (de)serialization, the framework.

    .venv/bin/python benchmarks/protocols.py --duration 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

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
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/protocols.json"))
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    levels = [int(c) for c in args.concurrency.split(",")]
    runs: dict[tuple[str, int], list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, ("tiny",))
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            for _ in range(args.repeats):
                for concurrency in levels:
                    for name, extra in VARIANTS.items():
                        target = server.grpc_url if "gRPC" in name else server.url
                        result = bench(target, extra, concurrency, client_cpu, args.duration)
                        s = result["summary"]
                        point = {"throughput": s["throughput_rps"],
                                 "p50_ms": s["latency_ms"]["p50"],
                                 "server_ms": s["server_ms"]["server_total"]["mean"],
                                 "overhead_ms": s["server_ms"]["overhead"]["mean"]}
                        runs.setdefault((name, concurrency), []).append(point)
                        print(f"{name:22s} c={concurrency:<3d} {point}", flush=True)
    print()
    print("| protocol | conc | req/s | p50 ms | server ms (mean) | overhead ms (mean) | "
          "req/s vs HTTP binary |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    rows = []
    for concurrency in levels:
        base = statistics.median(p["throughput"]
                                 for p in runs[("HTTP, binary tensors", concurrency)])
        for name in VARIANTS:
            points = runs[(name, concurrency)]
            med = {k: statistics.median(p[k] for p in points) for k in points[0]}
            rows.append({"protocol": name, "concurrency": concurrency, **med})
            print(f"| {name} | {concurrency} | {med['throughput']:,.0f} | {med['p50_ms']:.2f} | "
                  f"{med['server_ms']:.3f} | {med['overhead_ms']:.3f} | "
                  f"{med['throughput'] / base:.2f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.protocols/1",
                                     "command": " ".join(sys.argv), "rows": rows}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
