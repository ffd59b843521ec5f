"""A gateway in front of OpenAI-compatible replicas (the synthetic LLM on loopback
addresses of their own): the `openai` package streams through it, prompts that share a
prefix stay on the replica that holds it, a session stays on its replica, and a replica
killed mid-stream ends the stream with an error event."""

from __future__ import annotations

import http.server
import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import openai
import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tradeoff.backends.synthetic_generative import build_tokenizer, continuation
from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess, started

from .helpers import metric_samples, post_json, request, wait_for

pytestmark = [pytest.mark.integration]

HOSTS = ("127.0.0.2", "127.0.0.3")
MODEL = "synthetic-llm"


def write_router(root: Path, replicas: list[ServerProcess], **pool: object) -> None:
    (root / "chat").mkdir(parents=True, exist_ok=True)
    doc = {"pools": {"llm": {"protocol": "openai", "model": MODEL,
                             "replicas": [f"{r.url}/v1" for r in replicas],
                             "health": {"interval_s": 0.2, "eject_s": 0.5}, **pool}},
           "routes": [{"to": "llm"}]}
    (root / "chat" / "router.yaml").write_text(json.dumps(doc))


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[ServerProcess]]:
    roots = [tmp_path_factory.mktemp(f"llm_{host}") for host in HOSTS]
    for root in roots:
        write_synthetic_llm(root, model={"step_ms": 1.0}, max_num_seqs=8, num_blocks=512)
    with started([ServerProcess(root, host=host)
                  for root, host in zip(roots, HOSTS, strict=True)]) as servers:
        yield servers


def gateway_for(root: Path, replicas: list[ServerProcess], **pool: object) -> ServerProcess:
    write_router(root, replicas, **pool)
    return ServerProcess(root).start()


def pool_stats(gateway: ServerProcess) -> list[dict]:
    doc = json.loads(request(gateway.url, "GET", "/v2/models/chat/stats").body)
    return doc["model_stats"][0]["pools"][0]["replicas"]


def test_the_openai_client_streams_through_the_gateway(
        tmp_path: Path, replicas: list[ServerProcess]) -> None:
    gateway = gateway_for(tmp_path, replicas, policy="round_robin")
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused",
                           max_retries=0) as client:
            assert "chat" in [m.id for m in client.models.list().data]
            prompt = "the gateway passes this on"
            whole = client.completions.create(model="chat", prompt=prompt, max_tokens=12,
                                              temperature=0)
            tokenizer = build_tokenizer()
            expected = tokenizer.decode(continuation(tokenizer.encode(prompt), 12))
            assert whole.choices[0].text == expected
            pieces = [c.choices[0].text for c in client.completions.create(
                model="chat", prompt=prompt, max_tokens=12, temperature=0, stream=True)
                if c.choices]
            assert "".join(pieces) == expected
            chat = client.chat.completions.create(
                model="chat", messages=[{"role": "user", "content": "hello"}], max_tokens=5,
                temperature=0)
            assert chat.choices[0].finish_reason == "length"
        assert {r["answered"] for r in pool_stats(gateway)} != {0}
        assert all(r["answered"] >= 1 for r in pool_stats(gateway))
    finally:
        gateway.stop()
        gateway.close_log()


def test_prompts_that_share_a_prefix_stay_on_one_replica(
        tmp_path: Path, replicas: list[ServerProcess]) -> None:
    gateway = gateway_for(tmp_path, replicas, policy="prefix")
    systems = [f"system prompt {i}: " + "you are a careful assistant. " * 12 for i in range(4)]
    try:
        for round_ in range(3):
            for index, system in enumerate(systems):
                response = post_json(gateway.url, "/v1/completions", {
                    "model": "chat", "prompt": f"{system} question {round_} of {index}",
                    "max_tokens": 2})
                assert response.status == 200, response.body
        stats = pool_stats(gateway)
        sent = sum(r["prefix_blocks"] for r in stats)
        matched = sum(r["prefix_blocks_matched"] for r in stats)
        # the first of each prompt matches nothing; the next two rounds match the prefix
        assert matched >= 0.6 * sent
        assert all(r["answered"] >= 1 for r in stats)  # the prompts are spread too
    finally:
        gateway.stop()
        gateway.close_log()


def test_a_session_stays_on_its_replica(tmp_path: Path, replicas: list[ServerProcess]) -> None:
    gateway = gateway_for(tmp_path, replicas, policy="session", session="user")
    try:
        for user in ("ann", "bob", "cy", "di"):
            before = [r["answered"] for r in pool_stats(gateway)]
            for _ in range(3):
                assert post_json(gateway.url, "/v1/completions", {
                    "model": "chat", "prompt": "hi", "max_tokens": 1,
                    "user": user}).status == 200
            after = [r["answered"] for r in pool_stats(gateway)]
            assert sorted(a - b for a, b in zip(after, before, strict=True)) == [0, 3]
    finally:
        gateway.stop()
        gateway.close_log()


