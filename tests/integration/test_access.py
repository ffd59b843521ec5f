"""API keys and TLS against a real server: who may call what, over HTTP and gRPC."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc

from tradeoff.server.process import ServerProcess

from .helpers import request, running_server
from .model_repo import build_shutdown_repository

pytestmark = pytest.mark.integration

INFERENCE_KEY = "inference-key-0123"
FILE_KEY = "file-key-456789"
ENV_KEY = "env-key-abcdef"
ADMIN_KEY = "admin-key-98765"
METRICS_KEY = "metrics-key-24680"
MLP_BODY = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                                   "data": [0.5] * 256}]}).encode()


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("access")
    repo = build_shutdown_repository(root / "models")
    key_file = root / "keys.txt"
    key_file.write_text(f"# inference keys\n{FILE_KEY}\n\n")
    yield from running_server(repo, env={"TRADEOFF_API_KEY": ENV_KEY},
                              extra_args=("--api-key", INFERENCE_KEY, "--api-key-file",
                                          str(key_file), "--admin-key", ADMIN_KEY,
                                          "--metrics-key", METRICS_KEY))


def call(server: ServerProcess, method: str, path: str, key: str | None = None,
         body: bytes | None = None) -> tuple[int, dict, str | None]:
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    response = request(server.url, method, path, body, headers)
    doc = json.loads(response.body) if response.body else {}
    return response.status, doc, response.header("WWW-Authenticate")


def test_health_stays_open(secured: ServerProcess) -> None:
    for path in ("/v2/health/live", "/v2/health/ready", "/v2/models/mlp/ready",
                 "/v2/models/mlp/versions/1/ready"):
        assert call(secured, "GET", path)[0] == 200, path


def test_without_a_key_the_api_cannot_be_mapped(secured: ServerProcess) -> None:
    """Unknown routes and wrong methods answer 401 without a key, so a caller without
    one learns nothing but the open routes."""
    for method, path in (("GET", "/v2/nope"), ("GET", "/v2/models/mlp/infer"),
                         ("GET", "/v1/nope"), ("POST", "/v1/models")):
        assert call(secured, method, path)[0] == 401, (method, path)
    assert call(secured, "GET", "/v2/nope", INFERENCE_KEY)[0] == 404
    assert call(secured, "GET", "/v2/models/mlp/infer", INFERENCE_KEY)[0] == 405
    assert call(secured, "POST", "/v2/health/ready")[0] == 405  # an open route


@pytest.mark.parametrize("path", ["/v2", "/v2/models/mlp", "/v2/models/mlp/config",
                                  "/v2/models/mlp/stats", "/v2/models/stats"])
def test_metadata_needs_a_key(secured: ServerProcess, path: str) -> None:
    status, doc, challenge = call(secured, "GET", path)
    assert status == 401 and challenge == "Bearer"
    assert doc == {"error": "missing or invalid API key: send 'Authorization: Bearer KEY'"}
    assert call(secured, "GET", path, INFERENCE_KEY)[0] == 200


def test_inference_accepts_every_kind_of_inference_key_and_the_admin_key(
        secured: ServerProcess) -> None:
    path = "/v2/models/mlp/infer"
    for key in (INFERENCE_KEY, FILE_KEY, ENV_KEY, ADMIN_KEY):
        assert call(secured, "POST", path, key, MLP_BODY)[0] == 200, key
    assert call(secured, "POST", path, METRICS_KEY, MLP_BODY)[0] == 401  # scrapes only
    wrong = "wrong-key-000000"
    status, doc, _ = call(secured, "POST", path, wrong, MLP_BODY)
    assert status == 401 and wrong not in json.dumps(doc)
    assert call(secured, "POST", path, INFERENCE_KEY[:-1], MLP_BODY)[0] == 401
    response = request(secured.url, "POST", path, MLP_BODY,
                       {"Authorization": f"Basic {INFERENCE_KEY}"})
    assert response.status == 401  # only Bearer


def test_repository_changes_need_the_admin_key(secured: ServerProcess) -> None:
    path = "/v2/repository/models/held/unload"
    assert call(secured, "POST", path)[0] == 401
    status, doc, _ = call(secured, "POST", path, INFERENCE_KEY)
    assert status == 403 and "admin key" in doc["error"]
    assert call(secured, "POST", path, ADMIN_KEY)[0] == 200
    assert call(secured, "POST", "/v2/repository/models/held/load", ADMIN_KEY)[0] == 200
    assert call(secured, "POST", "/v2/repository/index", INFERENCE_KEY)[0] == 200


def test_grpc_uses_the_same_keys(secured: ServerProcess) -> None:
    client = triton_grpc.InferenceServerClient(secured.grpc_url)
    try:
        assert client.is_server_live() and client.is_model_ready("mlp")
        with pytest.raises(triton_grpc.InferenceServerException) as refused:
            client.get_model_metadata("mlp")
        assert refused.value.status() == "StatusCode.UNAUTHENTICATED"
        good = {"authorization": f"Bearer {INFERENCE_KEY}"}
        assert client.get_model_metadata("mlp", headers=good).name == "mlp"
        tensor = triton_grpc.InferInput("INPUT0", [1, 256], "FP32")
        tensor.set_data_from_numpy(np.full((1, 256), 0.5, np.float32))
        assert client.infer("mlp", [tensor], headers=good).as_numpy("OUTPUT0") is not None
        with pytest.raises(triton_grpc.InferenceServerException) as denied:
            client.unload_model("held", headers=good)
        assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
        client.load_model("held", headers={"authorization": f"Bearer {ADMIN_KEY}"})
    finally:
        client.close()


def test_metrics_take_the_metrics_key(secured: ServerProcess,
                                      open_server: ServerProcess) -> None:
    """/metrics names every model and its traffic: with --metrics-key a scrape needs that
    key (or an admin key), as Prometheus sends it; without, it stays open."""
    def scrape(server: ServerProcess, key: str | None) -> int:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return request(server.metrics_url.removesuffix("/metrics"), "GET", "/metrics",
                       headers=headers).status

    assert scrape(secured, None) == 401
    assert scrape(secured, INFERENCE_KEY) == 401
    assert scrape(secured, METRICS_KEY) == 200
    assert scrape(secured, ADMIN_KEY) == 200
    assert scrape(open_server, None) == 200


def test_keys_never_reach_the_log(secured: ServerProcess) -> None:
    log = secured.log_text()
    assert "access: 3 inference key(s), 1 admin key(s)" in log
    for key in (INFERENCE_KEY, FILE_KEY, ENV_KEY, ADMIN_KEY, METRICS_KEY):
        assert key not in log


def test_bench_sends_the_key(secured: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "bench", secured.url, "-m", "mlp",
                          "--requests", "20", "--header", f"Authorization:Bearer {ENV_KEY}",
                          "--json", str(out)], capture_output=True, text=True, timeout=120,
                         check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text())["summary"]["errors"] == 0
    unauthorized = subprocess.run([sys.executable, "-m", "tradeoff", "bench", secured.url,
                                   "-m", "mlp", "--requests", "5"], capture_output=True,
                                  text=True, timeout=120, check=False)
    assert unauthorized.returncode != 0 and "HTTP 401" in unauthorized.stderr


def test_short_keys_are_refused_at_start(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "tradeoff", "serve", "--model-repository",
                          str(tmp_path), "--api-key", "short"], capture_output=True, text=True,
                         timeout=60, check=False)
    assert run.returncode != 0 and "at least 8 characters" in run.stderr
    assert "Traceback" not in run.stderr


def self_signed(directory: Path) -> tuple[Path, Path]:
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key


def test_tls_on_http_and_grpc(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    repo = build_shutdown_repository(tmp_path / "models")
    with ServerProcess(repo, tls=True, extra_args=("--tls-cert", str(cert), "--tls-key",
                                                   str(key))) as server:
        context = ssl.create_default_context(cafile=str(cert))
        connection = http.client.HTTPSConnection(server.host, server.http_port,
                                                 context=context, timeout=30)
        connection.request("POST", "/v2/models/mlp/infer", MLP_BODY,
                           {"Content-Type": "application/json"})
        answer = connection.getresponse()
        assert answer.status == 200 and json.loads(answer.read())["model_name"] == "mlp"
        connection.close()
        plain = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
        with pytest.raises((ConnectionError, http.client.HTTPException, OSError)):
            plain.request("GET", "/v2/health/live")
            plain.getresponse().read()
        client = triton_grpc.InferenceServerClient(server.grpc_url, ssl=True,
                                                   root_certificates=str(cert))
        assert client.is_server_live()
        client.close()
        # tradeoff bench over https, trusting the certificate the way a user would
        out = tmp_path / "bench.json"
        bench = subprocess.run([sys.executable, "-m", "tradeoff", "bench", server.url,
                                "--model", "mlp", "--requests", "5", "--json", str(out)],
                               capture_output=True, text=True, timeout=120,
                               env={**os.environ, "SSL_CERT_FILE": str(cert)}, check=False)
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert server.url.startswith("https://")
        assert json.loads(out.read_text())["summary"]["successes"] == 5
        assert server.stop() == 0


def test_llm_bench_names_the_key_variable_when_refused(secured: ServerProcess) -> None:
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter
    from tradeoff.errors import BenchSetupError

    for variable, env in (("NO_SUCH_KEY", {}), ("WRONG_KEY", {"WRONG_KEY": "wrong-key-000"})):
        spec = EndpointSpec(f"{secured.url}/v1", "openai", "m",
                            generation=GenerationOptions(api_key_env=variable))
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            with pytest.raises(BenchSetupError, match=f"refused the API key.*\\${variable}"):
                make_adapter(spec).prepare()


# ---------------------------------------------------- browsers: DNS rebinding, cross-site

@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Keys off (the default), bound to 127.0.0.1."""
    yield from running_server(build_shutdown_repository(
        tmp_path_factory.mktemp("browsers") / "models"))


