"""`tradeoff bench` against real servers on 127.0.0.1: its numbers must be right."""

from __future__ import annotations

import csv
import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tradeoff.server.process import ServerProcess, free_port

from .control_server import ControlServer

pytestmark = pytest.mark.integration


def bench(tmp_path: Path, *args: str, check: bool = True) -> tuple[int, dict[str, Any], str]:
    out = tmp_path / "result.json"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "bench", *args, "--json", str(out)],
                         capture_output=True, text=True, timeout=120, check=False)
    if check:
        assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(out.read_text()) if out.exists() else {}
    return run.returncode, result, run.stdout + run.stderr


def test_request_count_equals_the_server_count(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=1", "--protocol", "http",
                             "--method", "GET", "--concurrency", "4", "--requests", "200",
                             "--warmup", "0.2")
        assert result["summary"]["requests"] == 200
        assert result["total_requests_sent"] == server.count
        assert result["total_requests_sent"] == 200 + result["warmup"]["requests"] + 1


@pytest.mark.timing  # p50 at most 22 ms: a loaded machine wakes the 20 ms sleeps later
def test_fixed_20ms_server_measures_20ms(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=20", "--protocol", "http",
                             "--concurrency", "2", "--duration", "2")
    p50 = result["summary"]["latency_ms"]["p50"]
    assert 20.0 <= p50 <= 22.0, p50


@pytest.mark.timing  # 500 req/s within 10: a loaded machine sends and answers late
def test_open_loop_holds_the_asked_rate(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=1", "--protocol", "http",
                             "--rate", "500", "--duration", "3")
    summary = result["summary"]
    assert summary["asked_rate_rps"] == 500
    assert abs(summary["achieved_rate_rps"] - 500) <= 10, summary["achieved_rate_rps"]
    assert abs(summary["throughput_rps"] - 500) <= 10, summary["throughput_rps"]
    assert result["client"]["send_lag_ms"] is not None
    assert result["client"]["loop_lag_ms"]["p50"] >= 0


def test_a_frozen_server_is_charged_from_the_scheduled_time(tmp_path: Path) -> None:
    """100 req/s, the server freezes for 1 s: every request scheduled while no answer
    came is charged from its scheduled time, the wait included."""
    records = tmp_path / "records.csv"
    with ControlServer() as server:
        bench(tmp_path, f"{server.url}/freeze?after=150&s=1", "--protocol", "http",
              "--rate", "100", "--duration", "4", "--records", str(records))
    with records.open() as handle:
        rows = [(float(row["scheduled_ms"]), float(row["end_ms"]), float(row["latency_ms"]))
                for row in csv.DictReader(handle)]
    # the longest silence between two answers holds the freeze; a stall of this machine
    # can only lengthen a silence, and every bound below holds for any silence
    ends = sorted(end for _, end, _ in rows)
    silence, before = max((b - a, a) for a, b in itertools.pairwise(ends))
    after = before + silence
    waiting = [(scheduled, latency) for scheduled, _, latency in rows
               if before < scheduled < after]
    assert silence >= 500 and len(waiting) >= 40, (silence, len(waiting))  # ~100 at 100/s
    # each is answered after the silence, and charged the whole wait (a client that hid
    # the freeze would charge its late send instead: a handful slow)
    assert all(latency >= after - scheduled - 1e-6 for scheduled, latency in waiting)
    assert sum(latency >= 500 for _, _, latency in rows) >= 40  # the freeze's first half


def test_errors_are_counted_by_class(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, unavailable, _ = bench(tmp_path, f"{server.url}/status?code=503", "--protocol",
                                  "http", "--concurrency", "2", "--requests", "20")
        _, reset, _ = bench(tmp_path, f"{server.url}/close", "--protocol", "http",
                            "--concurrency", "2", "--requests", "20")
        _, slow, _ = bench(tmp_path, f"{server.url}/fixed?ms=2000", "--protocol", "http",
                           "--concurrency", "2", "--requests", "4", "--timeout", "0.2")
    assert unavailable["summary"]["errors_by_class"] == {"http": 20, "http_503": 20}
    assert unavailable["summary"]["successes"] == 0
    assert reset["summary"]["errors_by_class"] == {"reset": 20}
    assert slow["summary"]["errors_by_class"] == {"timeout": 4}


def test_unreachable_endpoint_is_a_failed_run(tmp_path: Path) -> None:
    port = free_port()
    code, _, output = bench(tmp_path, f"http://127.0.0.1:{port}/", "--protocol", "http",
                            "--requests", "5", check=False)
    assert code == 1
    assert "connection refused" in output
    assert "Traceback" not in output


def test_trace_replay_sends_every_interval(tmp_path: Path) -> None:
    trace = tmp_path / "trace.txt"
    trace.write_text("\n".join(["0"] + ["10000"] * 49))  # 50 requests, 10 ms apart
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=1", "--protocol", "http",
                             "--intervals", str(trace))
        assert server.count == 51  # and the cold-start request
    assert result["summary"]["requests"] == 50
    assert result["load"]["mode"] == "trace"


