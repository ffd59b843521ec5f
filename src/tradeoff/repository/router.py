"""``router.yaml``: the file that makes a repository directory a router, a virtual model
that sends each request to one of its targets.

    routes:                                  # first match wins
      - when: {class: latency}               # request parameter "class" (or X-Tradeoff-Class)
        to: mlp_small
      - when: {deadline_ms_below: 20}        # the request's own timeout parameter
        to: mlp_small
      - when: {class: interactive}           # generative targets: the engine's order
        to: chat
        priority: 0                          # (scheduling: priority; lower first)
      - to: [{model: mlp, version: 1, weight: 90}, {model: mlp, version: 2, weight: 10}]
        sticky: user                         # a hash of this request parameter picks the arm
    fallback: [mlp_small]                    # when the chosen target refuses or is not ready
    shadow: {to: mlp_int8, fraction: 0.05}   # a copy of some requests, answer not waited for
    idempotent: false                        # true: a failed request may be tried again
    hide_targets: false                      # true: its targets answer only through it

This module reads and checks the file and decides where a request goes; serving it is
the server's. Errors name the file and the field, with "did you mean" for a misspelling.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradeoff.errors import ConfigError, shown
from tradeoff.repository.safe_yaml import read_yaml

__all__ = [
    "CLASS_PATTERN",
    "CONDITIONS",
    "MAX_WEIGHT",
    "PRIORITY_LIMIT",
    "ROUTE_FIELDS",
    "TARGET_FIELDS",
    "TOP_FIELDS",
    "Condition",
    "Decision",
    "Route",
    "RouterConfig",
    "Shadow",
    "Signature",
    "Target",
    "class_name_problem",
    "common_signature",
    "sticky_point",
]

TOP_FIELDS = ("routes", "fallback", "shadow", "idempotent", "hide_targets")
ROUTE_FIELDS = ("when", "to", "sticky", "priority")
PRIORITY_LIMIT = 2**31  # a generation's priority, a route's or a request's, lies in
# [-PRIORITY_LIMIT, PRIORITY_LIMIT)
CONDITIONS = ("class", "deadline_ms_below")
TARGET_FIELDS = ("model", "version", "weight")
MAX_WEIGHT = 1e6  # an arm's weight: a sum of any number of them stays finite
# A request class: it names pools, files and metrics, so it is a plain word everywhere
CLASS_PATTERN = "[A-Za-z0-9_.-]{1,64}"
_CLASS_NAME = re.compile(CLASS_PATTERN)


def class_name_problem(name: object) -> str | None:
    """Why ``name`` cannot be a request class, or None when it can: 1 to 64 letters,
    digits, '_', '.' or '-' (``CLASS_PATTERN``)."""
    if not isinstance(name, str):
        return f"a request class must be a string, got {type(name).__name__}"
    if _CLASS_NAME.fullmatch(name) is None:
        return (f"request class {shown(name)} is not a plain name: use 1 to 64 letters, "
                "digits, '_', '.' or '-'")
    return None


def _hint(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


def _known(doc: Mapping[str, Any], fields: Sequence[str], source: str, where: str) -> None:
    for key in doc:
        if key not in fields:
            raise ConfigError(source, f"{where}{key}", f"unknown field{_hint(str(key), fields)}"
                              f" (known: {', '.join(fields)})")


@dataclass(frozen=True)
class Target:
    """A model, optionally one version of it, with its share of a route's traffic."""

    model: str
    version: int | None = None
    weight: float = 1.0

    @property
    def label(self) -> str:
        """``mlp`` or ``mlp/2``: what answers and counters call it."""
        return self.model if self.version is None else f"{self.model}/{self.version}"


@dataclass(frozen=True)
class Condition:
    """When a route applies: the request's class, or a deadline shorter than a bound.
    Every condition given must hold."""

    request_class: str | None = None
    deadline_ms_below: float | None = None

    def holds(self, request_class: str | None, deadline_ms: float | None) -> bool:
        if self.request_class is not None and request_class != self.request_class:
            return False
        return self.deadline_ms_below is None or (
            deadline_ms is not None and deadline_ms < self.deadline_ms_below)


@dataclass(frozen=True)
class Route:
    """Requests that meet ``when`` (every request when it is None) go to one of ``arms``,
    chosen by weight; with ``sticky``, a hash of that request parameter chooses, so one
    caller stays on one arm."""

    arms: tuple[Target, ...]
    when: Condition | None = None
    sticky: str | None = None
    priority: int | None = None  # generative targets: the request's place in the engine

    def arm_at(self, point: float) -> int:
        """The arm whose share of the total weight holds ``point`` in [0, 1)."""
        largest = max(arm.weight for arm in self.arms)  # shares of it: the sum is finite
        shares = [arm.weight / largest for arm in self.arms]
        total = sum(shares)
        edge = 0.0
        for index, share in enumerate(shares):
            edge += share / total
            if point < edge:
                return index
        return len(self.arms) - 1


