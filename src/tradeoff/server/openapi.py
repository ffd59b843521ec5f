"""The OpenAPI 3 description of the HTTP API, served at ``/openapi.json``, made from
the route table.

It describes the Open Inference Protocol v2 routes as ``tradeoff serve`` implements them
(JSON tensors; the binary tensor extension is a header plus raw bytes, outside what
OpenAPI can say), the OpenAI-compatible routes (their bodies' schemas made from the types
that check them), and every error answer's JSON shape. OpenAPI 3.1: its schemas are JSON
Schema's, as msgspec writes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tradeoff.dtypes import DATATYPES
from tradeoff.protocol.v2 import REQUEST_FIELDS
from tradeoff.server import openai_requests
from tradeoff.server.routes import Route, path_parameters
from tradeoff.version import __version__

__all__ = ["document"]

# what the repository routes read of their bodies (tests/unit/test_request_fields.py
# checks server/http.py's handlers against them)
LOAD_FIELDS: dict[str, Any] = {"parameters": {"type": "object", "properties": {
    "config": {"type": "string", "description": "the model config as JSON"}}}}
INDEX_FIELDS: dict[str, Any] = {"ready": {"type": "boolean"}}


def _response(status: str, schema: str) -> dict[str, Any]:
    if not schema:
        return {"description": "no body"}
    description = "OK" if status.startswith("2") else \
        "the request was refused; 'error' says why"
    if schema in ("object", "array"):
        body: dict[str, Any] = {"type": schema}
        if schema == "array":
            body["items"] = {"type": "object"}
    else:
        body = {"$ref": f"#/components/schemas/{schema}"}
    return {"description": description, "content": {"application/json": {"schema": body}}}


def _operation(route: Route) -> dict[str, Any]:
    operation: dict[str, Any] = {
        "summary": route.summary, "operationId": route.operation_id,
        "responses": {status: _response(status, schema)
                      for status, schema in route.responses.items()}}
    parameters = path_parameters(route)
    if parameters:
        operation["parameters"] = parameters
    if route.request is not None:
        operation["requestBody"] = {"required": route.request_required, "content": {
            "application/json": {"schema": {"$ref": f"#/components/schemas/{route.request}"}}}}
    return operation


def document(routes: Sequence[Route]) -> dict[str, Any]:
    """The OpenAPI document of ``routes`` (a fresh dict each call)."""
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route.pattern, {})[route.method.lower()] = _operation(route)
    tensor_data = {"type": "array", "items": {}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "tradeoff serve: Open Inference Protocol v2", "version": __version__,
                 "description": "KServe v2 / Triton HTTP API. Errors are JSON {\"error\": ...}"
                                "; 503 answers carry Retry-After."},
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {"type": "object", "required": ["error"],
                          "properties": {"error": {"type": "string"}}},
                "ServerMetadata": {"type": "object", "properties": {
                    "name": {"type": "string"}, "version": {"type": "string"},
                    "extensions": {"type": "array", "items": {"type": "string"}}}},
                "Tensor": {"type": "object", "required": ["name", "datatype", "shape"],
                           "properties": {
                               "name": {"type": "string"},
                               "datatype": {"type": "string", "enum": list(DATATYPES)},
                               "shape": {"type": "array",
                                         "items": {"type": "integer", "minimum": 0}},
                               "parameters": {"type": "object"},
                               "data": tensor_data}},
                "ModelMetadata": {"type": "object", "properties": {
                    "name": {"type": "string"},
                    "versions": {"type": "array", "items": {"type": "string"}},
                    "platform": {"type": "string"},
                    "inputs": {"type": "array", "items": {"type": "object"}},
                    "outputs": {"type": "array", "items": {"type": "object"}}}},
                "InferRequest": {"type": "object", "required": ["inputs"],
                                 "properties": REQUEST_FIELDS},
                "InferResponse": {"type": "object", "properties": {
                    "model_name": {"type": "string"}, "model_version": {"type": "string"},
                    "id": {"type": "string"},
                    "outputs": {"type": "array",
                                "items": {"$ref": "#/components/schemas/Tensor"}}}},
                "Statistics": {"type": "object", "properties": {
                    "model_stats": {"type": "array", "items": {"type": "object"}}}},
                "LoadRequest": {"type": "object", "properties": LOAD_FIELDS},
                "IndexRequest": {"type": "object", "properties": INDEX_FIELDS},
                "OpenAIError": {"type": "object", "required": ["error"], "properties": {
                    "error": {"type": "object", "required": ["message", "type"],
                              "properties": {"message": {"type": "string"},
                                             "type": {"type": "string"}}}}},
                **openai_requests.schemas(),
            },
        },
    }
