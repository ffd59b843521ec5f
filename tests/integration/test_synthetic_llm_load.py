"""GPU token rates on a CPU: `tradeoff serve` of the synthetic generative model (64
sequences, 3 ms steps: at most 21,333 tokens/s) under `tradeoff bench --protocol openai`
at concurrency 64. Checks what every answer was (lengths, prompt tokens, one event a
token, the text itself), never how fast: the machine decides that."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tradeoff.backends.synthetic_generative import (
    build_tokenizer,
    continuation,
)
from tradeoff.bench.adapters import split_url
from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.openai_stream import (
    generation_body,
    generation_request,
    stream_once,
)
from tradeoff.bench.records import OK
from tradeoff.bench.session import run_benchmark
from tradeoff.cli import main
from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess

from .helpers import running_server

pytestmark = pytest.mark.integration

MODEL = "synthetic-llm"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = Path(tmp_path_factory.mktemp("synthetic")) / "models"
    write_synthetic_llm(repo, model={"step_ms": 3.0}, max_num_seqs=64)
    yield from running_server(repo)


def test_every_answer_of_a_gpu_rate_load_is_counted_exactly(server: ServerProcess) -> None:
    options = GenerationOptions(output_tokens=(16, 64), input_tokens=(8, 24), ignore_eos=True)
    adapter = make_adapter(EndpointSpec(f"{server.url}/v1", "openai", MODEL,
                                        generation=options))
    result, records, _ = run_benchmark(adapter, LoadSpec(concurrency=64, duration_s=2.0,
                                                         warmup_s=0.5))
    summary, generation = result.summary, result.summary.generation
    assert generation is not None and summary.errors == 0 and summary.successes > 64
    assert (records.outcome == OK).all() and len(records) >= summary.requests
    # every answer as long as it asked, each token its own event with text, and the
    # prompt as long as the model's tokenizer makes it
    assert (records.out_tokens == records.asked_tokens).all()
    assert records.usage_tokens.all()
    assert (records.gap_count == records.out_tokens - 1).all()
    tokenizer = build_tokenizer()
    prompt_tokens = np.array([len(tokenizer.encode(item.prompt or "")) for item in adapter.items])
    assert (records.in_tokens == prompt_tokens[records.request]).all()
    assert generation.output_length.exact == summary.requests
    assert generation.output_length.honoured
    counted = generation.output_tokens
    assert counted.from_usage == summary.requests and counted.counted_events == 0
    # the load generator did not run out of CPU (its event loop's lag depends on what
    # else this machine runs, so that part of the verdict is not asserted)
    assert not [r for r in result.client.reasons if r.startswith("client CPU")], \
        result.client.reasons


def test_the_streamed_text_is_the_models_answer(server: ServerProcess) -> None:
    host, port, base = split_url(f"{server.url}/v1")
    prompt = "Where does the text come from?"
    raw = generation_request(host, base, generation_body(MODEL, prompt=prompt, max_tokens=40,
                                                         ignore_eos=True), chat=False)
    timing = asyncio.run(stream_once(host, port, raw, chat=False))
    tokenizer = build_tokenizer()
    assert timing.error is None and timing.output_tokens == 40 == len(timing.text_ns)
    assert timing.text == tokenizer.decode(continuation(tokenizer.encode(prompt), 40))


def test_the_cli_with_two_workers(server: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(main, [
        "bench", f"{server.url}/v1", "--protocol", "openai", "--model", MODEL,
        "--ignore-eos", "--concurrency", "64", "--workers", "2", "--duration", "1.5",
        "--warmup", "0.5", "--input-tokens", "16", "--output-tokens", "32", "--json",
        str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    summary = doc["summary"]
    assert summary["errors"] == 0 and summary["output_length"]["exact"] == summary["requests"]
    assert summary["output_tokens"]["total"] == 32 * summary["requests"]
    assert doc["client"]["workers"] == 2


def test_a_profile_measures_constant_rates_between_one_at_a_time_and_flat_out(
        server: ServerProcess, tmp_path: Path) -> None:
    """guidellm's sweep profile: the two anchor runs, then every rate between them, each
    with its TTFT and TPOT."""
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(main, [
        "sweep", f"{server.url}/v1", "--protocol", "openai", "--model", MODEL,
        "--ignore-eos", "--profile", "3", "--profile-concurrency", "16", "--duration",
        "0.8", "--warmup", "0.2", "--input-tokens", "16", "--output-tokens", "16",
        "--json", str(out)])
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    anchors = doc["plan"]["profile"]
    assert 0 < anchors["synchronous_rps"] < anchors["throughput_rps"]
    loads = [row["load"] for row in doc["rows"]]
    assert len(loads) == 3 and loads[0] == pytest.approx(anchors["synchronous_rps"], 1e-3)
    assert loads[-1] == pytest.approx(anchors["throughput_rps"], 1e-3)
    assert all(row["ttft_p50_ms"] is not None and row["tpot_p50_ms"] is not None
               for row in doc["rows"])
    assert doc["stop_reason"] == "every rate of the profile measured"
    assert "flat out" in result.output
