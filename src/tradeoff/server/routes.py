"""Every HTTP route in one table: method, path pattern, handler, access class and its
OpenAPI description. Dispatch, the API-key check and ``/openapi.json`` all read it.

    router = Router(ROUTES)
    route, params = router.match("POST", "/v2/models/mlp/infer")
    route.handler, route.access, params   # "infer", INFERENCE, {"model": "mlp"}

Matching splits the path once and compares segments with the few routes of the same
length: a route costs a handful of string comparisons, not a regular expression.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from tradeoff.errors import NotFound, RequestError

__all__ = ["FOUND_PATHS", "ROUTES", "MethodNotAllowed", "Route", "Router", "path_parameters"]

OPEN, INFERENCE, ADMIN = "open", "inference", "admin"
V2, OPENAI = "v2", "openai"  # which error shape the route answers with


class MethodNotAllowed(RequestError):
    """405; ``access`` is the access class of the route the path did match."""

    status = 405

    def __init__(self, message: str, access: str) -> None:
        super().__init__(message)
        self.access = access


@dataclass(frozen=True)
class Route:
    """One route; ``{name}`` segments of the pattern are path parameters."""

    method: str
    pattern: str
    handler: str
    access: str
    summary: str
    operation_id: str
    responses: dict[str, str] = field(default_factory=dict)  # status -> schema ("": none)
    request: str | None = None  # request body schema name
    request_required: bool = False
    api: str = V2
    admit: bool = False  # takes one of --max-inflight's slots once its body is read
    segments: tuple[str, ...] = field(init=False)
    # (index, literal) to compare and (index, name) to capture, worked out once
    _literals: tuple[tuple[int, str], ...] = field(init=False, repr=False)
    _captures: tuple[tuple[int, str], ...] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        segments = tuple(self.pattern.strip("/").split("/"))
        object.__setattr__(self, "segments", segments)
        object.__setattr__(self, "_literals", tuple(
            (i, s) for i, s in enumerate(segments) if not s.startswith("{")))
        object.__setattr__(self, "_captures", tuple(
            (i, s[1:-1]) for i, s in enumerate(segments) if s.startswith("{")))

    def match(self, parts: Sequence[str]) -> dict[str, str] | None:
        """The path parameters when ``parts`` (as many as the pattern's segments) fit
        the pattern, else None."""
        for i, literal in self._literals:
            if parts[i] != literal:
                return None
        params = {name: parts[i] for i, name in self._captures}
        return None if "" in params.values() else params


def _model_routes(versioned: bool) -> list[Route]:
    base = "/v2/models/{model}" + ("/versions/{version}" if versioned else "")
    suffix = "Version" if versioned else ""
    return [
        Route("GET", base, "model_metadata", INFERENCE, "Model metadata", f"metadata{suffix}",
              {"200": "ModelMetadata", "401": "Error", "404": "Error", "503": "Error"}),
        Route("GET", f"{base}/ready", "model_ready", OPEN, "Model readiness",
              f"modelReady{suffix}", {"200": "", "404": "Error", "503": ""}),
        Route("GET", f"{base}/config", "model_config", INFERENCE, "Model configuration",
              f"config{suffix}", {"200": "object", "401": "Error", "404": "Error",
                                  "503": "Error"}),
        Route("GET", f"{base}/stats", "model_stats", INFERENCE, "Model statistics",
              f"stats{suffix}", {"200": "Statistics", "401": "Error", "404": "Error",
                                 "503": "Error"}),
        Route("POST", f"{base}/infer", "infer", INFERENCE, "Inference (JSON tensors)",
              f"infer{suffix}", {"200": "InferResponse", "400": "Error", "401": "Error",
                                 "404": "Error", "413": "Error", "500": "Error",
                                 "503": "Error"},
              request="InferRequest", request_required=True, admit=True),
    ]


_OPENAI_ERRORS = {"400": "OpenAIError", "401": "OpenAIError", "404": "OpenAIError",
                  "413": "OpenAIError", "503": "OpenAIError"}

ROUTES: tuple[Route, ...] = (
    Route("GET", "/openapi.json", "openapi", OPEN, "This document", "openapi",
          {"200": "object"}),
    Route("GET", "/v2", "server_metadata", INFERENCE, "Server metadata", "serverMetadata",
          {"200": "ServerMetadata", "401": "Error"}),
    Route("GET", "/v2/health/live", "live", OPEN, "Liveness", "live", {"200": "", "503": ""}),
    Route("GET", "/v2/health/ready", "ready", OPEN, "Readiness", "ready",
          {"200": "", "503": ""}),
    Route("GET", "/v2/models/stats", "all_stats", INFERENCE, "Statistics of every model",
          "allStats", {"200": "Statistics", "401": "Error"}),
    *_model_routes(versioned=False),
    *_model_routes(versioned=True),
    Route("POST", "/v2/repository/index", "repository_index", INFERENCE,
          "Models in the repository and their state", "repositoryIndex",
          {"200": "array", "400": "Error", "401": "Error"}, request="IndexRequest",
          admit=True),
    Route("POST", "/v2/repository/models/{model}/load", "load", ADMIN,
          "Load or reload a model (admin key when keys are set)", "load",
          {"200": "", "400": "Error", "401": "Error", "403": "Error", "404": "Error"},
          request="LoadRequest"),
    Route("POST", "/v2/repository/models/{model}/unload", "unload", ADMIN,
          "Unload a model (admin key when keys are set)", "unload",
          {"200": "", "400": "Error", "401": "Error", "403": "Error", "404": "Error"}),
    Route("GET", "/v1/models", "openai_models", INFERENCE, "Generative models (OpenAI)",
          "openaiModels", {"200": "object", "401": "OpenAIError"}, api=OPENAI),
    Route("POST", "/v1/completions", "completions", INFERENCE,
          "Text completion, streamed with stream: true (OpenAI)", "completions",
          {"200": "object", **_OPENAI_ERRORS}, request="CompletionRequest",
          request_required=True, api=OPENAI, admit=True),
    Route("POST", "/v1/chat/completions", "chat_completions", INFERENCE,
          "Chat completion, streamed with stream: true (OpenAI)", "chatCompletions",
          {"200": "object", **_OPENAI_ERRORS}, request="ChatRequest", request_required=True,
          api=OPENAI, admit=True),
)


FOUND_PATHS = 1024  # paths matched a route, remembered (then forgotten all at once)


class Router:
    """Finds the route of a request: NotFound or MethodNotAllowed saying what exists."""

    def __init__(self, routes: Sequence[Route] = ROUTES) -> None:
        self.routes = tuple(routes)
        self._by_length: dict[int, list[Route]] = {}
        for route in self.routes:
            self._by_length.setdefault(len(route.segments), []).append(route)
        self._found: dict[tuple[str, str], tuple[Route, dict[str, str]]] = {}

    def match(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        found = self._found.get((method, path))
        if found is not None:  # the same few paths come again and again
            return found[0], dict(found[1])
        route, params = self._search(method, path)
        if len(self._found) >= FOUND_PATHS:
            self._found.clear()
        self._found[method, path] = route, dict(params)
        return route, params

    def _search(self, method: str, path: str) -> tuple[Route, dict[str, str]]:
        parts = path.strip("/").split("/")
        allowed = None
        for route in self._by_length.get(len(parts), ()):
            params = route.match(parts)
            if params is None:
                continue
            if route.method == method:
                return route, params
            allowed = route
        if allowed is not None:
            raise MethodNotAllowed(f"{method} is not allowed on {path}; use {allowed.method}",
                                   allowed.access)
        if path == "/v1" or path.startswith("/v1/"):
            raise NotFound(f"no route {method} {path} in the OpenAI-compatible API")
        if not path.startswith("/v2"):
            raise NotFound(f"no route {path}; the API lives under /v2 (and /v1 for "
                           "generative models)")
        raise NotFound(f"no route {method} {path}")


def path_parameters(route: Route) -> list[dict[str, Any]]:
    """The OpenAPI ``parameters`` of a route's ``{name}`` segments."""
    examples = {"model": "mlp", "version": "1"}
    return [{"name": s[1:-1], "in": "path", "required": True, "schema": {"type": "string"},
             "example": examples.get(s[1:-1], "x")}
            for s in route.segments if s.startswith("{")]
