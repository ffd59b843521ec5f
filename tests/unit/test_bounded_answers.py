"""What the clients accept from an endpoint: answers they can read, of a bounded size,
and a client-bound verdict only when the client's lag shows in what it measured."""

from __future__ import annotations

import importlib
import time
from types import SimpleNamespace
from typing import Any

import orjson
import pytest
from click.testing import CliRunner
from rich.console import Console

from tradeoff.analysis.diagnose import diagnose
from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.endpoint import make_adapter
from tradeoff.bench.load import LOAD_DEFAULTS, LoadSpec
from tradeoff.bench.records import OUTCOME_NAMES, classify
from tradeoff.bench.result import client_check
from tradeoff.cli import main
from tradeoff.cli import options as cli_options
from tradeoff.protocol.http_client import Response, ResponseTooLarge
from tradeoff.protocol.openai_answers import MAX_EVENT_BYTES, StreamReader
from tradeoff.report.terminal import print_bench_result
from tradeoff.results import BenchResult, load_as

from .result_factory import bench_result

OUTPUTS = {"model_name": "m", "outputs": [{"name": "y", "datatype": "FP32", "shape": [1]}]}


def test_an_event_without_end_fails_the_answer_in_bounded_time() -> None:
    reader = StreamReader(chat=False)
    piece = b"data: " + b"x" * 4090
    started = time.perf_counter()
    for _ in range(4 * MAX_EVENT_BYTES // len(piece)):  # 4 MiB of one event, 4 KiB at a time
        reader(200, piece)
    assert time.perf_counter() - started < 2.0  # linear: no copy of what came before
    assert reader.failure() == f"an event longer than {MAX_EVENT_BYTES:,} bytes"
    assert reader.received == 4 * MAX_EVENT_BYTES // len(piece) * len(piece)


def test_an_event_dripped_byte_by_byte_is_read_whole() -> None:
    event = b'data: {"choices": [{"index": 0, "text": "ok"}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    reader = StreamReader(chat=False)
    for byte in event:
        reader(200, bytes((byte,)))
    assert reader.pieces == ["ok"] and reader.done and reader.failure() is None


def test_an_error_answer_keeps_only_its_beginning() -> None:
    reader = StreamReader(chat=False)
    for _ in range(1000):
        reader(500, b"e" * 65536)
    assert len(reader._error_body) <= 2 * 65536
    assert reader.failure() == "HTTP 500: " + "e" * 200


def test_a_benchmark_keeps_no_text() -> None:
    reader = StreamReader(chat=False, keep_text=False)
    reader(200, b'data: {"choices": [{"text": "ok"}]}\n\n')
    assert reader.pieces == [] and len(reader.text_ns) == 1


def _answer(body: bytes, header: int | None = None) -> Response:
    headers = {} if header is None else {b"inference-header-content-length": b"%d" % header}
    return Response(200, headers, body)


def test_v2_answers_that_cannot_be_read_are_named() -> None:
    adapter = V2Adapter("http://127.0.0.1:8000", "m")
    json_answer = orjson.dumps(OUTPUTS)
    assert adapter.invalid(_answer(json_answer)) is None
    assert adapter.invalid(_answer(json_answer + b"\0" * 4, len(json_answer))) is None
    for bad in (_answer(b"\x00\xffnot an answer"), _answer(b"[1, 2]"), _answer(b""),
                _answer(json_answer, len(json_answer) + 1), _answer(json_answer, 0),
                _answer(b"[" * 100_000)):
        why = adapter.invalid(bad)
        assert why is not None and why.startswith("undecodable answer"), bad.body[:20]


def test_max_response_size_reaches_the_adapter_and_reads_sizes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    taken: list[Any] = []

    def spy(url: str, options: dict[str, Any]) -> Any:
        taken.append(cli_options.take_endpoint(url, options))
        raise SystemExit(0)

    monkeypatch.setattr(importlib.import_module("tradeoff.cli.bench"), "take_endpoint", spy)
    runner = CliRunner()
    runner.invoke(main, ["bench", "http://127.0.0.1:9", "--model", "m"])
    runner.invoke(main, ["bench", "http://127.0.0.1:9", "--model", "m",
                         "--max-response-size", "1.5GiB"])
    default, given = taken
    assert default.max_response_bytes == LOAD_DEFAULTS.max_response_bytes == 64 << 20
    assert given.max_response_bytes == int(1.5 * (1 << 30))
    assert make_adapter(given).max_response_bytes == int(1.5 * (1 << 30))
    result = CliRunner().invoke(main, ["bench", "http://127.0.0.1:9", "--model", "m",
                                       "--max-response-size", "lots"])
    assert result.exit_code == 2 and "'lots' is not a size" in result.output


def test_an_answer_over_the_bound_is_a_class_of_its_own() -> None:
    assert OUTCOME_NAMES[classify(ResponseTooLarge.over(1 << 20))] == "too_large"
    assert OUTCOME_NAMES[classify(ConnectionResetError("closed"))] == "reset"
    assert OUTCOME_NAMES[classify(ConnectionError("malformed HTTP response"))] == "other"
    doc = bench_result(requests=10, errors=3).to_dict()
    doc["summary"]["errors_by_class"] = {"too_large": 3}
    result = load_as(BenchResult, doc)
    assert result.to_dict()["summary"]["errors_by_class"] == {"too_large": 3}
    console = Console(record=True, width=200)
    print_bench_result(result, console)
    assert "too_large: 3 (answers over --max-response-size)" in console.export_text()


def test_the_grace_is_the_timeout_at_most_the_stop_grace() -> None:
    assert LoadSpec(concurrency=1, timeout_s=5).grace_s == 5
    assert LoadSpec(concurrency=1, timeout_s=600).grace_s == LOAD_DEFAULTS.stop_grace_s
    assert LoadSpec(concurrency=1, timeout_s=600, stop_grace_s=2).grace_s == 2


def _check(p50: float, send_p99: float, loop_p99: float, cpu: float = 3.0,
           notes: list[str] | None = None, idle: float = 0.5) -> tuple[bool, list[str]]:
    """The runner's self-check of a run against an endpoint of ``p50`` ms."""
    outcome = SimpleNamespace(idle_lag_ms=idle, notes=notes or [], client_cpu_percent=cpu)
    summary = bench_result(p50=p50, p99=p50 * 1.1, mode="open").summary
    return client_check(outcome, summary, {"p50": 0.3, "p99": send_p99},  # type: ignore[arg-type]
                        {"p50": 0.1, "p99": loop_p99})


def _lagging(p50: float, send_p99: float, loop_p99: float, cpu: float = 3.0,
             notes: list[str] | None = None) -> BenchResult:
    """A bench result with the runner's verdict on its lag, against an endpoint of
    ``p50``."""
    bound, reasons = _check(p50, send_p99, loop_p99, cpu, notes)
    doc = bench_result(p50=p50, p99=p50 * 1.1, mode="open").to_dict()
    doc["client"].update(cpu_percent=cpu, client_bound=bound, reasons=reasons,
                         send_lag_ms={"p50": 0.3, "p99": send_p99},
                         loop_lag_ms={"p50": 0.1, "p99": loop_p99}, notes=notes or [])
    return load_as(BenchResult, doc)


def rules(result: BenchResult) -> dict[str, str]:
    return {f.rule: f.severity for f in diagnose(result)}


def test_a_slow_endpoint_is_not_the_client_s_slowness() -> None:
    # a dripping endpoint: 1.2 s answers, the client 11.5 ms late at p99 and 3% busy
    found = rules(_lagging(p50=1200, send_p99=11.5, loop_p99=7.1))
    assert "client_bound" not in found and found["client_lag"] == "info"
    # the same lag in front of a 2 ms endpoint is most of what was measured
    assert rules(_lagging(p50=2, send_p99=11.5, loop_p99=7.1))["client_bound"] == "critical"
    # a busy client is client-bound whatever the endpoint
    assert rules(_lagging(p50=1200, send_p99=0.5, loop_p99=1, cpu=99))["client_bound"] == \
        "critical"


def test_lag_counts_above_what_the_loop_shows_at_rest() -> None:
    """A 2-core machine's loop lags 3.8-6.3 ms with the server beside it: judged above the
    lag at rest, a 6 ms lag at 5 ms at rest is not a reason, at 0.5 ms it is."""
    assert _check(p50=1.0, send_p99=0.9, loop_p99=6.0, idle=5.0) == (False, [])
    bound, reasons = _check(p50=1.0, send_p99=0.9, loop_p99=6.0, idle=0.5)
    assert bound and "(0.5 ms at rest)" in reasons[0]


def test_waiting_for_a_free_connection_is_the_endpoint_s_doing() -> None:
    note = "40 request(s) waited for a free connection: the endpoint held all " \
           "--max-connections 4"
    held = _lagging(p50=900, send_p99=800, loop_p99=1, notes=[note])
    assert "client_bound" not in rules(held)
    assert "client_bound" in rules(_lagging(p50=900, send_p99=800, loop_p99=1))
