"""Routers in a real server: rules, weights and stickiness, fail-over under load with no
failed request, rules swapped under load, mismatched targets refused, shadow copies that
never hold up the answer; over HTTP and gRPC."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from tritonclient.utils import InferenceServerException

from tradeoff.models import build_repository
from tradeoff.server.process import ServerProcess
from tradeoff.server.router import SHADOW_IN_FLIGHT

from .helpers import (
    background_load,
    front_end_count,
    infer_json,
    metric_samples,
    post_json,
    request,
    running_server,
    wait_for,
)
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model

pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

ROUTER = """\
routes:
  - when: {class: latency}
    to: small
  - when: {deadline_ms_below: 20}
    to: small
  - to: [{model: big, weight: 75}, {model: small, weight: 25}]
    sticky: user
fallback: [small]
shadow: {to: slow, fraction: 1.0}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("routed")
    # big adds 1, small adds 2, slow adds 3 after holding each batch for up to 1.5 s
    _write(root, "big", {1: add_constant_model(1.0)}, CONSTANT_CONFIG.format(name="big", extra=""))
    _write(root, "small", {1: add_constant_model(2.0)},
           CONSTANT_CONFIG.format(name="small", extra=""))
    _write(root, "slow", {1: add_constant_model(3.0)}, CONSTANT_CONFIG.format(
        name="slow", extra="dynamic_batching { max_queue_delay_microseconds: 1500000 "
                           "preferred_batch_size: [ 8 ] }\n"))
    (root / "front").mkdir()
    (root / "front" / "router.yaml").write_text(ROUTER)
    build_repository(root, ("mlp",))  # another signature
    (root / "mismatched").mkdir()
    (root / "mismatched" / "router.yaml").write_text("routes: [{to: [big, mlp]}]\n")
    return root


@pytest.fixture(scope="module")
def server(repo: Path, server_mode: str) -> Iterator[ServerProcess]:
    yield from running_server(repo, mode=server_mode)


def ask(server: ServerProcess, value: float = 1.0, **parameters: object):
    rows = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [value] * 4}]
    return infer_json(server.url, "front", rows, **({"parameters": parameters}
                                                    if parameters else {}))


def routed(response) -> str:
    assert response.status == 200, response.body
    return response.json()["parameters"]["routed_to"]


def stats(server: ServerProcess, model: str = "front") -> dict:
    return request(server.url, "GET", f"/v2/models/{model}/stats").json()["model_stats"][0]


def test_a_router_is_a_model_with_its_targets_signature(server: ServerProcess) -> None:
    meta = request(server.url, "GET", "/v2/models/front").json()
    assert meta["platform"] == "router"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}]
    config = request(server.url, "GET", "/v2/models/front/config").json()
    assert config["max_batch_size"] == 8 and config["input"][0]["dims"] == [4]
    index = post_json(server.url, "/v2/repository/index", {}).json()
    assert {"name": "front", "version": "1", "state": "READY", "reason": ""} in index


def test_class_header_and_deadline_choose_the_route(server: ServerProcess) -> None:
    latency = ask(server, **{"class": "latency"})
    assert routed(latency) == "small" and latency.json()["outputs"][0]["data"] == [3.0] * 4
    assert 'route;desc="small"' in latency.header("server-timing")
    rows = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    by_header = request(server.url, "POST", "/v2/models/front/infer",
                        post_body(rows), {"X-Tradeoff-Class": "latency",
                                          "Content-Type": "application/json"})
    assert routed(by_header) == "small"
    assert routed(ask(server, timeout=10_000)) == "small"  # 10 ms: below 20
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        result = grpc.infer("front", [tensor], parameters={"class": "latency"})
        assert np.array_equal(result.as_numpy("OUTPUT0"), np.full((1, 4), 3.0))
        assert result.get_response().parameters["routed_to"].string_param == "small"
    finally:
        grpc.close()


