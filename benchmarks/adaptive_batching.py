"""Adaptive batching (`target_p99_ms`) against fixed queue delays, under a 5x peak.

One `tradeoff serve` on core 0 holds four copies of `mlp` (the same ONNX file), all with
`max_batch_size: 64`:

- `mlp_d0`, `mlp_d2000`, `mlp_d10000`: `dynamic_batching { max_queue_delay_microseconds: N }`
  with N = 0, 2,000 and 10,000 us;
- `mlp_adaptive`: `dynamic_batching { }` and `parameters { key: "target_p99_ms" ... "20" }`.

One trace (quiet, a peak at 5x the quiet rate, quiet again; constant gaps within each
phase) is replayed with `tradeoff bench --intervals FILE --records FILE.csv` on core 1
against each copy, the copies interleaved, in a rotated order each repeat. The raw
records are split by their scheduled send time into the phases: throughput during the
peak (successful responses that ended inside it, per second), p99 in the quiet parts
(latency from the scheduled send time). While each replay runs, `/metrics` is read every
0.5 s for the adaptive batcher's delay (`tradeoff_batcher_queue_delay_us`). Prints a table
of medians over the repeats and writes benchmarks/results/adaptive_batching.json.

    .venv/bin/python benchmarks/adaptive_batching.py
    .venv/bin/python benchmarks/adaptive_batching.py --quiet-rate 200 --repeats 3
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.bench.v2 import model_stats, stats_delta
from tradeoff.server.process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("tradeoff"))
VARIANTS = {
    "fixed 0 us": ("mlp_d0", "dynamic_batching { max_queue_delay_microseconds: 0 }"),
    "fixed 2000 us": ("mlp_d2000", "dynamic_batching { max_queue_delay_microseconds: 2000 }"),
    "fixed 10000 us": ("mlp_d10000",
                       "dynamic_batching { max_queue_delay_microseconds: 10000 }"),
    "adaptive (target 20 ms)": ("mlp_adaptive", 'dynamic_batching { }\nparameters { key: '
                                '"target_p99_ms" value: { string_value: "20" } }'),
}
DELAY = re.compile(r'^tradeoff_batcher_queue_delay_us\{([^}]*)\}\s+(\S+)', re.M)


def repository(root: Path) -> Path:
    done = subprocess.run([CLI, "models", "build", str(root / "src"), "--model", "mlp"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.exit(f"tradeoff models build failed: {done.stderr[-1000:]}")
    source = root / "src" / "mlp"
    base = "\n".join(line for line in (source / "config.pbtxt").read_text().splitlines()
                     if not line.startswith(("name:", "dynamic_batching", "max_batch_size")))
    repo = root / "models"
    for name, batching in VARIANTS.values():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "1" / "model.onnx").write_bytes((source / "1" / "model.onnx")
                                                       .read_bytes())
        (repo / name / "config.pbtxt").write_text(
            f'name: "{name}"\nmax_batch_size: 64\n{base}\n{batching}\n')
    return repo


def phases(args: argparse.Namespace) -> list[tuple[str, float, float, float]]:
    """(name, start s, end s, rate) of each part of the trace."""
    q, p = args.quiet_s, args.peak_s
    return [("quiet", 0.0, q, args.quiet_rate),
            ("peak", q, q + p, args.quiet_rate * args.peak_factor),
            ("quiet after", q + p, 2 * q + p, args.quiet_rate)]


def write_trace(path: Path, parts: list[tuple[str, float, float, float]]) -> int:
    """Offsets in microseconds, constant gaps inside each phase."""
    offsets: list[float] = []
    for _, start, end, rate in parts:
        offsets.extend(np.arange(start, end, 1.0 / rate) * 1e6)
    path.write_text("# offsets\n" + "\n".join(f"{o:.0f}" for o in offsets) + "\n")
    return len(offsets)


def adaptive_delay(metrics_url: str, model: str) -> float | None:
    with urllib.request.urlopen(metrics_url, timeout=5) as response:
        text = response.read().decode()
    for labels, value in DELAY.findall(text):
        if f'model="{model}"' in labels:
            return float(value)
    return None


class DelayPoller(threading.Thread):
    """Reads the adaptive batcher's delay every ``every`` s while a replay runs."""

    def __init__(self, metrics_url: str, model: str, every: float = 0.5) -> None:
        super().__init__(daemon=True)
        self.url, self.model, self.every = metrics_url, model, every
        self.samples: list[tuple[float, float | None]] = []
        self.stop = threading.Event()

    def run(self) -> None:
        start = time.monotonic()
        while not self.stop.is_set():
            try:
                self.samples.append((round(time.monotonic() - start, 2),
                                     adaptive_delay(self.url, self.model)))
            except OSError:
                pass
            self.stop.wait(self.every)