def test_until_stable_reports_its_windows(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=2", "--protocol", "http",
                             "--concurrency", "2", "--window", "0.4", "--max-windows", "4")
    assert 3 <= len(result["windows"]) <= 4
    assert isinstance(result["stable"], bool)
    assert result["stop_reason"].startswith(("stable", "not stable"))


def test_v2_against_tradeoff_serve_has_a_server_breakdown(server: ServerProcess,
                                                          tmp_path: Path) -> None:
    _, result, output = bench(tmp_path, server.url, "--model", "tiny", "--concurrency", "4",
                              "--duration", "1.5", "--batch-size", "2")
    summary = result["summary"]
    breakdown = summary["server_ms"]
    assert breakdown["source"] == "server-timing"
    assert breakdown["overhead"]["min"] >= 0  # server time never exceeds client latency
    assert breakdown["server_total"]["p99"] <= summary["latency_ms"]["max"]
    assert summary["inferences_per_s"] == pytest.approx(2 * summary["throughput_rps"])
    assert result["endpoint"]["max_batch_size"] == 64
    assert "server queue ms" in output


def test_v2_json_tensors(server: ServerProcess,
                                                       tmp_path: Path) -> None:
    _, result, _ = bench(tmp_path, server.url, "--model", "mlp", "--json-tensors",
                         "--concurrency", "2", "--requests", "50")
    assert result["summary"]["successes"] == 50
    assert result["endpoint"]["tensors"] == "json"


def test_bad_arguments_are_one_line(server: ServerProcess, tmp_path: Path) -> None:
    code, _, output = bench(tmp_path, server.url, "--model", "nope", "--requests", "1",
                            check=False)
    assert code == 1 and "HTTP 404" in output and "Traceback" not in output
    code, _, output = bench(tmp_path, server.url, "--model", "tiny", "--concurrency", "2",
                            "--rate", "10", check=False)
    assert code == 1 and "exactly one of" in output


@pytest.mark.timing  # the open loop's 400 req/s within 8 moves with the load
def test_workers_merge_records_exactly(tmp_path: Path) -> None:
    with ControlServer() as server:
        _, closed, _ = bench(tmp_path, f"{server.url}/fixed?ms=2", "--protocol", "http",
                             "--concurrency", "4", "--requests", "101", "--workers", "2")
        assert closed["summary"]["requests"] == 101
        assert closed["total_requests_sent"] == server.count
        before = server.count
        _, opened, _ = bench(tmp_path, f"{server.url}/fixed?ms=1", "--protocol", "http",
                             "--rate", "400", "--duration", "2", "--workers", "2")
        assert opened["total_requests_sent"] == server.count - before
    assert closed["client"]["workers"] == 2
    assert abs(opened["summary"]["achieved_rate_rps"] - 400) <= 8
    assert abs(opened["summary"]["throughput_rps"] - 400) <= 8


def test_workers_need_a_fixed_length(tmp_path: Path) -> None:
    with ControlServer() as server:
        code, _, output = bench(tmp_path, f"{server.url}/fixed", "--protocol", "http",
                                "--concurrency", "2", "--workers", "2", check=False)
    assert code == 1 and "--workers needs --duration" in output


def test_windows_carry_the_servers_statistics(server: ServerProcess, tmp_path: Path) -> None:
    records = tmp_path / "records.parquet"
    _, result, _ = bench(tmp_path, server.url, "--model", "tiny", "--concurrency", "2",
                         "--duration", "1.5", "--window", "0.5", "--records", str(records))
    windows = result["windows"]
    assert len(windows) == 3
    with_stats = [w for w in windows if "server_ms" in w]
    assert with_stats, windows
    for window in with_stats:
        assert set(window["server_ms"]) == {"queue", "compute_input", "compute_infer",
                                            "compute_output"}
        assert window["server_executions"] >= 1
    import pyarrow.parquet as pq

    table = pq.read_table(records)
    assert table.num_rows == result["total_requests_sent"] - 1  # all but the cold start
    assert "server_compute_infer_ms" in table.column_names


def test_v2_inputs_from_a_perf_analyzer_data_file(server: ServerProcess, tmp_path: Path) -> None:
    data = tmp_path / "inputs.json"
    data.write_text(json.dumps({"data": [
        {"INPUT0": [float(i) for i in range(16)]},
        {"INPUT0": {"content": [1.0] * 16, "shape": [16]}},
    ]}))
    _, result, _ = bench(tmp_path, server.url, "--model", "tiny", "--input-data", str(data),
                         "--requests", "20", "--batch-size", "3")
    assert result["summary"]["successes"] == 20
    assert result["summary"]["inferences_per_s"] == pytest.approx(
        3 * result["summary"]["throughput_rps"])
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"data": [{"INPUT0": [1.0, 2.0]}]}))
    code, _, output = bench(tmp_path, server.url, "--model", "tiny", "--input-data", str(bad),
                            "--requests", "1", check=False)
    assert code == 1 and "has 2 values, not shape [16]" in output


