"""The one reader and writer of result documents: files written before the result types
load, write back the same JSON, and every consumer accepts them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console

import tradeoff
from tradeoff.analysis.compare import compare_results
from tradeoff.analysis.diagnose import diagnose
from tradeoff.errors import ResultFormatError, TradeoffError
from tradeoff.report.terminal import (
    print_batch_size_tune,
    print_bench_result,
    print_compare,
    print_optimize,
    print_plan,
    print_serve_tune,
    print_soak,
    print_sweep,
)
from tradeoff.results import (
    BatchSizeTune,
    BenchResult,
    CompareResult,
    OptimizeResult,
    PlanResult,
    ServeTune,
    SoakResult,
    SweepResult,
    load_as,
    load_result,
    write_json,
)

from .result_factory import RESULT_FILES, RESULTS

KINDS = {"bench-tensor": BenchResult, "bench-openai": BenchResult, "bench-mix": BenchResult,
         "sweep": SweepResult, "sweep-sla": SweepResult, "soak": SoakResult,
         "compare": CompareResult, "optimize": OptimizeResult,
         "tune-batch-size": BatchSizeTune, "tune-serve": ServeTune, "plan": PlanResult,
         "plan-generative-classes": PlanResult}


def _text(document: object) -> str:
    # NaN and key order written alike on both sides
    return json.dumps(document, sort_keys=True)


def test_there_is_a_fixture_of_every_kind() -> None:
    assert {p.stem for p in RESULT_FILES} == set(KINDS)


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_fixture_loads_and_writes_back_the_same_json(path: Path, tmp_path: Path) -> None:
    document = load_result(path)
    assert isinstance(document, KINDS[path.stem])
    assert _text(document.to_dict()) == _text(json.loads(path.read_text()))
    write_json(document, tmp_path / "copy.json")
    assert _text(json.loads((tmp_path / "copy.json").read_text())) == \
        _text(json.loads(path.read_text()))
    assert load_result(json.loads(path.read_text())) == document


def test_typed_fields_of_the_fixtures() -> None:
    llm = load_as(BenchResult, RESULTS / "bench-openai.json")
    assert llm.summary.generation is not None
    assert llm.summary.generation.output_length.honoured
    assert llm.summary.generation.slo == {"ttft_ms": 150.0, "tpot_ms": 30.0}
    tensor = load_as(BenchResult, RESULTS / "bench-tensor.json")
    assert tensor.summary.generation is None and tensor.label == "tiny"
    assert tensor.windows[0].server_ms is not None
    sweep = load_as(SweepResult, RESULTS / "sweep.json")
    assert [r.load for r in sweep.rows] == [1, 2] and all(r.priced for r in sweep.rows)
    assert sweep.point_at(2) is sweep.points[1]
    compare = load_as(CompareResult, RESULTS / "compare.json")
    assert compare.fairness.interleaved and compare.endpoints[0].result.merged_rounds == 2
    assert compare.ratios_of("nobatch").metrics["p99"].ci95 is not None
    soak = load_as(SoakResult, RESULTS / "soak.json")
    assert soak.verdict.stable and len(soak.result.windows) == 7


@pytest.mark.parametrize("path", RESULT_FILES, ids=lambda p: p.stem)
def test_consumers_accept_every_fixture(path: Path) -> None:
    document = load_result(path)
    assert isinstance(diagnose(document), list)
    console = Console(record=True, width=160)
    printer = {BenchResult: print_bench_result, SweepResult: print_sweep,
               SoakResult: print_soak, CompareResult: print_compare,
               OptimizeResult: print_optimize, BatchSizeTune: print_batch_size_tune,
               ServeTune: print_serve_tune, PlanResult: print_plan}[type(document)]
    printer(document, console)  # type: ignore[operator]
    assert console.export_text()


def test_html_report_of_every_fixture() -> None:
    pytest.importorskip("matplotlib")
    from tradeoff.report.html import build_report

    page, _ = build_report([load_result(p) for p in RESULT_FILES])
    assert "Sweep over concurrency" in page and "Soak" in page and "Comparison" in page
    assert "Plan for mlp" in page and "Levers" in page


def test_compare_of_two_bench_fixtures() -> None:
    compare = compare_results([("tensor", load_as(BenchResult, RESULTS / "bench-tensor.json")),
                               ("llm", load_as(BenchResult, RESULTS / "bench-openai.json"))])
    assert [e.name for e in compare.endpoints] == ["tensor", "llm"]
    assert _text(load_result(compare.to_dict()).to_dict()) == _text(compare.to_dict())


def test_unknown_schema_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(json.dumps({"schema": "tradeoff.bench/9"}))
    with pytest.raises(ResultFormatError, match=r"odd\.json: not a tradeoff result .*bench/9"):
        load_result(path)


def test_missing_field_names_the_file_and_field(tmp_path: Path) -> None:
    document = json.loads((RESULTS / "sweep.json").read_text())
    del document["points"][1]["summary"]["throughput_rps"]
    path = tmp_path / "cut.json"
    path.write_text(json.dumps(document))
    with pytest.raises(ResultFormatError,
                       match=r"cut\.json\.points\[1\]\.summary: field 'throughput_rps'"):
        load_result(path)


def test_a_file_that_is_not_json_is_named(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text("{")
    with pytest.raises(ResultFormatError, match=r"broken\.json: not a readable JSON result"):
        load_result(path)


def test_load_as_refuses_another_kind() -> None:
    with pytest.raises(ResultFormatError, match=r"sweep\.json: a tradeoff\.sweep/1 document, not"):
        load_as(BenchResult, RESULTS / "sweep.json")


def test_a_format_error_is_in_the_error_tree_and_a_value_error() -> None:
    assert issubclass(ResultFormatError, TradeoffError)
    assert issubclass(ResultFormatError, ValueError)
    assert tradeoff.ResultFormatError is ResultFormatError


def test_a_certain_but_tiny_memory_trend_is_not_called_growth() -> None:
    """A soak printed '+0.0 MiB (p=0.005)' and called it stable without a word."""
    from tradeoff.report.terminal import soak_memory_text

    tiny = soak_memory_text({"growth_mib": 0.0012, "p_value": 0.005, "direction": "up"},
                            flagged=False)
    assert "+1 KiB" in tiny and "too small to matter" in tiny
    leak = soak_memory_text({"growth_mib": 40.0, "p_value": 0.001, "direction": "up"},
                            flagged=True)
    assert "+40.0 MiB" in leak and "unstable" in leak
    flat = soak_memory_text({"growth_mib": 0.3, "p_value": 0.4, "direction": "none"},
                            flagged=False)
    assert "no trend" in flat


def test_findings_say_which_result_they_came_from() -> None:
    pytest.importorskip("matplotlib")
    from tradeoff.report.html import build_report

    page, _ = build_report([load_result(RESULTS / "bench-tensor.json"),
                            load_result(RESULTS / "sweep.json")])
    findings = page.split("Findings")[1]
    assert "bench #1" in findings and "sweep #2" in findings
