"""Zipf input mixes and the hit ratio a cache should reach under them."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

from tradeoff.bench.mix import InputMix, RequestClass
from tradeoff.stats.popularity import first_sight_ratio, lru_hit_ratio, zipf_probabilities


def test_round_robin_has_no_order_and_says_so() -> None:
    assert InputMix().order(8, seed=0) is None
    assert InputMix().describe(8) == {"distinct_inputs": 8, "draw": "round-robin"}
    assert InputMix(1.2).describe(50) == {"distinct_inputs": 50, "draw": "zipf", "zipf_s": 1.2}


def test_draws_repeat_with_the_seed_and_follow_the_law() -> None:
    mix = InputMix(1.0)
    order = mix.order(100, seed=3)
    assert order is not None and np.array_equal(order, mix.order(100, seed=3))
    assert not np.array_equal(order, mix.order(100, seed=4))
    counts = np.bincount(order, minlength=100) / order.size
    want = zipf_probabilities(100, 1.0)
    assert np.abs(counts - want).max() < 0.005
    assert counts[0] > 1.9 * counts[1] > 2.8 * counts[2]  # 1 : 1/2 : 1/3
    uniform = InputMix(0.0).order(10, seed=0)
    assert uniform is not None
    assert np.abs(np.bincount(uniform) / uniform.size - 0.1).max() < 0.005


def _simulated_lru(order: np.ndarray, capacity: int) -> float:
    cache: OrderedDict[int, None] = OrderedDict()
    hits = 0
    for item in order.tolist():
        if item in cache:
            hits += 1
            cache.move_to_end(item)
        else:
            cache[item] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits / order.size


@pytest.mark.parametrize("s", [0.8, 1.0, 1.2])
def test_the_predicted_lru_hit_ratio_matches_a_simulated_lru(s: float) -> None:
    order = InputMix(s).order(2_000, seed=1)
    assert order is not None
    simulated = _simulated_lru(order[:100_000], 200)  # cold misses are ~1% of these
    assert lru_hit_ratio(zipf_probabilities(2_000, s), 200) == pytest.approx(simulated,
                                                                             abs=0.02)


def test_edges_of_the_prediction() -> None:
    p = zipf_probabilities(10, 1.0)
    assert lru_hit_ratio(p, 10) == 1.0 and lru_hit_ratio(p, 0) == 0.0
    assert first_sight_ratio(p, 1) == pytest.approx(1.0)
    # a cache holding everything still misses each input's first request
    order = InputMix(1.0).order(500, seed=2)
    assert order is not None
    p = zipf_probabilities(500, 1.0)
    seen = len(set(order[:5_000].tolist())) / 5_000
    assert first_sight_ratio(p, 5_000) == pytest.approx(seen, abs=0.01)
    later = len(set(order[:8_000].tolist()) - set(order[:5_000].tolist())) / 3_000
    assert first_sight_ratio(p, 3_000, before=5_000) == pytest.approx(later, abs=0.01)


def test_request_classes_parse_and_draw_by_weight() -> None:
    latency = RequestClass.parse("latency=20,class=latency,timeout=10000,fast=true,x=0.5")
    assert latency == RequestClass("latency", 20.0, {"class": "latency", "timeout": 10000,
                                                     "fast": True, "x": 0.5})
    bulk = RequestClass.parse("bulk=80")
    mix = InputMix(classes=(latency, bulk))
    order = mix.order(2 * 8, seed=1)  # 8 inputs, laid out once per class
    assert order is not None and order.min() >= 0 and order.max() < 16
    share = float((order // 8 == 0).mean())
    assert abs(share - 0.20) < 0.01
    within = order % 8
    assert np.array_equal(np.bincount(within[order // 8 == 1], minlength=8) > 0,
                          np.ones(8, bool))  # every input of a class is sent
    assert mix.describe(16)["distinct_inputs"] == 8
    assert [c["name"] for c in mix.describe(16)["classes"]] == ["latency", "bulk"]
    zipf = InputMix(1.0, (latency, bulk)).order(2 * 100, seed=1)
    assert zipf is not None and np.bincount(zipf % 100).argmax() == 0  # the most popular


@pytest.mark.parametrize("text", ["latency", "latency=0", "=5", "a=x", "a=1,class", "a=inf",
                                  "a=nan", "a=-3"])
def test_a_bad_request_class_says_how_to_write_one(text: str) -> None:
    with pytest.raises(ValueError) as caught:
        RequestClass.parse(text)
    assert "--mix" in str(caught.value)


def test_a_recorded_sequence_is_replayed_in_its_order() -> None:
    mix = InputMix(sequence=(3, 1, 1, 0, 2))
    order = mix.order(4, seed=0)
    assert order is not None
    # in order, repeated end to end; an index past the prepared inputs wraps
    assert order[:10].tolist() == [3, 1, 1, 0, 2, 3, 1, 1, 0, 2]
    assert mix.order(2, seed=0)[:5].tolist() == [1, 1, 1, 0, 0]
    assert mix.describe(4) == {"distinct_inputs": 4, "draw": "sequence",
                               "sequence_length": 5}


def test_a_recorded_class_sequence_gives_each_send_its_class_in_turn() -> None:
    classes = (RequestClass("a", 1.0, {"class": "a"}), RequestClass("b", 9.0, {"class": "b"}))
    mix = InputMix(classes=classes, sequence=(0, 1, 2), class_sequence=(1, 0, 0, 1))
    order = mix.order(2 * 3, seed=0)  # three inputs in each of two classes
    assert order is not None
    # class b's copy of an input sits three places on; the weights are not drawn
    assert order[:8].tolist() == [3, 1, 2, 3, 4, 2, 0, 4]
    assert mix.describe(6)["class_draw"] == "sequence"
    assert InputMix(classes=classes).describe(6)["class_draw"] == "weights"


def test_a_traces_classes_are_its_replays_class_sequence(tmp_path) -> None:
    import json

    from tradeoff.plan.traffic import Traffic

    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": t * 0.1, "class": c})
                               for t, c in enumerate("xyyxy")))
    traffic = Traffic.read(trace)
    names = list(traffic.classes)
    assert [names[i] for i in traffic.class_sequence()] == list("xyyxy")
    assert Traffic.law(5, classes={"x": 0.5, "y": 0.5}).class_sequence() == ()
