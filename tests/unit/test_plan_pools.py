"""`tradeoff plan` with classes of requests: each class's own traffic, a pool per class
weighed against one pool for all (where the right answer is known by hand), and the
router the plan writes for the pools."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.errors import InvalidValue
from tradeoff.plan.deployment import pool_name, serve_flags, write_deployment
from tradeoff.plan.search import NO_CACHE, ClassSearch, Searcher, pooled, rank_key
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.repository import ModelRepository
from tradeoff.repository.router import RouterConfig
from tradeoff.tune.goal import Goal
from tradeoff.tune.knobs import Knobs

from ..synthetic_model import write_synthetic_model
from .test_plan_search import CONFIG, NO_SERVER_COST, _version

START = (1, Knobs(1, 0, 1, 1, False))


def _plan(traffic: Traffic, goal: Goal) -> list:
    """The shared pool's candidates and the pools', ranked together as the planner does."""
    version = _version(fixed_ms=4.0, per_row_ms=0.5)
    strictest = goal.strictest(traffic.classes)
    shared = Searcher(CONFIG, traffic, replace(goal, sla_p99_ms=strictest), NO_SERVER_COST,
                      START).search([version], NO_CACHE)
    parts = []
    for name, share in traffic.classes.items():
        alone = replace(goal, sla_p99_ms=goal.sla_for(name), cores=goal.cores - 1)
        parts.append(ClassSearch(name, share, alone.sla_p99_ms,
                                 Searcher(CONFIG, traffic.part(name), alone, NO_SERVER_COST,
                                          START).search([version], NO_CACHE)))
    return sorted(shared + pooled(parts, goal, traffic.rate_rps),
                  key=lambda c: rank_key(c, strictest))


@pytest.mark.slow
def test_a_strict_small_class_gets_its_own_pool_when_one_pool_would_cost_more() -> None:
    # 4 ms + 0.5 ms per row. One pool for all 350/s at p99 <= 6 ms cannot wait for
    # batches: four instances of batch 1. Alone, the 5% latency class needs two instances
    # (a request arriving during another's 4.5 ms waits for it), and the bulk class one
    # instance with batches (8 rows in 8 ms): 3 cores against 4.
    traffic = Traffic.law(350, classes={"latency": 0.05, "bulk": 0.95})
    goal = Goal(sla_p99_ms=200, max_drop=0.01, cores=4, price_per_core_hour=0.1,
                    class_sla_ms={"latency": 6})
    ranked = _plan(traffic, goal)
    best = ranked[0]
    assert best.pools and best.cores == 3 and best.meets_sla
    pools = {p.request_class: p for p in best.pools}
    assert pools["latency"].sla_p99_ms == 6 and pools["bulk"].sla_p99_ms == 200
    assert pools["latency"].candidate.knobs["instances"] == 2
    assert pools["latency"].candidate.predicted.p99_ms <= 6
    assert pools["bulk"].candidate.cores == 1
    assert pools["bulk"].candidate.knobs["max_batch_size"] > 1
    shared = next(c for c in ranked if not c.pools and c.meets_sla)
    assert shared.cores == 4
    assert best.cost_per_million is not None and shared.cost_per_million is not None
    assert best.cost_per_million < shared.cost_per_million


@pytest.mark.slow
def test_classes_with_the_same_sla_keep_one_pool() -> None:
    traffic = Traffic.law(350, classes={"latency": 0.05, "bulk": 0.95})
    goal = Goal(sla_p99_ms=200, max_drop=0.01, cores=4, price_per_core_hour=0.1)
    best = _plan(traffic, goal)[0]
    assert not best.pools and best.cores == 1


def test_pools_that_do_not_fit_the_cores_are_not_candidates() -> None:
    traffic = Traffic.law(350, classes={"latency": 0.05, "bulk": 0.95})
    goal = Goal(sla_p99_ms=200, max_drop=0.01, cores=2, class_sla_ms={"latency": 6})
    assert not any(c.pools for c in _plan(traffic, goal))


def test_each_class_of_a_trace_is_its_own_traffic(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    times = np.cumsum(rng.exponential(1 / 200, 4000))
    classes = np.where(rng.random(times.size) < 0.25, "latency", "bulk")
    lines = [json.dumps({"timestamp": float(t), "class": str(c), "input": int(i % 50)})
             for t, c, i in zip(times, classes, range(times.size), strict=True)]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(lines))
    traffic = Traffic.read(path)
    assert traffic.classes["latency"] == pytest.approx(0.25, abs=0.03)
    latency = traffic.part("latency")
    assert latency.rate_rps == pytest.approx(50, rel=0.1)
    assert latency.classes == {"latency": 1.0}
    assert latency.offsets_s is not None and latency.offsets_s.size == (classes ==
                                                                        "latency").sum()
    assert latency.distinct_inputs == 50 and latency.burstiness == pytest.approx(1, abs=0.1)
    law = Traffic.law(100, classes={"a": 1, "b": 3})
    assert law.classes == {"a": 0.25, "b": 0.75}
    assert law.part("b").rate_rps == pytest.approx(75)
    with pytest.raises(InvalidValue, match="share"):
        Traffic.law(100, classes={"a": 0})


@pytest.mark.slow
def test_pools_are_written_behind_a_router_under_the_models_name(tmp_path: Path) -> None:
    traffic = Traffic.law(350, classes={"latency": 0.05, "bulk": 0.95})
    goal = Goal(sla_p99_ms=200, max_drop=0.01, cores=4, class_sla_ms={"latency": 6})
    best = _plan(traffic, goal)[0]
    assert best.pools
    candidates = write_synthetic_model(tmp_path / "candidates", max_batch_size=16)
    target = write_deployment(tmp_path / "deploy", candidates, best, CONFIG)
    router = RouterConfig.read(target / "synthetic" / "router.yaml")
    assert [r.when.request_class if r.when else None for r in router.routes] == \
        ["latency", None]  # what names no known class goes to the largest class's pool
    assert [r.arms[0].model for r in router.routes] == \
        [pool_name("synthetic", "latency"), pool_name("synthetic", "bulk")]
    assert router.hide_targets  # the pools answer only through the router
    repository = ModelRepository(target)
    assert repository.kind("synthetic") == "router"
    latency = repository.read("synthetic_latency").config
    assert latency.name == "synthetic_latency"
    assert latency.instance_count == 2
    assert serve_flags(best) == []
    assert pool_name("m", "a b/c") == "m_a_b_c"


def test_the_command_checks_the_class_flags(tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    model.mkdir(parents=True)
    runner = CliRunner()
    result = runner.invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                  "--class-sla", "latency=2"])
    assert result.exit_code == 2 and "no such class" in result.output
    result = runner.invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                  "--class-share", "latency=x"])
    assert result.exit_code == 1 and "NAME=NUMBER" in result.output
    result = runner.invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                  "--class-share", "a=1", "--class-share", "a=2"])
    assert result.exit_code == 1 and "names 'a' twice" in result.output
    result = runner.invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                  "--class-share", "a=0"])
    assert result.exit_code == 2 and "above 0" in result.output


def test_a_gpu_hour_price_costs_the_gpus_the_instances_use(tmp_path: Path) -> None:
    from tradeoff.plan.planner import _gpus
    from tradeoff.repository.config import parse_config_text

    gpu = parse_config_text('name: "m"\nbackend: "onnxruntime"\nmax_batch_size: 8\n'
                            'instance_group { kind: KIND_GPU count: 2 gpus: [0, 1] }\n',
                            source="test", default_name="m")
    assert _gpus(gpu) == 2
    goal = Goal(sla_p99_ms=5, max_drop=0.01, price_per_gpu_hour=3.0).on_gpus(2)
    assert goal.price is not None and goal.price.per_hour == 6.0
    assert goal.cost_per_million(1, 1000) == goal.cost_per_million(4, 1000)
    assert goal.plan_dict()["price_per_gpu_hour"] == 3.0
    with pytest.raises(InvalidValue, match="runs on the CPU"):
        _gpus(CONFIG)
    # the knobs keep the instances on the GPUs the config lists
    written = Knobs(4, 100, 3, 1, False).config(gpu.to_dict())
    assert written["instance_group"] == [{"kind": "KIND_GPU", "count": 3, "gpus": [0, 1]}]


def test_a_gpu_hour_price_for_a_cpu_model_is_one_line(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo")
    result = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate",
                                       "10", "--price-per-gpu-hour", "2"])
    assert result.exit_code == 1 and "runs on the CPU" in result.output
    assert not (tmp_path / "repo-plan-synthetic").exists()
    result = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate",
                                       "10", "--price-per-gpu-hour", "2",
                                       "--price-per-hour", "1"])
    assert result.exit_code == 2 and "give one of" in result.output