def test_a_replica_killed_mid_stream_ends_the_stream_with_an_error_event(
        tmp_path: Path) -> None:
    root = tmp_path / "replica"
    write_synthetic_llm(root, model={"step_ms": 40.0}, max_num_seqs=4, num_blocks=256)
    replica = ServerProcess(root, host=HOSTS[0]).start()
    gateway = gateway_for(tmp_path / "gw", [replica])
    try:
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", gateway.http_port, timeout=30)
        connection.request("POST", "/v1/completions", json.dumps({
            "model": "chat", "prompt": "a long answer", "max_tokens": 200,
            "stream": True, "ignore_eos": True}), {"Content-Type": "application/json"})
        response = connection.getresponse()
        assert response.status == 200
        first = response.readline()
        assert first.startswith(b"data: ")
        assert replica.process is not None
        replica.process.send_signal(signal.SIGKILL)
        replica.process.wait(10)
        rest = response.read().decode()
        events = [line[6:] for line in rest.splitlines() if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])
        assert "error" in error and "broke off" in error["error"]["message"]
        connection.close()
    finally:
        gateway.stop()
        gateway.close_log()
        replica.stop()
        replica.close_log()


def test_a_stream_server_that_is_not_ours(tmp_path: Path) -> None:
    """An OpenAI-compatible stream server of another make (benchmarks/
    llm_load_generator.py's stub: its own HTTP framing, one token a step) behind the
    gateway: the openai client gets every token and the end."""
    from tradeoff.server.process import free_port

    port = free_port()
    script = Path(__file__).resolve().parents[2] / "benchmarks" / "llm_load_generator.py"
    stub = subprocess.Popen([sys.executable, str(script), "--stub-port", str(port),
                             "--step-ms", "1", "--max-num-seqs", "8"])
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/v1/models"), "the stub up")
        root = tmp_path / "gw"
        (root / "chat").mkdir(parents=True)
        (root / "chat" / "router.yaml").write_text(json.dumps({
            "pools": {"stub": {"protocol": "openai", "model": MODEL, "policy": "round_robin",
                               "replicas": [f"http://127.0.0.1:{port}/v1"]}},
            "routes": [{"to": "stub"}]}))
        gateway = ServerProcess(root).start()
        try:
            with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused",
                               max_retries=0) as client:
                chunks = list(client.completions.create(
                    model="chat", prompt="hello", max_tokens=20, stream=True))
            texts = [c.choices[0].text for c in chunks if c.choices]
            assert "".join(texts) == "x" * 20
            assert chunks[-1].choices[0].finish_reason == "length"
        finally:
            gateway.stop()
            gateway.close_log()
    finally:
        stub.terminate()
        stub.wait(10)


def _answers(url: str) -> bool:
    try:
        return request(url.rsplit("/v1", 1)[0], "GET", "/v1/models").status == 200
    except OSError:
        return False


