"""Example models made locally (no downloads)."""

from tradeoff.models.examples import EXAMPLE_MODELS, build_repository, default_models
from tradeoff.models.generative import GENERATIVE_MODELS, available_generative_models

__all__ = ["EXAMPLE_MODELS", "GENERATIVE_MODELS", "available_generative_models",
           "build_repository", "default_models"]
