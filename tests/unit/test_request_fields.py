"""The OpenAPI document's request schemas come from the same field tables the handlers are
checked against: every key a handler reads from a request document (``x.get("key")``,
``x["key"]``, ``"key" in x``) must be a field of its table, or one it reads only to
refuse. Read from the source: a new field a handler starts to accept fails here until the
schema shows it. The /v1 bodies are types that both check and document them: their
handlers read no key of a document at all."""

from __future__ import annotations

import ast
import inspect
from collections.abc import Callable, Iterable
from typing import Any

import msgspec

from tradeoff.protocol import v2
from tradeoff.server import http, openai_api, openai_requests, openapi, router, validation
from tradeoff.server.routes import ROUTES

# what the handlers read that is not a request's JSON: ASGI messages and scopes, path
# parameters, the parsed tensors
NOT_REQUEST_KEYS = {"more_body", "body", "server", "version", "type", "headers"}


def keys_read(functions: Iterable[Callable[..., Any]]) -> set[str]:
    keys: set[str] = set()
    for function in functions:
        tree = ast.parse(inspect.cleandoc("\n" + inspect.getsource(function)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and \
                    isinstance(node.args[0], ast.Constant) and \
                    isinstance(node.args[0].value, str) and \
                    isinstance(node.func, ast.Attribute) and node.func.attr == "get":
                keys.add(node.args[0].value)
            elif isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and \
                    isinstance(node.slice.value, str) and isinstance(node.ctx, ast.Load):
                keys.add(node.slice.value)
            elif isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and \
                    isinstance(node.left.value, str) and \
                    any(isinstance(op, ast.In) for op in node.ops):
                keys.add(node.left.value)
    return keys


def fields(schema: dict[str, Any]) -> set[str]:
    """Every property name in a schema, at any depth."""
    names: set[str] = set()
    for key, value in schema.items():
        if key == "properties":
            names |= set(value)
        if isinstance(value, dict):
            names |= fields(value)
        elif isinstance(value, list):
            for item in value:
                if isinstance(item, dict):
                    names |= fields(item)
    return names


def test_the_infer_decoder_reads_only_the_fields_the_schema_shows() -> None:
    schema = openapi.document(ROUTES)["components"]["schemas"]["InferRequest"]
    declared = fields(schema)
    read = keys_read([v2._parse_header, validation.validate,
                      router.RoutedModel.decide]) - NOT_REQUEST_KEYS
    assert read - declared - set(v2.REFUSED_PARAMETERS) == set()
    assert {"binary_data_size", "binary_data", "priority", "timeout", "cache",
            "class", "binary_data_output"} <= declared


def test_the_openai_bodies_are_documented_by_the_types_that_read_them() -> None:
    schemas = openapi.document(ROUTES)["components"]["schemas"]
    for body in (openai_requests.CompletionRequest, openai_requests.ChatRequest):
        documented = schemas[body.__name__]
        assert set(documented["properties"]) == {
            f.encode_name for f in msgspec.structs.fields(body)}
        assert sorted(documented["required"]) == sorted(
            f.encode_name for f in msgspec.structs.fields(body) if f.required)
    declared = fields({name: schemas[name] for name in openai_requests.schemas()})
    for field in ("max_completion_tokens", "stream_options", "include_usage", "cache",
                  "prompt", "messages", "role", "content", "user", "class",
                  *openai_requests.REFUSED_FIELDS):
        assert field in declared, field
    read = keys_read([openai_api.OpenAIApi.completions, openai_api.OpenAIApi.chat_completions,
                      openai_api.OpenAIApi._generate, openai_api._route_parameters])
    assert read - NOT_REQUEST_KEYS == set()  # every field comes through the types


def test_the_repository_handlers_read_only_the_fields_the_schema_shows() -> None:
    schemas = openapi.document(ROUTES)["components"]["schemas"]
    read = keys_read([http.HttpApp.repository_index, http.HttpApp.load]) - NOT_REQUEST_KEYS \
        - {"model"}  # the path's
    assert read <= fields(schemas["IndexRequest"]) | fields(schemas["LoadRequest"])
    assert read == {"ready", "parameters"}
