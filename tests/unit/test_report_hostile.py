"""Result files are shared between people: a string in one reaches the HTML report as text
and a plot label as text, never as markup or mathtext, and a field of the wrong type is
refused by name when the file is read."""

from __future__ import annotations

import dataclasses
import json
from html.parser import HTMLParser
from itertools import cycle
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.errors import ResultFormatError
from tradeoff.results import (
    BatchSizeTune,
    BenchResult,
    CompareResult,
    ServeTune,
    load_as,
    load_result,
)

from .result_factory import RESULT_FILES, RESULTS, with_payloads

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(2)>'
PAYLOADS = (SCRIPT, IMG, "'><svg onload=alert(3)>", "</script><!--",
            "<details open ontoggle='alert(4)'>x</details>")
MATHTEXT = "$\\foo$"  # mathtext knows no \foo: parsed, it stopped the whole report


class _Markup(HTMLParser):
    """Every element and attribute of a page, and the text of its scripts."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, list[tuple[str, str | None]]]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, attrs))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag: str) -> None:
        self._in_script = False

    def handle_data(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data

    def handle_comment(self, data: str) -> None:
        if self._in_script:
            self.scripts[-1] += data


def _assert_inert(page: str) -> None:
    """Only the report's own script, no handler attribute, no element a payload brings."""
    from tradeoff.report.html import RENDER_CHECK

    markup = _Markup()
    markup.feed(page)
    markup.close()
    assert markup.scripts == [RENDER_CHECK]
    tags = {tag for tag, _ in markup.tags}
    assert not tags & {"img", "details", "iframe", "object", "embed"}, tags
    assert sum(tag == "svg" for tag, _ in markup.tags) == page.count("<figure class=\"plot\"")
    for tag, attrs in markup.tags:
        for name, value in attrs:
            # a payload inside a quoted value is text; one that broke out is an attribute
            assert not name.startswith("on") and name not in {"src", "open"}, (tag, name)
            assert not (value or "").lstrip().lower().startswith("javascript:"), (tag, value)


def test_every_string_of_every_result_reaches_the_html_as_text() -> None:
    pytest.importorskip("matplotlib")
    from tradeoff.report.html import build_report

    payloads, seen = cycle(PAYLOADS), dict[str, str]()
    documents = [load_result(with_payloads(json.loads(p.read_text()), payloads, seen,
                                           form=f"{{payload}} {MATHTEXT} {{value}}"), p.name)
                 for p in RESULT_FILES]
    page, _ = build_report(documents, title=SCRIPT)
    _assert_inert(page)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_numbers_of_the_wrong_type_built_in_code_are_still_escaped() -> None:
    """The report escapes what it is given even where the reader would have refused it."""
    pytest.importorskip("matplotlib")
    from tradeoff.report.html import build_report

    batch = load_as(BatchSizeTune, RESULTS / "tune-batch-size.json")
    serve = load_as(ServeTune, RESULTS / "tune-serve.json")
    bench = load_as(BenchResult, RESULTS / "bench-openai.json")
    generation = bench.summary.generation
    assert generation is not None
    length = dataclasses.replace(generation.output_length, honoured=False, shorter=SCRIPT,
                                 longer=IMG)
    bench = dataclasses.replace(bench, summary=dataclasses.replace(
        bench.summary, generation=dataclasses.replace(generation, output_length=length)))
    page, _ = build_report([dataclasses.replace(batch, recommended=SCRIPT),
                            dataclasses.replace(serve, grid_size=IMG), bench])
    _assert_inert(page)


def test_an_endpoint_named_like_mathtext_is_drawn_as_written() -> None:
    pytest.importorskip("matplotlib")
    from tradeoff.report import plots

    compare = load_as(CompareResult, RESULTS / "compare.json")
    names = {"batched": "$\\foo$", "nobatch": "$x^{$ costs $5"}
    renamed = dataclasses.replace(
        compare, baseline=names[compare.baseline],
        endpoints=[dataclasses.replace(e, name=names[e.name]) for e in compare.endpoints],
        ratios=[dataclasses.replace(r, name=names[r.name]) for r in compare.ratios])
    svg = plots.to_svg(plots.comparison(renamed))
    assert "$\\foo$" in svg and "$x^{$ costs $5" in svg


