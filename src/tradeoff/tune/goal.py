"""What a search must meet, what it may spend and how long it may take: the one goal of
``tradeoff tune serve`` and ``tradeoff plan``.

    Goal(sla_p99_ms=20, rate=None, budget_s=600)          # tune serve: max throughput
    Goal(sla_p99_ms=5, max_drop=0.01, cores=4,            # plan: a model, its traffic
         class_sla_ms={"latency": 2}, price_per_core_hour=0.05)

Both read the p99 SLA, the price (per hour of the deployment, per core or per GPU it
occupies) and the time budget. ``tune serve`` also reads the rate to serve (None: the
highest throughput within the SLA), its search strategy and the best it measures again;
``plan`` reads the accuracy a version may lose, the cores, each class's SLA and, for a
generative model, where ``sla_p99_ms`` is the time to first token, the p99 time per
output token. Each search checks the prices it offers (:class:`~tradeoff.tune.
serve_search.ServeSearch`, :class:`~tradeoff.plan.planner.PlanRequest`) and writes the
goal into its result in its own form (:meth:`Goal.serve_dict`, :meth:`Goal.plan_dict`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from tradeoff.errors import TuneError
from tradeoff.stats.cost import Price

__all__ = ["STRATEGIES", "Goal"]

STRATEGIES = ("coordinate", "grid")


@dataclass(frozen=True)
class Goal:
    """The SLA, the price and the budget of a search. For a generative model
    ``sla_p99_ms`` is the p99 time to first token, and ``sla_tpot_ms`` the p99 time per
    output token after it."""

    sla_p99_ms: float
    # tune serve: the rate to serve within the SLA (None: the highest throughput that does)
    rate: float | None = None
    price: Price | None = None  # the deployment, per hour or per 1k requests
    price_per_core_hour: float | None = None  # or per core the deployment occupies
    price_per_gpu_hour: float | None = None  # or per GPU its instances use (plan)
    budget_s: float = 600.0
    # tune serve: coordinate descent or the whole grid; the errors a trial may have; the
    # best this many measured again, with the server's config
    strategy: str = "coordinate"
    max_error_percent: float = 1.0
    confirm: int = 3
    # plan: the accuracy a version may lose, the cores the server may use, each replay
    # round's seconds, the requests each prediction simulates
    max_drop: float = 0.0
    cores: int = 1
    replay_s: float = 20.0
    simulated_requests: int = 10_000
    class_sla_ms: dict[str, float] = field(default_factory=dict)  # p99 of a class; the
    # others have sla_p99_ms
    sla_tpot_ms: float | None = None
    class_tpot_ms: dict[str, float] = field(default_factory=dict)  # TPOT p99 of a class

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise TuneError(f"--strategy {self.strategy!r}: use coordinate or grid")
        if not self.sla_p99_ms > 0:
            raise TuneError("--sla-p99-ms must be positive")

    def sla_for(self, request_class: str) -> float:
        """The p99 (TTFT for a generative model) one class of requests must meet."""
        return self.class_sla_ms.get(request_class, self.sla_p99_ms)

    def tpot_for(self, request_class: str) -> float | None:
        """The TPOT p99 one class of a generative model's requests must meet."""
        return self.class_tpot_ms.get(request_class, self.sla_tpot_ms)

    def strictest(self, classes: Iterable[str]) -> float:
        """The SLA a pool serving all these classes must meet: the tightest of theirs."""
        slas = [self.sla_for(c) for c in classes]
        return min(slas) if slas else self.sla_p99_ms

    def replay_requests(self, rate_rps: float) -> int:
        """Requests the replay sends each deployment: two rounds, each with its warmup."""
        return max(1, int(rate_rps * 2 * (self.replay_s + 1)))

    def on_gpus(self, gpus: int) -> Goal:
        """The goal for a model on ``gpus`` GPUs: a GPU-hour price becomes the deployment's
        price per hour (instances and pools share the GPUs; more of them cost nothing)."""
        if self.price_per_gpu_hour is None:
            return self
        return replace(self, price=Price(per_hour=self.price_per_gpu_hour * gpus))

    def cost_per_million(self, cores: int, rate_rps: float) -> float | None:
        """What a million requests cost a deployment of ``cores`` serving ``rate_rps``
        (None without a price)."""
        if self.price_per_core_hour is not None:
            return Price(per_hour=self.price_per_core_hour * cores).per_million(rate_rps)
        return self.price.per_million(rate_rps) if self.price else None

    def serve_dict(self) -> dict[str, Any]:
        """The goal as a ``tune serve`` result records it."""
        return {"sla_p99_ms": self.sla_p99_ms, "rate": self.rate,
                "objective": "max-throughput" if self.rate is None else "rate",
                "price": self.price.to_dict() if self.price else None,
                "price_per_core_hour": self.price_per_core_hour, "budget_s": self.budget_s,
                "strategy": self.strategy, "max_error_percent": self.max_error_percent,
                "confirm": self.confirm}

    def plan_dict(self) -> dict[str, Any]:
        """The goal as a plan records it."""
        return {"sla_p99_ms": self.sla_p99_ms, "max_drop": self.max_drop, "cores": self.cores,
                "price": self.price.to_dict() if self.price else None,
                "price_per_core_hour": self.price_per_core_hour, "budget_s": self.budget_s,
                "replay_s": self.replay_s, "simulated_requests": self.simulated_requests,
                **({"price_per_gpu_hour": self.price_per_gpu_hour}
                   if self.price_per_gpu_hour is not None else {}),
                **({"class_sla_ms": self.class_sla_ms} if self.class_sla_ms else {}),
                **({"sla_tpot_ms": self.sla_tpot_ms} if self.sla_tpot_ms is not None else {}),
                **({"class_tpot_ms": self.class_tpot_ms} if self.class_tpot_ms else {})}
