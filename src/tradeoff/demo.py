"""``tradeoff demo``: dynamic batching on vs off on the built-in ``mlp``, side by side."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.bench.v2 import model_stats, stats_delta
from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

DEMO_MODELS = ("mlp", "mlp_nobatch")


def _pinning() -> tuple[str | None, set[int] | None]:
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cores) >= 2:
        return str(cores[0]), set(cores[1:])
    return None, None


def run_demo(output: Path, duration: float, levels: tuple[int, ...]) -> list[dict[str, Any]]:
    console = Console()
    repository = output / "models"
    build_repository(repository)
    server_cpus, client_cpus = _pinning()
    rows: list[dict[str, Any]] = []
    with ServerProcess(repository, cpus=server_cpus) as server:
        if client_cpus:
            os.sched_setaffinity(0, client_cpus)
        console.print(f"server {server.url} (metrics {server.metrics_url})"
                      + (f", pinned to CPU {server_cpus}, client on {sorted(client_cpus)}"
                         if client_cpus else ""))
        with console.status("measuring") as status:
            for model in DEMO_MODELS:
                for concurrency in levels:
                    status.update(f"{model} at concurrency {concurrency} for {duration:g}s")
                    before = model_stats(server.url, model)
                    result, _, _ = run_benchmark(
                        V2Adapter(server.url, model),
                        LoadSpec(concurrency=concurrency, duration_s=duration,
                                 warmup_s=min(1.0, duration / 3)))
                    requests, executions = stats_delta(before, model_stats(server.url, model))
                    summary = result["summary"]
                    latency = summary["latency_ms"] or {}
                    rows.append({
                        "model": model, "concurrency": concurrency,
                        "throughput_rps": summary["throughput_rps"],
                        "p50_ms": latency.get("p50", float("nan")),
                        "p99_ms": latency.get("p99", float("nan")),
                        "executions_per_request": executions / requests if requests else None,
                        "errors": summary["errors"],
                    })
        exit_code = server.stop()
    table = Table(title="Dynamic batching on (mlp) vs off (mlp_nobatch)")
    for column in ("model", "conc", "infer/s", "p50 ms", "p99 ms", "exec/req", "errors"):
        table.add_column(column, justify="left" if column == "model" else "right")
    for row in rows:
        epr = row["executions_per_request"]
        table.add_row(row["model"], str(row["concurrency"]), f"{row['throughput_rps']:,.0f}",
                      f"{row['p50_ms']:.2f}", f"{row['p99_ms']:.2f}",
                      "-" if epr is None else f"{epr:.3f}", str(row["errors"]))
    console.print(table)
    results = output / "results.json"
    results.write_text(json.dumps({"schema": "tradeoff.demo/1", "rows": rows}, indent=2))
    console.print("exec/req: model executions per request; below 1, requests shared "
                  "executions (dynamic batching).")
    top = max(levels)
    on = next(r for r in rows if r["model"] == "mlp" and r["concurrency"] == top)
    off = next(r for r in rows if r["model"] == "mlp_nobatch" and r["concurrency"] == top)
    if off["throughput_rps"] and off["p50_ms"]:
        console.print(f"At concurrency {top}, dynamic batching gave "
                      f"{on['throughput_rps'] / off['throughput_rps']:.2f}x the throughput at "
                      f"{on['p50_ms'] / off['p50_ms']:.2f}x the p50 latency.")
    console.print(f"server exited with {exit_code} after SIGTERM; models in {repository}, "
                  f"results in {results}")
    return rows
