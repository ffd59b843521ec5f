"""Generative models go through the same data plane as tensor models: /metrics,
readiness, the repository extension, --max-inflight and SIGTERM draining."""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from prometheus_client.parser import text_string_to_metric_families

from tradeoff.models import build_repository
from tradeoff.models.generative import write_generative
from tradeoff.server.process import ServerProcess

from .helpers import (
    get_text,
    metric_samples,
    post_json,
    request,
    running_server,
    wait_for,
)

pytestmark = pytest.mark.integration

SMALL = {"max_num_seqs": 4, "max_num_batched_tokens": 64, "num_blocks": 64, "block_size": 8}


def complete(url: str, model: str = "tinyllama", tokens: int = 4, **extra: Any
             ) -> tuple[int, Any]:
    response = post_json(url, "/v1/completions", {
        "model": model, "prompt": "abc", "max_tokens": tokens, "temperature": 0,
        "ignore_eos": True, **extra})
    return response.status, response.json()


class Stream:
    """A streamed completion read event by event on its own connection."""

    def __init__(self, url: str, tokens: int, model: str = "tinyllama") -> None:
        host, port = url.removeprefix("http://").split(":")
        self.connection = http.client.HTTPConnection(host, int(port), timeout=120)
        body = json.dumps({"model": model, "prompt": "abc", "max_tokens": tokens,
                           "temperature": 0, "ignore_eos": True, "stream": True})
        self.connection.request("POST", "/v1/completions", body,
                                {"Content-Type": "application/json"})
        self.response: http.client.HTTPResponse | None = None
        self.events: list[Any] = []

    def next_event(self) -> Any:
        """The next ``data:`` payload (parsed JSON, or the string ``[DONE]``); None when
        the connection ended."""
        if self.response is None:  # the headers come with the first token
            self.response = self.connection.getresponse()
            if self.response.status != 200:  # refused before it started: one JSON error
                self.events.append({"status": self.response.status,
                                    **json.loads(self.response.read())})
                return None
        while True:
            line = self.response.readline()
            if not line:
                return None
            if line.startswith(b"data: "):
                data = line[6:].strip()
                event = "[DONE]" if data == b"[DONE]" else json.loads(data)
                self.events.append(event)
                return event

    def read_all(self) -> list[Any]:
        while self.next_event() not in (None, "[DONE]"):
            pass
        self.connection.close()
        return self.events


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = Path(tmp_path_factory.mktemp("mixed")) / "models"
    build_repository(repo, ("tiny", "mlp"))
    write_generative(repo, "tinyllama", **SMALL)
    write_generative(repo, "tinyllama", "tinyllama_b", **SMALL)
    yield from running_server(repo, extra_args=("--strict-readiness",))


def test_metrics_name_every_family_once(mixed: ServerProcess) -> None:
    """Two generative and two tensor models: a strict reading of /metrics finds each
    family (HELP, TYPE, and the parser's families) exactly once."""
    for model in ("tinyllama", "tinyllama_b"):
        assert complete(mixed.url, model)[0] == 200
    text = get_text(mixed.metrics_url)
    for kind in ("HELP", "TYPE"):
        names = Counter(line.split()[2] for line in text.splitlines()
                        if line.startswith(f"# {kind} "))
        assert [n for n, count in names.items() if count > 1] == [], kind
    families = Counter(f.name for f in text_string_to_metric_families(text))
    assert [n for n, count in families.items() if count > 1] == []
    ttft = next(f for f in text_string_to_metric_families(text)
                if f.name == "tradeoff_generation_time_to_first_token_seconds")
    assert {s.labels["model"] for s in ttft.samples} == {"tinyllama", "tinyllama_b"}
    assert "tradeoff_inference_request_success" in families


