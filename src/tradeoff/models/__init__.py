"""Example models built locally (no downloads): ``tradeoff models build DIR``."""

from tradeoff.models.examples import EXAMPLE_MODELS, build_repository

__all__ = ["EXAMPLE_MODELS", "build_repository"]
