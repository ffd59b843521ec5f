"""router.yaml: reading it, refusing mistakes in one line, and choosing a target."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tradeoff.errors import ConfigError
from tradeoff.repository.router import (
    Condition,
    QueueReport,
    RouterConfig,
    Signature,
    Target,
    common_signature,
)

EXAMPLE = """
routes:
  - when: {class: latency}
    to: mlp_small
  - when: {deadline_ms_below: 20}
    to: mlp_small
  - to: [{model: mlp, version: 1, weight: 90}, {model: mlp, version: 2, weight: 10}]
    sticky: user
fallback: [mlp_small]
shadow: {to: mlp_int8, fraction: 0.05}
"""


def example(tmp_path: Path) -> RouterConfig:
    path = tmp_path / "router.yaml"
    path.write_text(EXAMPLE)
    return RouterConfig.read(path)


def test_the_documented_example_reads_as_written(tmp_path: Path) -> None:
    config = example(tmp_path)
    assert config.routes[0].when == Condition(request_class="latency")
    assert config.routes[1].when == Condition(deadline_ms_below=20.0)
    assert config.routes[2].arms == (Target("mlp", 1, 90.0), Target("mlp", 2, 10.0))
    assert config.routes[2].sticky == "user" and config.routes[2].when is None
    assert config.fallback == (Target("mlp_small"),)
    assert config.shadow is not None and config.shadow.target == Target("mlp_int8")
    assert config.shadow.fraction == 0.05 and config.idempotent is False
    assert config.models() == ["mlp_small", "mlp", "mlp_int8"]
    assert [t.label for t in config.routes[2].arms] == ["mlp/1", "mlp/2"]


def test_a_route_may_set_the_priority_of_what_it_sends(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("routes:\n  - {when: {class: chat}, to: engine, priority: 0}\n"
                    "  - {to: engine, priority: 5}\n")
    config = RouterConfig.read(path)
    assert [r.priority for r in config.routes] == [0, 5]
    assert config.routes[config.decide("chat", None, {}, 0.5).route].priority == 0
    assert config.routes[config.decide("batch", None, {}, 0.5).route].priority == 5
    assert example(tmp_path).routes[0].priority is None  # the request's own


def test_a_router_may_hide_its_targets(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    path.write_text("routes: [{to: engine}]\nhide_targets: true\n")
    assert RouterConfig.read(path).hide_targets is True
    assert example(tmp_path).hide_targets is False  # they answer direct calls too


def test_first_matching_route_wins(tmp_path: Path) -> None:
    config = example(tmp_path)
    assert config.decide("latency", None, {}, 0.5).target == Target("mlp_small")
    assert config.decide(None, 10.0, {}, 0.5).route == 1
    assert config.decide(None, 30.0, {}, 0.5).route == 2  # a deadline not below 20
    assert config.decide("bulk", None, {}, 0.5).route == 2


def test_weights_hold_within_two_percent_over_ten_thousand_requests(tmp_path: Path) -> None:
    config = example(tmp_path)
    rng = random.Random(3)
    arms = [config.decide(None, None, {}, rng.random()).arm for _ in range(10_000)]
    assert abs(arms.count(1) / 10_000 - 0.10) < 0.02
    # sticky: one caller always lands on one arm; callers still split by weight
    users = [config.decide(None, None, {"user": f"u{k}"}, rng.random()).arm
             for k in range(10_000)]
    assert abs(users.count(1) / 10_000 - 0.10) < 0.02
    for k in range(200):
        assert len({config.decide(None, None, {"user": f"u{k}"}, rng.random()).arm
                    for _ in range(5)}) == 1


@pytest.mark.parametrize(("text", "field", "message"), [
    ("routes: []", "routes", "non-empty list"),
    ("routs: [{to: a}]", "routs", "did you mean 'routes'"),
    ("routes: [{to: a}, {when: {class: x}, to: b}]", "routes[0]", "can never match"),
    ("routes: [{when: {klass: x}, to: a}]", "routes[0].when.klass", "did you mean 'class'"),
    ("routes: [{when: {deadline_ms_below: -1}, to: a}, {to: b}]",
     "routes[0].when.deadline_ms_below", "positive"),
    ("routes: [{to: [{model: a, weight: 0}]}]", "routes[0].to[0].weight", "positive"),
    ("routes: [{to: [{model: a, weight: .inf}]}]", "routes[0].to[0].weight", "positive"),
    ("routes: [{to: [{model: a, weight: .nan}]}]", "routes[0].to[0].weight", "positive"),
    ("routes: [{to: [{model: a, version: 0}]}]", "routes[0].to[0].version", "positive"),
    ("routes: [{to: []}]", "routes[0].to", "must name a model"),
    ("routes: [{to: a}]\nshadow: {to: b, fraction: 2}", "shadow.fraction", "(0, 1]"),
    ("routes: [{to: a}]\nshadow: {to: [b, c]}", "shadow.to", "one model"),
    ("routes: [{to: a}]\nfallback: [{model: b, weight: 3}]", "fallback[0].weight",
     "unknown field"),
    ("routes: [{to: a}]\nidempotent: maybe", "idempotent", "true or false"),
    ("routes: [{to: a}]\nhide_targets: 1", "hide_targets", "true or false"),
    ("routes: [{to: a, priority: high}]", "routes[0].priority", "integer"),
    ("routes: [{to: a, priority: 1.5}]", "routes[0].priority", "integer"),
    ("routes: [{to: a, priority: 4294967296}]", "routes[0].priority", "2**31 - 1"),
    ("routes: [{to: a, priorty: 1}]", "routes[0].priorty", "did you mean 'priority'"),
])
def test_mistakes_name_the_field(tmp_path: Path, text: str, field: str, message: str) -> None:
    path = tmp_path / "router.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        RouterConfig.read(path)
    assert f"{field}:" in str(caught.value) and message in str(caught.value)
    assert str(path) in str(caught.value)


def signature(shape: tuple[int, ...], datatype: str = "FP32", output: str = "y") -> Signature:
    return Signature(inputs=(("x", datatype, shape),), outputs=((output, "FP32", (-1, 10)),))


def test_targets_must_agree_on_names_datatypes_and_shapes() -> None:
    common = common_signature("r", {"a": signature((-1, 256)), "b": signature((4, 256))})
    assert common.inputs == (("x", "FP32", (4, 256)),)  # what every target accepts
    for other, message in ((signature((-1, 128)), "[-1, 256] in a but [-1, 128] in b"),
                           (signature((-1, 256), "FP16"), "FP32 in a but FP16 in b"),
                           (signature((-1, 256), output="z"), "outputs ['y'] but b has ['z']"),
                           (signature((256,)), "but [256] in b")):
        with pytest.raises(ConfigError) as caught:
            common_signature("r", {"a": signature((-1, 256)), "b": other})
        assert message in str(caught.value) and "router 'r'" in str(caught.value)


POOLS = {"pools": {"remote": {"protocol": "v2", "model": "mlp", "policy": "round_robin",
                              "replicas": ["http://127.0.0.2:8000",
                                           {"url": "https://10.0.0.3:9000/prefix/",
                                            "drain": True}],
                              "forward_headers": ["Authorization"],
                              "health": {"interval_s": 0.5, "eject_after": 2}}},
         "routes": [{"when": {"class": "batch"}, "to": "remote"}, {"to": "mlp"}],
         "fallback": ["remote"]}


def test_a_pool_is_a_target_beside_the_local_models() -> None:
    config = RouterConfig.from_mapping(POOLS, "front/router.yaml", name="front")
    pool = config.pools["remote"]
    assert config.models() == ["remote", "mlp"] and config.local_models() == ["mlp"]
    assert (pool.protocol, pool.model, pool.policy) == ("v2", "mlp", "round_robin")
    first, second = pool.replicas
    assert (first.host, first.port, first.prefix, first.drain) == ("127.0.0.2", 8000, "", False)
    assert (second.scheme, second.port, second.prefix, second.drain) == \
        ("https", 9000, "/prefix", True)
    assert pool.forward_headers == ("authorization",)
    assert (pool.health.interval_s, pool.health.eject_after) == (0.5, 2)
    assert pool.retry_budget == 0.5 and pool.api_key_env is None


@pytest.mark.parametrize(("change", "message"), [
    ({"protocol": "http2"}, "pools.remote.protocol: must be one of v2, v2-grpc, openai"),
    ({"protocol": "v2-grpc"}, "give grpc://HOST:PORT"),
    ({"polcy": "x"}, "pools.remote.polcy: unknown field; did you mean 'policy'?"),
    ({"replicas": []}, "pools.remote.replicas: must list the replicas' URLs"),
    ({"replicas": ["ftp://a:1"]}, "give http://HOST:PORT"),
    ({"replicas": ["http://user:pw@a:1"]}, "no credentials, query or fragment"),
    ({"replicas": ["http://a:1", "http://a:1/"]}, "lists a replica twice"),
    ({"policy": "prefix"}, "use it with protocol openai"),
    ({"policy": "session"}, "policy session needs the header"),
    ({"forward_headers": ["Host"]}, "'host' belongs to one connection"),
    ({"retry_budget": 2}, "pools.remote.retry_budget: must be a number from 0 to 1"),
    ({"api_key_env": "not a name"}, "must name an environment variable"),
    ({"health": {"interval_s": 0}}, "pools.remote.health.interval_s: must be a number"),
    ({"queue": "trition"}, "pools.remote.queue.server: must be one of tradeoff, "
                           "tradeoff-generation, triton, vllm; did you mean 'triton'?"),
    ({"queue": {}}, "name the replicas' server or the metric to read"),
    ({"queue": {"metric": "a b"}}, "pools.remote.queue.metric: must be a Prometheus metric"),
    ({"queue": {"server": "vllm", "labels": ["model"]}}, "queue.labels: must map label"),
    ({"queue": {"metric": "q", "path": "metrics"}}, "queue.path: must be a path"),
    ({"queue": ["triton"]}, "pools.remote.queue: must name the replicas' server"),
    ({"protocol": "v2-grpc", "replicas": ["grpc://a:1"], "queue": {"metric": "q"}},
     "queue.port: a gRPC replica's metrics are on another port"),
    ({"replicas": [{"url": "http://a:1", "metrics": "a:2/metrics"}]},
     "metrics: 'a:2/metrics': give http://HOST:PORT"),
])
def test_a_pool_mistake_is_one_line_naming_the_field(change: dict, message: str) -> None:
    pool = {**POOLS["pools"]["remote"], **change}  # type: ignore[dict-item]
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("?", r"\?")):
        RouterConfig.from_mapping({**POOLS, "pools": {"remote": pool}}, "r.yaml", name="front")


def test_a_pool_reads_its_replicas_queues_from_their_metrics() -> None:
    def queue(value: object, **pool: object) -> QueueReport | None:
        doc = {**POOLS["pools"]["remote"], "queue": value, **pool}  # type: ignore[dict-item]
        config = RouterConfig.from_mapping({**POOLS, "pools": {"remote": doc}}, "r.yaml")
        return config.pools["remote"].queue

    assert queue("triton") == QueueReport("nv_inference_pending_request_count",
                                          (("model", "mlp"),), 8002)
    assert queue("tradeoff") == QueueReport("tradeoff_inference_queue_depth",
                                            (("model", "mlp"),), 8002)
    assert queue("tradeoff", protocol="openai").metric == "tradeoff_generation_requests_waiting"
    assert queue({"server": "vllm", "port": 9100, "interval_s": 1}) == QueueReport(
        "vllm:num_requests_waiting", (("model_name", "mlp"),), 9100, "/metrics", 1.0)
    assert queue({"metric": "waiting", "labels": {"deployment": "a"}}) == QueueReport(
        "waiting", (("deployment", "a"),))
    assert queue(None) is None
    replicas = [{"url": "grpc://127.0.0.2:8001", "metrics": "http://127.0.0.2:8002/metrics"}]
    grpc = RouterConfig.from_mapping({**POOLS, "pools": {"remote": {
        "protocol": "v2-grpc", "model": "mlp", "replicas": replicas,
        "queue": {"metric": "waiting"}}}}, "r.yaml").pools["remote"]
    assert grpc.replicas[0].metrics == "http://127.0.0.2:8002/metrics"


def test_a_pool_has_no_versions_and_hides_nothing() -> None:
    with pytest.raises(ConfigError, match="pool 'remote' has no versions here"):
        RouterConfig.from_mapping({**POOLS, "routes": [{"to": {"model": "remote",
                                                                "version": 2}}]}, "r.yaml")
    with pytest.raises(ConfigError, match="hides local targets only"):
        RouterConfig.from_mapping({**POOLS, "hide_targets": True}, "r.yaml")
    with pytest.raises(ConfigError, match="a pool cannot have its router's name"):
        RouterConfig.from_mapping({**POOLS, "pools": {"front": POOLS["pools"]["remote"]},
                                   "routes": [{"to": "mlp"}]}, "r.yaml", name="front")
