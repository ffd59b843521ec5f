"""Which prepared request each send uses: round-robin, or drawn from a Zipf law.

Real traffic repeats itself unevenly: a few inputs are asked for often, most rarely.
``--distinct-inputs N --zipf S`` sends N distinct inputs, the k-th most popular with
probability proportional to 1/k**S, drawn with ``--seed`` so a run can be repeated; that
is how a response cache can be measured honestly (round-robin over a few inputs makes
every request after the first round a hit).

    mix = InputMix(zipf=1.0)
    order = mix.order(1000, seed=0)              # request indices, most popular first

``--mix NAME=WEIGHT[,param=value...]`` adds request classes: each request is drawn to a
class by weight (from the same schedule), and carries that class's request parameters;
the prepared requests are laid out class by class, each class over the same inputs.

    InputMix(classes=(RequestClass.parse("latency=20,class=latency"),
                      RequestClass.parse("bulk=80,class=throughput")))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from tradeoff.errors import InvalidValue, shown
from tradeoff.repository.router import class_name_problem
from tradeoff.stats.popularity import zipf_probabilities

__all__ = [
    "ORDER_LENGTH",
    "InputMix",
    "RequestClass",
]

ORDER_LENGTH = 1 << 20  # draws made up front, then reused in the same order


@dataclass(frozen=True)
class RequestClass:
    """A kind of request in a mix: its share of the traffic and the request parameters
    it carries (``class=latency``, ``timeout=10000``, ``priority=1``...)."""

    name: str
    weight: float
    parameters: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, text: str) -> RequestClass:
        """``NAME=WEIGHT[,KEY=VALUE...]``; values read as integers, numbers, true/false
        where they can be, else strings."""
        head, *rest = text.split(",")
        name, sep, weight_text = head.partition("=")
        try:
            weight = float(weight_text)
        except ValueError:
            weight = -1.0
        if not sep or not name or not 0 < weight < float("inf"):
            raise InvalidValue(f"--mix {text!r}: use NAME=WEIGHT[,param=value...], e.g. "
                               "latency=20,class=latency")
        parameters: dict[str, Any] = {}
        for item in rest:
            key, sep, value = item.partition("=")
            if not sep or not key:
                raise InvalidValue(f"--mix {text!r}: {item!r} is not param=value")
            key = key.strip()  # a class is a name, even one of digits
            parameters[key] = value.strip() if key == "class" else _value(value.strip())
        for request_class in (name.strip(), parameters.get("class")):
            if request_class is not None and (problem := class_name_problem(request_class)):
                raise InvalidValue(f"--mix {shown(text)}: {problem}")
        return cls(name.strip(), weight, parameters)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "weight": self.weight, "parameters": self.parameters}


def _value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


@dataclass(frozen=True)
class InputMix:
    """Round-robin over the prepared requests (``zipf`` None), Zipf draws over them, or
    a given ``sequence`` of input indices (a recorded trace's, replayed in its order and
    repeated end to end); with ``classes``, each send is also drawn to a class by
    weight, or takes the class ``class_sequence`` gives it in turn (a trace's)."""

    zipf: float | None = None
    classes: tuple[RequestClass, ...] = ()
    sequence: tuple[int, ...] = ()
    class_sequence: tuple[int, ...] = ()  # each send's class in turn (a trace's), not drawn

    def inputs_of(self, count: int) -> int:
        """Distinct inputs among ``count`` prepared requests (one copy per class)."""
        return count // max(len(self.classes), 1)

    def order(self, count: int, seed: int) -> np.ndarray | None:
        """The index of the request each send uses, in turn (None: round-robin)."""
        if self.zipf is None and not self.classes and not self.sequence:
            return None
        inputs = self.inputs_of(count)
        rng = np.random.default_rng([seed, 0x21BF])  # apart from the arrivals' stream
        if self.sequence:
            order = np.resize(np.asarray(self.sequence, dtype=np.int64) % inputs,
                              ORDER_LENGTH)
        elif self.zipf is None:
            order = np.arange(ORDER_LENGTH, dtype=np.int64) % inputs
        else:
            order = rng.choice(inputs, size=ORDER_LENGTH, p=zipf_probabilities(inputs,
                                                                             self.zipf))
        if self.classes and self.class_sequence:
            order = np.resize(np.asarray(self.class_sequence, dtype=np.int64)
                              % len(self.classes), ORDER_LENGTH) * inputs + order
        elif self.classes:
            weights = np.array([c.weight for c in self.classes])
            order = rng.choice(len(self.classes), size=ORDER_LENGTH,
                               p=weights / weights.sum()) * inputs + order
        return order.astype(np.int32)

    def describe(self, count: int) -> dict[str, Any]:
        """What the result records: how many distinct inputs, drawn how, in which
        classes."""
        out: dict[str, Any] = {"distinct_inputs": self.inputs_of(count), "draw": "round-robin"}
        if self.sequence:
            out.update(draw="sequence", sequence_length=len(self.sequence))
        elif self.zipf is not None:
            out.update(draw="zipf", zipf_s=self.zipf)
        if self.classes:
            out["classes"] = [c.to_dict() for c in self.classes]
            out["class_draw"] = "sequence" if self.class_sequence else "weights"
        return out
