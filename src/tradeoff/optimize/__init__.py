"""Optimised versions of a model (INT8, FP16, graph-optimised) and what each costs."""

from tradeoff.optimize.optimizer import DEFAULT_MAX_DROP, OptimizePlan, optimize_model
from tradeoff.optimize.variants import KINDS, Variant

__all__ = ["DEFAULT_MAX_DROP", "KINDS", "OptimizePlan", "Variant", "optimize_model"]
