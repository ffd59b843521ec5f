"""Traces written by whoever sent the traffic: every malformed one is one line naming the
file and the line, class names are plain words, and memory stays a few bytes a request."""

from __future__ import annotations

import json
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from tradeoff.bench.mix import RequestClass
from tradeoff.errors import InvalidValue
from tradeoff.plan import traffic as traffic_module
from tradeoff.plan.traffic import Traffic


def _jsonl(path: Path, *entries: dict) -> Path:
    path.write_text("\n".join(json.dumps(entry) for entry in entries) + "\n")
    return path


@pytest.mark.parametrize("name", ["bulk\n%x ;touch PWNED\n---\n#", "a b", "", "x" * 65,
                                  "$(id)", "caf\u00e9", 7])
def test_a_class_that_is_not_a_plain_name_is_refused_with_its_line(tmp_path: Path,
                                                                     name: object) -> None:
    path = _jsonl(tmp_path / "t.jsonl", {"timestamp": 0, "class": "ok"},
                  {"timestamp": 1, "class": name})
    with pytest.raises(InvalidValue, match=r"t\.jsonl:2: .*(plain name|must be a string)"):
        Traffic.read(path)


def test_classes_that_would_share_a_pool_are_refused_when_read(tmp_path: Path) -> None:
    path = _jsonl(tmp_path / "t.jsonl", {"timestamp": 0, "class": "Bulk"},
                  {"timestamp": 1, "class": "bulk"}, {"timestamp": 2, "class": "bulk"})
    with pytest.raises(InvalidValue, match="'Bulk' and 'bulk' differ only in letter case"):
        Traffic.read(path)
    with pytest.raises(InvalidValue, match=r"--class-share: .*'a b'"):
        Traffic.law(100, classes={"a b": 1, "a_b": 1})


def test_mix_classes_are_plain_names() -> None:
    assert RequestClass.parse("latency=20,class=latency").name == "latency"
    with pytest.raises(InvalidValue, match="plain name"):
        RequestClass.parse("bulk;rm=80")
    with pytest.raises(InvalidValue, match="plain name"):
        RequestClass.parse("bulk=80,class=a b")


@pytest.mark.parametrize("lines, problem", [
    (['{"timestamp": 0}', '{"timestamp": Infinity}'], r"t\.jsonl:2: not JSON"),
    (['{"timestamp": 0}', '{"timestamp": 1e400}'], r"t\.jsonl:2: not JSON .*infinity"),
    (['{"timestamp": 0}', '{"timestamp": 1e308}'], r"t\.jsonl: the trace spans .* days"),
    (['{"timestamp": 0}', '{"timestamp": 18446744073709551615}'], r"spans .* days"),
    (['{"timestamp": 0}', '{"timestamp": 1e12}'], r"spans .* days"),
    (['{"timestamp": 0}', '{"timestamp": 123456789012345678901}'], r"spans .* days"),
    (['{"timestamp": 0, "prompt_tokens": 1}', '{"timestamp": 1, "prompt_tokens": 1e30}'],
     r"t\.jsonl:2: 'prompt_tokens' must be a whole number"),
    (['{"timestamp": 0, "output_tokens": 1}',
      '{"timestamp": 1, "output_tokens": 18446744073709551615}'],
     r"t\.jsonl:2: 'output_tokens' must be a whole number"),
    (['{"timestamp": 0}', "[1, 2]"], r"t\.jsonl:2: expected an object"),
])
def test_a_malformed_json_trace_is_one_line_naming_the_line(tmp_path: Path, lines: list[str],
                                                            problem: str) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InvalidValue, match=problem):
        Traffic.read(path)


@pytest.mark.parametrize("rows, problem", [
    (["0,0", "nan,1"], r"r\.csv:3: the time must be a finite number"),
    (["0,0", "inf,1"], r"r\.csv:3: the time must be a finite number"),
    (["0,0", "10,12345678901234567890"], r"r\.csv:3: 'request' .* from 0 to 2\*\*63 - 1"),
    (["0,0", "10,1,extra"], r"r\.csv:3: 3 fields where the header has 2"),
    (["0,0", "10"], r"r\.csv:3: 1 fields where the header has 2"),
    (["0,0", "soon,1"], r"r\.csv:3: 'soon' is not a number"),
    (["0,0", "1e15,1"], r"r\.csv: the trace spans .* days"),
])
def test_a_malformed_records_csv_is_one_line_naming_the_line(tmp_path: Path, rows: list[str],
                                                             problem: str) -> None:
    path = tmp_path / "r.csv"
    path.write_text("\n".join(["scheduled_ms,request", *rows]) + "\n")
    with pytest.raises(InvalidValue, match=problem):
        Traffic.read(path)


def test_a_trace_past_its_bounds_names_the_bound(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(traffic_module, "MAX_TRACE_REQUESTS", 100)
    path = _jsonl(tmp_path / "t.jsonl", *({"timestamp": i} for i in range(101)))
    with pytest.raises(InvalidValue, match=r"more than 100 requests, the most a trace"):
        Traffic.read(path)
    monkeypatch.setattr(traffic_module, "MAX_TRACE_LINE_BYTES", 1000)
    path = _jsonl(tmp_path / "t.jsonl", {"timestamp": 0}, {"timestamp": 1, "input": "x" * 2000})
    with pytest.raises(InvalidValue, match=r"t\.jsonl:2: a line is longer than 1,000 bytes"):
        Traffic.read(path)


def test_a_trace_costs_a_few_bytes_a_request(tmp_path: Path) -> None:
    count = 50_000
    rng = np.random.default_rng(5)
    path = tmp_path / "t.jsonl"
    with path.open("w") as file:
        for i, key in enumerate(rng.integers(0, 20_000, count)):
            file.write(json.dumps({"timestamp": i / 500, "input": {"text": f"q{key}" * 20},
                                   "class": "chat" if i % 3 else "bulk",
                                   "prompt_tokens": 100, "output_tokens": 20}) + "\n")
    tracemalloc.start()
    try:
        traffic = Traffic.read(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert traffic.offsets_s is not None and traffic.offsets_s.size == count
    assert traffic.distinct_inputs is not None and 15_000 < traffic.distinct_inputs <= 20_000
    assert traffic.classes == pytest.approx({"bulk": 1 / 3, "chat": 2 / 3}, abs=1e-4)
    # the file is 8 MB; before, each input was kept whole (about 4 KB a request)
    assert peak / count < 400, f"{peak / count:.0f} bytes a request"
