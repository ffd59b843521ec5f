"""`tradeoff bench --protocol openai` against a streaming server whose token timing the
test controls: TTFT, ITL and TPOT as scheduled, exact token counts, a server that does
not honour the asked length, errors mid-stream, goodput, and the API key kept secret."""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tradeoff.bench.adapters import split_url
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.openai_stream import generation_body, generation_request, stream_once
from tradeoff.bench.session import run_benchmark
from tradeoff.cli import main
from tradeoff.results import BenchResult, Generation, OutputLength

from .streaming_server import StreamingServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def streaming() -> Iterator[StreamingServer]:
    with StreamingServer() as server:
        yield server


def bench(url: str, requests: int = 8, concurrency: int = 2, **generation: Any
          ) -> BenchResult:
    options = GenerationOptions(**{"output_tokens": (10, 10), "ignore_eos": True,
                                   **generation})
    adapter = make_adapter(EndpointSpec(url, "openai", "test-model", generation=options))
    result, _, _ = run_benchmark(adapter, LoadSpec(concurrency=concurrency, requests=requests))
    return result


def generation_of(result: BenchResult) -> Generation:
    assert result.summary.generation is not None, "no generation figures"
    return result.summary.generation


@pytest.mark.timing  # TTFT and ITL within 10% of the server's sleeps move with the load
def test_timings_follow_the_servers_schedule(streaming: StreamingServer) -> None:
    result = bench(streaming.url(first=200, every=40))
    s, g = result.summary, generation_of(result)
    assert s.errors == 0 and s.successes == 8
    assert g.ttft_ms and g.itl_ms and g.tpot_ms
    assert g.ttft_ms["p50"] == pytest.approx(200, rel=0.10)
    assert g.itl_ms["p50"] == pytest.approx(40, rel=0.10)
    assert g.tpot_ms["p50"] == pytest.approx(40, rel=0.10)
    out = g.output_tokens
    assert (out.total, out.from_usage, out.counted_events) == (80, 8, 0)
    assert g.input_tokens and g.input_tokens.total == 8 * 7  # the server's usage.prompt_tokens
    assert g.output_length.exact == 8 and g.output_length.honoured
    for key in ("p50", "p90", "p99", "p999", "mean", "max"):
        assert key in g.ttft_ms and key in g.itl_ms and key in g.tpot_ms
    assert g.output_tokens_per_s > 0 and g.goodput_rps is None


def test_a_server_that_ignores_the_asked_length_is_reported(streaming: StreamingServer) -> None:
    result = bench(streaming.url(cap=5))
    g = generation_of(result)
    assert result.summary.errors == 0 and g.output_tokens.total == 8 * 5
    assert g.output_length == OutputLength(asked=8, exact=0, shorter=8, longer=0,
                                           ignore_eos=True, honoured=False)


def test_errors_mid_stream_are_counted(streaming: StreamingServer) -> None:
    failed = bench(streaming.url(fail=3), requests=4)
    assert failed.summary.errors_by_class == {"stream": 4}
    assert "the engine failed mid-stream" in failed.client.notes[0]
    cut = bench(streaming.url(cut=3), requests=4)
    assert cut.summary.errors_by_class == {"reset": 4}
    assert "after 3 text event(s)" in cut.client.notes[0]


def test_without_usage_tokens_are_counted_from_events_and_flagged(
        streaming: StreamingServer) -> None:
    out = generation_of(bench(streaming.url(nousage=1), requests=4)).output_tokens
    assert out.total == 40 and out.counted_events == 4 and out.from_usage == 0


def test_goodput_counts_requests_within_the_slo(streaming: StreamingServer) -> None:
    url = streaming.url(first=150, every=10)
    missed = bench(url, requests=4, slo={"ttft_ms": 100})
    assert generation_of(missed).goodput_rps == 0 and missed.summary.throughput_rps > 0
    met = bench(url, requests=4, slo={"ttft_ms": 1000, "tpot_ms": 100})
    assert generation_of(met).goodput_rps == pytest.approx(met.summary.throughput_rps)


def test_cli_keeps_the_api_key_out_of_the_result(streaming: StreamingServer,
                                                 tmp_path: Path) -> None:
    key = "sk-test-0123456789abcdef"
    out = tmp_path / "llm.json"
    records = tmp_path / "llm.csv"
    result = CliRunner(env={"MY_PROVIDER_KEY": key}).invoke(main, [
        "bench", streaming.url(first=20, every=5), "--protocol", "openai", "--model",
        "test-model", "--chat", "--api-key-env", "MY_PROVIDER_KEY", "--requests", "4",
        "--output-tokens", "6", "--input-tokens", "16:32", "--slo", "ttft_ms=500",
        "--json", str(out), "--records", str(records)])
    assert result.exit_code == 0, result.output
    assert f"Bearer {key}" in streaming.authorization
    assert key not in out.read_text() and key not in records.read_text()
    assert key not in result.output
    doc = json.loads(out.read_text())
    assert doc["endpoint"]["api_key"] == "$MY_PROVIDER_KEY"
    assert doc["endpoint"]["api"] == "chat/completions"
    assert doc["summary"]["output_tokens"]["total"] == 4 * 6
    assert "TTFT p50 / p99 ms" in result.output and "goodput" in result.output
    assert "ttft_ms" in records.read_text().splitlines()[0]


def test_a_stream_has_the_timeout_in_all(streaming: StreamingServer) -> None:
    def stream(timeout_s: float, **behaviour: int) -> str | None:
        host, port, base = split_url(streaming.url(**behaviour))
        raw = generation_request(host, base, generation_body("test-model", prompt="x",
                                                             max_tokens=4), chat=False)
        timing = asyncio.run(stream_once(host, port, raw, chat=False, timeout_s=timeout_s))
        assert timing.latency_s < 3
        return timing.error

    # --timeout is the whole answer's deadline: 4 tokens 250 ms apart take longer in all
    # than 0.4 s though no gap does; within 2 s they finish
    assert "TimeoutError" in str(stream(0.4, first=50, every=250))
    assert stream(2.0, first=50, every=250) is None
    assert "TimeoutError" in str(stream(0.4, first=700))


def test_cli_mistakes_are_one_line(streaming: StreamingServer) -> None:
    runner = CliRunner()
    for args, message in ((["--slo", "ttft=5"], "--slo 'ttft=5'"),
                          (["--output-tokens", "9:3"], "need 1 <= LO <= HI"),
                          (["--model", "other"], "no model 'other'")):
        argv = ["bench", streaming.url(), "--protocol", "openai", "--model", "test-model",
                "--requests", "1", *args]
        result = runner.invoke(main, argv)
        assert result.exit_code == 1, result.output
        assert message in result.output and "Traceback" not in result.output
    assert os.environ.get("MY_PROVIDER_KEY") is None