def test_v2_grpc_has_the_same_breakdown(server: ServerProcess, tmp_path: Path) -> None:
    _, result, _ = bench(tmp_path, server.grpc_url, "--protocol", "v2-grpc", "--model", "tiny",
                         "--concurrency", "2", "--requests", "40", "--batch-size", "2")
    summary = result["summary"]
    assert summary["successes"] == 40
    assert summary["server_ms"]["source"] == "server-timing"
    assert summary["server_ms"]["overhead"]["min"] >= 0
    assert summary["inferences_per_s"] == pytest.approx(2 * summary["throughput_rps"])
    assert result["endpoint"]["protocol"] == "v2-grpc"
    code, _, output = bench(tmp_path, server.grpc_url, "--protocol", "v2-grpc", "--model",
                            "nope", "--requests", "1", check=False)
    assert code == 1 and "NOT_FOUND" in output


@pytest.mark.parametrize("workers", ["1", "2"])
def test_no_open_loop_request_leaves_before_its_scheduled_time(tmp_path: Path,
                                                               workers: str) -> None:
    """Timers that woke early sent requests before their time (28 of 5,977 at 500 req/s),
    and latency from the intended time came out negative."""
    records = tmp_path / "records.csv"
    with ControlServer() as server:
        _, result, _ = bench(tmp_path, f"{server.url}/fixed?ms=0", "--protocol", "http",
                             "--rate", "700", "--arrival", "poisson", "--duration", "3",
                             "--workers", workers, "--seed", "5", "--records", str(records))
    with records.open() as f:
        rows = list(csv.DictReader(f))
    assert len(rows) > 1500
    early = [r for r in rows if float(r["sent_ms"]) < float(r["scheduled_ms"])]
    assert not early, f"{len(early)} of {len(rows)} sent early, e.g. {early[:2]}"
    assert result["summary"]["latency_ms"]["min"] >= 0


def test_the_wrong_port_or_url_is_one_line_saying_what_to_give(server: ServerProcess,
                                                               tmp_path: Path) -> None:
    """The gRPC port gave a BadStatusLine of binary garbage; no server, a bare refusal;
    an infer URL, a 404 for a doubled path."""
    cases = [([f"http://{server.grpc_url}", "--model", "mlp"], "as a gRPC port does"),
             ([f"http://127.0.0.1:{free_port()}", "--model", "mlp"],
              "nothing listens at 127.0.0.1:"),
             ([f"{server.url}/v2/models/mlp/infer", "--model", "mlp"],
              "give the server's base URL"),
             ([f"{server.url}/v1/chat/completions", "--protocol", "openai", "--model", "m"],
              "give the API's base URL")]
    for args, says in cases:
        code, _, out = bench(tmp_path, *args, "--requests", "2", check=False)
        assert code != 0 and says in out and "Traceback" not in out, out
    sweep = subprocess.run([sys.executable, "-m", "tradeoff", "sweep",
                            f"http://{server.grpc_url}", "--model", "mlp",
                            "--concurrency-range", "1:2"], capture_output=True, text=True,
                           timeout=60, check=False)
    said = (sweep.stdout + sweep.stderr).strip()  # the error alone: no warmup note first
    assert sweep.returncode != 0 and said.count("\n") == 0 and "as a gRPC port does" in said
    top = subprocess.run([sys.executable, "-m", "tradeoff", "top", f"http://{server.grpc_url}",
                          "--iterations", "1"], capture_output=True, text=True, timeout=60,
                         check=False)
    assert "as a gRPC port does" in top.stdout + top.stderr


def test_records_and_summaries_go_into_folders_made_for_them(server: ServerProcess,
                                                              tmp_path: Path) -> None:
    """--records and --summary into folders that do not exist yet: made before the run,
    so nothing measured is lost after it (as --json does)."""
    records = tmp_path / "runs" / "today" / "records.csv"
    _, result, _ = bench(tmp_path, server.url, "--model", "tiny", "--requests", "20",
                         "--warmup", "0.3", "--records", str(records))
    with records.open() as handle:
        phases = [row["phase"] for row in csv.DictReader(handle)]
    # the warmup's requests are in the file, marked: the result's count is the measured
    assert phases.count("measured") == result["summary"]["requests"] == 20
    assert phases.count("warmup") == result["warmup"]["requests"] > 0
    assert phases == sorted(phases, key=lambda p: p == "measured")  # warmup first
    summary = tmp_path / "tables" / "sweep.md"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "sweep", server.url, "--model",
                          "tiny", "--concurrency-range", "1:2", "--duration", "0.3s",
                          "--summary", str(summary)],
                         capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert summary.read_text().startswith("|")
