"""A mixed load against one pool, the other, and a router over both.

The load: open loop, Poisson arrivals, 20% latency class (`class=latency`) and 80%
throughput class, from one schedule (`tradeoff bench --mix`). The servers, each alone on
core 0 with the load generator on core 1, serve `mlp` three ways:

- (a) batched: every request to `mlp_batched` (dynamic batching, 5 ms queue delay,
  preferred batch 32): the throughput pool;
- (b) unbatched: every request to `mlp_realtime` (the same model, no dynamic batching):
  the latency pool;
- (c) routed: `front`, a router sending the latency class to `mlp_realtime` and the rest
  to `mlp_batched`.

Rounds interleave the three; medians per class. Writes benchmarks/results/routing.json.

    .venv/bin/python benchmarks/routing.py                 # 1,300 and 1,800 req/s
    .venv/bin/python benchmarks/routing.py --rate 2000 --rounds 1 --duration 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from harness import command_line, write_results
from rich.console import Console
from rich.table import Table

from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.mix import RequestClass
from tradeoff.bench.session import run_benchmark
from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

POOLS = {"batched": ("mlp_batched", "dynamic_batching { max_queue_delay_microseconds: 5000 "
                                    "preferred_batch_size: [ 32 ] }"),
         "unbatched": ("mlp_realtime", "")}
SETUPS = {"(a) batched": "mlp_batched", "(b) unbatched": "mlp_realtime", "(c) routed": "front"}
ROUTER = """\
routes:
  - when: {class: latency}
    to: mlp_realtime
  - to: mlp_batched
fallback: [mlp_batched]
"""
CLASSES = (RequestClass("latency", 20, {"class": "latency"}),
           RequestClass("throughput", 80, {"class": "throughput"}))


def repository(root: Path) -> Path:
    build_repository(root, ("mlp",))
    source = (root / "mlp" / "config.pbtxt").read_text()
    base = "\n".join(line for line in source.splitlines()
                     if not line.startswith(("name:", "dynamic_batching")))
    for name, batching in POOLS.values():
        target = root / name
        (target / "1").mkdir(parents=True)
        (target / "1" / "model.onnx").write_bytes((root / "mlp" / "1" / "model.onnx")
                                                  .read_bytes())
        (target / "config.pbtxt").write_text(f'name: "{name}"\n{base}\n{batching}\n')
    (root / "front").mkdir()
    (root / "front" / "router.yaml").write_text(ROUTER)
    return root


def measure(server: ServerProcess, model: str, rate: float, args: argparse.Namespace,
            seed: int) -> dict[str, Any]:
    spec = EndpointSpec(server.url, model=model, classes=CLASSES, seed=seed)
    load = LoadSpec(rate=rate, arrival="poisson", duration_s=args.duration,
                    warmup_s=args.warmup, seed=seed, max_connections=256)
    result, _, _ = run_benchmark(make_adapter(spec), load)
    out: dict[str, Any] = {"all": {"throughput_rps": result.summary.throughput_rps,
                                   "p50_ms": result.summary.latency("p50"),
                                   "p99_ms": result.summary.latency("p99"),
                                   "errors": result.summary.errors},
                           "client_bound": result.client.client_bound}
    for c in result.classes or []:
        out[c.name] = {"throughput_rps": c.throughput_rps, "p50_ms": c.latency("p50"),
                       "p99_ms": c.latency("p99"), "errors": c.errors}
    return out


def median(runs: list[dict[str, Any]], group: str, key: str) -> float | None:
    values = [r[group][key] for r in runs if r[group][key] is not None]
    return statistics.median(values) if values else None


def report(rate: float, runs: dict[str, list[dict[str, Any]]], args: argparse.Namespace,
           console: Console) -> dict[str, Any]:
    """The medians of each setup, as a table and as JSON."""
    table = Table(title=f"mixed load, {rate:g} req/s Poisson, 20% latency class "
                        f"(medians of {args.rounds} rounds)")
    for column in ("setup", "latency p50", "latency p99", "throughput-class req/s",
                   "throughput p99", "all req/s", "errors"):
        table.add_column(column, justify="right")
    summary: dict[str, Any] = {}
    for setup in SETUPS:
        row = {f"{group}_{key}": median(runs[setup], group, key)
               for group in ("latency", "throughput", "all")
               for key in ("throughput_rps", "p50_ms", "p99_ms", "errors")}
        row["client_bound"] = any(r["client_bound"] for r in runs[setup])
        summary[setup] = row
        table.add_row(setup, f"{row['latency_p50_ms']:.2f}", f"{row['latency_p99_ms']:.2f}",
                      f"{row['throughput_throughput_rps']:,.0f}",
                      f"{row['throughput_p99_ms']:.2f}", f"{row['all_throughput_rps']:,.0f}",
                      f"{row['all_errors']:.0f}")
    console.print(table)
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, nargs="+", default=[1300.0, 1800.0],
                        help="requests per second (each rate is its own run)")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", type=Path,
                        default=Path(__file__).parent / "results" / "routing.json")
    args = parser.parse_args()
    console = Console(width=120)
    out: dict[str, Any] = {"command": command_line(),
                           "rates": {}}
    with tempfile.TemporaryDirectory(prefix="tradeoff-routing-") as scratch:
        root = repository(Path(scratch))
        with ServerProcess(root, cpus="0") as server:
            os.sched_setaffinity(0, {1})
            for rate in args.rate:
                runs: dict[str, list[dict[str, Any]]] = {setup: [] for setup in SETUPS}
                for round_ in range(args.rounds):
                    for setup, model in SETUPS.items():
                        runs[setup].append(measure(server, model, rate, args, round_))
                        console.print(f"{rate:g}/s round {round_ + 1} {setup}: "
                                      f"{runs[setup][-1]}")
                out["rates"][str(rate)] = {"rounds": runs, "medians": report(rate, runs, args,
                                                                             console)}
            os.sched_setaffinity(0, {0, 1})
    write_results(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
