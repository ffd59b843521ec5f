"""The mark a ``tune serve`` trial config carries on the server, and the original config
put back from it.

Every candidate loaded carries in its ``parameters`` who applied it (``tradeoff_tune``)
and the config the server had (``tradeoff_tune_original``), so the repository index and
the model's config show that the server is on a trial config, and
:func:`restore_original` can put the original back even after the tuner was killed.

    config["parameters"] |= trial_marker(original)
    tune_marker(control.config())      # who applied the config now served, or None
    restore_original(control)          # the original loaded back; says what it did
"""

from __future__ import annotations

import datetime
import json
import os
import socket
from typing import Any

from tradeoff.bench.v2 import ModelControl
from tradeoff.errors import TuneError
from tradeoff.server.catalog import TUNE_MARKER, TUNE_ORIGINAL

__all__ = ["restore_original", "trial_marker", "tune_marker"]


def trial_marker(original: dict[str, Any]) -> dict[str, Any]:
    """The ``parameters`` that mark a config as this process's trial over ``original``
    (Triton's JSON, as the server reported it)."""
    return {
        TUNE_MARKER: {"string_value": (
            f"tradeoff tune serve, pid {os.getpid()} on {socket.gethostname()}, since "
            f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%dT%H:%M:%SZ}")},
        TUNE_ORIGINAL: {"string_value": json.dumps(original, separators=(",", ":"))}}


def tune_marker(config: dict[str, Any]) -> str | None:
    """Who applied ``config`` (Triton's JSON, as the server reports it) when a tune serve
    did; None for a config of the model's own."""
    entry = (config.get("parameters") or {}).get(TUNE_MARKER)
    return None if entry is None else str(entry.get("string_value", "")) or "tune serve"


def restore_original(control: ModelControl) -> str:
    """Load back the config a tune serve found (kept in its marker) when the server is
    still on one of its trial configs; says what it did."""
    current = control.config()
    applied = tune_marker(current)
    if applied is None:
        raise TuneError(f"{control.model!r} is on its own config, not one applied by tune "
                        "serve: nothing to restore")
    text = (current.get("parameters") or {}).get(TUNE_ORIGINAL, {}).get("string_value")
    try:
        original = json.loads(text or "")
    except ValueError:
        original = None
    if not isinstance(original, dict):
        raise TuneError(f"{control.model!r}: the tune serve marker holds no original config; "
                        f"load the model's file instead: POST {control.url}/v2/repository/"
                        f"models/{control.model}/load")
    refused = control.load(original)
    if refused is not None:
        raise TuneError(f"could not restore the original config of {control.model!r}: "
                        f"{refused}")
    return (f"{control.model}: the config applied by {applied} replaced by the original "
            f"(max_batch_size {original.get('max_batch_size', 0)})")