def test_a_model_named_like_a_path_keeps_its_png_in_the_folder(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from tradeoff.report.html import build_report

    batch = load_as(BatchSizeTune, RESULTS / "tune-batch-size.json")
    _, report = build_report([dataclasses.replace(batch, model="../../outside/m")],
                             png_dir=tmp_path / "png")
    assert report.pngs and all(p.parent == tmp_path / "png" and p.exists()
                               for p in report.pngs)


def _with(path: Path, keys: list[str | int], value: Any) -> dict[str, Any]:
    data = json.loads(path.read_text())
    node = data
    for key in keys[:-1]:
        node = node[key]
    node[keys[-1]] = value
    return data  # type: ignore[no-any-return]


WRONG = [
    ("tune-batch-size.json", ["recommended"], SCRIPT, "recommended: expected an integer"),
    ("tune-serve.json", ["grid_size"], SCRIPT, "grid_size: expected an integer"),
    ("bench-openai.json", ["summary", "output_length", "shorter"], SCRIPT,
     "summary.output_length.shorter: expected an integer"),
    ("bench-openai.json", ["summary", "output_length", "honoured"], "yes",
     "summary.output_length.honoured: expected true or false"),
    ("tune-serve.json", ["elapsed_s"], "34", "elapsed_s: expected a number"),
    ("tune-serve.json", ["grid_size"], True, "grid_size: expected an integer"),
    ("tune-serve.json", ["model"], 7, "model: expected a string"),
    ("sweep.json", ["rows", 1, "load"], [], "rows[1].load: expected a number"),
    ("sweep.json", ["points", 0, "summary", "latency_ms", "p99"], SCRIPT,
     "points[0].summary.latency_ms.p99: expected a number"),
    ("optimize.json", ["versions", 0, "throughput_by_batch"], {"one": 1.0},
     "versions[0].throughput_by_batch: key 'one' is not an integer"),
    ("soak.json", ["memory", "samples", 0], [1.0, SCRIPT],
     "memory.samples[0][1]: expected a number"),
    ("compare.json", ["fairness", "checks"], {"a": 1}, "fairness.checks: expected a list"),
]


@pytest.mark.parametrize(("name", "keys", "value", "message"), WRONG,
                         ids=[f"{n}:{'.'.join(map(str, k))}" for n, k, _, _ in WRONG])
def test_a_field_of_the_wrong_type_is_refused_by_name(name: str, keys: list[str | int],
                                                       value: Any, message: str) -> None:
    with pytest.raises(ResultFormatError) as caught:
        load_result(_with(RESULTS / name, keys, value), name)
    text = str(caught.value)
    assert text.startswith(f"{name}.") and message in text, text
    assert "\n" not in text


@pytest.mark.parametrize("keys", [["recommended"], ["points", 0, "batch_size"]])
def test_the_report_command_refuses_a_wrong_typed_field_in_one_line(
        tmp_path: Path, keys: list[str | int]) -> None:
    bad = tmp_path / "shared.json"
    bad.write_text(json.dumps(_with(RESULTS / "tune-batch-size.json", keys, SCRIPT)))
    run = CliRunner().invoke(main, ["report", str(bad), "-o", str(tmp_path / "r.html")])
    assert run.exit_code == 1, run.output
    assert run.exception is None or isinstance(run.exception, SystemExit), run.exception
    lines = run.output.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in run.output, run.output
    field = ".".join(map(str, keys)).replace(".0.", "[0].")
    assert lines[0].startswith(f"Error: {bad}.{field}: expected an integer"), lines[0]
    assert not (tmp_path / "r.html").exists()
