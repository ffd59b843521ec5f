"""Does `tradeoff bench` agree with perf_analyzer? Same server, same load, interleaved.

`tradeoff serve` (pinned to one core) serves `mlp`; perf_analyzer (in its default
synchronous mode, one thread per request in flight, and with --async) and `tradeoff bench`
(all pinned to the other core) take turns at each concurrency, closed loop, binary tensors
over HTTP, several times; medians of throughput and p50 are compared.
perf_analyzer comes from scripts/get_perf_analyzer.sh.

    .venv/bin/python benchmarks/bench_agreement.py --concurrency 1,8,32 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

PERF_ANALYZER = Path(".tools/bin/perf_analyzer")


def perf_analyzer(url: str, model: str, concurrency: int, cpu: int, window_ms: int,
                  protocol: str = "http", asynchronous: bool = False) -> dict[str, float]:
    out = subprocess.run(["taskset", "-c", str(cpu), str(PERF_ANALYZER), "-m", model, "-u", url,
                          "-i", protocol, "--concurrency-range", str(concurrency),
                          "--measurement-interval", str(window_ms), "--max-trials", "20",
                          *(["--async"] if asynchronous else [])],
                         capture_output=True, text=True, timeout=600, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"perf_analyzer failed:\n{out.stdout}\n{out.stderr}")
    throughput = re.search(r"Throughput: ([\d.]+) infer/sec", out.stdout)
    p50 = re.search(r"p50 latency: (\d+) usec", out.stdout)
    if not throughput or not p50:
        raise RuntimeError(f"cannot read perf_analyzer's output:\n{out.stdout}")
    return {"throughput": float(throughput.group(1)), "p50_ms": int(p50.group(1)) / 1000}


def tradeoff_bench(url: str, model: str, concurrency: int, cpu: int,
                   seconds: float) -> dict[str, float]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(["taskset", "-c", str(cpu), sys.executable, "-m", "tradeoff", "bench",
                        url, "--model", model, "--concurrency", str(concurrency),
                        "--duration", f"{seconds:g}", "--warmup", "1", "--json", out.name],
                       check=True, capture_output=True, timeout=600)
        summary = json.loads(Path(out.name).read_text())["summary"]
    counted = (summary.get("server_counts") or {}).get("requests", 0)
    return {"throughput": summary["inferences_per_s"], "p50_ms": summary["latency_ms"]["p50"],
            # the server's own count over the same measurement: the ground truth
            "server_throughput": counted / summary["duration_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--concurrency", default="1,8,32")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/bench_agreement.json"))
    args = parser.parse_args()
    if not PERF_ANALYZER.exists():
        sys.exit("perf_analyzer missing: run scripts/get_perf_analyzer.sh first")
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    levels = [int(c) for c in args.concurrency.split(",")]
    tools = ("perf_analyzer", "perf_analyzer --async", "tradeoff bench")
    runs: dict[int, dict[str, list[dict[str, float] | None]]] = {
        c: {tool: [] for tool in tools} for c in levels}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, (args.model,))
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            host = f"{server.host}:{server.http_port}"
            for round_no in range(args.repeats):
                for c in levels:
                    measure = {
                        "perf_analyzer": lambda c=c: perf_analyzer(
                            host, args.model, c, client_cpu, int(args.seconds * 1000)),
                        "perf_analyzer --async": lambda c=c: perf_analyzer(
                            host, args.model, c, client_cpu, int(args.seconds * 1000),
                            asynchronous=True),
                        "tradeoff bench": lambda c=c: tradeoff_bench(
                            server.url, args.model, c, client_cpu, args.seconds)}
                    # Rotate which tool goes first so slow drift of the machine cancels.
                    order = tools[round_no % 3:] + tools[:round_no % 3]
                    got: dict[str, dict[str, float] | None] = {}
                    for tool in order:
                        try:
                            got[tool] = measure[tool]()
                        except RuntimeError as exc:  # no stable window, or a client error
                            print(f"c={c}: {tool} failed: {str(exc).splitlines()[-1]}",
                                  flush=True)
                            got[tool] = None
                    for tool, figures in got.items():
                        runs[c][tool].append(figures)
                    print(f"c={c}: {got}", flush=True)
    print()
    print("Median of the ratios within each round (measured back to back), "
          "bench / perf_analyzer:")
    paired: dict[int, dict[str, float]] = {}
    for c in levels:
        bench = runs[c]["tradeoff bench"]
        paired[c] = {}
        for tool in tools[:2]:
            pairs = [(pa, tb) for pa, tb in zip(runs[c][tool], bench, strict=True)
                     if pa is not None and tb is not None]
            paired[c][f"{tool} rounds"] = len(pairs)
            for k in ("throughput", "p50_ms"):
                paired[c][f"{k} vs {tool}"] = statistics.median(
                    tb[k] / pa[k] for pa, tb in pairs) if pairs else float("nan")
        paired[c]["bench_vs_server_count"] = statistics.median(
            tb["throughput"] / tb["server_throughput"] for tb in bench if tb is not None)
        print(f"  c={c}: " + ", ".join(f"{k} {v:.3f}" for k, v in paired[c].items()))
    print()
    print("| concurrency | perf_analyzer infer/s | --async infer/s | tradeoff bench infer/s | "
          "perf_analyzer p50 ms | --async p50 ms | tradeoff bench p50 ms |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for c in levels:
        med = {tool: {k: statistics.median(r[k] for r in runs[c][tool] if r is not None)
                      if any(runs[c][tool]) else float("nan")
                      for k in ("throughput", "p50_ms")} for tool in runs[c]}
        rows.append({"concurrency": c, **{f"{t}_{k}": v for t in med for k, v in med[t].items()}})
        print(f"| {c} | " + " | ".join(f"{med[t]['throughput']:,.0f}" for t in tools)
              + " | " + " | ".join(f"{med[t]['p50_ms']:.2f}" for t in tools) + " |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.agreement/1",
                                     "command": " ".join(sys.argv), "rows": rows,
                                     "paired_ratio_medians": {str(c): v
                                                              for c, v in paired.items()},
                                     "runs": {str(c): v for c, v in runs.items()}}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
