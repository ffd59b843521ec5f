"""The version of tradeoff, in a module of its own so that any module can read it without
importing the package root (which imports the result documents)."""

__all__ = ["__version__"]

__version__ = "0.1.0"
