"""Readings of /metrics: rates between two, histogram quantiles, rows per model."""

from __future__ import annotations

import pytest

from tradeoff.bench.scrape import live_rows, metrics_url, parse, quantile

BEFORE = """
# TYPE tradeoff_inference_request_success counter
tradeoff_inference_request_success_total{model="mlp",version="1"} 100
# TYPE tradeoff_inference_request_failure counter
tradeoff_inference_request_failure_total{model="mlp",version="1",reason="REJECTED"} 0
tradeoff_inference_request_failure_total{model="mlp",version="1",reason="BACKEND"} 1
# TYPE tradeoff_inference_count counter
tradeoff_inference_count_total{model="mlp",version="1"} 100
# TYPE tradeoff_inference_exec_count counter
tradeoff_inference_exec_count_total{model="mlp",version="1"} 50
# TYPE tradeoff_inference_queue_depth gauge
tradeoff_inference_queue_depth{model="mlp",version="1"} 0
# TYPE tradeoff_inference_in_flight gauge
tradeoff_inference_in_flight{model="mlp",version="1"} 0
# TYPE tradeoff_model_ready gauge
tradeoff_model_ready{model="mlp",version="1"} 1
# TYPE tradeoff_inference_request_duration_seconds histogram
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="0.001"} 50
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="0.01"} 100
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="+Inf"} 100
tradeoff_inference_request_duration_seconds_count{model="mlp",version="1"} 100
tradeoff_inference_request_duration_seconds_sum{model="mlp",version="1"} 0.3
# TYPE tradeoff_generation_requests_running gauge
tradeoff_generation_requests_running{model="llm"} 0
# TYPE tradeoff_generation_generation_tokens counter
tradeoff_generation_generation_tokens_total{model="llm"} 1000
"""

AFTER = """
# TYPE tradeoff_inference_request_success counter
tradeoff_inference_request_success_total{model="mlp",version="1"} 300
# TYPE tradeoff_inference_request_failure counter
tradeoff_inference_request_failure_total{model="mlp",version="1",reason="REJECTED"} 4
tradeoff_inference_request_failure_total{model="mlp",version="1",reason="BACKEND"} 1
# TYPE tradeoff_inference_count counter
tradeoff_inference_count_total{model="mlp",version="1"} 300
# TYPE tradeoff_inference_exec_count counter
tradeoff_inference_exec_count_total{model="mlp",version="1"} 75
# TYPE tradeoff_inference_queue_depth gauge
tradeoff_inference_queue_depth{model="mlp",version="1"} 7
# TYPE tradeoff_inference_in_flight gauge
tradeoff_inference_in_flight{model="mlp",version="1"} 9
# TYPE tradeoff_model_ready gauge
tradeoff_model_ready{model="mlp",version="1"} 1
# TYPE tradeoff_inference_request_duration_seconds histogram
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="0.001"} 50
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="0.01"} 250
tradeoff_inference_request_duration_seconds_bucket{model="mlp",version="1",le="+Inf"} 300
tradeoff_inference_request_duration_seconds_count{model="mlp",version="1"} 300
tradeoff_inference_request_duration_seconds_sum{model="mlp",version="1"} 2.0
# TYPE tradeoff_generation_requests_running gauge
tradeoff_generation_requests_running{model="llm"} 3
# TYPE tradeoff_generation_generation_tokens counter
tradeoff_generation_generation_tokens_total{model="llm"} 1500
"""


def test_rates_percentiles_and_gauges_over_two_readings() -> None:
    models, generations = live_rows(parse(BEFORE, at=10.0), parse(AFTER, at=12.0))
    (mlp,) = models
    assert (mlp.model, mlp.version) == ("mlp", "1")
    assert mlp.requests_per_s == 100.0 and mlp.failures_per_s == 2.0
    assert mlp.inferences_per_s == 100.0 and mlp.executions_per_s == 12.5
    assert mlp.mean_batch == 8.0
    assert (mlp.queue_depth, mlp.in_flight) == (7, 9)
    # the interval's 200 requests: 150 in (1 ms, 10 ms], 50 past 10 ms
    assert mlp.p50_ms == pytest.approx(1 + 9 * 100 / 150)
    assert mlp.p99_ms == pytest.approx(10.0)  # past the last finite bound: the bound
    (llm,) = generations
    assert llm.output_tokens_per_s == 250.0 and llm.running == 3
    assert llm.ttft_p50_ms is None  # no histogram, nothing made up


def test_quantile_of_an_empty_interval_and_a_counter_reset() -> None:
    assert quantile(0.5, {1.0: 5, float("inf"): 5}, {1.0: 5, float("inf"): 5}) is None
    assert quantile(0.5, {}, {0.5: 10, 1.0: 20, float("inf"): 20}) == pytest.approx(0.5)
    models, _ = live_rows(parse(AFTER, at=0.0), parse(BEFORE, at=1.0))  # a restart
    assert models[0].requests_per_s == 0.0


@pytest.mark.parametrize(("given", "url"), [
    ("127.0.0.1:8002", "http://127.0.0.1:8002/metrics"),
    ("http://h:8002/", "http://h:8002/metrics"),
    ("http://h:8002/metrics", "http://h:8002/metrics"),
])
def test_metrics_url(given: str, url: str) -> None:
    assert metrics_url(given) == url
