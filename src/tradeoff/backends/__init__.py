"""Runtimes that execute a model: one module per runtime, all behind :class:`Backend`."""

from tradeoff.backends.base import Backend, TensorSpec

__all__ = ["Backend", "TensorSpec"]
