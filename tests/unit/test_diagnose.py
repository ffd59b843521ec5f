"""Every diagnosis rule on a result that shows its symptom and on one that does not."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from tradeoff.analysis.diagnose import diagnose
from tradeoff.cli import main
from tradeoff.results import BenchResult, ResultDocument, SoakResult, SweepResult, Window, load_as

from .result_factory import bench_result, sweep_result

DATA = Path(__file__).parent.parent / "data" / "results"


def rules(document: ResultDocument) -> set[str]:
    return {f.rule for f in diagnose(document)}


def healthy() -> BenchResult:
    return bench_result()


def test_a_healthy_result_has_no_warnings() -> None:
    findings = diagnose(healthy())
    assert [f.rule for f in findings] == ["compute_bound"]
    assert findings[0].severity == "info"


def test_long_tail() -> None:
    assert "long_tail" in rules(bench_result(p50=2.0, p99=8.0))
    severe = [f for f in diagnose(bench_result(p50=1.0, p99=12.0)) if f.rule == "long_tail"]
    assert severe[0].severity == "critical"
    assert severe[0].evidence["ratio"] == pytest.approx(12.0)
    assert "long_tail" not in rules(bench_result(p50=5.0, p99=8.0))


def window(index: int, p99: float) -> dict:
    return {"index": index, "duration_s": 1.0, "completed": 100, "errors": 0,
            "throughput_rps": 100.0, "p50_ms": 2.0, "p99_ms": p99}


def test_periodic_latency_spikes() -> None:
    spiky = [window(i, 20.0 if i % 3 == 2 else 5.0) for i in range(9)]
    found = [f for f in diagnose(bench_result(windows=spiky)) if f.rule == "latency_spikes"]
    assert found and found[0].evidence["periodic"] is True
    assert found[0].evidence["windows"] == [2, 5, 8]
    even = [window(i, 5.0 + 0.1 * i) for i in range(9)]
    assert "latency_spikes" not in rules(bench_result(windows=even))


def test_queue_bound_vs_compute_bound() -> None:
    assert "queue_bound" in rules(bench_result(queue=4.0, compute=1.0))
    assert "compute_bound" in rules(bench_result(queue=0.5, compute=3.0))
    assert not {"queue_bound", "compute_bound"} & rules(bench_result(queue=None, compute=None))


def test_overhead_bound() -> None:
    assert "overhead_bound" in rules(bench_result(queue=0.1, compute=0.4, latency_mean=3.0))
    assert "overhead_bound" not in rules(bench_result(queue=1.0, compute=3.0,
                                                      latency_mean=4.5))


def test_client_bound() -> None:
    assert "client_bound" in rules(bench_result(client_bound=True))
    assert "client_bound" not in rules(healthy())


def test_cold_start() -> None:
    found = [f for f in diagnose(bench_result(cold_start=400.0, p50=5.0))
             if f.rule == "cold_start"]
    assert found and found[0].evidence["cold_start_ms"] == 400.0
    assert "cold_start" not in rules(bench_result(cold_start=20.0, p50=5.0))


def test_unstable_measurement() -> None:
    assert "unstable_measurement" in rules(bench_result(stable=False))
    assert "unstable_measurement" not in rules(bench_result(stable=True))
    assert "unstable_measurement" not in rules(bench_result(stable=None))


def test_errors() -> None:
    assert "errors" in rules(bench_result(errors=500))
    assert "errors" not in rules(bench_result(errors=5))


def linear_sweep(executions_equal_requests: bool | None) -> SweepResult:
    points = []
    for c in (1, 2, 4, 8, 16):
        executions = None if executions_equal_requests is None else (
            10_000 if executions_equal_requests else 10_000 // c)
        points.append(bench_result(load=c, throughput=200.0 * (1 + 0.01 * c), p50=5.0 * c,
                                   p99=6.0 * c, executions=executions))
    return sweep_result(points)


def test_no_batching_from_a_flat_curve_and_one_execution_per_request() -> None:
    found = [f for f in diagnose(linear_sweep(True)) if f.rule == "no_batching"]
    assert found and found[0].severity == "critical"
    assert found[0].evidence["executions_per_request"] == [1.0] * 4
    assert found[0].evidence["knee_load"] == 1
    assert "no_batching" in rules(linear_sweep(None))  # the curve alone shows it


def test_answers_mostly_from_the_server_cache_are_named_with_how_inputs_repeated() -> None:
    robin = {"distinct_inputs": 8, "draw": "round-robin"}
    found = [f for f in diagnose(bench_result(executions=600, cache_hits=9_000,
                                              input_mix=robin)) if f.rule == "cached_answers"]
    assert found and found[0].severity == "warning"
    assert "90%" in found[0].title and "8 inputs sent round-robin" in found[0].title
    assert "--distinct-inputs" in found[0].action and '"cache": false' in found[0].action
    zipf = {"distinct_inputs": 1000, "draw": "zipf", "zipf_s": 1.0}
    found = [f for f in diagnose(bench_result(executions=4_000, cache_hits=6_000,
                                              input_mix=zipf)) if f.rule == "cached_answers"]
    assert found and found[0].severity == "info"  # asked for: realistic repetition
    assert "cached_answers" not in rules(bench_result(executions=8_000, cache_hits=2_000))
    assert "cached_answers" not in rules(bench_result(executions=8_000))  # no cache


def test_cache_hits_do_not_count_as_shared_batches() -> None:
    """Requests answered from the cache ran nothing: executions per computed request."""
    points = [bench_result(load=c, throughput=200.0 * (1 + 0.01 * c), p50=5.0 * c,
                           p99=6.0 * c, executions=5_000, cache_hits=5_000)
              for c in (1, 2, 4, 8, 16)]
    found = [f for f in diagnose(sweep_result(points)) if f.rule == "no_batching"]
    assert found and found[0].evidence["executions_per_request"] == [1.0] * 4


def test_no_batching_not_claimed_when_requests_shared_executions() -> None:
    assert "no_batching" not in rules(linear_sweep(False))


def test_a_batching_server_that_saturates_late_is_not_called_unbatched() -> None:
    points = [bench_result(load=c, throughput=t, p50=c / t * 1000, p99=2 * c / t * 1000)
              for c, t in ((1, 1000), (2, 1600), (4, 2400), (8, 3000), (16, 3500),
                           (32, 3550), (64, 3560))]
    assert "no_batching" not in rules(sweep_result(points))


def test_no_batching_not_claimed_when_throughput_grows() -> None:
    points = [bench_result(load=c, throughput=200.0 * c, p50=5.0, p99=6.0)
              for c in (1, 2, 4, 8)]
    assert "no_batching" not in rules(sweep_result(points))


def test_saturation() -> None:
    falling = [bench_result(load=c, throughput=t, p50=c * 1.0, p99=c * 2.0)
               for c, t in ((1, 500), (2, 900), (4, 1000), (8, 700))]
    found = [f for f in diagnose(sweep_result(falling)) if f.rule == "saturation"]
    assert found and found[0].evidence["best_load"] == 4
    erroring = [bench_result(load=c, throughput=t, errors=e)
                for c, t, e in ((1, 500, 0), (2, 900, 0), (4, 990, 900))]
    found = [f for f in diagnose(sweep_result(erroring)) if f.rule == "saturation"]
    assert found and found[0].severity == "critical"
    growing = [bench_result(load=c, throughput=300.0 * c) for c in (1, 2, 4)]
    assert "saturation" not in rules(sweep_result(growing))


def test_findings_come_most_severe_first_and_name_their_subject() -> None:
    findings = diagnose(bench_result(errors=900, p50=1.0, p99=4.0, name="resnet"))
    severities = [f.severity for f in findings]
    order = {"critical": 0, "warning": 1, "info": 2}
    assert severities == sorted(severities, key=order.__getitem__)
    assert {f.subject for f in findings} == {"resnet"}
    assert all(f.action for f in findings)


def test_unknown_documents_are_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"schema": "something/1"}))
    result = CliRunner().invoke(main, ["diagnose", str(path)])
    assert result.exit_code == 1
    assert result.output.startswith(f"Error: {path}: not a tradeoff result")
    assert len(result.output.splitlines()) == 1


def test_no_batching_with_throughput_that_still_scales_is_only_information() -> None:
    points = [bench_result(load=c, throughput=200.0 * c, p50=5.0, p99=6.0, executions=10_000)
              for c in (1, 2, 4, 8)]
    found = [f for f in diagnose(sweep_result(points)) if f.rule == "no_batching"]
    assert found and found[0].severity == "info"


def test_soak_reasons_become_findings() -> None:
    from tradeoff.bench.soak import verdict

    windows = [Window(index=i, duration_s=60.0, completed=1000, errors=0, throughput_rps=100.0,
                      p50_ms=5.0, p99_ms=10.0 + i) for i in range(8)]
    soak = load_as(SoakResult, DATA / "soak.json")
    soak = dataclasses.replace(soak, endpoint={"model": "m"}, verdict=verdict(windows, []))
    found = diagnose(soak)
    assert [f.rule for f in found] == ["soak_drift"]
    assert found[0].severity == "critical" and found[0].subject == "m"
    steady = [dataclasses.replace(w, p99_ms=10.0) for w in windows]
    assert diagnose(dataclasses.replace(soak, verdict=verdict(steady, []))) == []


def test_an_optimized_version_over_the_max_drop_or_slower_is_a_finding() -> None:
    from tradeoff.results import OptimizeResult, OutputAccuracy, VersionReport

    def version(number: int, precision: str, p50: float, best: float,
                cosine: float | None) -> VersionReport:
        accuracy = [] if cosine is None else [OutputAccuracy(
            "embedding", "embedding", 64, {"cosine_mean": cosine, "cosine_min": cosine},
            1 - cosine)]
        return VersionReport(number, precision, "m", 100, {"p50": p50}, {1: best},
                             accuracy, created=number > 1)

    result = OptimizeResult("minilm", "repo", 1, {"source": "s", "samples": 64}, None, 0.01,
                            {}, [version(1, "fp32", 6.0, 200.0, None),
                                 version(2, "int8", 3.0, 400.0, 0.995),
                                 version(3, "int8", 3.5, 450.0, 0.96),
                                 version(4, "fp16", 7.0, 150.0, 0.9999)])
    findings = {(f.rule, f.subject) for f in diagnose(result)}
    assert findings == {("optimize_accuracy_drop", "minilm v3 (int8)"),
                        ("optimize_not_faster", "minilm v4 (fp16)")}


def test_a_cached_run_is_neither_queue_nor_compute_bound() -> None:
    """A fully cached run used to read 'compute-bound: 0.00 ms of compute vs 0.00 ms
    queued'."""
    found = rules(bench_result(queue=0.0, compute=0.0, executions=10, cache_hits=9_990))
    assert "compute_bound" not in found and "queue_bound" not in found
    assert "cached_answers" in found
    assert "compute_bound" in rules(bench_result(queue=0.5, compute=3.0))
