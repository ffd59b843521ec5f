"""The response cache in a real server (``--cache local``): hits answer what the model
answered, versions and opt-outs are kept apart, errors are never kept, identical misses
run once, Triton's clients read the counts, and whole greedy generations replay."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http

from tradeoff.bench.endpoint import EndpointSpec, make_adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess

from .helpers import infer_json, metric_samples, post_json, request, running_server
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model

# in one process only: under serve --workers each front end keeps a local cache of its
# own (test_workers.py); test_redis_cache.py runs the shared cache in both modes
pytestmark = pytest.mark.integration

CACHED = 'response_cache { enable: true }\n'
SLOW_CONFIG = """\
name: "slow"
platform: "onnxruntime_onnx"
max_batch_size: 64
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 1500000 preferred_batch_size: [ 64 ] }
instance_group [ { count: 1 kind: KIND_CPU } ]
""" + CACHED
FAULTY_CONFIG = CONSTANT_CONFIG.format(name="faulty", extra="""\
parameters { key: "fault_fail_on_value" value: { string_value: "13" } }
""" + CACHED)
VERSIONS_CONFIG = CONSTANT_CONFIG.format(name="versions",
                                         extra="version_policy: { all: { } }\n" + CACHED)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cached")
    build_repository(root, ("mlp", "mlp_nobatch"))
    config = root / "mlp" / "config.pbtxt"
    config.write_text(config.read_text() + CACHED)  # mlp_nobatch: no response_cache
    _write(root, "slow", {1: add_constant_model(1.0)}, SLOW_CONFIG)
    _write(root, "faulty", {1: add_constant_model(1.0)}, FAULTY_CONFIG)
    _write(root, "versions", {1: add_constant_model(1.0), 2: add_constant_model(2.0)},
           VERSIONS_CONFIG)
    try:
        from tradeoff.models.generative import write_generative

        write_generative(root, "tinyllama", max_num_seqs=4, max_num_batched_tokens=64,
                         num_blocks=64, block_size=8, response_cache=True)
    except (ImportError, ValueError):
        pass  # no torch: the generation test skips
    return root


@pytest.fixture(scope="module")
def server(repo: Path, server_mode: str) -> Iterator[ServerProcess]:
    yield from running_server(repo, mode=server_mode, extra_args=("--cache", "local,size=4MB",
                                                "--allow-fault-injection"))


def rows(value: float, width: int = 4) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, width], "data": [value] * width}]


def verdict(response) -> str:
    timing = response.header("server-timing") or ""
    first = timing.split(",")[0]
    return first.split(";desc=")[1].split(";")[0] if first.startswith("cache;") else ""


def stats(server: ServerProcess, model: str, version: str = "", key: str = "") -> dict:
    path = f"/v2/models/{model}" + (f"/versions/{version}" if version else "") + "/stats"
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return request(server.url, "GET", path, headers=headers).json()["model_stats"][-1]


def test_a_hit_answers_what_the_model_answered_and_skips_the_queue(server: ServerProcess
                                                                   ) -> None:
    data = np.random.default_rng(5).standard_normal(256).astype(np.float32).tolist()
    inputs = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256], "data": data}]
    first = infer_json(server.url, "mlp", inputs)
    second = infer_json(server.url, "mlp", inputs)
    assert first.status == second.status == 200
    assert (verdict(first), verdict(second)) == ("miss", "hit")
    assert first.json()["outputs"] == second.json()["outputs"]
    assert second.json()["model_version"] == "1"
    assert "queue;dur=0.000" in second.header("server-timing")
    # the same inputs as binary, asking for binary output: another answer, another entry
    body = json.dumps({"inputs": [{**inputs[0], "data": data}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]})
    third = request(server.url, "POST", "/v2/models/mlp/infer", body.encode())
    assert third.status == 200 and verdict(third) == "miss"
    opted_out = infer_json(server.url, "mlp", inputs, parameters={"cache": False})
    assert opted_out.status == 200 and verdict(opted_out) == ""
    assert opted_out.json()["outputs"] == first.json()["outputs"]
    bad = infer_json(server.url, "mlp", inputs, parameters={"cache": "no"})
    assert bad.status == 400 and "'cache' must be true or false" in bad.json()["error"]
    # a model without response_cache is never cached
    plain = [infer_json(server.url, "mlp_nobatch", [{**inputs[0], "shape": [256]}])
             for _ in range(2)]
    assert [verdict(r) for r in plain] == ["", ""]
    counts = stats(server, "mlp")["inference_stats"]
    assert counts["cache_hit"]["count"] == 1 and counts["cache_miss"]["count"] == 2


def test_a_version_never_reads_another_versions_answer(server: ServerProcess) -> None:
    one = infer_json(server.url, "versions", rows(3.0), version="1")
    two = infer_json(server.url, "versions", rows(3.0), version="2")
    assert (verdict(one), verdict(two)) == ("miss", "miss")
    assert one.json()["outputs"][0]["data"] == [4.0] * 4
    assert two.json()["outputs"][0]["data"] == [5.0] * 4
    latest = infer_json(server.url, "versions", rows(3.0))  # resolves to version 2
    assert verdict(latest) == "hit" and latest.json()["outputs"][0]["data"] == [5.0] * 4
    assert latest.json()["model_version"] == "2"


def test_errors_are_never_cached(server: ServerProcess) -> None:
    before = metric_samples(server)
    failures = [infer_json(server.url, "faulty", rows(13.0)) for _ in range(3)]
    assert [r.status for r in failures] == [500] * 3
    assert all("injected fault" in r.json()["error"] for r in failures)
    assert [verdict(r) for r in failures] == [""] * 3  # an error has no cache verdict
    after = metric_samples(server)
    inserted = ("tradeoff_cache_insertions_total", frozenset({"store": "local"}.items()))
    assert after[inserted] == before[inserted]
    counts = stats(server, "faulty")["inference_stats"]
    assert counts["cache_hit"]["count"] == 0 and counts["fail"]["count"] == 3
    good = [infer_json(server.url, "faulty", rows(1.0)) for _ in range(2)]
    assert [verdict(r) for r in good] == ["miss", "hit"]


def test_identical_concurrent_misses_run_the_model_once(server: ServerProcess) -> None:
    before = stats(server, "slow")

    def send(_: int):
        return infer_json(server.url, "slow", rows(21.0))

    # the batcher holds the first for up to 1.5 s: the other 31 arrive while it waits
    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(send, range(32)))
    assert [r.status for r in answers] == [200] * 32
    assert all(r.json()["outputs"][0]["data"] == [22.0] * 4 for r in answers)
    after = stats(server, "slow")
    assert after["execution_count"] - before["execution_count"] == 1
    assert after["inference_count"] - before["inference_count"] == 1
    verdicts = sorted(verdict(r) for r in answers)
    assert verdicts.count("miss") == 1 and set(verdicts) <= {"miss", "coalesced", "hit"}
    assert verdicts.count("coalesced") >= 16  # most arrived while the first was queued
    hits = after["inference_stats"]["cache_hit"]["count"] - \
        before["inference_stats"]["cache_hit"]["count"]
    assert hits == 31


def test_tritonclient_reads_cache_hit_and_cache_miss(server: ServerProcess) -> None:
    http = triton_http.InferenceServerClient(server.url.removeprefix("http://"))
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton_http.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.full((1, 4), 40.0, np.float32))
        for _ in range(3):
            result = http.infer("faulty", [tensor])
            assert np.array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 41.0))
        gtensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        gtensor.set_data_from_numpy(np.full((1, 4), 40.0, np.float32))
        assert np.array_equal(grpc.infer("faulty", [gtensor]).as_numpy("OUTPUT0"),
                              np.full((1, 4), 41.0))  # gRPC reads what HTTP stored
        from_http = http.get_inference_statistics("faulty")["model_stats"][0]
        from_grpc = grpc.get_inference_statistics("faulty", as_json=True)["model_stats"][0]
    finally:
        http.close()
        grpc.close()
    for doc in (from_http, from_grpc):
        counts = doc["inference_stats"]
        assert int(counts["cache_hit"]["count"]) >= 3
        assert int(counts["cache_miss"]["count"]) >= 1
        assert int(counts["cache_hit"]["ns"]) > 0


def test_bench_sends_a_zipf_mix_and_reports_the_servers_hit_ratio(server: ServerProcess
                                                                  ) -> None:
    spec = EndpointSpec(server.url, model="mlp", distinct_inputs=40, zipf=1.1, seed=7)
    adapter = make_adapter(spec)
    result, _, _ = run_benchmark(adapter, LoadSpec(concurrency=2, requests=600,
                                                 warmup_s=0.0, seed=7))
    assert result.endpoint["input_mix"] == {"distinct_inputs": 40, "draw": "zipf",
                                            "zipf_s": 1.1}
    counts = result.summary.server_counts
    assert counts is not None and counts.cache_hit_ratio is not None
    # 40 inputs, all fit: only each input's first request misses (some ran before)
    assert counts.cache_misses <= 40 and counts.cache_hits >= 560  # type: ignore[operator]
    # a miss is counted at its lookup, a success at its answer: the 2 in flight when the
    # counts are read may fall on either side
    lookups = counts.cache_hits + counts.cache_misses  # type: ignore[operator]
    assert abs(lookups - counts.requests) <= 2
    assert counts.executions <= counts.cache_misses + 2  # type: ignore[operator]


def test_whole_greedy_generations_replay_and_streams_are_not_cached(server: ServerProcess,
                                                                    repo: Path) -> None:
    if not (repo / "tinyllama").exists():
        pytest.skip("tinyllama needs torch (the llm extra)")
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        def ask(**extra):
            return c.completions.with_raw_response.create(
                model="tinyllama", prompt="the cache keeps", max_tokens=6, **extra)

        first, second = ask(temperature=0), ask(temperature=0)
        assert first.headers["server-timing"].startswith("cache;desc=miss")
        assert second.headers["server-timing"].startswith("cache;desc=hit")
        assert first.parse().choices[0].text == second.parse().choices[0].text
        assert second.parse().usage.completion_tokens == first.parse().usage.completion_tokens
        seeded = [ask(temperature=0.8, seed=11) for _ in range(2)]
        assert [r.headers["server-timing"].split(";")[1] for r in seeded] == \
            ["desc=miss", "desc=hit"]
        sampled = ask(temperature=0.8)  # no seed: another answer each time
        assert "server-timing" not in sampled.headers
        opted_out = ask(temperature=0, extra_body={"cache": False})
        assert "server-timing" not in opted_out.headers
        before = stats(server, "tinyllama")["inference_stats"]
        stream = c.completions.create(model="tinyllama", prompt="the cache keeps",
                                      max_tokens=6, temperature=0, stream=True)
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == \
            first.parse().choices[0].text
        after = stats(server, "tinyllama")["inference_stats"]
    assert after["cache_hit"] == before["cache_hit"]
    assert after["cache_miss"] == before["cache_miss"]
    assert int(after["cache_hit"]["count"]) == 2


ALICE, BOB = "alice-key-0123456789", "bob-key-0123456789"


def test_with_api_keys_each_key_sees_only_its_own_answers(repo: Path, server_mode: str) -> None:
    """Tenants over HTTP, gRPC and /v1: another key's identical request is a miss, and
    identical requests of two keys in flight together are not coalesced."""
    server_gen = running_server(repo, mode=server_mode, extra_args=(
        "--cache", "local,size=4MB", "--allow-fault-injection",
                                                  "--api-key", ALICE, "--api-key", BOB))
    server = next(server_gen)

    def ask(key: str, model: str, value: float):
        answer = post_json(server.url, f"/v2/models/{model}/infer", {"inputs": rows(value)},
                           {"Authorization": f"Bearer {key}"})
        assert answer.status == 200, answer.body
        return answer

    try:
        assert verdict(ask(ALICE, "faulty", 5.0)) == "miss"
        assert verdict(ask(ALICE, "faulty", 5.0)) == "hit"
        assert verdict(ask(BOB, "faulty", 5.0)) == "miss"
        grpc = triton_grpc.InferenceServerClient(server.grpc_url)
        try:
            tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(np.full((1, 4), 6.0, np.float32))
            for key in (ALICE, BOB, ALICE):
                grpc.infer("faulty", [tensor], headers={"authorization": f"Bearer {key}"})
        finally:
            grpc.close()
        assert verdict(ask(BOB, "faulty", 6.0)) == "hit"  # Bob's own gRPC answer
        before = stats(server, "slow", key=ALICE)
        with ThreadPoolExecutor(8) as pool:  # held together by the batcher's delay
            answers = list(pool.map(lambda key: ask(key, "slow", 33.0), [ALICE, BOB] * 4))
        after = stats(server, "slow", key=ALICE)
        by_key = {key: sorted(verdict(a) for a, k in zip(answers, [ALICE, BOB] * 4,
                                                         strict=True) if k == key)
                  for key in (ALICE, BOB)}
        assert all(v.count("miss") == 1 for v in by_key.values()), by_key
        assert after["inference_count"] - before["inference_count"] == 2
        if (repo / "tinyllama").exists():
            openai = pytest.importorskip("openai")
            texts = []
            for key, want in ((ALICE, "miss"), (ALICE, "hit"), (BOB, "miss")):
                with openai.OpenAI(base_url=f"{server.url}/v1", api_key=key,
                                   max_retries=0) as client:
                    reply = client.completions.with_raw_response.create(
                        model="tinyllama", prompt="tenants apart", max_tokens=4,
                        temperature=0)
                assert reply.headers["server-timing"].startswith(f"cache;desc={want}")
                texts.append(reply.parse().choices[0].text)
            assert len(set(texts)) == 1
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)


def test_bench_and_the_server_report_one_hit_ratio(repo: Path, server_mode: str) -> None:
    """On a server that nothing else has sent to, a run with no warmup sees what the
    server's statistics and its Prometheus counters say: hits / lookups."""
    server_gen = running_server(repo, mode=server_mode, extra_args=("--cache", "local,size=4MB"))
    server = next(server_gen)
    try:
        spec = EndpointSpec(server.url, model="mlp", distinct_inputs=30, zipf=1.0, seed=3)
        result, _, _ = run_benchmark(make_adapter(spec), LoadSpec(
            concurrency=2, requests=400, warmup_s=0.0, seed=3))
        counts = result.summary.server_counts
        assert counts is not None and counts.cache_hit_ratio is not None
        own = stats(server, "mlp")["inference_stats"]
        hits, misses = int(own["cache_hit"]["count"]), int(own["cache_miss"]["count"])
        # the server also counted the bench's cold-start request, sent before its window
        assert result.cold_start_ok
        assert (hits, misses - 1) == (counts.cache_hits, counts.cache_misses)
        assert counts.cache_hit_ratio == hits / (hits + misses - 1)
        samples = metric_samples(server)
        mlp = frozenset({"model": "mlp", "version": "1"}.items())
        assert samples[("tradeoff_cache_lookups_total", mlp)] == hits + misses
        assert samples[("tradeoff_cache_hits_total", mlp)] == hits
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)
