"""``python -m tradeoff``: the same command line as ``tradeoff``."""

from tradeoff.cli import main

if __name__ == "__main__":
    main()
