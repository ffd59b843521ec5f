"""The OpenAPI 3 description of the HTTP API, served at ``/openapi.json``.

It describes the Open Inference Protocol v2 routes as ``tradeoff serve`` implements them
(JSON tensors; the binary tensor extension is a header plus raw bytes, outside what
OpenAPI can say), and every error answer's JSON shape.
"""

from __future__ import annotations

from typing import Any

from tradeoff import __version__
from tradeoff.dtypes import DATATYPES

_ERROR = {"description": "the request was refused; 'error' says why",
          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
_EMPTY = {"description": "no body"}


def _json(schema: str, description: str = "OK") -> dict[str, Any]:
    return {"description": description,
            "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}}}


def _responses(ok: dict[str, Any], *codes: str) -> dict[str, Any]:
    out = {"200": ok}
    for code in codes:
        out[code] = _EMPTY if code == "503-empty" else _ERROR
    if "503-empty" in out:
        out["503"] = out.pop("503-empty")
    return out


def _model_params(with_version: bool) -> list[dict[str, Any]]:
    params = [{"name": "model", "in": "path", "required": True, "schema": {"type": "string"},
               "example": "mlp"}]
    if with_version:
        params.append({"name": "version", "in": "path", "required": True,
                       "schema": {"type": "string"}, "example": "1"})
    return params


def document() -> dict[str, Any]:
    """The OpenAPI document (a fresh dict each call)."""
    paths: dict[str, Any] = {
        "/v2": {"get": {"summary": "Server metadata", "operationId": "serverMetadata",
                        "responses": _responses(_json("ServerMetadata"), "401")}},
        "/v2/health/live": {"get": {"summary": "Liveness", "operationId": "live",
                                    "responses": _responses(_EMPTY, "503-empty")}},
        "/v2/health/ready": {"get": {"summary": "Readiness", "operationId": "ready",
                                     "responses": _responses(_EMPTY, "503-empty")}},
        "/v2/models/stats": {"get": {"summary": "Statistics of every model",
                                     "operationId": "allStats",
                                     "responses": _responses(_json("Statistics"), "401")}},
        "/v2/repository/index": {"post": {
            "summary": "Models in the repository and their state",
            "operationId": "repositoryIndex",
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": {"type": "object", "properties": {"ready": {"type": "boolean"}}}}}},
            "responses": _responses({"description": "OK", "content": {"application/json": {
                "schema": {"type": "array", "items": {"type": "object"}}}}}, "400", "401")}},
        "/v2/repository/models/{model}/load": {"post": {
            "summary": "Load or reload a model (admin key when keys are set)",
            "operationId": "load", "parameters": _model_params(False),
            "requestBody": {"required": False, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/LoadRequest"}}}},
            "responses": _responses(_EMPTY, "400", "401", "403", "404")}},
        "/v2/repository/models/{model}/unload": {"post": {
            "summary": "Unload a model (admin key when keys are set)",
            "operationId": "unload", "parameters": _model_params(False),
            "responses": _responses(_EMPTY, "400", "401", "403", "404")}},
    }
    for versioned in (False, True):
        base = "/v2/models/{model}" + ("/versions/{version}" if versioned else "")
        suffix = "Version" if versioned else ""
        params = _model_params(versioned)
        paths[base] = {"get": {"summary": "Model metadata", "operationId": f"metadata{suffix}",
                               "parameters": params,
                               "responses": _responses(_json("ModelMetadata"), "401", "404",
                                                       "503")}}
        paths[f"{base}/ready"] = {"get": {
            "summary": "Model readiness", "operationId": f"modelReady{suffix}",
            "parameters": params, "responses": _responses(_EMPTY, "404", "503-empty")}}
        paths[f"{base}/config"] = {"get": {
            "summary": "Model configuration", "operationId": f"config{suffix}",
            "parameters": params,
            "responses": _responses({"description": "OK", "content": {"application/json": {
                "schema": {"type": "object"}}}}, "401", "404", "503")}}
        paths[f"{base}/stats"] = {"get": {
            "summary": "Model statistics", "operationId": f"stats{suffix}",
            "parameters": params,
            "responses": _responses(_json("Statistics"), "401", "404", "503")}}
        paths[f"{base}/infer"] = {"post": {
            "summary": "Inference (JSON tensors)", "operationId": f"infer{suffix}",
            "parameters": params,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": "#/components/schemas/InferRequest"}}}},
            "responses": _responses(_json("InferResponse"), "400", "401", "404", "413",
                                    "500", "503")}}
    tensor_data = {"type": "array", "items": {}}
    return {
        "openapi": "3.0.3",
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
                "InferRequest": {"type": "object", "required": ["inputs"], "properties": {
                    "id": {"type": "string"}, "parameters": {"type": "object"},
                    "inputs": {"type": "array", "items": {"$ref": "#/components/schemas/Tensor"}},
                    "outputs": {"type": "array", "items": {"type": "object", "properties": {
                        "name": {"type": "string"}, "parameters": {"type": "object"}}}}}},
                "InferResponse": {"type": "object", "properties": {
                    "model_name": {"type": "string"}, "model_version": {"type": "string"},
                    "id": {"type": "string"},
                    "outputs": {"type": "array",
                                "items": {"$ref": "#/components/schemas/Tensor"}}}},
                "Statistics": {"type": "object", "properties": {
                    "model_stats": {"type": "array", "items": {"type": "object"}}}},
                "LoadRequest": {"type": "object", "properties": {
                    "parameters": {"type": "object", "properties": {
                        "config": {"type": "string"}}}}},
            },
        },
    }