def test_generative_models_in_readiness_index_and_stats(mixed: ServerProcess) -> None:
    assert request(mixed.url, "GET", "/v2/health/ready").status == 200
    assert request(mixed.url, "GET", "/v2/models/tinyllama/ready").status == 200
    index = {row["name"]: row["state"]
             for row in post_json(mixed.url, "/v2/repository/index", {}).json()}
    assert index == {"tiny": "READY", "mlp": "READY", "tinyllama": "READY",
                     "tinyllama_b": "READY"}
    metadata = request(mixed.url, "GET", "/v2/models/tinyllama").json()
    assert metadata["name"] == "tinyllama" and metadata["versions"] == ["1"]
    before = request(mixed.url, "GET", "/v2/models/tinyllama/stats").json()
    assert complete(mixed.url)[0] == 200
    after = request(mixed.url, "GET", "/v2/models/tinyllama/stats").json()
    count = [doc["model_stats"][0]["inference_stats"]["success"]["count"]
             for doc in (before, after)]
    assert count[1] == count[0] + 1
    # batch_stats: the engine's steps by how many sequences they ran, and their time
    entry = after["model_stats"][0]
    batches = entry["batch_stats"]
    assert sum(b["compute_infer"]["count"] for b in batches) == entry["execution_count"] > 0
    assert all(b["batch_size"] >= 1 and b["compute_infer"]["ns"] > 0 for b in batches)
    # each kind refuses the other's route with a 400 that says where to go
    wrong = post_json(mixed.url, "/v2/models/tinyllama/infer", {"inputs": []})
    assert wrong.status == 400 and "/v1/completions" in wrong.json()["error"]
    status, doc = complete(mixed.url, model="mlp")
    assert status == 400 and "/v2/models/mlp/infer" in doc["error"]["message"]


def test_bad_requests_get_openai_errors(mixed: ServerProcess) -> None:
    status, doc = complete(mixed.url, seed=2**70)
    assert status == 400 and "'seed'" in doc["error"]["message"]
    for path in ("/v1", "/v1/nope"):
        missing = request(mixed.url, "GET", path)
        assert missing.status == 404 and missing.json()["error"]["type"] == "not_found_error"
    assert complete(mixed.url)[0] == 200  # the engine still serves


def test_a_model_that_fails_to_load_leaves_the_others_serving(tmp_path: Path) -> None:
    """A load that fails with a runtime's own exception (a weights file safetensors
    cannot read) or with our own check (a KV cache larger than the free memory) marks
    that model unavailable with the reason; the server starts and serves the others."""
    repo = tmp_path / "models"
    build_repository(repo, ("tiny",))
    write_generative(repo, "tinyllama", "corrupt", **SMALL)
    (repo / "corrupt" / "1" / "model.safetensors").write_bytes(b"not safetensors")
    write_generative(repo, "tinyllama", "huge",  # the largest sizes: 512 GiB of KV cache
                     **{**SMALL, "num_blocks": 2**20, "block_size": 1024})
    write_generative(repo, "tinyllama", **SMALL)
    with contextlib.contextmanager(running_server)(repo) as server:
        index = {row["name"]: row for row in
                 post_json(server.url, "/v2/repository/index", {}).json()}
        assert index["tinyllama"]["state"] == index["tiny"]["state"] == "READY"
        assert index["corrupt"]["state"] == "UNAVAILABLE"
        assert "SafetensorError" in index["corrupt"]["reason"]
        assert index["huge"]["state"] == "UNAVAILABLE"
        assert "lower num_blocks" in index["huge"]["reason"]
        status, doc = complete(server.url, "huge")
        assert status == 503 and "not ready" in doc["error"]["message"]
        assert complete(server.url)[0] == 200


def test_unload_and_load_a_generative_model(mixed: ServerProcess) -> None:
    assert post_json(mixed.url, "/v2/repository/models/tinyllama_b/unload", {}).status == 200
    assert request(mixed.url, "GET", "/v2/models/tinyllama_b/ready").status == 503
    assert request(mixed.url, "GET", "/v2/health/ready").status == 503  # strict readiness
    listed = [m["id"] for m in request(mixed.url, "GET", "/v1/models").json()["data"]]
    assert listed == ["tinyllama"]
    status, doc = complete(mixed.url, "tinyllama_b")
    assert status == 503 and "not ready" in doc["error"]["message"]
    assert post_json(mixed.url, "/v2/repository/models/tinyllama_b/load", {}).status == 200
    assert request(mixed.url, "GET", "/v2/health/ready").status == 200
    assert complete(mixed.url, "tinyllama_b")[0] == 200


