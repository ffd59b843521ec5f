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
    pools:                                   # targets on other servers (a gateway)
      remote_mlp:                            # a name routes use like a model's
        protocol: v2                         # v2 (HTTP), v2-grpc or openai
        model: mlp                           # its name on the replicas (default: the pool's)
        policy: least_outstanding            # round_robin, least_outstanding,
                                             # power_of_two, prefix, session
        replicas: [http://127.0.0.2:8000, {url: http://127.0.0.3:8000, drain: true}]
        queue: tradeoff                      # read each replica's own queue from its
                                             # /metrics: tradeoff, triton, vllm, or
                                             # {metric, labels, port, path, interval_s}

This module reads and checks the file and decides where a request goes; serving it is
the server's. Errors name the file and the field, with "did you mean" for a misspelling.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, urlsplit

from tradeoff.errors import ConfigError, shown
from tradeoff.repository.safe_yaml import read_yaml

__all__ = [
    "CLASS_PATTERN",
    "CONDITIONS",
    "HEALTH_FIELDS",
    "MAX_REPLICAS",
    "MAX_WEIGHT",
    "POLICIES",
    "POOL_FIELDS",
    "PRIORITY_LIMIT",
    "PROTOCOLS",
    "QUEUE_FIELDS",
    "QUEUE_SERVERS",
    "REPLICA_FIELDS",
    "ROUTE_FIELDS",
    "TARGET_FIELDS",
    "TOP_FIELDS",
    "Condition",
    "Decision",
    "HealthCheck",
    "PoolConfig",
    "QueueReport",
    "ReplicaConfig",
    "Route",
    "RouterConfig",
    "Shadow",
    "Signature",
    "Target",
    "class_name_problem",
    "common_signature",
    "sticky_point",
]

TOP_FIELDS = ("routes", "fallback", "shadow", "idempotent", "hide_targets", "pools")
POOL_FIELDS = ("protocol", "model", "policy", "replicas", "session", "health", "timeout_s",
               "connections", "retry_budget", "forward_headers", "balance", "api_key_env", "queue")
REPLICA_FIELDS = ("url", "drain", "metrics")
HEALTH_FIELDS = ("path", "interval_s", "timeout_s", "eject_after", "eject_s")
PROTOCOLS = ("v2", "v2-grpc", "openai")
QUEUE_FIELDS = ("server", "metric", "labels", "port", "path", "interval_s")
# The gauge each kind of server reports its waiting requests in, the label naming the
# model, and the port of its /metrics (None: the replica's own)
QUEUE_SERVERS: dict[str, tuple[str, str, int | None]] = {
    "tradeoff": ("tradeoff_inference_queue_depth", "model", 8002),
    "tradeoff-generation": ("tradeoff_generation_requests_waiting", "model", 8002),
    "triton": ("nv_inference_pending_request_count", "model", 8002),
    "vllm": ("vllm:num_requests_waiting", "model_name", None),
}
POLICIES = ("round_robin", "least_outstanding", "power_of_two", "prefix", "session")
MAX_REPLICAS = 256
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
class ReplicaConfig:
    """One server of a pool: its base URL (scheme, host, port, and a path prefix if
    any), whether it is draining (no new requests), and where its Prometheus metrics
    are when they are not where the pool's ``queue`` says."""

    url: str
    scheme: str
    host: str
    port: int
    prefix: str = ""
    drain: bool = False
    metrics: str | None = None  # http(s)://HOST:PORT/PATH

    @cached_property
    def name(self) -> str:
        """``host:port``: what counters and answers call it."""
        return f"{self.host}:{self.port}"


@dataclass(frozen=True)
class HealthCheck:
    """Active checks of each replica's readiness, and passive ejection: a replica that
    fails ``eject_after`` requests in a row (or a check) is out for at least ``eject_s``,
    until a check passes again."""

    path: str | None = None  # None: the protocol's (/v2/health/ready, /models)
    interval_s: float = 1.0
    timeout_s: float = 1.0
    eject_after: int = 3
    eject_s: float = 1.0


@dataclass(frozen=True)
class QueueReport:
    """Where each replica of a pool reports the requests waiting in its own queue: the
    gauge ``metric`` (its samples with ``labels`` summed) in the Prometheus text at
    ``path`` on the replica's host and ``port`` (None: the replica's port), read every
    ``interval_s``."""

    metric: str
    labels: tuple[tuple[str, str], ...]
    port: int | None = None
    path: str = "/metrics"
    interval_s: float = 0.25


@dataclass(frozen=True)
class PoolConfig:
    """Replicas of one model on other servers, and how requests are spread over them."""

    name: str
    protocol: str
    model: str
    policy: str
    replicas: tuple[ReplicaConfig, ...]
    session: str | None = None   # policy session: the header (or "user") that keys it
    health: HealthCheck = HealthCheck()
    timeout_s: float = 60.0      # one request at one replica, its whole answer
    connections: int = 64        # per replica, kept alive; more requests wait
    retry_budget: float = 0.5    # retries in flight: at most this share of requests (min 3);
    # half, so the requests in flight at one lost replica of two or more can all go again
    forward_headers: tuple[str, ...] = ()  # client headers passed on (none by default)
    balance: float = 1.5         # prefix: a replica over this x the mean load is passed over
    api_key_env: str | None = None  # the gateway's own key for the replicas, from this
    # environment variable (Authorization: Bearer), never written in the file
    queue: QueueReport | None = None  # the replicas' own queues, read from their metrics


@dataclass(frozen=True)
class RouterConfig:
    routes: tuple[Route, ...]
    fallback: tuple[Target, ...] = ()
    shadow: Shadow | None = None
    idempotent: bool = False
    hide_targets: bool = False  # direct calls to its targets are refused while it serves
    pools: Mapping[str, PoolConfig] = field(default_factory=dict)

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
        pools = _pools(doc.get("pools"), source, name)
        config = cls(routes, fallback, shadow, idempotent, hide, pools)
        for route_index, route in enumerate(routes):
            for arm in route.arms:
                if arm.model in pools and arm.version is not None:
                    raise ConfigError(source, f"routes[{route_index}].to", f"pool "
                                      f"{arm.model!r} has no versions here: its replicas "
                                      "serve the version their server chooses")
        if hide and pools:
            raise ConfigError(source, "hide_targets", "hides local targets only; a pool's "
                              "replicas are other servers")
        return config

    def models(self) -> list[str]:
        """Every model or pool the router may send to, each once, in order of
        appearance."""
        names = [arm.model for route in self.routes for arm in route.arms]
        names += [t.model for t in self.fallback]
        if self.shadow is not None:
            names.append(self.shadow.target.model)
        return list(dict.fromkeys(names))

    def local_models(self) -> list[str]:
        """The targets that are models of this server (not pools)."""
        return [name for name in self.models() if name not in self.pools]

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


def _pools(raw: Any, source: str, router: str | None) -> dict[str, PoolConfig]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(source, "pools", "must map pool names to {protocol, replicas, ...}")
    pools = {}
    for name, doc in raw.items():
        where = f"pools.{name}"
        if not isinstance(name, str) or _CLASS_NAME.fullmatch(name) is None:
            raise ConfigError(source, where, "a pool's name is 1 to 64 letters, digits, "
                              "'_', '.' or '-'")
        if name == router:
            raise ConfigError(source, where, "a pool cannot have its router's name")
        pools[name] = _pool(name, doc, source, where)
    return pools


def _number(doc: Mapping[str, Any], key: str, default: float, source: str, where: str, *,
            low: float, high: float, integer: bool = False) -> Any:
    value = doc.get(key, default)
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "an integer" if integer else "a number"
        raise ConfigError(source, f"{where}{key}", f"must be {kind} from {low:g} to {high:g}")
    return value if integer else float(value)


def _choice(doc: Mapping[str, Any], key: str, default: str, choices: Sequence[str],
            source: str, where: str) -> str:
    value = doc.get(key, default)
    if value not in choices:
        raise ConfigError(source, f"{where}{key}", f"must be one of {', '.join(choices)}"
                          f"{_hint(str(value), choices)}")
    return str(value)


def _pool(name: str, doc: Any, source: str, where: str) -> PoolConfig:
    if not isinstance(doc, dict):
        raise ConfigError(source, where, "must be a mapping with protocol and replicas")
    _known(doc, POOL_FIELDS, source, f"{where}.")
    at = f"{where}."
    protocol = _choice(doc, "protocol", "v2", PROTOCOLS, source, at)
    model = doc.get("model", name)
    if not isinstance(model, str) or not model or "/" in model or len(model) > 256:
        raise ConfigError(source, f"{at}model", "must be the model's name on the replicas")
    policy = _choice(doc, "policy", "least_outstanding", POLICIES, source, at)
    if policy == "prefix" and protocol != "openai":
        raise ConfigError(source, f"{at}policy", "prefix routes generations by their "
                          "prompts: use it with protocol openai")
    raw_replicas = doc.get("replicas")
    if not isinstance(raw_replicas, list) or not raw_replicas:
        raise ConfigError(source, f"{at}replicas", "must list the replicas' URLs")
    if len(raw_replicas) > MAX_REPLICAS:
        raise ConfigError(source, f"{at}replicas", f"at most {MAX_REPLICAS} replicas")
    replicas = tuple(_replica(r, source, f"{at}replicas[{i}]", protocol)
                     for i, r in enumerate(raw_replicas))
    names = [r.name + r.prefix for r in replicas]
    if len(set(names)) != len(names):
        raise ConfigError(source, f"{at}replicas", "lists a replica twice")
    session = doc.get("session")
    if session is not None and (not isinstance(session, str) or
                                re.fullmatch(r"[A-Za-z0-9-]{1,64}", session) is None):
        raise ConfigError(source, f"{at}session", "must name a header (letters, digits, "
                          "'-'), or be 'user' (the OpenAI body's field)")
    if policy == "session" and session is None:
        raise ConfigError(source, f"{at}session", "policy session needs the header that "
                          "keys it (or 'user')")
    health = _health(doc.get("health"), source, f"{at}health.")
    forward = doc.get("forward_headers", [])
    if not isinstance(forward, list) or not all(
            isinstance(h, str) and re.fullmatch(r"[A-Za-z0-9-]{1,64}", h) for h in forward):
        raise ConfigError(source, f"{at}forward_headers", "must list header names")
    lowered = tuple(h.lower() for h in forward)
    hop = {"host", "content-length", "connection", "transfer-encoding", "keep-alive",
           "upgrade", "te", "trailer", "proxy-authorization", "expect"}
    if bad := [h for h in lowered if h in hop]:
        raise ConfigError(source, f"{at}forward_headers", f"{bad[0]!r} belongs to one "
                          "connection and is never passed on")
    key_env = doc.get("api_key_env")
    if key_env is not None and (not isinstance(key_env, str) or
                                re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,127}", key_env) is None):
        raise ConfigError(source, f"{at}api_key_env", "must name an environment variable")
    return PoolConfig(
        name, protocol, model, policy, replicas, session, health,
        _number(doc, "timeout_s", 60.0, source, at, low=0.01, high=3600),
        _number(doc, "connections", 64, source, at, low=1, high=4096, integer=True),
        _number(doc, "retry_budget", 0.5, source, at, low=0, high=1),
        lowered,
        _number(doc, "balance", 1.5, source, at, low=1, high=100),
        key_env,
        _queue(doc.get("queue"), source, f"{at}queue", protocol, model, replicas))


def _replica(raw: Any, source: str, where: str, protocol: str) -> ReplicaConfig:
    drain, metrics = False, None
    if isinstance(raw, dict):
        _known(raw, REPLICA_FIELDS, source, f"{where}.")
        drain = raw.get("drain", False)
        if not isinstance(drain, bool):
            raise ConfigError(source, f"{where}.drain", "must be true or false")
        if "metrics" in raw:
            metrics = raw["metrics"]
            _url(metrics, source, f"{where}.metrics", ("http", "https"))
        raw = raw.get("url")
    if not isinstance(raw, str) or not raw:
        raise ConfigError(source, where, "must be a URL, or {url, drain, metrics}")
    schemes = ("grpc",) if protocol == "v2-grpc" else ("http", "https")
    parts = _url(raw, source, where, schemes)
    port = parts.port
    if protocol == "v2-grpc" and (port is None or parts.path.strip("/")):
        raise ConfigError(source, where, f"{shown(raw)}: give grpc://HOST:PORT, no path")
    port = port or (443 if parts.scheme == "https" else 80)
    assert parts.hostname is not None
    return ReplicaConfig(raw, parts.scheme, parts.hostname, port,
                         parts.path.rstrip("/"), drain, metrics)


def _url(raw: Any, source: str, where: str, schemes: Sequence[str]) -> SplitResult:
    """A replica's URL, checked: one of ``schemes``, a host, no credentials, query or
    fragment."""
    if not isinstance(raw, str) or not raw:
        raise ConfigError(source, where, "must be a URL")
    try:
        parts = urlsplit(raw)
        parts.port  # noqa: B018 (a bad port raises here)
    except ValueError as exc:
        raise ConfigError(source, where, f"{shown(raw)} is not a URL: {exc}") from None
    if parts.scheme not in schemes or not parts.hostname:
        example = "grpc://HOST:PORT" if "grpc" in schemes else "http://HOST:PORT (or https)"
        raise ConfigError(source, where, f"{shown(raw)}: give {example}")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise ConfigError(source, where, f"{shown(raw)}: no credentials, query or "
                          "fragment in a replica's URL (forward_headers passes a key on)")
    return parts


def _queue(raw: Any, source: str, where: str, protocol: str, model: str,
           replicas: Sequence[ReplicaConfig]) -> QueueReport | None:
    """A pool's ``queue``: a server's name (its gauge, label and port), or a mapping
    that names the server or the metric and may set the rest."""
    if raw is None:
        return None
    if isinstance(raw, str):
        raw = {"server": raw}
    if not isinstance(raw, dict):
        raise ConfigError(source, where, f"must name the replicas' server "
                          f"({', '.join(QUEUE_SERVERS)}) or map {', '.join(QUEUE_FIELDS)}")
    _known(raw, QUEUE_FIELDS, source, f"{where}.")
    server = raw.get("server")
    if server is None and "metric" not in raw:
        raise ConfigError(source, where, "name the replicas' server or the metric to read")
    metric, label, port = None, "model", None
    if server is not None:
        server = _choice(raw, "server", "", tuple(QUEUE_SERVERS), source, f"{where}.")
        if server == "tradeoff" and protocol == "openai":
            server = "tradeoff-generation"  # a generative model's waiting requests
        metric, label, port = QUEUE_SERVERS[server]
    metric = raw.get("metric", metric)
    if not isinstance(metric, str) or re.fullmatch(r"[A-Za-z_:][A-Za-z0-9_:]{0,199}",
                                                  metric) is None:
        raise ConfigError(source, f"{where}.metric", "must be a Prometheus metric name")
    labels = raw.get("labels", {label: model})
    if not isinstance(labels, dict) or not all(
            isinstance(k, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]{0,99}", k) and
            isinstance(v, str) and len(v) <= 256 for k, v in labels.items()):
        raise ConfigError(source, f"{where}.labels", "must map label names to values")
    if "port" in raw:
        port = _number(raw, "port", 0, source, f"{where}.", low=1, high=65535, integer=True)
    elif protocol == "v2-grpc" and port is None and \
            any(r.metrics is None for r in replicas):
        raise ConfigError(source, f"{where}.port", "a gRPC replica's metrics are on "
                          "another port: give the port of its HTTP /metrics")
    path = _path(raw.get("path", "/metrics"), source, f"{where}.path", "/metrics",
                 query=True)
    return QueueReport(metric, tuple(sorted(labels.items())), port, path,
                       _number(raw, "interval_s", 0.25, source, f"{where}.", low=0.05,
                               high=3600))


def _path(value: Any, source: str, where: str, example: str, query: bool = False) -> str:
    """A path on a replica's server: from the root, no spaces, line breaks or fragment,
    and no query unless ``query``."""
    refused = " \r\n#" if query else " \r\n?#"
    if not isinstance(value, str) or not value.startswith("/") or \
            any(c in value for c in refused):
        raise ConfigError(source, where, f"must be a path such as {example}")
    return value


def _health(raw: Any, source: str, where: str) -> HealthCheck:
    if raw is None:
        return HealthCheck()
    if not isinstance(raw, dict):
        raise ConfigError(source, where.rstrip("."), f"must be a mapping of "
                          f"{', '.join(HEALTH_FIELDS)}")
    _known(raw, HEALTH_FIELDS, source, where)
    path = raw.get("path")
    return HealthCheck(
        None if path is None else _path(path, source, f"{where}path", "/v2/health/ready"),
        _number(raw, "interval_s", 1.0, source, where, low=0.05, high=3600),
        _number(raw, "timeout_s", 1.0, source, where, low=0.01, high=600),
        _number(raw, "eject_after", 3, source, where, low=1, high=1000, integer=True),
        _number(raw, "eject_s", 1.0, source, where, low=0, high=3600))


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
