"""The response cache in Redis: two servers share it under one secret, planted or moved
entries are misses, tenants neither read nor flush each other's entries, Redis's own
password works, and Redis dying under load costs the cache, never a request."""

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
from tradeoff.server.cache.keys import MAC_BYTES, Keys
from tradeoff.server.cache.stores import REDIS_PREFIX
from tradeoff.server.cache.values import encode_outputs
from tradeoff.server.process import ServerProcess, free_port

from .helpers import (
    background_load,
    front_end_count,
    infer_json,
    metric_samples,
    post_json,
    running_server,
    wait_for,
)

redis = pytest.importorskip("redis")
pytestmark = [pytest.mark.integration, pytest.mark.both_modes]

REDIS = shutil.which("redis-server")
if REDIS is None:
    pytest.skip("redis-server is not installed (make test installs it: scripts/apt_get.sh)",
                allow_module_level=True)


class RedisServer:
    """A throwaway redis-server on 127.0.0.1 (no persistence)."""

    def __init__(self, port: int | None = None, password: str | None = None) -> None:
        self.port = port or free_port()
        self.password = password
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        assert REDIS is not None
        self.process = subprocess.Popen(
            [REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--protected-mode", "yes",
             *(["--requirepass", self.password] if self.password else [])],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = self.client()
        wait_for(lambda: _pings(client), "redis-server to answer PING", timeout=15)
        return self

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1,
                           password=self.password)

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


SECRET = "integration-test-secret-0123456789"


@pytest.fixture(scope="module")
def secret_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("secret") / "cache.key"
    path.write_text(SECRET + "\n")
    return path


def inputs(value: np.ndarray) -> list[dict]:
    return [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
             "data": value.reshape(-1).tolist()}]


def verdict(response) -> str:
    timing = response.header("server-timing") or ""
    return timing.split(";desc=")[1].split(";")[0] if timing.startswith("cache;") else ""


def test_two_servers_share_one_redis_and_a_planted_entry_is_a_miss(
        repo: Path, store: RedisServer, secret_file: Path, server_mode: str) -> None:
    cache = ("--cache", f"{store.url},ttl=120,secret_file={secret_file}")
    first_server = running_server(repo, mode=server_mode, extra_args=cache)
    second_server = running_server(repo, mode=server_mode, extra_args=cache)
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

        # a writer without the secret cannot even find where an answer lives: the key it
        # computes offline for an input nobody sent is one no server looks up
        other = np.zeros((1, 256), np.float32)
        material = ("mlp", 1, [("INPUT0", "FP32", other)], [("OUTPUT0", False)], {})
        guessed = Keys(b"what-an-attacker-guesses-0000").tensor_key(b"", *material)
        planted = encode_outputs([TensorOutput("OUTPUT0", np.full((1, 10), 1337.0,
                                                                  np.float32), "FP32", False)])
        client.set(REDIS_PREFIX + guessed.key, b"\0" * MAC_BYTES + planted)
        # under the right key (here the test knows the secret), a value without its MAC,
        # or with the MAC of another key's value, is rejected
        real = Keys(SECRET.encode()).tensor_key(b"", *material)
        client.set(REDIS_PREFIX + real.key, b"\0" * MAC_BYTES + planted)
        answer = infer_json(second.url, "mlp", inputs(other))
        assert answer.status == 200 and verdict(answer) == "miss"
        assert 1337.0 not in answer.json()["outputs"][0]["data"]
        rejected = ("tradeoff_cache_rejected_total", frozenset({"store": "redis"}.items()))
        assert metric_samples(second)[rejected] == 1
        # the true answer replaced the planted one: the first server now hits it
        wait_for(lambda: client.get(REDIS_PREFIX + real.key)[MAC_BYTES:] != planted,
                 "the computed answer to replace the planted entry")
        again = infer_json(first.url, "mlp", inputs(other))
        assert verdict(again) == "hit" and again.json()["outputs"] == answer.json()["outputs"]
        # a stored answer copied under another key fails its MAC there
        client.set(REDIS_PREFIX + real.key, client.get(stored_key))
        moved = infer_json(second.url, "mlp", inputs(other))
        assert verdict(moved) == "miss" and moved.json()["outputs"] == answer.json()["outputs"]
        assert metric_samples(second)[rejected] == 2
    finally:
        for fixture in (first_server, second_server):
            with pytest.raises(StopIteration):
                next(fixture)


