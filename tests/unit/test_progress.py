"""Progress lines: the share done and the time left at the pace so far."""

from __future__ import annotations

import io

from rich.console import Console

from tradeoff.cli.options import step_progress
from tradeoff.stats.progress import duration_text, progress_text


def test_the_time_left_follows_the_pace_so_far() -> None:
    assert progress_text(3, 7, 30.0, "levels") == "3 of 7 levels, 43%, about 40 s left"
    assert progress_text(0, 7, 0.0, "levels") == "0 of 7 levels, 0%"  # no pace yet
    assert progress_text(120, 600, 120) == "20%, about 8m00s left"
    assert progress_text(9, 4, 10.0) == "100%"  # more than planned: never over 100%
    assert [duration_text(s) for s in (0.4, 59, 75, 7260)] == ["0 s", "59 s", "1m15s",
                                                               "2h01m"]


def test_steps_are_plain_lines_when_the_output_is_not_a_terminal() -> None:
    out = io.StringIO()
    console = Console(file=out, force_terminal=False)
    with step_progress(console, "reading the model") as say:
        say("measuring version 2 (1 of 3, 33%, about 8 s left)")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("reading the model")
    assert "measuring version 2 (1 of 3, 33%" in lines[1]