class _Recorder(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible replica that keeps what it was sent."""

    seen: ClassVar[list[tuple[dict[str, str], dict]]] = []

    def do_GET(self) -> None:
        self._answer({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.seen.append(({k.lower(): v for k, v in self.headers.items()}, body))
        self._answer({"id": "x", "object": "text_completion", "model": body["model"],
                      "choices": [{"index": 0, "text": "ok", "finish_reason": "stop"}],
                      "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                "total_tokens": 2}})

    def _answer(self, doc: dict) -> None:
        data = json.dumps(doc).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_what_the_gateway_sends_on(tmp_path: Path) -> None:
    """The replica sees the pool's model name and the gateway's own key, never the
    client's; a client's priority held to what its key may claim, a route's set."""
    server = http.server.ThreadingHTTPServer((HOSTS[0], 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    _Recorder.seen.clear()
    try:
        root = tmp_path / "gw"
        (root / "chat").mkdir(parents=True)
        (root / "chat" / "router.yaml").write_text(json.dumps({
            "pools": {"remote": {"protocol": "openai", "model": "their-model",
                                 "api_key_env": "REMOTE_KEY", "replicas": [
                                     f"http://{HOSTS[0]}:{server.server_port}/v1"]}},
            "routes": [{"when": {"class": "urgent"}, "to": "remote", "priority": -5},
                       {"to": "remote"}]}))
        gateway = ServerProcess(root, env={"REMOTE_KEY": "gateway-key"},
                                extra_args=("--api-key", "client-key")).start()
        try:
            headers = {"Authorization": "Bearer client-key"}
            for body in ({"prompt": "a", "priority": -100}, {"prompt": "b", "class": "urgent"}):
                response = post_json(gateway.url, "/v1/completions",
                                     {"model": "chat", "max_tokens": 1, **body}, headers)
                assert response.status == 200, response.body
                assert json.loads(response.body)["choices"][0]["text"] == "ok"
        finally:
            gateway.stop()
            gateway.close_log()
        (first_headers, first), (_, second) = _Recorder.seen
        assert first["model"] == second["model"] == "their-model"
        assert first_headers["authorization"] == "Bearer gateway-key"
        assert first["priority"] == 0  # an ordinary key claims no more than the default
        assert second["priority"] == -5
    finally:
        server.shutdown()
        server.server_close()


def test_shadow_copies_compare_answers_across_servers(
        tmp_path: Path, replicas: list[ServerProcess]) -> None:
    """Shadows over OpenAI pools, compared as text: a pool shadowing a pool of the same
    model agrees wholly; a model here that ends its answers early matches the pool's
    up to its end; a model here shadowed by a pool agrees.
    Streamed and whole answers, completions and chat, are compared; sampled ones not."""
    prompt = "the gateway passes this on"
    tokenizer = build_tokenizer()
    prompt_tokens = len(tokenizer.encode(prompt))
    write_synthetic_llm(tmp_path, model={"step_ms": 1.0})
    write_synthetic_llm(tmp_path, "short-llm",
                        model={"step_ms": 1.0, "eos_at_position": prompt_tokens + 5})
    urls = [f"{r.url}/v1" for r in replicas]
    pool = {"protocol": "openai", "model": MODEL, "replicas": urls,
            "health": {"interval_s": 0.2}}
    routers = {
        "mirror": {"pools": {"llm": pool, "llm_copy": pool}, "routes": [{"to": "llm"}],
                   "shadow": {"to": "llm_copy", "fraction": 1.0}},
        "short": {"pools": {"llm": pool}, "routes": [{"to": "llm"}],
                  "shadow": {"to": "short-llm", "fraction": 1.0}},
        "here_first": {"pools": {"llm": pool}, "routes": [{"to": MODEL}],
                       "shadow": {"to": "llm", "fraction": 1.0}},
    }
    for name, doc in routers.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "router.yaml").write_text(json.dumps(doc))
    gateway = ServerProcess(tmp_path).start()

    def shadow(router: str) -> dict:
        stats = json.loads(request(gateway.url, "GET", f"/v2/models/{router}/stats").body)
        return stats["model_stats"][0]["shadow"]

    first = {}
    try:
        with openai.OpenAI(base_url=f"{gateway.url}/v1", api_key="unused",
                           max_retries=0) as client:
            for router in routers:
                whole = client.completions.create(model=router, prompt=prompt,
                                                  max_tokens=12, temperature=0)
                assert whole.choices[0].text == tokenizer.decode(
                    continuation(tokenizer.encode(prompt), 12))
                wait_for(lambda r=router: shadow(r)["compared"] == 1, f"{router}'s copy")
                first[router] = shadow(router)
                streamed = client.completions.create(
                    model=router, prompt=prompt, max_tokens=12, temperature=0, stream=True,
                    stream_options={"include_usage": True})
                assert "".join(c.choices[0].text for c in streamed if c.choices) == \
                    whole.choices[0].text
                wait_for(lambda r=router: shadow(r)["compared"] == 2, f"{router}'s copy")
                chat = client.chat.completions.create(
                    model=router, messages=[{"role": "user", "content": "hi"}],
                    max_tokens=6, temperature=0, stream=router == "mirror")
                assert chat is not None
                wait_for(lambda r=router: shadow(r)["compared"] == 3, f"{router}'s copy")
                client.completions.create(model=router, prompt=prompt, max_tokens=4,
                                          temperature=1.0)  # sampled: no copy
        mirror, short, here = shadow("mirror"), shadow("short"), shadow("here_first")
        for stats in (mirror, here):
            assert stats["sent"] == stats["compared"] == stats["texts_compared"] == 3
            assert stats["text_identical"] == stats["text_prefix_agreement"] == 1.0
            assert stats["failed"] == stats["dropped"] == 0
        # the first answer: 5 of its 12 characters alike before the short model's end
        assert (first["short"]["text_prefix_chars"], first["short"]["text_chars"]) == (5, 12)
        assert first["short"]["texts_identical"] == 0
        assert short["texts_compared"] == 3 and short["text_prefix_agreement"] < 1.0
        samples = metric_samples(gateway)
        agreement = "tradeoff_router_shadow_text_agreement"
        assert samples[(agreement, frozenset({"router": "mirror"}.items()))] == 1.0
        assert samples[(agreement, frozenset({"router": "short"}.items()))] < 1.0
    finally:
        gateway.stop()
        gateway.close_log()