def test_a_class_that_is_not_a_plain_name_is_refused_by_name(server: ServerProcess) -> None:
    """Clients choose their class, and classes end up in traces, plans and file names."""
    hostile = "bulk\n%x ;touch PWNED"
    answer = ask(server, **{"class": hostile})
    assert answer.status == 400 and "is not a plain name" in answer.json()["error"]
    rows = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
    by_header = request(server.url, "POST", "/v2/models/front/infer", post_body(rows),
                        {"X-Tradeoff-Class": "a b;rm", "Content-Type": "application/json"})
    assert by_header.status == 400 and "'a b;rm'" in by_header.json()["error"]
    assert ask(server, **{"class": 7}).status == 400
    grpc = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        tensor = triton_grpc.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 4), np.float32))
        with pytest.raises(InferenceServerException, match="not a plain name"):
            grpc.infer("front", [tensor], parameters={"class": "x" * 65})
    finally:
        grpc.close()
    assert routed(ask(server, **{"class": "latency"})) == "small"


def post_body(rows: list[dict]) -> bytes:
    import json

    return json.dumps({"inputs": rows}).encode()


def test_weights_hold_and_a_caller_stays_on_one_arm(server: ServerProcess) -> None:
    before = {r["target"]: r["count"] for r in stats(server)["routes"] if r["route"] == 2}
    for _ in range(1_000):
        ask(server)
    after = {r["target"]: r["count"] for r in stats(server)["routes"] if r["route"] == 2}
    small = after["small"] - before["small"]
    assert small + after["big"] - before["big"] == 1_000
    assert abs(small / 1_000 - 0.25) < 0.05  # 3.6 standard deviations
    for user in ("ada", "bob", "cy", "di"):
        assert len({routed(ask(server, user=user)) for _ in range(10)}) == 1
    users = {routed(ask(server, user=f"u{k}")) for k in range(40)}
    assert users == {"big", "small"}


def test_an_unloaded_target_fails_over_with_no_failed_request(server: ServerProcess) -> None:
    assert routed(ask(server, user="to-big")) == "big"
    with background_load(lambda: ask(server, user="to-big").status) as statuses:
        time.sleep(0.5)
        assert post_json(server.url, "/v2/repository/models/big/unload", {}).status == 200
        time.sleep(1.0)
        assert routed(ask(server, user="to-big")) == "small"
        assert post_json(server.url, "/v2/repository/models/big/load", {}).status == 200
        time.sleep(0.5)
    assert len(statuses) > 50 and set(statuses) == {200}
    assert stats(server)["fallbacks"].get("small", 0) > 0
    assert routed(ask(server, user="to-big")) == "big"
    fallbacks = ("tradeoff_router_fallbacks_total",
                 frozenset({"router": "front", "target": "small"}.items()))
    assert metric_samples(server)[fallbacks] > 0


def test_mismatched_targets_refuse_to_load_naming_the_mismatch(server: ServerProcess) -> None:
    index = post_json(server.url, "/v2/repository/index", {}).json()
    (row,) = [r for r in index if r["name"] == "mismatched"]
    assert row["state"] == "UNAVAILABLE"
    assert "input" in row["reason"] and "big" in row["reason"] and "mlp" in row["reason"]
    answer = post_json(server.url, "/v2/repository/models/mismatched/load", {})
    assert answer.status == 400 and "router 'mismatched'" in answer.json()["error"]
    assert request(server.url, "GET", "/v2/models/mismatched/ready").status != 200


def test_the_shadow_copy_never_holds_up_the_answer(server: ServerProcess) -> None:
    def settled() -> bool:
        shadow = stats(server)["shadow"]
        return shadow["sent"] == shadow["compared"] + shadow["failed"]

    wait_for(settled, "the copies of the earlier tests to finish")
    start = stats(server)["shadow"]
    for _ in range(30):  # a copy of each is asked for: the slow target holds 8 at most
        ask(server, user="to-big")  # in each front end
    burst = stats(server)["shadow"]
    held = SHADOW_IN_FLIGHT * front_end_count(server)
    assert burst["sent"] - start["sent"] <= held
    assert burst["dropped"] - start["dropped"] >= 30 - held
    wait_for(settled, "the burst's copies to finish")
    before = stats(server)["shadow"]
    answer = ask(server, 5.0, **{"class": "latency"})
    assert routed(answer) == "small" and answer.json()["outputs"][0]["data"] == [7.0] * 4
    # the copy waits in slow's batcher for up to 1.5 s: the answer came first
    now = stats(server)["shadow"]
    assert now["sent"] == before["sent"] + 1 and now["compared"] == before["compared"]
    wait_for(lambda: stats(server)["shadow"]["compared"] == before["compared"] + 1,
             "the shadow's answer")
    shadow = stats(server)["shadow"]
    assert shadow["max_abs_diff"] >= 1.0  # slow adds 3, small adds 2
    assert shadow["failed"] == 0


