"""Bench and sweep results with chosen figures, for the analysis rules' tests."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tradeoff.bench.sweep import knee_of, point_summary
from tradeoff.results import BenchResult, SweepResult, load_as

# one document of every kind, as the current version writes it
RESULTS = Path(__file__).parent.parent / "data" / "results"
RESULT_FILES = sorted(RESULTS.glob("*.json"))


def bench_result(*, load: float = 8, mode: str = "closed", throughput: float = 1000.0,
                 p50: float = 5.0, p99: float = 8.0, requests: int = 10_000, errors: int = 0,
                 queue: float | None = 1.0, compute: float | None = 3.0,
                 latency_mean: float | None = None, cold_start: float = 6.0,
                 stable: bool | None = True, client_bound: bool = False,
                 windows: list[dict[str, Any]] | None = None,
                 executions: int | None = None, name: str = "m",
                 cache_hits: int | None = None, input_mix: dict | None = None,
                 achieved: float | None = None) -> BenchResult:
    """A bench result read from the document a run with these figures writes."""
    mean = latency_mean if latency_mean is not None else p50 * 1.1
    server = None
    if queue is not None and compute is not None:
        server = {"source": "server-timing", "queue": {"mean": queue},
                  "compute_input": {"mean": 0.0}, "compute_infer": {"mean": compute},
                  "compute_output": {"mean": 0.0}, "server_total": {"mean": queue + compute},
                  "overhead": {"mean": mean - queue - compute}}
    return load_as(BenchResult, {
        "schema": "tradeoff.bench/1",
        "endpoint": {"protocol": "v2", "url": "http://127.0.0.1:8000", "model": name,
                     "batch_size": 1, "inputs": [], "platform": "onnxruntime_onnx",
                     **({"input_mix": input_mix} if input_mix else {})},
        "load": {"mode": mode, "concurrency": load if mode == "closed" else None,
                 "rate": load if mode == "open" else None, "arrival": None,
                 "warmup_s": 1.0, "duration_s": 5.0, "stability_percent": 10.0},
        "environment": {"client_host": "test"},
        "cold_start_ms": cold_start,
        "cold_start_ok": True,
        "warmup": {"requests": 10, "latency_ms": None},
        "total_requests_sent": requests + 11,
        "windows": windows if windows is not None else [
            {"index": 0, "duration_s": 5.0, "completed": requests, "errors": errors,
             "throughput_rps": throughput, "p50_ms": p50, "p99_ms": p99}],
        "stable": stable,
        "stop_reason": "--duration reached",
        "client": {"workers": 1, "cpu_percent": 40.0, "send_lag_ms": None,
                   "loop_lag_ms": None, "client_bound": client_bound,
                   "reasons": ["client CPU 99% > 90%"] if client_bound else [], "notes": []},
        "summary": {"requests": requests, "successes": requests - errors, "errors": errors,
                    "errors_by_class": {"http_503": errors} if errors else {},
                    "throughput_rps": throughput, "inferences_per_s": throughput,
                    "latency_ms": {"min": p50 / 2, "mean": mean, "p50": p50, "p90": p99 * 0.8,
                                   "p95": p99 * 0.9, "p99": p99, "p999": p99 * 1.2,
                                   "max": p99 * 1.5},
                    "server_ms": server,
                    "server_counts": None if executions is None else
                    {"requests": requests, "executions": executions,
                     **({} if cache_hits is None else {"cache_hits": cache_hits,
                                                       "cache_misses": requests - cache_hits})},
                    "bytes_sent": 0, "bytes_received": 0,
                    "asked_rate_rps": load if mode == "open" else None,
                    "achieved_rate_rps": achieved, "duration_s": 5.0},
    })


def sweep_result(points: list[BenchResult], mode: str = "concurrency") -> SweepResult:
    """A sweep of these points, its rows and knee found as ``tradeoff sweep`` finds them."""
    return SweepResult(endpoint=points[0].endpoint, mode=mode, plan={"mode": mode},
                       environment={"client_host": "test"}, points=points,
                       rows=[point_summary(p) for p in points], knee=knee_of(points),
                       stop_reason="last level reached", sla=None, price=None, ranking=None,
                       score={"alpha": 0.5, "sla_p99_ms": None, "max_error_percent": 1.0})


def with_payloads(value: Any, payloads: Iterator[str], seen: dict[str, str], *,
                  form: str = "{payload} {value}", kept: frozenset[str] = frozenset(
                      {"schema", "search"}), keyed: frozenset[str] = frozenset(),
                  key: str = "") -> Any:
    """A result document (as read from JSON) with every string written in ``form`` around
    the next payload: one string always the same way, so a name still finds what it
    names. Fields in ``kept`` (what the readers branch on) stay as written; the keys of
    fields in ``keyed`` (names from outside: error classes, facts) take payloads too."""
    if key in kept:
        return value
    if isinstance(value, str):
        return seen.setdefault(value, form.format(payload=next(payloads), value=value))
    again = {"payloads": payloads, "seen": seen, "form": form, "kept": kept, "keyed": keyed}
    if isinstance(value, list):
        return [with_payloads(v, **again) for v in value]
    if isinstance(value, dict):
        return {(with_payloads(k, **again) if key in keyed else k):
                with_payloads(v, **again, key=k) for k, v in value.items()}
    return value
