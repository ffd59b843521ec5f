"""The one Pareto front both searches use (tune serve's trials, plan's candidates)."""

from __future__ import annotations

from tradeoff.stats.pareto import front


def test_the_front_keeps_what_nothing_beats_on_every_count() -> None:
    points = {"cheap-slow": (1.0, 9.0), "dear-fast": (5.0, 1.0), "beaten": (5.0, 9.0),
              "twin-a": (2.0, 4.0), "twin-b": (2.0, 4.0)}
    kept = front(list(points), lambda name: points[name])
    assert kept == ["cheap-slow", "dear-fast", "twin-a", "twin-b"]  # equal keys keep each other
    assert front([], lambda name: (0.0,)) == []