def test_reload_under_a_running_generation_loses_nothing(mixed: ServerProcess) -> None:
    stream = Stream(mixed.url, tokens=48)
    assert stream.next_event() is not None  # generating on the old version
    assert post_json(mixed.url, "/v2/repository/models/tinyllama/load", {}).status == 200
    events = stream.read_all()
    assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] == "length"
    assert complete(mixed.url)[0] == 200  # the new version serves


@pytest.mark.slow
def test_max_inflight_counts_generations(tmp_path: Path) -> None:
    repo = tmp_path / "models"
    write_generative(repo, "tinyllama", **SMALL)
    with contextlib.contextmanager(running_server)(
            repo, extra_args=("--max-inflight", "2")) as server:
        streams = [Stream(server.url, tokens=400) for _ in range(2)]
        for stream in streams:
            assert stream.next_event() is not None  # both admitted and generating
        status, doc = complete(server.url)
        assert status == 503 and "--max-inflight" in doc["error"]["message"]
        # listing the models reads no body and takes no slot
        assert request(server.url, "GET", "/v1/models").status == 200
        for stream in streams:
            assert stream.read_all()[-1] == "[DONE]"
        wait_for(lambda: complete(server.url)[0] == 200, "a free slot", timeout=60)


def test_sigterm_lets_generations_finish_or_end_them_with_an_error(tmp_path: Path) -> None:
    """At SIGTERM a short generation finishes; those that cannot finish within the drain
    end with an error event and [DONE]; nothing is cut without a word."""
    repo = tmp_path / "models"
    write_generative(repo, "tinyllama", **{**SMALL, "max_num_seqs": 2, "num_blocks": 160})
    # a 1 s drain; 500 tokens take 0.25-0.35 s here, two at a time: 30 cannot all finish
    process = ServerProcess(repo, extra_args=("--shutdown-timeout", "2"))
    with process:
        streams = {"short": Stream(process.url, tokens=24)}
        streams.update({f"long{i}": Stream(process.url, tokens=500) for i in range(30)})
        assert streams["short"].next_event() is not None

        def accepted() -> float:  # the short one may finish before the last long one arrives
            samples = metric_samples(process)
            return sum(samples.get((f"tradeoff_generation_requests_{kind}",
                                    frozenset({"model": "tinyllama"}.items())), 0)
                       for kind in ("running", "waiting", "finished_total"))

        wait_for(lambda: accepted() == len(streams), "every stream to be accepted")
        assert process.process is not None
        process.process.send_signal(signal.SIGTERM)
        results: dict[str, list[Any]] = {}
        readers = [threading.Thread(target=lambda n=n, s=s: results.__setitem__(n, s.read_all()))
                   for n, s in streams.items()]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout=60)
        assert process.process.wait(timeout=60) == 0
    assert results["short"][-1] == "[DONE]"
    assert results["short"][-2]["choices"][0]["finish_reason"] == "length"
    stopped = 0
    for name, events in results.items():
        if events[-1] != "[DONE]":  # still waiting at the deadline: a 503 instead of a stream
            assert len(events) == 1 and events[0]["status"] == 503, (name, events)
            assert "shutdown drain" in events[0]["error"]["message"]
            stopped += 1
            continue
        last = events[-2]
        if "error" in last:
            assert "shutdown drain" in last["error"]["message"], last
            assert last["error"]["type"] == "service_unavailable"
            stopped += 1
        else:
            assert last["choices"][0]["finish_reason"] == "length", (name, last)
    assert stopped >= 1
