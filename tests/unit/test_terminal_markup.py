"""Result files are shared between people and an endpoint chooses its own error text: a
string from either reaches the terminal tables as text, never as rich markup (a stray
closing tag stopped the printer with a traceback, an opening one restyled or linked what
followed), while the tables' own markup still renders."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from itertools import cycle
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from tradeoff.analysis.diagnose import diagnose
from tradeoff.bench.scrape import GenerationRow, ModelRow
from tradeoff.report.terminal import (
    live_view,
    print_batch_size_tune,
    print_bench_result,
    print_compare,
    print_findings,
    print_optimize,
    print_plan,
    print_ranking,
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
    load_result,
)

from .result_factory import RESULT_FILES, with_payloads

PAYLOADS = ("[/x]", "[bold red]boom[/]", "[link=https://example.invalid]click[/link]")
# dicts whose keys are names from outside too: error classes, facts, SLO metrics, classes
KEYED = {"errors_by_class", "facts", "slo", "classes"}
PRINTERS: dict[type, Callable[[Any, Console], None]] = {
    BenchResult: print_bench_result, SweepResult: print_sweep, SoakResult: print_soak,
    CompareResult: print_compare, OptimizeResult: print_optimize,
    BatchSizeTune: print_batch_size_tune, ServeTune: print_serve_tune, PlanResult: print_plan}


def _poisoned(value: Any, payloads: Any, seen: dict[str, str]) -> Any:
    """Every string led by a payload and ended by a backslash (which would escape a
    closing tag printed after it); names from outside used as keys too."""
    return with_payloads(value, payloads, seen, form="{payload} {value}\\",
                         keyed=frozenset(KEYED))


def _widened(data: dict[str, Any]) -> dict[str, Any]:
    """A bench document that also draws the lines a plain run leaves out: notes, a client
    that could not keep up, errors by class, unstable windows."""
    if data["schema"] == "tradeoff.bench/1":
        data["client"].update(notes=["the endpoint answered: overloaded"],
                              reasons=["client CPU 99% > 90%"], client_bound=True)
        data["summary"]["errors_by_class"] = {"http_503": 2, "too_large": 1}
        data["stable"] = False
    return data


def _console() -> Console:
    return Console(file=io.StringIO(), width=200)


def _text(console: Console) -> str:
    out = console.file
    assert isinstance(out, io.StringIO)
    return out.getvalue()


def _assert_literal(text: str) -> None:
    """Every payload that reached the screen reads as written; no markup of the tables'
    own was shown as text instead of rendered (as it is when a string before it ends in
    a backslash that escapes its closing tag)."""
    assert any(p in text for p in PAYLOADS), text
    assert text.count("boom") == text.count("red]boom[/]"), text
    assert text.count("click") == text.count("]click[/link]"), text
    assert set(re.findall(r"\[/[^\]]*\]", text)) <= {"[/x]", "[/]", "[/link]"}, text
    assert text.count("[/]") == text.count("boom[/]"), text


@pytest.mark.parametrize("path", RESULT_FILES, ids=[p.name for p in RESULT_FILES])
def test_every_string_of_a_result_reaches_the_terminal_as_text(path: Path) -> None:
    payloads, seen = cycle(PAYLOADS), dict[str, str]()
    document = load_result(_poisoned(_widened(json.loads(path.read_text())), payloads, seen),
                           path.name)
    console = _console()
    PRINTERS[type(document)](document, console)
    if isinstance(document, SweepResult) and document.ranking:
        print_ranking(document.ranking, document.score, console)
    print_findings(diagnose(document), console)
    _assert_literal(_text(console))


def test_all_payloads_reach_the_terminal_across_the_results() -> None:
    payloads, seen = cycle(PAYLOADS), dict[str, str]()
    console = _console()
    for path in RESULT_FILES:
        document = load_result(
            _poisoned(_widened(json.loads(path.read_text())), payloads, seen), path.name)
        PRINTERS[type(document)](document, console)
    text = _text(console)
    _assert_literal(text)
    assert all(p in text for p in PAYLOADS), text
    assert "the endpoint answered: overloaded" in text


def test_a_hostile_server_names_its_models_as_it_likes_in_the_live_view() -> None:
    """``tradeoff top`` draws the names a server's metrics carry."""
    console = _console()
    models = [ModelRow(model=f"{p} m\\", version=f"{p} 1", requests_per_s=1.0,
                       failures_per_s=0.5, inferences_per_s=2.0, executions_per_s=1.0,
                       p50_ms=1.0, p99_ms=2.0, queue_depth=0.0, in_flight=1.0)
               for p in PAYLOADS]
    generations = [GenerationRow(model=f"{p} llm\\", output_tokens_per_s=10.0,
                                 requests_per_s=1.0, running=1.0, waiting=0.0, kv_usage=0.5,
                                 ttft_p50_ms=1.0, ttft_p99_ms=2.0) for p in PAYLOADS]
    console.print(live_view(models, generations, f"{PAYLOADS[1]} http://server\\",
                            window=PAYLOADS[0]))
    text = _text(console)
    _assert_literal(text)
    assert all(p in text for p in PAYLOADS), text
