"""The OpenAI-compatible API of `tradeoff serve`, with the official `openai` package as
the client, on the tiny random-weight Llama."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

pytest.importorskip("torch")
openai = pytest.importorskip("openai")

import asyncio  # noqa: E402

import torch  # noqa: E402

from tradeoff.bench.adapters import split_url  # noqa: E402
from tradeoff.bench.openai_stream import (  # noqa: E402
    generation_body,
    generation_request,
    stream_once,
)
from tradeoff.models.generative import write_generative  # noqa: E402
from tradeoff.server.process import ServerProcess  # noqa: E402

from .helpers import get_text, request, running_server  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

SMALL = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 64, "block_size": 8}
GREEDY = {"temperature": 0, "max_tokens": 12, "extra_body": {"ignore_eos": True}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, server_mode: str
           ) -> Iterator[ServerProcess]:
    repo = Path(tmp_path_factory.mktemp("llm")) / "models"
    write_generative(repo, "tinyllama", **SMALL)
    write_generative(repo, "tinyllama", "tinyllama_static", batching="static", **SMALL)
    if not torch.cuda.is_available():  # a model asking for a GPU that is not there
        write_generative(repo, "tinyllama", "tinyllama_gpu", device="cuda", **SMALL)
    yield from running_server(repo, mode=server_mode)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> Iterator:
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        yield c


def test_models_are_listed(client: object) -> None:
    listed = [m.id for m in client.models.list()]  # type: ignore[attr-defined]
    assert listed == ["tinyllama", "tinyllama_static"]


def test_a_model_that_failed_to_load_says_why(client: object) -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(openai.InternalServerError) as refused:
        client.completions.create(model="tinyllama_gpu", prompt="x", max_tokens=2)  # type: ignore[attr-defined]
    assert refused.value.status_code == 503
    assert "torch sees no CUDA GPU" in str(refused.value)


def test_static_batching_gives_the_same_greedy_text(client: object) -> None:
    def complete(model: str) -> str:
        return client.completions.create(model=model, prompt="same",  # type: ignore[attr-defined]
                                         **GREEDY).choices[0].text

    assert complete("tinyllama_static") == complete("tinyllama")


def test_the_bench_stream_client_times_every_event(client: object,
                                                   server: ServerProcess) -> None:
    host, port, _ = split_url(server.url)
    body = generation_body("tinyllama", prompt="abc", max_tokens=12, ignore_eos=True)
    timing = asyncio.run(stream_once(host, port, generation_request(host, "/v1", body, False),
                                     chat=False))
    assert timing.error is None, timing.error
    assert timing.output_tokens == 12 and timing.tokens_from_usage
    assert timing.finish_reason == "length"
    whole = client.completions.create(model="tinyllama", prompt="abc", **GREEDY)  # type: ignore[attr-defined]
    assert timing.text == whole.choices[0].text
    assert 0 < timing.ttft_s <= timing.latency_s  # type: ignore[operator]
    assert len(timing.itl_s) == len(timing.text_ns) - 1 and min(timing.itl_s) >= 0


def test_completion_with_usage(client: object) -> None:
    result = client.completions.create(model="tinyllama", prompt="Once upon",  # type: ignore[attr-defined]
                                       **GREEDY)
    choice = result.choices[0]
    assert choice.finish_reason == "length" and isinstance(choice.text, str)
    assert result.usage.prompt_tokens == len(b"Once upon") + 1  # bytes + <|bos|>
    assert result.usage.completion_tokens == 12
    assert result.usage.total_tokens == result.usage.prompt_tokens + 12
    assert result.object == "text_completion" and result.model == "tinyllama"


def test_streamed_completion_matches_the_whole_one(client: object) -> None:
    whole = client.completions.create(model="tinyllama", prompt="abc", **GREEDY)  # type: ignore[attr-defined]
    chunks = list(client.completions.create(  # type: ignore[attr-defined]
        model="tinyllama", prompt="abc", stream=True,
        stream_options={"include_usage": True}, **GREEDY))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12


def test_chat_completion_streamed_and_whole(client: object) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    whole = client.chat.completions.create(model="tinyllama", messages=messages, **GREEDY)  # type: ignore[attr-defined]
    assert whole.choices[0].message.role == "assistant"
    assert whole.object == "chat.completion"
    chunks = list(client.chat.completions.create(  # type: ignore[attr-defined]
        model="tinyllama", messages=messages, stream=True, **GREEDY))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == whole.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_greedy_output_is_the_same_alone_or_batched(client: object) -> None:
    prompts = ["one", "two two", "three three three", "four four four four", "five"]

    def complete(prompt: str) -> str:
        return client.completions.create(model="tinyllama", prompt=prompt,  # type: ignore[attr-defined]
                                         **GREEDY).choices[0].text

    alone = [complete(p) for p in prompts]
    with ThreadPoolExecutor(len(prompts)) as pool:
        together = list(pool.map(complete, prompts))
    assert together == alone


def test_errors_come_in_openai_shape(client: object, server: ServerProcess) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.completions.create(model="nope", prompt="x", max_tokens=2)  # type: ignore[attr-defined]
    assert "unknown model 'nope'" in str(missing.value)
    with pytest.raises(openai.BadRequestError, match="temperature"):
        client.completions.create(model="tinyllama", prompt="x", temperature=9)  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError, match="positions"):
        client.completions.create(model="tinyllama", prompt="x", max_tokens=100_000)  # type: ignore[attr-defined]
    raw = request(server.url, "POST", "/v1/completions", b"{not json",
                  {"Content-Type": "application/json"})
    assert raw.status == 400
    error = raw.json()["error"]
    assert error["type"] == "invalid_request_error" and "not valid JSON" in error["message"]


def test_generation_metrics(client: object, server: ServerProcess) -> None:
    client.completions.create(model="tinyllama", prompt="metrics", **GREEDY)  # type: ignore[attr-defined]
    text = get_text(server.metrics_url)
    for name in ("tradeoff_generation_requests_running", "tradeoff_generation_requests_waiting",
                 "tradeoff_generation_kv_cache_usage_ratio",
                 "tradeoff_generation_prompt_tokens_total",
                 "tradeoff_generation_generation_tokens_total",
                 "tradeoff_generation_preemptions_total",
                 "tradeoff_generation_time_to_first_token_seconds_bucket",
                 "tradeoff_generation_inter_token_latency_seconds_count",
                 "tradeoff_generation_e2e_request_latency_seconds_sum"):
        assert f"{name}{{" in text, name
    line = next(row for row in text.splitlines()
                if row.startswith("tradeoff_generation_generation_tokens_total{"))
    assert float(line.split()[-1]) >= 12


@pytest.mark.parametrize("chat", [False, True])
def test_bench_measures_our_server(server: ServerProcess, chat: bool) -> None:
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.session import run_benchmark

    options = GenerationOptions(chat=chat, input_tokens=(4, 16), output_tokens=(4, 12),
                                ignore_eos=True, slo={"ttft_ms": 10_000})
    adapter = make_adapter(EndpointSpec(f"{server.url}/v1", "openai", "tinyllama",
                                        generation=options))
    result, records, _ = run_benchmark(adapter, LoadSpec(rate=20, arrival="poisson",
                                                         requests=12))
    s = result.summary
    g = s.generation
    assert g is not None and g.ttft_ms is not None
    assert s.errors == 0 and s.successes == 12, s.errors_by_class
    assert g.output_length.honoured and g.output_length.exact == 12
    assert g.output_tokens.from_usage == 12
    assert g.output_tokens.total == int(records.out_tokens.sum()) \
        == int(records.asked_tokens.sum())
    assert 0 < g.ttft_ms["p50"] <= (s.latency("p50") or 0)
    assert g.goodput_rps == pytest.approx(s.throughput_rps)
    assert result.endpoint["server"]["name"] == "tradeoff"


@pytest.mark.slow
def test_compare_sweep_diagnose_and_report_understand_generations(
        server: ServerProcess, tmp_path: Path) -> None:
    from tradeoff.analysis.compare import run_compare
    from tradeoff.analysis.diagnose import diagnose
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.sweep import Sweep, SweepPlan
    from tradeoff.report.html import write_report

    options = GenerationOptions(input_tokens=(8, 24), output_tokens=(8, 24),
                                ignore_eos=True, slo={"ttft_ms": 5000})
    endpoints = [EndpointSpec(f"{server.url}/v1", "openai", model, name=name,
                              generation=options)
                 for name, model in (("continuous", "tinyllama"),
                                     ("static", "tinyllama_static"))]
    spec = LoadSpec(concurrency=4, duration_s=2.0, window_s=1.0)
    compare = run_compare(endpoints, spec, rounds=2)
    static = compare.ratios_of("static").metrics
    for metric in ("output_tokens_per_s", "ttft_p50", "ttft_p99", "tpot_p50"):
        assert static[metric].ratio is not None, metric
        assert static[metric].ci95 is not None, metric
    checks = {c.check: c for c in compare.fairness.checks}
    assert checks["same inputs"].ok and checks["output lengths as asked"].ok
    first = compare.endpoints[0]
    merged = first.result.summary.generation
    assert merged is not None and all(r.generation for r in first.rounds)
    assert merged.output_length.asked == sum(
        r.generation.output_length.asked for r in first.rounds if r.generation)

    sweep = Sweep(make_adapter(endpoints[0]), LoadSpec(concurrency=1, duration_s=1.5),
                  SweepPlan("concurrency", [1.0, 2.0, 4.0])).run()
    assert all(r.tokens and r.tokens.output_tokens_per_s > 0 and r.tokens.ttft_p50_ms
               for r in sweep.rows)
    findings = diagnose(compare) + diagnose(sweep)
    assert all(f.rule != "long_tail" for f in findings)  # spread lengths are not a tail

    report = tmp_path / "llm.html"
    write_report([compare, sweep, sweep.points[0]], report)
    html = report.read_text()
    for text in ("Generations", "TTFT p50", "time to first token", "output tokens/s",
                 "lengths as asked"):
        assert text in html, text


def test_a_repeated_prompt_reports_cached_tokens(client: object, server: ServerProcess) -> None:
    prompt = "a prompt long enough to fill a few KV blocks of eight tokens"
    first = client.completions.create(model="tinyllama", prompt=prompt, **GREEDY)  # type: ignore[attr-defined]
    again = client.completions.create(model="tinyllama", prompt=prompt, **GREEDY)  # type: ignore[attr-defined]
    assert again.choices[0].text == first.choices[0].text
    blocks = (len(prompt.encode()) + 1 - 1) // 8  # prompt + <|bos|>, the last one computed
    assert again.usage.prompt_tokens_details.cached_tokens == 8 * blocks
    text = get_text(server.metrics_url)
    hits = next(row for row in text.splitlines()
                if row.startswith('tradeoff_generation_prefix_cache_hits_total{model="tinyllama"}'))
    assert float(hits.split()[-1]) >= 8 * blocks
