"""Classes of generation requests in a real server: a router that gives each class its
priority in one engine, `bench --mix` over the OpenAI API reporting each class's TTFT and
TPOT, and the refusals (a bad priority, a tensor router with one)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tradeoff.server.process import ServerProcess

from ..synthetic_model import write_synthetic_model
from .helpers import post_json, request, running_server

pytestmark = pytest.mark.integration

ROUTER = """\
routes:
  - {when: {class: chat}, to: engine, priority: 0}
  - {to: engine, priority: 1}
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    pytest.importorskip("torch")
    from tradeoff.models.generative import write_synthetic_llm

    root = tmp_path_factory.mktemp("classes")
    # one sequence at a time, 20 ms a step: a queue forms, and its order is the priority
    write_synthetic_llm(root, "engine", model={"step_ms": 20.0}, max_num_seqs=1,
                        scheduling="priority")
    (root / "front").mkdir()
    (root / "front" / "router.yaml").write_text(ROUTER)
    write_synthetic_model(root, "tensor")
    (root / "tensor_front").mkdir()
    (root / "tensor_front" / "router.yaml").write_text(
        "routes: [{to: tensor, priority: 1}]\n")
    yield from running_server(root)


@pytest.mark.timing  # chat's TPOT p50 at most 30 ms (20 ms steps) moves with the load
@pytest.mark.slow
def test_bench_mix_reports_each_class_and_the_router_puts_chat_first(server: ServerProcess
                                                                    ) -> None:
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.mix import RequestClass
    from tradeoff.bench.session import run_benchmark

    spec = EndpointSpec(f"{server.url}/v1", "openai", "front", seed=5, classes=(
        RequestClass.parse("chat=25,class=chat"), RequestClass.parse("batch=75,class=batch")),
        generation=GenerationOptions(input_tokens=(8, 8), output_tokens=(6, 6), num_prompts=16,
                                     ignore_eos=True))
    # six in flight on an engine of one sequence: five wait at any time
    result, records, _ = run_benchmark(make_adapter(spec), LoadSpec(
        concurrency=6, requests=80, warmup_s=0.0, seed=5))
    assert result.classes is not None
    chat, batch = result.classes
    assert (chat.name, batch.name) == ("chat", "batch")
    assert chat.requests + batch.requests == result.summary.requests
    assert chat.errors == batch.errors == 0 and chat.requests >= 8
    assert chat.ttft_ms is not None and batch.ttft_ms is not None
    assert chat.tpot_ms is not None and chat.tpot_ms["p50"] == pytest.approx(20, rel=0.5)
    # chat jumps the queue: it waits for the sequence running, batch for the queue too
    assert chat.ttft_ms["p50"] < 0.5 * batch.ttft_ms["p50"]
    assert result.endpoint["input_mix"]["classes"][0]["parameters"] == {"class": "chat"}
    routes = request(server.url, "GET", "/v2/models/front/stats").json()[
        "model_stats"][0]["routes"]
    sent = {r["route"]: r["count"] for r in routes}
    assert sent[0] == int((records.request // 16 == 0).sum())  # 16 prompts a class


def test_a_request_may_carry_its_own_priority_and_a_bad_one_is_refused(
        server: ServerProcess) -> None:
    body = {"model": "engine", "prompt": "hi", "max_tokens": 2, "priority": 3}
    answer = post_json(server.url, "/v1/completions", body)
    assert answer.status == 200, answer.body
    for bad in ("high", 1.5, 2**40, True):
        refused = post_json(server.url, "/v1/completions", {**body, "priority": bad})
        assert refused.status == 400 and "priority" in refused.json()["error"]["message"]


def test_a_tensor_router_with_a_priority_refuses_to_load(server: ServerProcess) -> None:
    index = {m["name"]: m for m in post_json(server.url, "/v2/repository/index", {}).json()}
    assert index["tensor_front"]["state"] == "UNAVAILABLE"
    assert "priority" in index["tensor_front"]["reason"]
    assert index["front"]["state"] == "READY"
