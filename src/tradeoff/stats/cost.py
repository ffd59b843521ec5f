"""Cost per request and a cost-performance score (docs/cost.md).

    cost per 1M requests = price_per_hour / (throughput_rps * 3600) * 1e6
                         = price_per_1k_requests * 1000            (priced APIs)
    throughput per cost = requests per dollar = 1e6 / cost per 1M requests
                          (for a deployment: throughput_rps * 3600 / price_per_hour)
    score = alpha * throughput_per_cost / max(throughput_per_cost)
          + (1 - alpha) * (1 / p99) / max(1 / p99)

Scores fall in [0, 1]; the best candidate on both counts scores 1. With an SLA on p99
(and on the error rate), candidates that miss it are listed but not ranked.

    parse_prices(["a=2.5", "0.9"], [], ["a", "b"])
    # {"a": Price(per_hour=2.5), "b": Price(per_hour=0.9)}
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from tradeoff.errors import InvalidValue

__all__ = ["Price", "named_numbers", "parse_prices", "rank"]


@dataclass(frozen=True)
class Price:
    """What one endpoint costs: per hour of the deployment, or per 1,000 requests."""

    per_hour: float | None = None
    per_1k_requests: float | None = None

    def __post_init__(self) -> None:
        given = [v for v in (self.per_hour, self.per_1k_requests) if v is not None]
        if len(given) != 1 or given[0] < 0:
            raise InvalidValue("give one non-negative price: per hour or per 1k requests")

    def per_million(self, throughput_rps: float) -> float | None:
        """Cost of one million requests at this throughput (None when nothing was served)."""
        if self.per_1k_requests is not None:
            return self.per_1k_requests * 1000
        assert self.per_hour is not None
        if throughput_rps <= 0:
            return None
        return self.per_hour / (throughput_rps * 3600) * 1e6

    def to_dict(self) -> dict[str, float | None]:
        return {"per_hour": self.per_hour, "per_1k_requests": self.per_1k_requests}


def named_numbers(values: Iterable[str], option: str, *, bare: bool = False
                  ) -> dict[str, float]:
    """``NAME=NUMBER`` values (with ``bare``, a lone ``NUMBER`` is kept under ``*``): each
    number finite and not negative, each name once."""
    out: dict[str, float] = {}
    form = "NAME=NUMBER or NUMBER" if bare else "NAME=NUMBER"
    for value in values:
        name, sep, number = value.rpartition("=")
        key = name if sep else "*"
        try:
            parsed = float(number)
        except ValueError:
            parsed = math.nan
        if (not sep and not bare) or (not name and sep) or not math.isfinite(parsed) \
                or parsed < 0:
            raise InvalidValue(f"{option} {value!r}: use {form}, a number >= 0")
        if key in out:
            raise InvalidValue(f"{option} gives a bare NUMBER twice" if key == "*" else
                               f"{option} names {key!r} twice")
        out[key] = parsed
    return out


def parse_prices(per_hour: Iterable[str], per_1k_requests: Iterable[str],
                 names: list[str]) -> dict[str, Price]:
    """The Price of each endpoint in ``names`` from ``--price-per-hour`` and
    ``--price-per-1k-requests`` values (``NAME=USD``, or ``USD`` for every endpoint); a
    price per hour wins over one per request, and an unknown name is refused."""
    hourly = named_numbers(per_hour, "--price-per-hour", bare=True)
    per_request = named_numbers(per_1k_requests, "--price-per-1k-requests", bare=True)
    unknown = (set(hourly) | set(per_request)) - set(names) - {"*"}
    if unknown:
        raise InvalidValue(f"prices name unknown endpoints: {', '.join(sorted(unknown))}")
    prices = {}
    for name in names:
        hour = hourly.get(name, hourly.get("*"))
        thousand = per_request.get(name, per_request.get("*"))
        if hour is not None or thousand is not None:
            prices[name] = Price(per_hour=hour, per_1k_requests=None if hour is not None
                                 else thousand)
    return prices


def rank(candidates: list[dict[str, Any]], alpha: float = 0.5,
         sla_p99_ms: float | None = None, max_error_percent: float | None = None
         ) -> list[dict[str, Any]]:
    """Score and rank candidates, each ``{name, throughput_rps, p99_ms, error_percent,
    price: Price | None}``. Returns them with ``cost_per_million``, ``meets_sla``, ``score``
    and ``rank`` (1 = best; None when not ranked), best first."""
    if not 0 <= alpha <= 1:
        raise InvalidValue(f"alpha must be in [0, 1], got {alpha}")
    out = []
    for c in candidates:
        price = c.get("price")
        cost = price.per_million(c["throughput_rps"]) if price else None
        meets = True
        reasons = []
        if sla_p99_ms is not None and (c["p99_ms"] is None or c["p99_ms"] > sla_p99_ms):
            meets = False
            reasons.append(f"p99 {c['p99_ms'] or float('nan'):.2f} ms > {sla_p99_ms:g} ms")
        if max_error_percent is not None and c.get("error_percent", 0) > max_error_percent:
            meets = False
            reasons.append(f"errors {c['error_percent']:.1f}% > {max_error_percent:g}%")
        out.append({**{k: v for k, v in c.items() if k != "price"},
                    "price": price.to_dict() if price else None,
                    "cost_per_million": cost, "meets_sla": meets, "sla_misses": reasons})
    ranked = [c for c in out if c["meets_sla"] and c["throughput_rps"] > 0 and c["p99_ms"]]
    priced = all(c["cost_per_million"] for c in ranked)
    value = {id(c): (1e6 / c["cost_per_million"] if priced else c["throughput_rps"])
             for c in ranked}
    speed = {id(c): 1 / c["p99_ms"] for c in ranked}
    best_value = max(value.values(), default=0) or 1
    best_speed = max(speed.values(), default=0) or 1
    for c in out:
        if id(c) in value:
            c["score"] = (alpha * value[id(c)] / best_value
                          + (1 - alpha) * speed[id(c)] / best_speed)
            c["score_basis"] = ("requests per dollar" if priced
                                else "throughput (no prices)")
        else:
            c["score"] = None
    order = sorted(out, key=lambda c: (c["score"] is None, -(c["score"] or 0)))
    position = 1
    for c in order:
        c["rank"] = position if c["score"] is not None else None
        position += c["score"] is not None
    return order
