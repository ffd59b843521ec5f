"""Tune documents: JSON round trip, the Pareto front, and their report sections."""

from __future__ import annotations

from pathlib import Path

from tradeoff.report.html import build_report
from tradeoff.results import (
    BatchPoint,
    BatchSizeTune,
    MemoryEstimate,
    ServeTune,
    Trial,
    load_result,
    write_json,
)
from tradeoff.tune.knobs import Knobs, Space
from tradeoff.tune.serve_search import pareto_front


def trial(name: str, rps: float, p99: float, cost: float | None = None,
          meets: bool = True) -> Trial:
    return Trial(name, {}, "measured", None, rps, p99 / 2, p99, 0.0, cost, meets)


def serve_tune() -> ServeTune:
    trials = [trial("a", 1000, 5), trial("b", 2000, 9), trial("c", 1500, 12),
              trial("d", 2500, 30, meets=False),
              Trial("e", {}, "refused", "HTTP 400: too many instances")]
    front = pareto_front([t for t in trials if t.status == "measured"])
    trials = [Trial(**{**t.to_dict(), "pareto": t.name in front}) for t in trials]
    return ServeTune({"protocol": "v2", "url": "http://127.0.0.1:8000"}, "mlp",
                     {"sla_p99_ms": 20, "rate": None, "objective": "max-throughput",
                      "strategy": "coordinate"}, {}, trials, "a", "b", "converged", 12.0, 16,
                     None)


def test_the_pareto_front_drops_what_another_beats_on_every_count() -> None:
    trials = [trial("a", 1000, 5), trial("b", 2000, 9), trial("c", 1500, 12),
              trial("d", 2500, 30)]
    assert pareto_front(trials) == {"a", "b", "d"}  # c: b has more throughput and less p99
    priced = [trial("a", 1000, 5, cost=2.0), trial("b", 1000, 5, cost=1.0)]
    assert pareto_front(priced) == {"b"}


def test_knobs_write_the_config_and_read_it_back() -> None:
    original = {"name": "m", "max_batch_size": 8, "instance_group": [{"kind": "KIND_CPU",
                                                                      "count": 1}],
                "dynamic_batching": {"max_queue_delay_microseconds": 0}}
    knobs = Knobs(16, 2000, 2, 1, True)
    config = knobs.config(original)
    assert config["dynamic_batching"]["preferred_batch_size"] == [16]
    assert config["instance_group"] == [{"kind": "KIND_CPU", "count": 2}]
    assert Knobs.of(config) == knobs and original["max_batch_size"] == 8
    assert Knobs(1, 500, 1, 1, True).normal() == Knobs(1, 0, 1, 1, False)
    assert len(Space((1, 4), (0, 100), (1,), (1,)).grid()) == 5  # batch 1 takes no delay


def test_documents_round_trip_and_make_report_sections(tmp_path: Path) -> None:
    batch = BatchSizeTune("mlp", "/models", "cpu", {"intra_op_threads": 1}, {}, [
        BatchPoint(1, "doubling", 1000.0, {"p50": 1.0, "p99": 1.2}, 1_000_000, True),
        BatchPoint(2, "doubling", 1800.0, {"p50": 1.1, "p99": 1.3}, 2_000_000, True),
        BatchPoint(4, "doubling", 1850.0, {"p50": 2.1, "p99": 2.3}, 4_000_000, True),
        BatchPoint(8, "doubling", None, None, None, False, "out of memory")],
        2, 1, "throughput stopped growing", "batch 8 failed",
        MemoryEstimate("peak RSS", 10_000_000, 1_000_000.0, None, None, None))
    for document in (batch, serve_tune()):
        path = tmp_path / f"{document.search}.json"
        write_json(document, path)
        again = load_result(path)
        assert again == document and again.to_dict() == document.to_dict()
    page, _ = build_report([batch, serve_tune()])
    assert "Batch size of mlp" in page and "Serving configuration of mlp" in page
    assert "refused: HTTP 400: too many instances" in page
    assert page.count("<svg") >= 2


def test_the_serve_tune_table_says_what_it_optimises() -> None:
    """tune batch-size and tune serve may pick different batch sizes: each says why."""
    from rich.console import Console

    from tradeoff.report.terminal import print_serve_tune

    console = Console(record=True, width=120)
    print_serve_tune(serve_tune(), console)
    text = console.export_text()
    assert "what this optimises: served throughput" in text and "tune batch-size" in text
