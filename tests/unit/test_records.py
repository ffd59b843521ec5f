"""The one generic writer and reader of result documents: each way a field may be written,
and the result types' optional parts written exactly as their files have them."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

import pytest

from tradeoff.errors import ResultFormatError
from tradeoff.records import Fields, Record, written
from tradeoff.results import (
    ClientReport,
    Knee,
    RowTokens,
    ServerCounts,
    SweepRow,
    VersionReport,
    Window,
)


@dataclass(frozen=True)
class Point(Record):
    x: int
    pair: tuple[float, float]


@dataclass(frozen=True)
class Extra(Record):
    marker: str
    depth: int


@dataclass(frozen=True)
class Shape(Record):
    name: str
    points: list[Point]
    by_size: dict[int, float]
    best: Point | None
    total: int = field(init=False)  # derived: written, not read
    extra: Extra | None = field(default=None, metadata=written(flat="marker"))
    note: str | None = field(default=None, metadata=written(omit_none=True))
    detail: str | None = field(default=None, metadata=written(when=lambda s: s.note is not None))
    tag: str = field(default="", metadata=written(required=True))
    seen: bool = field(default=False, metadata=written(never=True,
                                                       reader=lambda f: f.has("detail")))
    schema = "test.shape/1"

    def __post_init__(self) -> None:
        object.__setattr__(self, "total", sum(p.x for p in self.points))


def _shape(**changes: object) -> Shape:
    base = Shape("s", [Point(1, (0.5, 1.5)), Point(2, (2.0, 3.0))], {8: 10.0, 16: 12.5},
                 None, tag="t")
    return dataclasses.replace(base, **changes)  # type: ignore[arg-type]


def test_fields_are_written_in_order_after_the_schema() -> None:
    out = _shape().to_dict()
    assert list(out) == ["schema", "name", "points", "by_size", "best", "total", "tag"]
    assert out["points"] == [{"x": 1, "pair": [0.5, 1.5]}, {"x": 2, "pair": [2.0, 3.0]}]
    assert out["by_size"] == {"8": 10.0, "16": 12.5} and out["total"] == 3


def test_a_written_document_reads_back_equal_through_json() -> None:
    for shape in (_shape(), _shape(note="n", detail="d", seen=True, best=Point(3, (1, 2))),
                  _shape(extra=Extra("m", 2))):
        again = Shape.read(Fields(json.loads(json.dumps(shape.to_dict())), "shape"))
        assert again == shape
        assert isinstance(again.points[0].pair, tuple) and 16 in again.by_size


def test_the_options_leave_out_what_they_say() -> None:
    out = _shape(note="n").to_dict()
    assert out["note"] == "n" and out["detail"] is None and "seen" not in out
    flat = _shape(extra=Extra("m", 2)).to_dict()
    assert flat["marker"] == "m" and flat["depth"] == 2 and "extra" not in flat


def test_a_missing_field_is_named_with_its_path() -> None:
    document = _shape().to_dict()
    del document["points"][1]["x"]
    with pytest.raises(ResultFormatError, match=r"shape\.points\[1\]: field 'x' is missing"):
        Shape.read(Fields(document, "shape"))
    document = _shape().to_dict()
    del document["tag"]  # has a default, but is required
    with pytest.raises(ResultFormatError, match=r"shape: field 'tag' is missing"):
        Shape.read(Fields(document, "shape"))
    document = {**_shape().to_dict(), "points": {"x": 1}}
    with pytest.raises(ResultFormatError, match=r"shape\.points: expected a list"):
        Shape.read(Fields(document, "shape"))


def test_a_field_with_a_default_may_be_absent() -> None:
    document = _shape().to_dict()
    assert Shape.read(Fields(document, "shape")).note is None


def test_optional_parts_of_the_results_are_written_as_before() -> None:
    window = Window(0, 0.5, 10, 0, 20.0, 1.0, 2.0)
    assert list(window.to_dict()) == ["index", "duration_s", "completed", "errors",
                                      "throughput_rps", "p50_ms", "p99_ms"]
    with_server = dataclasses.replace(window, server_ms={"queue": 0.1}, round=1)
    assert with_server.to_dict()["server_executions"] is None
    assert with_server.to_dict()["round"] == 1

    counts = ServerCounts(10, 4)
    assert counts.to_dict() == {"requests": 10, "executions": 4}
    cached = ServerCounts(10, 4, 6, 4)
    assert cached.to_dict() == {"requests": 10, "executions": 4, "cache_hits": 6,
                                "cache_misses": 4, "cache_hit_ratio": 0.6}
    assert ServerCounts(10, 4, 0, 0).cache_hit_ratio is None

    client = ClientReport(2, 10.0, None, None, False, [], [])
    assert "hosts" not in client.to_dict() and "start_skew_ms" not in client.to_dict()
    ray = dataclasses.replace(client, hosts=[{"node": "127.0.0.2"}])
    assert ray.to_dict()["hosts"] == [{"node": "127.0.0.2"}]
    assert ray.to_dict()["start_skew_ms"] is None

    row = SweepRow(1, 10.0, 10.0, 1.0, 2.0, 0.0, 100,
                   tokens=RowTokens(50.0, 1.0, 2.0, 0.1, 0.2, None))
    assert "cost_per_million" not in row.to_dict() and row.to_dict()["ttft_p50_ms"] == 1.0
    priced = dataclasses.replace(row, priced=True)
    assert priced.to_dict()["cost_per_million"] is None
    for r in (row, priced):
        assert SweepRow.read(Fields(r.to_dict(), "row")) == r
    knee = Knee(**{f.name: getattr(row, f.name) for f in dataclasses.fields(SweepRow)},
                rule="gain under 10%")
    assert list(knee.to_dict())[-1] == "rule" and Knee.read(Fields(knee.to_dict(), "k")) == knee


def test_derived_figures_follow_a_replaced_field() -> None:
    version = VersionReport(1, "fp32", "original", 10, {"p50": 1.0}, {1: 10.0, 8: 40.0}, [],
                            created=False)
    assert (version.best_batch, version.best_throughput, version.drop) == (8, 40.0, 0.0)
    faster = dataclasses.replace(version, throughput_by_batch={1: 10.0, 8: 40.0, 16: 90.0})
    assert (faster.best_batch, faster.best_throughput) == (16, 90.0)
    assert list(version.to_dict())[5:8] == ["throughput_by_batch", "best_batch",
                                            "best_throughput"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d.update(name=["s"]), "shape.name: expected a string, got ['s']"),
    (lambda d: d["points"][0].update(x=1.5), "shape.points[0].x: expected an integer, got 1.5"),
    (lambda d: d["points"][0].update(x=True), "shape.points[0].x: expected an integer"),
    (lambda d: d["points"][1].update(pair=[1.0]), "shape.points[1].pair: expected 2 items"),
    (lambda d: d["points"][1].update(pair=[1.0, "2"]),
     "shape.points[1].pair[1]: expected a number, got '2'"),
    (lambda d: d.update(by_size={"eight": 1.0}), "shape.by_size: key 'eight' is not an integer"),
    (lambda d: d.update(by_size={"8": "fast"}), "shape.by_size.8: expected a number"),
    (lambda d: d.update(tag={"a": 1}), "shape.tag: expected a string, got {'a': 1}"),
], ids=["str-list", "int-float", "int-bool", "tuple-length", "tuple-item", "int-key",
        "float-str", "str-object"])
def test_a_value_of_the_wrong_type_is_refused_by_name(change: object, message: str) -> None:
    data = json.loads(json.dumps(_shape().to_dict()))
    change(data)  # type: ignore[operator]
    with pytest.raises(ResultFormatError) as caught:
        Shape.read(Fields(data, "shape"))
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_wrong_typed_value_under_an_odd_key_is_named_without_echoing_it() -> None:
    @dataclass(frozen=True)
    class Scores(Record):
        by_name: dict[str, float]

    key = "a\nb" + "x" * 100
    with pytest.raises(ResultFormatError) as caught:
        Scores.read(Fields({"by_name": {key: "high"}}, "s.json"))
    text = str(caught.value)
    assert "\n" not in text and text.startswith("s.json.by_name['a\\nb") and "..." in text


@dataclass(frozen=True)
class Predicted(Record):
    p99_ms: float
    by_class: dict[str, float]
    spread: list[float] | None = None


def test_numbers_json_cannot_hold_are_written_as_strings_and_read_back() -> None:
    """An overloaded deployment's predicted p99 is infinite: the file stays JSON (no bare
    Infinity, which strict parsers refuse) and reads back as the same numbers."""
    record = Predicted(float("inf"), {"chat": float("-inf"), "bulk": 2.5}, [float("nan")])
    text = json.dumps(record.to_dict(), allow_nan=False)
    assert json.loads(text) == {"p99_ms": "Infinity",
                                "by_class": {"chat": "-Infinity", "bulk": 2.5},
                                "spread": ["NaN"]}
    back = Predicted.read(Fields(json.loads(text), "p.json"))
    assert back.p99_ms == float("inf") and back.by_class["chat"] == float("-inf")
    assert back.spread is not None and back.spread[0] != back.spread[0]  # NaN
    with pytest.raises(ResultFormatError, match="expected a number"):
        Predicted.read(Fields({"p99_ms": "Infinite", "by_class": {}}, "p.json"))