@dataclass(frozen=True)
class Shadow:
    """A copy of ``fraction`` of the requests goes to ``target`` after the answer."""

    target: Target
    fraction: float


@dataclass(frozen=True)
class Decision:
    """Where one request goes: the route that matched, and its arm."""

    route: int
    arm: int
    target: Target


@dataclass(frozen=True)
class RouterConfig:
    routes: tuple[Route, ...]
    fallback: tuple[Target, ...] = ()
    shadow: Shadow | None = None
    idempotent: bool = False
    hide_targets: bool = False  # direct calls to its targets are refused while it serves

    @classmethod
    def read(cls, path: Path) -> RouterConfig:
        """Read and check ``router.yaml``; the router is named after its directory."""
        return cls.from_mapping(read_yaml(path), str(path), name=path.parent.name)

    @classmethod
    def from_mapping(cls, doc: Any, source: str, name: str | None = None) -> RouterConfig:
        """Check a router's document; ``name``: the router's, which no target may be."""
        if not isinstance(doc, dict):
            raise ConfigError(source, "", "must be a mapping with 'routes'")
        _known(doc, TOP_FIELDS, source, "")
        raw_routes = doc.get("routes")
        if not isinstance(raw_routes, list) or not raw_routes:
            raise ConfigError(source, "routes", "must be a non-empty list of routes")
        routes = tuple(_route(r, source, f"routes[{i}].", name)
                       for i, r in enumerate(raw_routes))
        for index, route in enumerate(routes[:-1]):
            if route.when is None:
                raise ConfigError(source, f"routes[{index}]", "has no 'when', so the routes "
                                  "after it can never match; put it last")
        fallback = _targets(doc["fallback"], source, "fallback", weights=False,
                            router=name) if doc.get("fallback") else ()
        shadow = None
        if doc.get("shadow") is not None:
            raw = doc["shadow"]
            if not isinstance(raw, dict):
                raise ConfigError(source, "shadow", "must be {to: MODEL, fraction: F}")
            _known(raw, ("to", "fraction"), source, "shadow.")
            fraction = raw.get("fraction", 1.0)
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or \
                    not 0 < fraction <= 1:
                raise ConfigError(source, "shadow.fraction", "must be a number in (0, 1]")
            (target,) = _targets(raw.get("to"), source, "shadow.to", weights=False, one=True,
                                 router=name)
            shadow = Shadow(target, float(fraction))
        idempotent = doc.get("idempotent", False)
        if not isinstance(idempotent, bool):
            raise ConfigError(source, "idempotent", "must be true or false")
        hide = doc.get("hide_targets", False)
        if not isinstance(hide, bool):
            raise ConfigError(source, "hide_targets", "must be true or false")
        return cls(routes, fallback, shadow, idempotent, hide)

    def models(self) -> list[str]:
        """Every model the router may send to, each once, in order of appearance."""
        names = [arm.model for route in self.routes for arm in route.arms]
        names += [t.model for t in self.fallback]
        if self.shadow is not None:
            names.append(self.shadow.target.model)
        return list(dict.fromkeys(names))

    def decide(self, request_class: str | None, deadline_ms: float | None,
               parameters: Mapping[str, Any], draw: float) -> Decision:
        """The first route whose condition holds and its arm: by the sticky parameter's
        hash when the request carries it, else by ``draw`` (uniform in [0, 1))."""
        for index, route in enumerate(self.routes):
            if route.when is None or route.when.holds(request_class, deadline_ms):
                point = draw
                if route.sticky is not None and route.sticky in parameters:
                    point = sticky_point(route.sticky, parameters[route.sticky])
                arm = route.arm_at(point) if len(route.arms) > 1 else 0
                return Decision(index, arm, route.arms[arm])
        raise LookupError("no route matches")  # from_mapping makes the last route total


