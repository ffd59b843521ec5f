"""The serving knobs ``tune serve`` moves and ``plan`` predicts: one configuration
(:class:`Knobs`), written into a model's Triton config and read back from one, and the
values each may take (:class:`Space`).

    knobs = Knobs(max_batch_size=16, max_queue_delay_us=500, instances=2, threads=1,
                  preferred=False)
    config = knobs.config(original)          # Triton's JSON config with these knobs
    Knobs.of(config) == knobs
    Space(max_batch_size=(1, 8, 64)).grid()  # every distinct combination
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from dataclasses import dataclass
from typing import Any

from tradeoff.errors import TuneError

__all__ = ["KNOBS", "Knobs", "Space"]

KNOBS = ("max_batch_size", "max_queue_delay_us", "instances", "threads", "preferred")


@dataclass(frozen=True)
class Knobs:
    """One serving configuration: the values the search moves."""

    max_batch_size: int
    max_queue_delay_us: int
    instances: int
    threads: int
    preferred: bool  # preferred_batch_size = max_batch_size

    def normal(self) -> Knobs:
        """The same configuration written one way: without batching there is no delay
        and no preferred size."""
        if self.max_batch_size <= 1:
            return dataclasses.replace(self, max_queue_delay_us=0, preferred=False)
        return self

    @property
    def name(self) -> str:
        return (f"batch {self.max_batch_size}, delay {self.max_queue_delay_us} us, "
                f"{self.instances} inst x {self.threads} thr"
                + (", preferred" if self.preferred else ""))

    @property
    def cores(self) -> int:
        return self.instances * self.threads

    def config(self, original: dict[str, Any]) -> dict[str, Any]:
        """``original`` (Triton's JSON config) with these knobs."""
        config = json.loads(json.dumps(original))
        config["max_batch_size"] = self.max_batch_size
        batching = dict(config.get("dynamic_batching") or {})
        batching["max_queue_delay_microseconds"] = self.max_queue_delay_us
        batching["preferred_batch_size"] = [self.max_batch_size] if self.preferred else []
        config["dynamic_batching"] = batching
        groups = config.get("instance_group") or [{"kind": "KIND_CPU"}]
        group = {"kind": groups[0].get("kind", "KIND_CPU"), "count": self.instances}
        if groups[0].get("gpus"):  # count is per listed GPU: the instances stay on them
            group["gpus"] = groups[0]["gpus"]
        config["instance_group"] = [group]
        parameters = dict(config.get("parameters") or {})
        parameters["intra_op_thread_count"] = {"string_value": str(self.threads)}
        config["parameters"] = parameters
        for warmup in config.get("model_warmup") or []:
            warmup["batch_size"] = min(warmup.get("batch_size", 1), self.max_batch_size)
        return config

    @classmethod
    def of(cls, config: dict[str, Any]) -> Knobs:
        """The knobs of a Triton JSON config as the server reports it (without
        ``dynamic_batching`` a model runs each request alone: batch 1)."""
        batching = config.get("dynamic_batching")
        groups = config.get("instance_group") or [{}]
        threads = (config.get("parameters") or {}).get("intra_op_thread_count", {})
        max_batch = int(config.get("max_batch_size", 0)) if batching is not None else 1
        batching = batching or {}
        return cls(max(max_batch, 1), int(batching.get("max_queue_delay_microseconds", 0)),
                   sum(int(g.get("count", 1)) for g in groups),
                   int(threads.get("string_value", 1) or 1),
                   bool(batching.get("preferred_batch_size"))
                   and list(batching["preferred_batch_size"]) == [max_batch]).normal()


@dataclass(frozen=True)
class Space:
    """The values each knob may take."""

    max_batch_size: tuple[int, ...] = (1, 4, 16, 64)
    max_queue_delay_us: tuple[int, ...] = (0, 500, 2000, 10000)
    instances: tuple[int, ...] = (1, 2)
    threads: tuple[int, ...] = (1, 2)
    preferred: tuple[bool, ...] = (False, True)

    def __post_init__(self) -> None:
        for knob in KNOBS:
            values = getattr(self, knob)
            if not values:
                raise TuneError(f"no values to try for {knob}")
            if knob != "preferred" and min(values) < (0 if knob == "max_queue_delay_us"
                                                      else 1):
                raise TuneError(f"{knob}: {list(values)} holds a value below the least "
                                "allowed")

    def grid(self) -> list[Knobs]:
        """Every distinct combination, in order."""
        seen: dict[Knobs, None] = {}
        for values in itertools.product(*(getattr(self, k) for k in KNOBS)):
            seen.setdefault(Knobs(**dict(zip(KNOBS, values, strict=True))).normal())
        return list(seen)
