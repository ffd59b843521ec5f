"""Choosing a replica: the policies, ejection and readmission rules, the retry budget,
and the prefix index they read (no network: the replicas' states are set here)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

from tradeoff.errors import ModelLoadError
from tradeoff.repository.router import RouterConfig
from tradeoff.server.prefix_index import PrefixIndex
from tradeoff.server.queue_report import gauge_sum
from tradeoff.server.replica_pool import MIN_RETRIES, ReplicaPool


def pool(policy: str = "round_robin", count: int = 4, protocol: str = "v2",
         **extra: object) -> ReplicaPool:
    doc = {"pools": {"p": {"protocol": protocol, "policy": policy,
                           "replicas": [f"http://127.0.0.{i + 2}:8000" for i in range(count)],
                           **extra}}, "routes": [{"to": "p"}]}
    made = ReplicaPool(RouterConfig.from_mapping(doc, "r.yaml", "r").pools["p"])
    for replica in made.replicas:
        replica.ready = replica.checked = True
    return made


def chosen(made: ReplicaPool, count: int, **kwargs: object) -> list[int]:
    picks = []
    for _ in range(count):
        replica = made.choose(set(), **kwargs)  # type: ignore[arg-type]
        assert replica is not None
        picks.append(replica.index)
    return picks


def test_round_robin_takes_each_in_turn_and_skips_the_unavailable() -> None:
    made = pool()
    assert chosen(made, 8) == [0, 1, 2, 3, 0, 1, 2, 3]
    made.replicas[1].draining = True
    made.replicas[2].eject(time.monotonic(), 60, "test")
    assert chosen(made, 4) == [0, 3, 0, 3]
    assert made.choose({0, 3}) is None
    assert "127.0.0.3:8000 draining" in made.unavailable_reason()
    assert "127.0.0.4:8000 ejected" in made.unavailable_reason()


def test_least_outstanding_weighs_requests_in_flight_by_answer_time() -> None:
    made = pool("least_outstanding")
    for replica in made.replicas:
        replica.observe(0.002)
    made.replicas[3].observe(0.5)  # slow now: its average moves most of the way
    made.replicas[3].observe(0.5)
    made.replicas[3].observe(0.5)
    made.replicas[0].in_flight = 1
    picks = Counter(chosen(made, 30))
    assert picks[3] == 0 and picks[0] == 0 and picks[1] == picks[2] == 15
    for replica in made.replicas[:3]:
        replica.in_flight = 1000  # the fast ones crowded: the slow one takes the next
    assert chosen(made, 1) == [3]


def test_a_session_stays_on_its_replica_and_moves_only_when_it_goes() -> None:
    made = pool("session", protocol="openai", session="user")
    homes = {user: chosen(made, 1, session=user)[0] for user in map(str, range(40))}
    assert all(chosen(made, 3, session=u) == [h] * 3 for u, h in homes.items())
    assert len(set(homes.values())) == 4
    made.replicas[homes["7"]].draining = True
    moved = {u for u, h in homes.items() if chosen(made, 1, session=u)[0] != h}
    assert moved == {u for u, h in homes.items() if h == homes["7"]}


def test_prefix_sends_a_prompt_back_where_its_prefix_went_unless_that_one_is_crowded() -> None:
    made = pool("prefix", protocol="openai")
    assert made.prefixes is not None
    prompts = [made.prefixes.blocks(f"system {i} ".encode() * 40) for i in range(4)]
    homes = [chosen(made, 1, prefix=p)[0] for p in prompts]
    assert sorted(homes) == [0, 1, 2, 3]  # new prompts spread over the caches
    assert [chosen(made, 1, prefix=p)[0] for p in prompts] == homes
    crowded = made.replicas[homes[0]]
    crowded.in_flight = 10  # for the last few seconds: another takes it, and holds it next
    crowded.average_load(time.monotonic() + 5)
    other = chosen(made, 1, prefix=prompts[0])[0]
    assert other != homes[0]
    stats = made.replicas[homes[0]].stats
    assert (stats.prefix_blocks_matched, stats.prefix_blocks) == \
        (len(prompts[0]), 2 * len(prompts[0]))  # matched the second time


def test_the_queue_a_replica_reports_counts_as_its_load_while_recent(
        monkeypatch: pytest.MonkeyPatch) -> None:
    made = pool("least_outstanding", count=2, queue="tradeoff")
    assert made.queues is not None
    busy, idle = made.replicas
    busy.report_queue(5)
    idle.report_queue(0)
    assert chosen(made, 4) == [1, 1, 1, 1]
    idle.in_flight = 5  # its own 5 against the other's 5 waiting and none of ours
    assert Counter(chosen(made, 4)) == Counter({0: 2, 1: 2})
    idle.in_flight = 0
    busy.report_queue(None)  # a failed reading counts nothing
    assert Counter(chosen(made, 4)) == Counter({0: 2, 1: 2})
    busy.report_queue(5)
    later = time.monotonic() + 1.5  # older than three readings (at least 1 s): stale
    monkeypatch.setattr(time, "monotonic", lambda: later)
    assert busy.queued(later) == 0 and Counter(chosen(made, 4)) == Counter({0: 2, 1: 2})


def test_prefix_balances_on_the_queue_a_replica_reports() -> None:
    made = pool("prefix", count=2, protocol="openai", queue="tradeoff")
    assert made.prefixes is not None
    prompt = made.prefixes.blocks(b"system prompt " * 40)
    home = chosen(made, 1, prefix=prompt)[0]
    made.replicas[home].report_queue(8)  # others filled its queue: the prompt moves
    assert chosen(made, 1, prefix=prompt) == [1 - home]


@pytest.mark.parametrize(("text", "metric", "labels", "expected"), [
    (b'# HELP tradeoff_inference_queue_depth Requests waiting\n'
     b'# TYPE tradeoff_inference_queue_depth gauge\n'
     b'tradeoff_inference_queue_depth{model="mlp",version="1"} 3.0\n'
     b'tradeoff_inference_queue_depth{model="mlp_small",version="1"} 9.0\n'
     b'tradeoff_inference_queue_depth_total{model="mlp"} 100\n',
     "tradeoff_inference_queue_depth", [("model", "mlp")], 3.0),
    (b'nv_inference_pending_request_count{model="bert",version="1"} 2\n'
     b'nv_inference_pending_request_count{model="bert",version="2"} 4\n',
     "nv_inference_pending_request_count", [("model", "bert")], 6.0),
    (b'vllm:num_requests_waiting{engine="0",model_name="meta/llama"} 7.0 1700000000\r\n',
     "vllm:num_requests_waiting", [("model_name", "meta/llama")], 7.0),
    (b'waiting{name="a \\"quoted\\" one"} 1\nwaiting 2\n', "waiting",
     [("name", 'a "quoted" one')], 1.0),
    (b'waiting 2\n', "waiting", [], 2.0),
    (b'waiting{model="x"} NaN\n', "waiting", [("model", "x")], None),
    (b'waiting{model="x"} -1e9\nwaiting{model="x",v="2"} +Inf\n', "waiting",
     [("model", "x")], None),
    (b'waiting{v="1"} 2\nwaiting{v="2"} -3\n', "waiting", [], 2.0),
    (b'waiting{model="x"} 1\n', "waiting", [("model", "y")], None),
    (b'not prometheus at all', "waiting", [], None),
])
def test_a_gauge_is_read_from_prometheus_text(text: bytes, metric: str,
                                              labels: list[tuple[str, str]],
                                              expected: float | None) -> None:
    assert gauge_sum(text, metric, labels) == expected


def test_failures_in_a_row_eject_and_a_success_resets_the_count() -> None:
    made = pool(health={"eject_after": 2, "eject_s": 30})
    replica = made.replicas[0]
    made.request_failed(replica, "refused")
    replica.finished(True, 0.001)
    made.request_failed(replica, "refused")
    assert replica.available(time.monotonic())
    made.request_failed(replica, "refused")
    assert not replica.available(time.monotonic()) and replica.stats.ejections == 1


def test_the_retry_budget_is_a_share_of_the_requests_in_flight() -> None:
    made = pool(retry_budget=0.25)
    made.retries_in_flight = MIN_RETRIES
    assert not made.may_retry()
    made.replicas[0].in_flight = 40
    assert made.may_retry()
    made.retries_in_flight = 10
    assert not made.may_retry()


def test_a_replica_with_every_connection_busy_and_as_many_waiting_is_passed_over() -> None:
    made = pool(connections=2)
    made.replicas[0].waiting = 2
    assert 0 not in chosen(made, 6)


def test_a_connection_given_back_after_its_pool_stopped_is_closed() -> None:
    """A request still out when its pool stops (a reload's old router, a late shadow
    copy) does not leave its connection kept where nothing will close it."""
    async def scenario() -> tuple[bool, bool]:
        replica = pool(count=1).replicas[0]
        early = await replica.acquire()
        replica.release(early, kept=True)
        reused = await replica.acquire() is early  # kept while the pool serves
        late = await replica.acquire()
        replica.close()  # the pool stops
        replica.release(late, kept=True)
        return reused, await replica.acquire() is late

    assert asyncio.run(scenario()) == (True, False)


def test_the_pools_own_key_must_be_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REPLICA_KEY", raising=False)
    with pytest.raises(ModelLoadError, match=r"api_key_env names \$REPLICA_KEY"):
        pool(api_key_env="REPLICA_KEY")
    monkeypatch.setenv("REPLICA_KEY", "k")
    raw = pool(api_key_env="REPLICA_KEY").replicas[0].request("GET", "/v2/health/ready")
    assert b"Authorization: Bearer k\r\n" in raw
    forwarded = pool(api_key_env="REPLICA_KEY").replicas[0].request(
        "GET", "/x", headers={"authorization": "Bearer client"})
    assert b"Bearer k" not in forwarded and b"Bearer client" in forwarded


def test_the_prefix_index_counts_whole_blocks_and_forgets() -> None:
    index = PrefixIndex(block_bytes=4, capacity=6)
    a = index.blocks(b"abcdefghij")  # two whole blocks
    b = index.blocks(b"abcdXXXX")
    assert len(a) == 2 and a[0] == b[0] and a[1] != b[1]
    index.record(a, 0)
    index.record(b, 1)
    assert index.matches(a) == {0: 2, 1: 1}
    assert index.held(0) == 2 and index.held(1) == 2
    index.forget(0)
    assert index.matches(a) == {1: 1} and index.held(0) == 0
    for replica in range(2, 6):
        index.record(index.blocks(bytes([replica]) * 8), replica)
    assert len(index._owners) <= 6 and index.matches(b) == {}


def test_a_reloaded_pool_keeps_what_it_learnt_of_the_replicas_it_still_has() -> None:
    old = pool("prefix", count=3, protocol="openai")
    assert old.prefixes is not None
    gone_prompt = old.prefixes.blocks(b"a prompt sent to the replica removed " * 4)
    assert chosen(old, 1, prefix=gone_prompt) == [0]
    old.replicas[0].draining = True
    prompt = old.prefixes.blocks(b"a system prompt " * 20)
    assert chosen(old, 1, prefix=prompt) == [1]
    home = old.replicas[1]
    home.observe(0.25)
    home.eject(time.monotonic(), 60, "test")
    # reloaded: the first replica gone, one added at the end
    urls = [r.config.url for r in old.replicas[1:]] + ["http://127.0.0.9:8000"]
    doc = {"pools": {"p": {"protocol": "openai", "policy": "prefix", "replicas": urls}},
           "routes": [{"to": "p"}]}
    new = ReplicaPool(RouterConfig.from_mapping(doc, "r.yaml", "r").pools["p"])
    new.adopt(old)
    kept = new.replicas[0]
    assert kept.config.url == home.config.url
    assert kept.stats is home.stats and kept.stats.prefix_blocks == len(prompt)
    assert kept.latency(time.monotonic()) == 0.25
    assert kept.ejected_until == home.ejected_until
    assert new.prefixes is not None
    assert new.prefixes.matches(prompt) == {0: len(prompt)}
    assert new.prefixes.matches(gone_prompt) == {}
    assert new.replicas[2].stats.requests == 0
    other = pool("round_robin", count=3, protocol="v2")  # another model's pool: nothing
    other.adopt(old)
    assert all(r.stats.prefix_blocks == 0 for r in other.replicas)