def test_rules_swap_under_load_with_no_failed_request(server: ServerProcess,
                                                      repo: Path) -> None:
    path = repo / "front" / "router.yaml"
    try:
        with background_load(lambda: ask(server).status) as statuses:
            time.sleep(0.3)
            path.write_text("routes: [{to: small}]\n")
            assert post_json(server.url, "/v2/repository/models/front/load", {}).status == 200
            time.sleep(0.5)
    finally:
        path.write_text(ROUTER)
    assert len(statuses) > 20 and set(statuses) == {200}
    assert {routed(ask(server)) for _ in range(20)} == {"small"}
    assert post_json(server.url, "/v2/repository/models/front/load", {}).status == 200


@pytest.fixture(scope="module")
def alias_server(tmp_path_factory: pytest.TempPathFactory, server_mode: str
                 ) -> Iterator[ServerProcess]:
    pytest.importorskip("torch")
    from tradeoff.models.generative import write_generative

    root = tmp_path_factory.mktemp("alias")
    small = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 64,
             "block_size": 8}
    write_generative(root, "tinyllama", **small)
    write_generative(root, "tinyllama", "tinyllama_b", **small)
    (root / "chat").mkdir()
    (root / "chat" / "router.yaml").write_text(
        "routes:\n  - when: {class: latency}\n    to: tinyllama_b\n  - to: tinyllama\n"
        "fallback: [tinyllama_b]\nshadow: {to: tinyllama_b, fraction: 1.0}\n")
    yield from running_server(root, mode=server_mode)


def test_a_router_of_generative_models_is_an_alias_that_streams(alias_server: ServerProcess
                                                                ) -> None:
    openai = pytest.importorskip("openai")
    with openai.OpenAI(base_url=f"{alias_server.url}/v1", api_key="unused",
                       max_retries=0) as client:
        assert "chat" in {m.id for m in client.models.list()}
        with client.completions.with_streaming_response.create(
                model="chat", prompt="route me", max_tokens=5, stream=True,
                stream_options={"include_usage": True},
                extra_body={"ignore_eos": True}) as response:
            assert response.headers["server-timing"] == 'route;desc="tinyllama"'
            chunks = list(response.parse())
        assert {c.model for c in chunks} == {"tinyllama"}
        # five tokens streamed (their text may be empty: random weights sample any piece)
        usage = [c.usage for c in chunks if c.usage is not None]
        assert len(usage) == 1 and usage[0].completion_tokens == 5
        assert any(c.choices for c in chunks)
        latency = client.chat.completions.create(
            model="chat", messages=[{"role": "user", "content": "hi"}], max_tokens=3,
            temperature=0, extra_body={"class": "latency"})
        assert latency.model == "tinyllama_b"
        by_header = client.with_options(default_headers={"X-Tradeoff-Class": "latency"}
                                        ).completions.create(model="chat", prompt="x",
                                                             max_tokens=2, temperature=0)
        assert by_header.model == "tinyllama_b"
        with pytest.raises(openai.BadRequestError, match="not a plain name"):
            client.completions.create(model="chat", prompt="x", max_tokens=1,
                                      extra_body={"class": "a b"})
        # tinyllama_b is the same model, asked greedily: the shadow chooses alike, but for
        # near ties that batching with other sequences can tip (random weights)
        wait_for(lambda: request(alias_server.url, "GET", "/v2/models/chat/stats").json()[
            "model_stats"][0]["shadow"]["compared"] >= 2, "the shadow generations")
        shadow = request(alias_server.url, "GET", "/v2/models/chat/stats").json()[
            "model_stats"][0]["shadow"]
        assert shadow["token_agreement"] >= 0.5 and shadow["failed"] == 0
        # the first answer, streamed, was sampled (temperature 1): no copy of it; the two
        # greedy ones each got one
        assert shadow["sent"] + shadow["dropped"] == 2
        with client.completions.with_streaming_response.create(  # streamed and greedy
                model="chat", prompt="again", max_tokens=3, stream=True,
                temperature=0) as response:
            list(response.parse())

        def copies() -> int:
            now = request(alias_server.url, "GET", "/v2/models/chat/stats").json()[
                "model_stats"][0]["shadow"]
            return int(now["sent"] + now["dropped"])

        wait_for(lambda: copies() == 3, "the streamed greedy answer's copy")
    assert post_json(alias_server.url, "/v2/repository/models/tinyllama/unload",
                     {}).status == 200
    with openai.OpenAI(base_url=f"{alias_server.url}/v1", api_key="unused",
                       max_retries=0) as client:
        assert client.completions.create(model="chat", prompt="x",
                                         max_tokens=2).model == "tinyllama_b"  # fell back
    routes = request(alias_server.url, "GET", "/v2/models/chat/stats").json()
    assert routes["model_stats"][0]["fallbacks"] == {"tinyllama_b": 1}
    tensor = infer_json(alias_server.url, "chat", [{"name": "x", "datatype": "FP32",
                                                    "shape": [1], "data": [1.0]}])
    assert tensor.status == 400 and "/v1/completions" in tensor.json()["error"]


