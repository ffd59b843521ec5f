"""Data files shipped with tradeoff, for samples that must be real rather than random."""

from __future__ import annotations

from importlib import resources

__all__ = ["sentences"]


def sentences() -> list[str]:
    """English sentences on everyday topics, one per line (``sentences.txt``): validation
    and calibration text for embedding models."""
    text = resources.files(__name__).joinpath("sentences.txt").read_text()
    return [line for line in text.splitlines() if line.strip()]
