"""API keys and TLS against a real server: who may call what, over HTTP and gRPC."""

from __future__ import annotations

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
                                          str(key_file), "--admin-key", ADMIN_KEY))


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


def test_keys_never_reach_the_log(secured: ServerProcess) -> None:
    log = secured.log_text()
    assert "access: 3 inference key(s), 1 admin key(s)" in log
    for key in (INFERENCE_KEY, FILE_KEY, ENV_KEY, ADMIN_KEY):
        assert key not in log


def test_bench_sends_the_key(secured: ServerProcess, tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "bench", secured.url, "-m", "mlp",
                          "--requests", "20", "--header", f"Authorization:Bearer {ENV_KEY}",
                          "--json", str(out)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text())["summary"]["errors"] == 0
    unauthorized = subprocess.run([sys.executable, "-m", "tradeoff", "bench", secured.url,
                                   "-m", "mlp", "--requests", "5"], capture_output=True,
                                  text=True, timeout=120)
    assert unauthorized.returncode != 0 and "HTTP 401" in unauthorized.stderr


def test_short_keys_are_refused_at_start(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "tradeoff", "serve", "--model-repository",
                          str(tmp_path), "--api-key", "short"], capture_output=True, text=True,
                         timeout=60)
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
                               env={**os.environ, "SSL_CERT_FILE": str(cert)})
        assert bench.returncode == 0, bench.stdout + bench.stderr
        assert server.url.startswith("https://")
        assert json.loads(out.read_text())["summary"]["successes"] == 5
        assert server.stop() == 0


def test_llm_bench_names_the_key_variable_when_refused(secured: ServerProcess) -> None:
    from tradeoff.bench.adapters import BenchSetupError
    from tradeoff.bench.endpoint import EndpointSpec, GenerationOptions, make_adapter

    for variable, env in (("NO_SUCH_KEY", {}), ("WRONG_KEY", {"WRONG_KEY": "wrong-key-000"})):
        spec = EndpointSpec(f"{secured.url}/v1", "openai", "m",
                            generation=GenerationOptions(api_key_env=variable))
        with pytest.MonkeyPatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            with pytest.raises(BenchSetupError, match=f"refused the API key.*\\${variable}"):
                make_adapter(spec).prepare()
