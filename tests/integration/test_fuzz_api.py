"""Schemathesis fuzzes the HTTP API from its own OpenAPI document, against a running
server holding healthy models only: whatever it sends, no 5xx, no crash, no hang."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings

from tradeoff.models import build_repository
from tradeoff.server.openapi import document
from tradeoff.server.process import ServerProcess
from tradeoff.server.routes import ROUTES

from .helpers import request, running_server

pytestmark = pytest.mark.integration

# load and unload change what the other operations see (an unloaded model is a 503 by
# design); they are fuzzed with unknown model names only, below
schema = schemathesis.openapi.from_dict(document(ROUTES)).exclude(operation_id=["load", "unload"])


@pytest.fixture(scope="module")
def healthy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = Path(tmp_path_factory.mktemp("fuzz")) / "models"
    build_repository(repo, ("tiny", "mlp"))
    yield from running_server(repo)


def test_the_document_is_served(healthy: ServerProcess) -> None:
    response = request(healthy.url, "GET", "/openapi.json")
    assert response.status == 200 and response.json() == document(ROUTES)


@schema.parametrize()
@settings(max_examples=40, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, healthy: ServerProcess) -> None:
    response = case.call(base_url=healthy.url, timeout=30)
    assert response.status_code < 500, (case.method, case.formatted_path, case.body,
                                        response.status_code, response.text[:500])
    if response.status_code >= 400:
        content_type = response.headers.get("content-type") or ""
        content_type = content_type[0] if isinstance(content_type, list) else content_type
        if content_type.startswith("text/plain"):
            # refused by the HTTP parser before the app (a request line it cannot read)
            assert response.status_code == 400 and "Invalid HTTP request" in response.text
        else:
            assert content_type == "application/json", content_type
            error = response.json()["error"]
            if case.formatted_path.startswith("/v1/"):  # OpenAI's error shape
                assert isinstance(error["message"], str) and isinstance(error["type"], str)
            else:
                assert isinstance(error, str)
    assert requests.get(f"{healthy.url}/v2/health/live", timeout=10).status_code == 200


@pytest.mark.parametrize("name", ["..", "../mlp", "..%2Fmlp", "%2Fetc%2Fpasswd", "/etc/passwd",
                                  "mlp%00", "%2e%2e", "mlp/../tiny", "C:%5Cwindows"])
@pytest.mark.parametrize("action", ["load", "unload"])
def test_repository_names_cannot_leave_the_repository(healthy: ServerProcess, name: str,
                                                      action: str) -> None:
    response = request(healthy.url, "POST", f"/v2/repository/models/{name}/{action}", b"{}")
    assert response.status == 404, (name, response.status, response.body)
    assert request(healthy.url, "GET", "/v2/models/mlp/ready").status == 200


@pytest.mark.parametrize("path", ["/v2/models/../../etc/passwd", "/v2/models/%2e%2e/config",
                                  "/v2/models/mlp/versions/..%2F1/infer",
                                  "/v2/models/mlp/versions/-1", "/v2/models/mlp/versions/1e3"])
def test_model_paths_cannot_leave_the_repository(healthy: ServerProcess, path: str) -> None:
    response = request(healthy.url, "GET" if not path.endswith("infer") else "POST", path)
    assert response.status in (404, 405), (path, response.status, response.body)


@pytest.mark.parametrize("override", [
    {"default_model_filename": "../../../../etc/passwd"},
    {"default_model_filename": "/etc/passwd"},
    {"model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {
        "data_type": "TYPE_FP32", "dims": [256], "input_data_file": "../../../etc/passwd"}}}]},
])
def test_a_config_sent_with_load_cannot_name_files_outside_the_model(
        healthy: ServerProcess, override: dict) -> None:
    import json

    config = json.dumps({"name": "mlp", **override})
    response = request(healthy.url, "POST", "/v2/repository/models/mlp/load",
                       json.dumps({"parameters": {"config": config}}).encode())
    assert response.status == 400, response.body
    assert "outside the model directory" in response.json()["error"]
    assert request(healthy.url, "GET", "/v2/models/mlp/ready").status == 200
