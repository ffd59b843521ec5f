"""The response cache in Redis: two servers share it, a forged entry is a miss, and
Redis dying under load costs the cache, never a request."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tradeoff.models import build_repository
from tradeoff.protocol.v2 import TensorOutput
from tradeoff.server.cache import REDIS_PREFIX, encode_outputs, tensor_key
from tradeoff.server.process import ServerProcess, free_port

from .helpers import background_load, infer_json, metric_samples, running_server, wait_for

redis = pytest.importorskip("redis")
pytestmark = pytest.mark.integration

REDIS = shutil.which("redis-server")
if REDIS is None:
    pytest.skip("redis-server is not installed (make test installs it: scripts/apt_get.sh)",
                allow_module_level=True)


class RedisServer:
    """A throwaway redis-server on 127.0.0.1 (no persistence)."""

    def __init__(self, port: int | None = None) -> None:
        self.port = port or free_port()
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        wait_for(lambda: _pings(client), "redis-server to answer PING", timeout=15)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)

    def kill(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shared")
    build_repository(root, ("mlp",))
    config = root / "mlp" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    return root


@pytest.fixture()
def store() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.kill()


def inputs(value: np.ndarray) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
             "data": value.reshape(-1).tolist()}]


def verdict(response) -> str:
    timing = response.header("server-timing") or ""
    return timing.split(";desc=")[1].split(";")[0] if timing.startswith("cache;") else ""


def test_two_servers_share_one_redis_and_a_forged_entry_is_a_miss(repo: Path,
                                                                  store: RedisServer) -> None:
    cache = ("--cache", f"{store.url},ttl=120")
    first_server = running_server(repo, extra_args=cache)
    second_server = running_server(repo, extra_args=cache)
    first, second = next(first_server), next(second_server)
    try:
        value = np.random.default_rng(1).standard_normal((1, 256)).astype(np.float32)
        computed = infer_json(first.url, "mlp", inputs(value))
        assert computed.status == 200 and verdict(computed) == "miss"
        client = store.client()
        wait_for(lambda: client.dbsize() == 1, "the answer to reach Redis")
        (stored_key,) = client.keys()
        assert client.ttl(stored_key) > 100
        shared = infer_json(second.url, "mlp", inputs(value))  # never computed here
        assert verdict(shared) == "hit"
        assert shared.json()["outputs"] == computed.json()["outputs"]
        samples = metric_samples(second)
        mlp = frozenset({"model": "mlp", "version": "1"}.items())
        assert samples[("tradeoff_cache_hits_total", mlp)] == 1
        assert samples[("tradeoff_cache_misses_total", mlp)] == 0

        # an entry under the right key whose digest is not this request's: a miss
        other = np.zeros((1, 256), np.float32)
        key = tensor_key("mlp", 1, [("INPUT0", "FP32", other)], [("OUTPUT0", False)], {})
        assert REDIS_PREFIX + key.key not in client.keys()
        forged = encode_outputs([TensorOutput("OUTPUT0", np.full((1, 10), 666.0, np.float32),
                                              "FP32", False)])
        client.set(REDIS_PREFIX + key.key, b"\0" * 32 + forged)
        answer = infer_json(second.url, "mlp", inputs(other))
        assert answer.status == 200 and verdict(answer) == "miss"
        assert 666.0 not in answer.json()["outputs"][0]["data"]
        collisions = ("tradeoff_cache_collisions_total", frozenset({"store": "redis"}.items()))
        assert metric_samples(second)[collisions] == 1
        # the true answer replaced the forged one: the first server now hits it
        wait_for(lambda: client.get(REDIS_PREFIX + key.key)[:32] == key.check,
                 "the computed answer to replace the forged entry")
        again = infer_json(first.url, "mlp", inputs(other))
        assert verdict(again) == "hit" and again.json()["outputs"] == answer.json()["outputs"]
    finally:
        for fixture in (first_server, second_server):
            with pytest.raises(StopIteration):
                next(fixture)


def test_redis_killed_under_load_loses_no_request_and_comes_back(repo: Path,
                                                                 store: RedisServer) -> None:
    server_gen = running_server(repo, extra_args=("--cache", store.url))
    server: ServerProcess = next(server_gen)
    values = np.random.default_rng(2).standard_normal((20, 1, 256)).astype(np.float32)
    rng = np.random.default_rng(3)

    def send() -> int:
        return infer_json(server.url, "mlp", inputs(values[rng.integers(20)])).status

    restarted: RedisServer | None = None
    try:
        with background_load(send) as statuses:
            time.sleep(1.5)
            served_before = len(statuses)
            store.kill()  # mid-load: connections reset, then refused
            time.sleep(2.5)
            served_while_down = len(statuses) - served_before
            restarted = RedisServer(store.port).start()  # the same address, empty
            time.sleep(2.5)
        assert statuses and set(statuses) == {200}, f"not all 200: {set(statuses)}"
        assert served_while_down > 20  # it kept serving without the cache
        errors = ("tradeoff_cache_errors_total", frozenset({"store": "redis"}.items()))
        assert metric_samples(server)[errors] >= 1
        # back: answers are written and read again
        client = restarted.client()
        wait_for(lambda: client.dbsize() > 0, "answers to reach the new Redis")
        probe = np.full((1, 256), 0.5, np.float32)
        assert infer_json(server.url, "mlp", inputs(probe)).status == 200
        wait_for(lambda: verdict(infer_json(server.url, "mlp", inputs(probe))) == "hit",
                 "a hit after Redis came back")
        log = server.log_text()
        warnings = [line for line in log.splitlines()
                    if "WARNING" in line and "response cache: Redis at" in line]
        assert len(warnings) == 1, warnings  # once per interval, not once per failed call
    finally:
        if restarted is not None:
            restarted.kill()
        with pytest.raises(StopIteration):
            next(server_gen)
