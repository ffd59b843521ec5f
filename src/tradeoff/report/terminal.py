"""Terminal tables for benchmark results."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_bench_result(result: dict[str, Any], console: Console) -> None:
    """The summary of one ``tradeoff bench`` result."""
    s = result["summary"]
    endpoint = result["endpoint"]
    load = result["load"]
    what = endpoint.get("model") or endpoint["url"]
    if load["mode"] == "closed":
        offered = f"concurrency {load['concurrency']}"
    elif load["mode"] == "open":
        offered = f"{load['arrival']} arrivals at {load['rate']:g}/s"
    else:
        offered = f"trace of {load['intervals']} requests"
    table = Table(title=f"{what} ({endpoint['protocol']}), {offered}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    table.add_row("requests (errors)", f"{s['requests']:,} ({s['errors']:,})")
    table.add_row("throughput", f"{s['throughput_rps']:,.1f} req/s, "
                                f"{s['inferences_per_s']:,.1f} infer/s")
    if s["asked_rate_rps"]:
        table.add_row("asked / achieved rate",
                      f"{s['asked_rate_rps']:,.1f} / {s['achieved_rate_rps']:,.1f} req/s")
    lat = s["latency_ms"] or {}
    for key in ("p50", "p90", "p99", "p999", "mean", "max"):
        table.add_row(f"latency {key} ms", _ms(lat.get(key)))
    server = s.get("server_ms")
    if server:
        for part in ("queue", "compute_input", "compute_infer", "compute_output", "overhead"):
            values = server.get(part) or {}
            cell = f"mean {_ms(values.get('mean'))}"
            if "p99" in values:
                cell += f"  p99 {_ms(values['p99'])}"
            table.add_row(f"server {part} ms", cell)
        table.add_row("server breakdown from", server["source"])
    if s["errors_by_class"]:
        table.add_row("errors by class", ", ".join(f"{k}: {v}"
                                                   for k, v in s["errors_by_class"].items()))
    table.add_row("bytes sent / received", f"{s['bytes_sent']:,} / {s['bytes_received']:,}")
    table.add_row("cold start ms", _ms(result["cold_start_ms"]))
    table.add_row("warmup requests", f"{result['warmup']['requests']:,}")
    stable = result["stable"]
    table.add_row("windows", f"{len(result['windows'])}, "
                             + ("stable" if stable else "unstable" if stable is False else
                                "stability not checked") + f" ({result['stop_reason']})")
    client = result["client"]
    table.add_row("client CPU", f"{client['cpu_percent']:.0f}%")
    if client["send_lag_ms"]:
        table.add_row("send lag p99 ms", _ms(client["send_lag_ms"]["p99"]))
    if client.get("loop_lag_ms"):
        table.add_row("client loop lag p99 ms", _ms(client["loop_lag_ms"]["p99"]))
    console.print(table)
    if client["client_bound"]:
        console.print("[bold yellow]client_bound[/]: the load generator could not keep up ("
                      + "; ".join(client["reasons"]) + "); the figures understate the "
                      "endpoint. Try --workers N or a faster client machine.")
    if stable is False:
        console.print(f"[yellow]unstable[/]: {result['stop_reason']}; last windows disagree "
                      f"by more than {load['stability_percent']:g}%.")