def sticky_point(name: str, value: Any) -> float:
    """Where a caller lands in [0, 1): the same value always lands in the same place."""
    digest = hashlib.blake2b(f"{name}={value}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2**64


def _route(raw: Any, source: str, where: str, router: str | None) -> Route:
    if not isinstance(raw, dict):
        raise ConfigError(source, where.rstrip("."), "must be a mapping with 'to'")
    _known(raw, ROUTE_FIELDS, source, where)
    when = None
    if raw.get("when") is not None:
        condition = raw["when"]
        if not isinstance(condition, dict) or not condition:
            raise ConfigError(source, f"{where}when", "must be a mapping of conditions: "
                              f"{', '.join(CONDITIONS)}")
        _known(condition, CONDITIONS, source, f"{where}when.")
        request_class = condition.get("class")
        if request_class is not None and (problem := class_name_problem(request_class)):
            raise ConfigError(source, f"{where}when.class", problem)
        bound = condition.get("deadline_ms_below")
        if bound is not None and (isinstance(bound, bool) or not isinstance(bound, (int, float))
                                  or bound <= 0):
            raise ConfigError(source, f"{where}when.deadline_ms_below",
                              "must be a positive number of milliseconds")
        when = Condition(request_class, None if bound is None else float(bound))
    sticky = raw.get("sticky")
    if sticky is not None and (not isinstance(sticky, str) or not sticky):
        raise ConfigError(source, f"{where}sticky", "must name a request parameter")
    priority = raw.get("priority")
    if priority is not None and (isinstance(priority, bool) or not isinstance(priority, int)
                                 or not -PRIORITY_LIMIT <= priority < PRIORITY_LIMIT):
        raise ConfigError(source, f"{where}priority", "must be an integer from -2**31 to "
                          "2**31 - 1 (lower is served first)")
    arms = _targets(raw.get("to"), source, f"{where}to", weights=True, router=router)
    return Route(arms, when, sticky, priority)


def _targets(raw: Any, source: str, where: str, *, weights: bool, one: bool = False,
             router: str | None = None) -> tuple[Target, ...]:
    """``MODEL``, ``{model, version, weight}``, or a list of either; none ``router``."""
    items = raw if isinstance(raw, list) else [raw]
    if raw is None or raw == []:
        raise ConfigError(source, where, "must name a model, or list {model, version, weight}")
    if one and len(items) != 1:
        raise ConfigError(source, where, "must name one model")
    targets = []
    for index, item in enumerate(items):
        at = f"{where}[{index}]" if isinstance(raw, list) else where
        if isinstance(item, str) and item:
            if item == router:
                raise ConfigError(source, at, "a router cannot target itself")
            targets.append(Target(item))
            continue
        if not isinstance(item, dict):
            raise ConfigError(source, at, "must be a model name or {model, version, weight}")
        _known(item, TARGET_FIELDS if weights else TARGET_FIELDS[:2], source, f"{at}.")
        model = item.get("model")
        if not isinstance(model, str) or not model:
            raise ConfigError(source, f"{at}.model", "must name a model")
        if model == router:
            raise ConfigError(source, f"{at}.model", "a router cannot target itself")
        version = item.get("version")
        if version is not None and (isinstance(version, bool) or not isinstance(version, int)
                                    or version < 1):
            raise ConfigError(source, f"{at}.version", "must be a positive integer")
        weight = item.get("weight", 1)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or \
                not 0 < weight <= MAX_WEIGHT:
            raise ConfigError(source, f"{at}.weight", f"must be a positive number of at most "
                              f"{MAX_WEIGHT:,.0f}")
        targets.append(Target(model, version, float(weight)))
    return tuple(targets)


@dataclass(frozen=True)
class Signature:
    """What a model takes and gives: (name, datatype, full shape) per input and output."""

    inputs: tuple[tuple[str, str, tuple[int, ...]], ...]
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]


def common_signature(router: str, signatures: Mapping[str, Signature]) -> Signature:
    """The signature every target accepts: the same tensor names, datatypes and ranks,
    each dimension fixed where any target fixes it (-1 where all leave it free).
    ConfigError naming the first mismatch."""
    items = list(signatures.items())
    first_name, first = items[0]
    common = first
    for name, signature in items[1:]:
        common = Signature(
            _merge(router, "input", first_name, common.inputs, name, signature.inputs),
            _merge(router, "output", first_name, common.outputs, name, signature.outputs))
    return common


def _merge(router: str, kind: str, left_name: str,
           left: tuple[tuple[str, str, tuple[int, ...]], ...], right_name: str,
           right: tuple[tuple[str, str, tuple[int, ...]], ...]
           ) -> tuple[tuple[str, str, tuple[int, ...]], ...]:
    where = f"router {router!r}"
    by_name = {t[0]: t for t in right}
    if set(by_name) != {t[0] for t in left}:
        raise ConfigError(where, "targets", f"{left_name} has {kind}s "
                          f"{sorted(t[0] for t in left)} but {right_name} has "
                          f"{sorted(by_name)}")
    merged = []
    for name, datatype, shape in left:
        _, other_type, other_shape = by_name[name]
        if datatype != other_type:
            raise ConfigError(where, "targets", f"{kind} {name!r} is {datatype} in "
                              f"{left_name} but {other_type} in {right_name}")
        if len(shape) != len(other_shape) or any(
                a != b and a != -1 and b != -1 for a, b in zip(shape, other_shape, strict=True)):
            raise ConfigError(where, "targets", f"{kind} {name!r} has shape {list(shape)} in "
                              f"{left_name} but {list(other_shape)} in {right_name}")
        merged.append((name, datatype, tuple(a if a != -1 else b
                                             for a, b in zip(shape, other_shape, strict=True))))
    return tuple(merged)
