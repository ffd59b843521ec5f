"""The replica group's coordinator (in process, without Ray), the statistics sum and the
Ray Serve deployment options."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tradeoff.scheduling.stats import ModelStats, merge_model_stats
from tradeoff.server import replicas
from tradeoff.server.options import RayOptions
from tradeoff.server.ray_serve import parse_autoscale
from tradeoff.server.replicas import ReplicaCoordinator


def run(coroutine: Any) -> Any:
    return asyncio.run(coroutine)


def test_a_change_reaches_the_others_and_the_publisher_waits_for_them() -> None:
    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        assert await coordinator.register("a", "127.0.0.2", 1, None) == []
        await coordinator.register("b", "127.0.0.3", 2, None)
        generation = await coordinator.publish("a", {"op": "unload", "model": "mlp"})
        waiting = asyncio.ensure_future(coordinator.wait_applied(generation, 5.0))
        news = await coordinator.poll("b", 0)
        assert [(c["op"], c["model"], c["origin"]) for c in news["changes"]] == \
            [("unload", "mlp", "a")]
        await asyncio.sleep(0.01)
        assert not waiting.done()  # b has not applied it yet
        await coordinator.acknowledge("b", generation, None)
        assert await waiting == {}

    run(scenario())


def test_a_failed_or_late_replica_is_named() -> None:
    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        for name in ("a", "b", "c"):
            await coordinator.register(name, "n", 1, None)
        generation = await coordinator.publish("a", {"op": "load", "model": "mlp",
                                                     "parameters": {}})
        await coordinator.acknowledge("b", generation, "out of memory")
        failed = await coordinator.wait_applied(generation, 0.05)
        assert failed["b"] == "out of memory"
        assert "did not apply it" in failed["c"] and "a" not in failed

    run(scenario())


def test_a_late_replica_replays_only_the_last_change_of_each_model() -> None:
    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        await coordinator.register("a", "n", 1, None)
        await coordinator.publish("a", {"op": "unload", "model": "mlp"})
        await coordinator.publish("a", {"op": "unload", "model": "tiny"})
        await coordinator.publish("a", {"op": "load", "model": "mlp", "parameters": {}})
        replay = await coordinator.register("new", "n", 2, None)
        assert [(c["op"], c["model"]) for c in replay] == [("unload", "tiny"), ("load", "mlp")]

    run(scenario())


def test_gather_asks_every_other_live_replica_and_skips_the_silent() -> None:
    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        for name in ("a", "b", "c"):
            await coordinator.register(name, "n", 1, None)
        asking = asyncio.ensure_future(coordinator.gather("a", {"kind": "statistics"}, 0.3))
        await asyncio.sleep(0)
        news = await coordinator.poll("b", 0)
        [query] = news["queries"]
        await coordinator.answer("b", query["query"], {"model_stats": ["from b"]})
        assert await asking == [{"model_stats": ["from b"]}]  # c never answered
        assert (await coordinator.poll("a", 0))["queries"] == []

    run(scenario())


def test_a_replica_that_leaves_leaves_its_counts_in_every_later_metrics() -> None:
    """The counters and histograms of the last /metrics a replica answered are added to
    every /metrics gathered after it left (a front end killed and started again: the
    server's counters do not step back); its gauges are not."""
    counter = {"name": "tradeoff_inference_request_success", "type": "counter",
               "documentation": "", "unit": "",
               "samples": [["tradeoff_inference_request_success_total", {}, 40.0]]}
    gauge = {"name": "tradeoff_server_in_flight", "type": "gauge", "documentation": "",
             "unit": "", "samples": [["tradeoff_server_in_flight", {}, 3.0]]}

    async def scrape(coordinator: ReplicaCoordinator, answering: str | None
                     ) -> list[dict[str, Any]]:
        asking = asyncio.ensure_future(coordinator.gather("a", {"kind": "metrics"}, 0.3))
        await asyncio.sleep(0)
        if answering is not None:
            [query] = (await coordinator.poll(answering, 0))["queries"]
            await coordinator.answer(answering, query["query"],
                                     {"families": [counter, gauge]})
        return await asking

    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        for name in ("a", "b"):
            await coordinator.register(name, "n", 1, None)
        assert await scrape(coordinator, "b") == [{"families": [counter, gauge]}]
        await coordinator.leave("b")
        assert await scrape(coordinator, None) == [{"families": [counter]}]
        await coordinator.register("b2", "n", 2, None)  # its replacement, from zero
        answers = await scrape(coordinator, "b2")
        assert answers == [{"families": [counter, gauge]}, {"families": [counter]}]

    run(scenario())


def test_a_replica_silent_for_too_long_is_not_waited_for() -> None:
    async def scenario() -> None:
        coordinator = ReplicaCoordinator()
        await coordinator.register("a", "n", 1, None)
        await coordinator.register("dead", "n", 2, None)
        coordinator.members["dead"]["seen"] -= replicas.LIVE_S + 1
        generation = await coordinator.publish("a", {"op": "unload", "model": "mlp"})
        assert await coordinator.wait_applied(generation, 5.0) == {}
        assert [m["replica"] for m in await coordinator.replicas()] == ["a"]
        await coordinator.leave("a")
        assert await coordinator.replicas() == []

    run(scenario())


def _stats(count: int, batches: dict[int, int]) -> dict[str, Any]:
    stats = ModelStats("mlp", 1)
    stats.inference_count = count
    stats.execution_count = sum(batches.values())
    stats.success = [count, count * 1000]
    for size, times in batches.items():
        stats.batches[size] = [times, 10 * times, 20 * times, 30 * times]
    return {"model_stats": [stats.to_dict()]}


def test_statistics_of_replicas_add_up_per_version_and_batch_size() -> None:
    merged = merge_model_stats([_stats(10, {1: 4, 2: 3}), _stats(6, {2: 1, 4: 1}),
                                {"model_stats": []}])
    [entry] = merged["model_stats"]
    assert entry["inference_count"] == 16 and entry["execution_count"] == 9
    assert entry["inference_stats"]["success"] == {"count": 16, "ns": 16000}
    assert [(b["batch_size"], b["compute_infer"]["count"], b["compute_infer"]["ns"])
            for b in entry["batch_stats"]] == [(1, 4, 80), (2, 4, 80), (4, 1, 20)]


def test_autoscale_bounds_and_the_deployment_options() -> None:
    assert parse_autoscale("1:8") == (1, 8)
    assert parse_autoscale("0:2") == (0, 2)
    for bad in ("8", "3:2", "a:b", "-1:2", "0:0"):
        with pytest.raises(ValueError, match="MIN:MAX"):
            parse_autoscale(bad)
    fixed = RayOptions(replicas=3).deployment_options()
    assert fixed["num_replicas"] == 3 and "autoscaling_config" not in fixed
    scaled = RayOptions(autoscale=(1, 4), target_ongoing_requests=16,
                        upscale_delay_s=5).deployment_options()
    config = scaled["autoscaling_config"]
    assert (config["min_replicas"], config["max_replicas"], config["initial_replicas"]) == \
        (1, 4, 1)
    assert config["target_ongoing_requests"] == 16 and config["upscale_delay_s"] == 5
    assert "num_replicas" not in scaled
    assert scaled["ray_actor_options"] == {"num_cpus": 1.0}
    # --upscale-delay 0 is allowed; Ray's AutoscalingConfig refuses a metrics interval of 0
    instant = RayOptions(autoscale=(1, 2), upscale_delay_s=0).deployment_options()
    assert instant["autoscaling_config"]["metrics_interval_s"] > 0
