"""Fault injection for reliability tests: a wrapper that makes a real backend fail on cue.

Enabled only when the server runs with ``--allow-fault-injection``; a model opts in with
config parameters (string values, as Triton's ``parameters`` are):

    parameters { key: "fault_fail_on_value" value: { string_value: "13" } }
    parameters { key: "fault_die_on_value" value: { string_value: "666" } }

A batch whose first input holds the *fail* value raises, as a runtime error would; a
batch that holds the *die* value kills the instance (:class:`InstanceDied`), as a lost
device or a crashed session would. Everything else runs on the wrapped backend.

A generative model opts in with ``fault_nan_on_token: ID`` in its ``generate.yaml``: a
sequence whose tokens hold that id gets NaN logits, as a numerical fault of one input
would, and its next token cannot be chosen (:class:`NaNLogitsDecoder`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from tradeoff.backends.base import Backend
from tradeoff.errors import ConfigError, InstanceDied

__all__ = ["PARAMETERS", "FaultInjectingBackend", "NaNLogitsDecoder", "fault_values"]

PARAMETERS = ("fault_fail_on_value", "fault_die_on_value")


class FaultInjectingBackend(Backend):
    """Runs ``inner`` unless the batch holds one of the trigger values."""

    def __init__(self, inner: Backend, fail_on: float | None, die_on: float | None) -> None:
        self.inner = inner
        self.fail_on = fail_on
        self.die_on = die_on
        self.dead = False

    def run(self, inputs: Mapping[str, np.ndarray],
            output_names: Sequence[str]) -> dict[str, np.ndarray]:
        if self.dead:
            raise InstanceDied("instance is dead (injected fault)")
        first = next(iter(inputs.values()))
        if self.die_on is not None and np.any(first == self.die_on):
            self.dead = True
            raise InstanceDied(f"injected fault: instance died on value {self.die_on:g}")
        if self.fail_on is not None and np.any(first == self.fail_on):
            raise RuntimeError(f"injected fault: batch holds value {self.fail_on:g}")
        return self.inner.run(inputs, output_names)

    def close(self) -> None:
        self.inner.close()


def fault_values(parameters: Mapping[str, str], source: str) -> tuple[float | None, float | None]:
    """(fail_on, die_on) from a model's parameters."""
    values: list[float | None] = []
    for key in PARAMETERS:
        text = parameters.get(key)
        try:
            values.append(None if text is None else float(text))
        except ValueError:
            raise ConfigError(source, f"parameters.{key}", f"not a number: {text!r}") from None
    return values[0], values[1]


class NaNLogitsDecoder:
    """A generative decoder whose logits are NaN for every sequence holding ``token``."""

    def __init__(self, inner: Any, token: int) -> None:
        self.inner = inner
        self.token = token

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def step(self, steps: Sequence[Any], cache: Any, all_logits: bool = False) -> Any:
        logits = self.inner.step(steps, cache, all_logits)
        for index, part in enumerate(steps):
            if bool((part.tokens == self.token).any()):
                logits[index] = logits[index].new_full(logits[index].shape, float("nan"))
        return logits