def raw(server: ServerProcess, method: str, path: str, headers: dict[str, str],
        body: bytes = b"") -> tuple[int, dict]:
    """One request with exactly these headers (http.client would add its own Host)."""
    connection = http.client.HTTPConnection(server.host, server.http_port, timeout=30)
    try:
        connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            connection.putheader(name, value)
        connection.endheaders(body)
        response = connection.getresponse()
        payload = response.read()
        return response.status, json.loads(payload) if payload else {}
    finally:
        connection.close()


def test_a_cross_site_form_cannot_unload_a_model(open_server: ServerProcess) -> None:
    """A text/plain POST (no CORS preflight) from a foreign page, with keys off, used to
    unload a model; refused with 403 and the model keeps serving."""
    own = f"127.0.0.1:{open_server.http_port}"
    status, doc = raw(open_server, "POST", "/v2/repository/models/mlp/unload",
                      {"Host": own, "Origin": "https://evil.example.com",
                       "Content-Type": "text/plain"}, b"{}")
    assert status == 403 and "--allowed-origin" in doc["error"], doc
    assert call(open_server, "GET", "/v2/models/mlp/ready")[0] == 200
    # a page served from the server itself may; clients that send no Origin are unchanged
    status, _ = raw(open_server, "POST", "/v2/models/mlp/infer",
                    {"Host": own, "Origin": f"http://{own}",
                     "Content-Type": "application/json"}, MLP_BODY)
    assert status == 200
    assert call(open_server, "POST", "/v2/models/mlp/infer", body=MLP_BODY)[0] == 200