def replay(server: ServerProcess, model: str, trace: Path, scratch: Path, tag: str,
           parts: list[tuple[str, float, float, float]], client_cpu: int) -> dict[str, Any]:
    records = scratch / f"{tag}.csv"
    before = model_stats(server.url, model)
    poller = DelayPoller(server.metrics_url, model)
    poller.start()
    done = subprocess.run(["taskset", "-c", str(client_cpu), CLI, "bench", server.url,
                           "--model", model, "--intervals", str(trace), "--records",
                           str(records), "--max-connections", "256", "--json",
                           str(scratch / f"{tag}.json")], capture_output=True, text=True,
                          check=False)
    poller.stop.set()
    poller.join()
    if done.returncode != 0:
        sys.exit(f"bench {model} failed: {done.stdout[-1500:]}\n{done.stderr[-1500:]}")
    requests, executions = stats_delta(before, model_stats(server.url, model))
    with records.open() as handle:
        rows = list(csv.DictReader(handle))
    scheduled = np.array([float(r["scheduled_ms"]) for r in rows]) / 1e3
    end = np.array([float(r["end_ms"]) for r in rows]) / 1e3
    latency = np.array([float(r["latency_ms"]) for r in rows])
    ok = np.array([r["outcome"] == "ok" for r in rows])
    out: dict[str, Any] = {"requests": len(rows), "errors": int((~ok).sum()),
                           "mean_batch": requests / executions if executions else 0.0,
                           "final_delay_us": adaptive_delay(server.metrics_url, model),
                           "delay_samples": poller.samples}
    for name, start, stop, rate in parts:
        sent = (scheduled >= start) & (scheduled < stop)
        lat = latency[sent & ok]
        finished = ok & (end >= start) & (end < stop)
        out[name] = {"rate": rate, "sent": int(sent.sum()), "errors": int((sent & ~ok).sum()),
                     "throughput_rps": float(finished.sum() / (stop - start)),
                     "p50_ms": float(np.percentile(lat, 50)) if lat.size else None,
                     "p99_ms": float(np.percentile(lat, 99)) if lat.size else None}
    in_peak = [value for t, value in poller.samples
               if value is not None and parts[1][1] <= t < parts[1][2]]
    out["peak_delay_us"] = float(np.median(in_peak)) if in_peak else None
    quiet = (ok & ((scheduled < parts[0][2]) | (scheduled >= parts[2][1])))
    out["quiet_all"] = {"p50_ms": float(np.percentile(latency[quiet], 50)),
                        "p99_ms": float(np.percentile(latency[quiet], 99))}
    return out


