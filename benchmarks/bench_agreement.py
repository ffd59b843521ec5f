"""Does `tradeoff bench` agree with perf_analyzer? Same server, same load, interleaved.

`tradeoff serve` (pinned to one core) serves `mlp`; perf_analyzer and `tradeoff bench`
(pinned to the other core) take turns at each concurrency, closed loop, binary tensors
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
                  protocol: str = "http") -> dict[str, float]:
    out = subprocess.run(["taskset", "-c", str(cpu), str(PERF_ANALYZER), "-m", model, "-u", url,
                          "-i", protocol, "--concurrency-range", str(concurrency),
                          "--measurement-interval", str(window_ms), "--max-trials", "20"],
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
    runs: dict[int, dict[str, list[dict[str, float]]]] = {
        c: {"perf_analyzer": [], "tradeoff bench": []} for c in levels}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        build_repository(repo, (args.model,))
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            host = f"{server.host}:{server.http_port}"
            for round_no in range(args.repeats):
                for c in levels:
                    # Alternate which tool goes first so slow drift of the machine cancels.
                    def run_pa(c: int = c) -> dict[str, float]:
                        return perf_analyzer(host, args.model, c, client_cpu,
                                             int(args.seconds * 1000))

                    def run_tb(c: int = c) -> dict[str, float]:
                        return tradeoff_bench(server.url, args.model, c, client_cpu,
                                              args.seconds)

                    try:
                        if round_no % 2:
                            tb = run_tb()
                            pa = run_pa()
                        else:
                            pa = run_pa()
                            tb = run_tb()
                    except RuntimeError as exc:  # perf_analyzer found no stable window
                        print(f"c={c}: pair dropped: {str(exc).splitlines()[-1]}", flush=True)
                        continue
                    runs[c]["perf_analyzer"].append(pa)
                    runs[c]["tradeoff bench"].append(tb)
                    print(f"c={c}: perf_analyzer {pa}, tradeoff bench {tb}", flush=True)
    print()
    print("Median of paired ratios (each pair measured back to back), bench / perf_analyzer:")
    paired = {}
    for c in levels:
        pairs = list(zip(runs[c]["perf_analyzer"], runs[c]["tradeoff bench"], strict=True))
        paired[c] = {k: statistics.median(tb[k] / pa[k] for pa, tb in pairs)
                     for k in ("throughput", "p50_ms")}
        truth = statistics.median(tb["throughput"] / tb["server_throughput"]
                                  for tb in runs[c]["tradeoff bench"])
        paired[c]["bench_vs_server_count"] = truth
        print(f"  c={c}: throughput {paired[c]['throughput']:.3f}, "
              f"p50 {paired[c]['p50_ms']:.3f} ({len(pairs)} pairs); bench throughput / "
              f"server's own count {truth:.3f}")
    print()
    print("| concurrency | perf_analyzer infer/s | tradeoff bench infer/s | ratio | "
          "perf_analyzer p50 ms | tradeoff bench p50 ms | ratio |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    rows = []
    for c in levels:
        med = {tool: {k: statistics.median(r[k] for r in runs[c][tool])
                      for k in ("throughput", "p50_ms")} for tool in runs[c]}
        pa, tb = med["perf_analyzer"], med["tradeoff bench"]
        rows.append({"concurrency": c, **{f"{t}_{k}": v for t in med for k, v in med[t].items()}})
        print(f"| {c} | {pa['throughput']:,.0f} | {tb['throughput']:,.0f} | "
              f"{tb['throughput'] / pa['throughput']:.3f} | {pa['p50_ms']:.2f} | "
              f"{tb['p50_ms']:.2f} | {tb['p50_ms'] / pa['p50_ms']:.3f} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.agreement/1",
                                     "command": " ".join(sys.argv), "rows": rows,
                                     "paired_ratio_medians": {str(c): v
                                                              for c, v in paired.items()},
                                     "runs": {str(c): v for c, v in runs.items()}}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