def test_a_rebound_host_name_is_refused(open_server: ServerProcess) -> None:
    """Any Host used to be served: a site that re-points its name to 127.0.0.1 could
    read and change the server from its visitors' browsers."""
    status, doc = raw(open_server, "GET", "/v2/models/mlp",
                      {"Host": f"rebind.example.com:{open_server.http_port}"})
    assert status == 403 and "--allowed-host" in doc["error"], doc
    for host in (f"localhost:{open_server.http_port}", f"127.0.0.1:{open_server.http_port}"):
        assert raw(open_server, "GET", "/v2/models/mlp", {"Host": host})[0] == 200


def test_allowed_hosts_and_origins_are_served(tmp_path: Path) -> None:
    repo = build_shutdown_repository(tmp_path / "models")
    with contextlib.contextmanager(running_server)(repo, extra_args=(
            "--allowed-host", "models.internal", "--allowed-origin",
            "https://dash.example.com")) as server:
        host = {"Host": "models.internal:8000"}
        assert raw(server, "GET", "/v2/models/mlp", host)[0] == 200
        status, _ = raw(server, "POST", "/v2/models/mlp/infer",
                        {**host, "Origin": "https://dash.example.com"}, MLP_BODY)
        assert status == 200
        status, _ = raw(server, "POST", "/v2/models/mlp/infer",
                        {**host, "Origin": "https://other.example.com"}, MLP_BODY)
        assert status == 403


def test_a_repeated_authorization_header_is_read_the_same_on_every_path(
        secured: ServerProcess) -> None:
    """The first Authorization header counts, for a small infer body (answered without
    ASGI) as for a metadata call (through ASGI)."""
    for first, second, status in ((INFERENCE_KEY, "wrong-key-000000", 200),
                                  ("wrong-key-000000", INFERENCE_KEY, 401)):
        for method, path, body in (("POST", "/v2/models/mlp/infer", MLP_BODY),
                                   ("GET", "/v2/models/mlp", None)):
            connection = http.client.HTTPConnection(secured.host, secured.http_port,
                                                    timeout=30)
            try:
                connection.putrequest(method, path)
                connection.putheader("Authorization", f"Bearer {first}")
                connection.putheader("Authorization", f"Bearer {second}")
                connection.putheader("Content-Type", "application/json")
                connection.putheader("Content-Length", str(len(body or b"")))
                connection.endheaders(body)
                assert connection.getresponse().status == status, (path, first)
            finally:
                connection.close()
