"""How far long work has come and how long it has left, for progress lines.

    progress_text(3, 7, 30.0, "levels")   # '3 of 7 levels, 43%, about 40 s left'
"""

from __future__ import annotations

__all__ = ["duration_text", "progress_text"]


def duration_text(seconds: float) -> str:
    """``75`` -> ``1m15s``; under a minute in whole seconds."""
    seconds = max(round(seconds), 0)
    if seconds < 60:
        return f"{seconds} s"
    minutes, rest = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{rest:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def progress_text(done: float, total: float, elapsed_s: float, unit: str = "") -> str:
    """``done`` of ``total`` as a percentage, with the time left at the pace so far (none
    before anything is done)."""
    if total <= 0:
        return f"{duration_text(elapsed_s)} elapsed"
    share = min(max(done / total, 0.0), 1.0)
    counted = f"{done:g} of {total:g}{' ' + unit if unit else ''}, " if unit else ""
    text = f"{counted}{share:.0%}"
    if 0 < share < 1 and elapsed_s > 0:
        text += f", about {duration_text(elapsed_s * (1 - share) / share)} left"
    return text