def test_bench_mix_sends_classes_by_weight_and_reports_each(server: ServerProcess) -> None:
    from tradeoff.bench.endpoint import EndpointSpec, make_adapter
    from tradeoff.bench.load import LoadSpec
    from tradeoff.bench.mix import RequestClass
    from tradeoff.bench.session import run_benchmark

    before = {(r["route"], r["target"]): r["count"] for r in stats(server)["routes"]}
    spec = EndpointSpec(server.url, model="front", seed=3, classes=(
        RequestClass.parse("latency=20,class=latency"), RequestClass.parse("bulk=80")))
    result, records, _ = run_benchmark(make_adapter(spec),
                                       LoadSpec(concurrency=2, requests=1_000, seed=3))
    assert result.classes is not None
    latency, bulk = result.classes
    assert (latency.name, bulk.name) == ("latency", "bulk")
    assert latency.requests + bulk.requests == result.summary.requests == 1_000
    assert abs(latency.requests / 1_000 - 0.20) < 0.04
    assert latency.errors == bulk.errors == 0 and latency.latency("p99") is not None
    after = {(r["route"], r["target"]): r["count"] for r in stats(server)["routes"]}
    # the server's route 0 (class latency) saw the latency class: measured + cold start
    sent_latency = int((records.request // 8 == 0).sum())
    assert after[(0, "small")] - before[(0, "small")] == sent_latency
    assert result.endpoint["input_mix"]["classes"][0]["parameters"] == {"class": "latency"}


def test_a_latency_priority_with_its_own_delay_takes_the_waiting_batch(tmp_path: Path
                                                                       ) -> None:
    """The throughput level waits up to 5 s to fill a batch; a level-1 request (delay 0)
    goes at once and takes the waiting request with it: one execution of two rows."""
    config = CONSTANT_CONFIG.format(name="levels", extra=(
        "dynamic_batching { max_queue_delay_microseconds: 5000000 priority_levels: 2 "
        "default_priority_level: 2 }\n"
        'parameters { key: "priority_1_max_queue_delay_microseconds" '
        'value: { string_value: "0" } }\n'))
    _write(tmp_path, "levels", {1: add_constant_model(1.0)}, config)
    server_gen = running_server(tmp_path)
    server = next(server_gen)
    try:
        rows = [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]
        answers: dict[str, int] = {}
        bulk = threading.Thread(target=lambda: answers.__setitem__(
            "bulk", infer_json(server.url, "levels", rows).status))
        bulk.start()
        wait_for(lambda: stats(server, "levels")["inference_stats"]["success"]["count"] == 0
                 and bool(metric_samples(server)[("tradeoff_inference_queue_depth",
                                                  frozenset({"model": "levels",
                                                             "version": "1"}.items()))]),
                 "the bulk request to wait in the queue")
        urgent = infer_json(server.url, "levels", rows, parameters={"priority": 1})
        bulk.join(10)
        assert urgent.status == 200 and answers == {"bulk": 200}
        batches = stats(server, "levels")["batch_stats"]
        assert [(b["batch_size"], b["compute_infer"]["count"]) for b in batches] == [(2, 1)]
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)