def test_tenants_neither_read_nor_flush_each_others_entries(
        repo: Path, store: RedisServer, secret_file: Path, server_mode: str) -> None:
    alice, bob = "alice-key-0123456789", "bob-key-0123456789"
    server_gen = running_server(repo, mode=server_mode, extra_args=(
        "--cache", f"{store.url},secret_file={secret_file},tenant_size=20KB",
        "--api-key", alice, "--api-key", bob))
    server = next(server_gen)

    def ask(key: str, value: np.ndarray) -> str:
        answer = post_json(server.url, "/v2/models/mlp/infer", {"inputs": inputs(value)},
                           {"Authorization": f"Bearer {key}"})
        assert answer.status == 200, answer.body
        return verdict(answer)

    try:
        mine = np.full((1, 256), 0.25, np.float32)
        assert ask(alice, mine) == "miss"
        wait_for(lambda: ask(alice, mine) == "hit", "Alice's answer to be kept")
        assert ask(bob, mine) == "miss"  # Bob's timing says nothing of what Alice sent
        bob_inputs = [np.full((1, 256), i, np.float32) for i in range(5)]
        for value in bob_inputs:
            ask(bob, value)
        wait_for(lambda: ask(bob, bob_inputs[-1]) == "hit", "Bob's answers to be kept")
        for i in range(400):  # Alice sends many distinct inputs: her share trims hers only
            ask(alice, np.full((1, 256), 1000.0 + i, np.float32))
        client = store.client()
        shares = [int(client.get(k)) for k in client.keys(REDIS_PREFIX + b"tenant:*:bytes")]
        assert len(shares) == 2 and max(shares) <= 20_000
        evictions = ("tradeoff_cache_evictions_total", frozenset({"store": "redis"}.items()))
        assert metric_samples(server)[evictions] > 200
        assert all(ask(bob, value) == "hit" for value in bob_inputs)
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)


ACL = ("ACL SETUSER tradeoff on >tradeoff-password-0123 ~tradeoff:cache:* +get +set +del "
       "+evalsha +script|load +zadd +zrangebyscore +zrem +zpopmin +hset +hget +hdel "
       "+incrby +decrby +expire +ping")  # as docs/cache.md gives it


def test_a_redis_user_with_the_documented_acl_is_enough(repo: Path, tmp_path: Path,
                                                        secret_file: Path) -> None:
    guarded = RedisServer(password="admin-password-0123").start()
    guarded.client().execute_command(*ACL.split())
    password = tmp_path / "redis.password"
    password.write_text("tradeoff-password-0123\n")
    url = f"redis://tradeoff@127.0.0.1:{guarded.port}/0"
    server_gen = running_server(repo, extra_args=(
        "--cache", f"{url},secret_file={secret_file},password_file={password}",
        "--api-key", "alice-key-0123456789"))  # keys on: the per-key share's script runs
    server = next(server_gen)
    try:
        value = np.full((1, 256), 3.0, np.float32)

        def ask() -> str:
            return verdict(post_json(server.url, "/v2/models/mlp/infer",
                                     {"inputs": inputs(value)},
                                     {"Authorization": "Bearer alice-key-0123456789"}))

        assert ask() == "miss"
        wait_for(lambda: ask() == "hit", "a hit from the ACL-guarded Redis")
        errors = ("tradeoff_cache_errors_total", frozenset({"store": "redis"}.items()))
        assert metric_samples(server)[errors] == 0
        assert "tradeoff-password" not in server.log_text()
    finally:
        guarded.kill()
        with pytest.raises(StopIteration):
            next(server_gen)


def test_redis_killed_under_load_loses_no_request_and_comes_back(
        repo: Path, store: RedisServer, secret_file: Path, server_mode: str) -> None:
    server_gen = running_server(repo, mode=server_mode, extra_args=(
        "--cache", f"{store.url},secret_file={secret_file}"))
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
        # once per interval (in each front end that saw it), not once per failed call
        assert 1 <= len(warnings) <= front_end_count(server), warnings
    finally:
        if restarted is not None:
            restarted.kill()
        with pytest.raises(StopIteration):
            next(server_gen)


def test_a_redis_that_is_down_at_start_is_reported_at_start(repo: Path,
                                                             secret_file: Path) -> None:
    """The cache used to be logged as fine until the first request failed on it."""
    url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    server_gen = running_server(repo, extra_args=("--cache", f"{url},secret_file={secret_file}"))
    server = next(server_gen)
    try:
        started = server.log_text()
        assert "response cache: Redis at" in started and "failed" in started
        assert infer_json(server.url, "mlp", inputs(np.zeros((1, 256), np.float32))).status \
            == 200  # served without the cache
    finally:
        with pytest.raises(StopIteration):
            next(server_gen)
