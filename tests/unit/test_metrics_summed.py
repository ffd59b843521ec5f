"""``/metrics`` of several front ends as one server: each family once, counters and
histograms added up, each gauge by what it measures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from tradeoff.server.metrics import families, render_summed


def front_end(successes: float, in_flight: float, cap: float, started: float,
              buckets: list[tuple[str, float]], model: str = "mlp") -> CollectorRegistry:
    class Front(Collector):
        def collect(self) -> Iterator[Metric]:
            labels = ["model", "version"]
            success = CounterMetricFamily("tradeoff_inference_request_success",
                                          "Successful inference requests", labels=labels)
            success.add_metric([model, "1"], successes)
            flight = GaugeMetricFamily("tradeoff_inference_in_flight", "In flight",
                                       labels=labels)
            flight.add_metric([model, "1"], in_flight)
            batch = GaugeMetricFamily("tradeoff_batcher_batch_cap", "Cap", labels=labels)
            batch.add_metric([model, "1"], cap)
            start = GaugeMetricFamily("process_start_time_seconds", "Start", value=started)
            latency = HistogramMetricFamily("tradeoff_request_duration_seconds", "Latency",
                                            labels=labels)
            latency.add_metric([model, "1"], buckets, sum_value=1.0)
            yield from (success, flight, batch, start, latency)

    registry = CollectorRegistry(auto_describe=False)
    registry.register(Front())
    return registry


def samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_counters_and_histograms_add_up_and_gauges_follow_their_rule() -> None:
    mine = front_end(10, 3, 32, 1000.0, [("0.1", 4), ("+Inf", 10)])
    other = front_end(5, 2, 16, 900.0, [("0.1", 1), ("+Inf", 5)])
    text = render_summed(mine, [families(other)]).decode()
    got = samples(text)
    mlp = (("model", "mlp"), ("version", "1"))
    assert got[("tradeoff_inference_request_success_total", mlp)] == 15
    assert got[("tradeoff_inference_in_flight", mlp)] == 5  # each holds its own
    assert got[("tradeoff_batcher_batch_cap", mlp)] == 32  # the executor's, alike in each
    assert got[("process_start_time_seconds", ())] == 900.0  # the earliest
    assert got[("tradeoff_request_duration_seconds_bucket",
                tuple(sorted((*mlp, ("le", "0.1")))))] == 5
    assert got[("tradeoff_request_duration_seconds_count", mlp)] == 15
    types = [line for line in text.splitlines() if line.startswith("# TYPE")]
    assert len(types) == len(set(types)) == 5


def test_a_model_only_another_front_end_serves_is_shown() -> None:
    mine = front_end(1, 0, 8, 1.0, [("+Inf", 1)])
    other = front_end(7, 1, 8, 1.0, [("+Inf", 7)], model="other")
    got = samples(render_summed(mine, [families(other), []]).decode())
    assert got[("tradeoff_inference_request_success_total",
                (("model", "other"), ("version", "1")))] == 7
    assert got[("tradeoff_inference_request_success_total",
                (("model", "mlp"), ("version", "1")))] == 1


@pytest.mark.parametrize("name", ["tradeoff_generation_requests_finished",
                                  "tradeoff_inference_exec_on_loop_count"])
def test_a_shared_processs_counts_are_shown_once(name: str) -> None:
    """A generative model's engine process, or an executor process's batcher."""
    def shared(count: float) -> CollectorRegistry:
        class Shared(Collector):
            def collect(self) -> Iterator[Metric]:
                family = CounterMetricFamily(name, "Counted there", labels=["model"])
                family.add_metric(["m"], count)
                yield family

        registry = CollectorRegistry(auto_describe=False)
        registry.register(Shared())
        return registry

    # two front ends read the same process's count, one a moment later
    got = samples(render_summed(shared(40), [families(shared(41))]).decode())
    assert got[(f"{name}_total", (("model", "m"),))] == 41