def capacity(server: ServerProcess, model: str, client_cpu: int, scratch: Path) -> float:
    """Closed-loop throughput at 32 in flight: how much the peak asks of the core."""
    path = scratch / "capacity.json"
    subprocess.run(["taskset", "-c", str(client_cpu), CLI, "bench", server.url, "--model",
                    model, "--concurrency", "32", "--duration", "3s", "--warmup", "1s",
                    "--json", str(path)], capture_output=True, text=True, check=True)
    return float(json.loads(path.read_text())["summary"]["throughput_rps"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quiet-rate", type=float,
                        help="requests/s (default: the peak over --peak-factor)")
    parser.add_argument("--peak-share", type=float, default=0.85,
                        help="without --quiet-rate: the peak as a share of the capacity "
                             "measured first (mlp_d0, closed loop, 32 in flight)")
    parser.add_argument("--peak-factor", type=float, default=5.0)
    parser.add_argument("--quiet-s", type=float, default=6.0, help="each quiet part")
    parser.add_argument("--peak-s", type=float, default=4.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", type=Path,
                        default=ROOT / "benchmarks/results/adaptive_batching.json")
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores: one for the server, one for the load generator")
    server_cpu, client_cpu = cores[0], cores[1]
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="tradeoff-adaptive-") as tmp:
        scratch = Path(tmp)
        repo = repository(scratch)
        trace = scratch / "trace.txt"
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            os.sched_setaffinity(0, {client_cpu})
            cap = capacity(server, "mlp_d0", client_cpu, scratch)
            if args.quiet_rate is None:
                args.quiet_rate = round(cap * args.peak_share / args.peak_factor)
            parts = phases(args)
            count = write_trace(trace, parts)
            print(f"capacity of mlp_d0 at 32 in flight: {cap:,.0f} req/s; peak asks "
                  f"{parts[1][3]:,.0f}/s; trace of {count} requests", flush=True)
            names = list(VARIANTS)
            for repeat in range(args.repeats):
                order = names[repeat % len(names):] + names[:repeat % len(names)]
                for variant in order:
                    model = VARIANTS[variant][0]
                    point = replay(server, model, trace, scratch, f"{model}-{repeat}", parts,
                                   client_cpu)
                    runs[variant].append(point)
                    delay = point["final_delay_us"]
                    print(f"[{repeat + 1}/{args.repeats}] {variant:24s} quiet p99 "
                          f"{point['quiet_all']['p99_ms']:7.2f} ms  peak "
                          f"{point['peak']['throughput_rps']:6.0f}/s p99 "
                          f"{point['peak']['p99_ms']:7.2f} ms  batch "
                          f"{point['mean_batch']:.1f}  errors {point['errors']}"
                          + (f"  delay {delay:.0f} us" if delay is not None else ""),
                          flush=True)
                    time.sleep(1.0)
            exit_code = server.stop()
            os.sched_setaffinity(0, set(cores))

    def med(variant: str, *path: str) -> float | None:
        values = []
        for r in runs[variant]:
            value: Any = r
            for key in path:
                value = value[key]
            if value is not None:
                values.append(value)
        return statistics.median(values) if values else None

    summary = {}
    for variant in VARIANTS:
        summary[variant] = {
            "quiet_p50_ms": med(variant, "quiet_all", "p50_ms"),
            "quiet_p99_ms": med(variant, "quiet_all", "p99_ms"),
            "quiet_before_p50_ms": med(variant, "quiet", "p50_ms"),
            "quiet_before_p99_ms": med(variant, "quiet", "p99_ms"),
            "quiet_after_p99_ms": med(variant, "quiet after", "p99_ms"),
            "peak_throughput_rps": med(variant, "peak", "throughput_rps"),
            "peak_p99_ms": med(variant, "peak", "p99_ms"),
            "mean_batch": med(variant, "mean_batch"),
            "peak_delay_us": med(variant, "peak_delay_us"),
            "errors": med(variant, "errors"),
            "final_delay_us": med(variant, "final_delay_us")}
    peak_rate = parts[1][3]
    print()
    print(f"trace: {args.quiet_rate:g}/s for {args.quiet_s:g} s, {peak_rate:g}/s for "
          f"{args.peak_s:g} s, {args.quiet_rate:g}/s for {args.quiet_s:g} s; medians of "
          f"{args.repeats}")
    print("| variant | quiet before: p50 / p99 ms | quiet after: p99 ms | peak req/s | "
          "peak p99 ms | mean batch | errors | delay in the peak, us |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for variant, s in summary.items():
        delay = s["peak_delay_us"]
        print(f"| {variant} | {s['quiet_before_p50_ms']:.2f} / {s['quiet_before_p99_ms']:.2f}"
              f" | {s['quiet_after_p99_ms']:.2f} | {s['peak_throughput_rps']:,.0f} | "
              f"{s['peak_p99_ms']:.2f} | {s['mean_batch']:.1f} | {s['errors']:.0f} | "
              f"{'-' if delay is None else f'{delay:,.0f}'} |")
    print(f"capacity (mlp_d0, closed loop, 32 in flight): {cap:,.0f} req/s")
    print(f"server exit code after SIGTERM: {exit_code}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({
        "schema": "tradeoff.bench.adaptive_batching/1",
        "command": " ".join(["benchmarks/adaptive_batching.py", *sys.argv[1:]]),
        "phases": [{"name": n, "start_s": a, "end_s": b, "rate": r} for n, a, b, r in parts],
        "capacity_rps": cap, "summary": summary, "runs": runs}, indent=1))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
