"""Who may claim a generation's priority, against a real `tradeoff serve`: an ordinary
key's `"priority": -2147483648` sent to the engine directly (past the router that sets
priorities by class) no longer starves the router's clients; a key the operator allows
may still jump the queue; and a router that hides its targets refuses direct calls."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit

import pytest

from tradeoff.server.process import ServerProcess

from ..synthetic_model import write_synthetic_model
from .helpers import post_json, request, running_server

pytestmark = pytest.mark.integration

ORDINARY = "ordinary-key-0123"
TRUSTED = "trusted-key-4567"
ADMIN = "admin-key-89abcd"
WAIT_S = 15.0  # longest a request of these tests waits for its answer


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    pytest.importorskip("torch")
    from tradeoff.models.generative import write_synthetic_llm

    root = tmp_path_factory.mktemp("priority")
    # one sequence at a time, 20 ms a step: a queue forms, and its order is the priority
    for name in ("engine", "hidden_engine"):
        write_synthetic_llm(root, name, model={"step_ms": 20.0}, max_num_seqs=1,
                            scheduling="priority")
    (root / "front").mkdir()
    (root / "front" / "router.yaml").write_text(
        "routes:\n  - {when: {class: chat}, to: engine, priority: 0}\n"
        "  - {to: engine, priority: 1}\n")
    (root / "hidden_front").mkdir()
    (root / "hidden_front" / "router.yaml").write_text(
        "routes: [{to: hidden_engine}]\nhide_targets: true\n")
    write_synthetic_model(root, "tensor")
    (root / "tensor_front").mkdir()
    (root / "tensor_front" / "router.yaml").write_text(
        "routes: [{to: tensor}]\nhide_targets: true\n")
    yield from running_server(root, extra_args=(
        "--api-key", ORDINARY, "--api-key-priority", f"{TRUSTED}=-10",
        "--admin-key", ADMIN))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def complete(url: str, key: str, model: str, **body: object) -> tuple[int, dict]:
    """One completion on a fresh connection that waits at most WAIT_S."""
    parts = urlsplit(url)
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=WAIT_S)
    try:
        connection.request("POST", "/v1/completions", json.dumps(
            {"model": model, "prompt": "hello", "max_tokens": 8, "ignore_eos": True,
             **body}).encode(), {"Content-Type": "application/json", **bearer(key)})
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"{}")
    finally:
        connection.close()


@contextmanager
def flood(url: str, key: str, priority: int, clients: int) -> Iterator[list[float]]:
    """``clients`` callers sending to the engine directly, each its next request as soon
    as the last is answered; yields the times (monotonic) their answers came."""
    answered: list[float] = []
    stop = threading.Event()

    def caller() -> None:
        while not stop.is_set():
            status, _ = complete(url, key, "engine", priority=priority)
            if status == 200:
                answered.append(time.monotonic())

    with concurrent.futures.ThreadPoolExecutor(clients) as pool:
        calls = [pool.submit(caller) for _ in range(clients)]
        try:
            time.sleep(0.5)  # the flood holds the engine and its queue
            yield answered
        finally:
            stop.set()
            for call in calls:
                call.result()


def passed_by(answered: list[float], key: str, url: str, model: str, **body: object
              ) -> int:
    """Send one request while a flood runs; how many flood answers came while it
    waited (fails the test when it is not answered within WAIT_S)."""
    sent = time.monotonic()
    try:
        status, doc = complete(url, key, model, **body)
    except TimeoutError:
        pytest.fail(f"no answer in {WAIT_S:.0f} s: the flood starved it")
    done = time.monotonic()
    assert status == 200, doc
    return sum(sent < at < done for at in answered)


def test_an_ordinary_key_claiming_the_top_priority_does_not_starve_the_router_s_clients(
        server: ServerProcess) -> None:
    """Four requests in flight at priority -2**31 from an ordinary key: the router's chat
    class (its route's priority 0) used to get no answer at all. The claim is now held
    to the key's allowance (0): the chat request waits its turn behind the requests
    already there, first come first served, and no more."""
    with flood(server.url, ORDINARY, -(2**31), clients=4) as answered:
        for _ in range(3):
            overtaken = passed_by(answered, ORDINARY, server.url, "front", **{"class": "chat"})
            # the four already there, give or take one sent meanwhile; honoured, the
            # claim let every flood request pass until the chat request aged (or for ever)
            assert overtaken <= 8, f"{overtaken} flood requests went first"
        assert len(answered) >= 4  # the flood was served too


def test_a_key_allowed_a_priority_still_jumps_the_queue(server: ServerProcess) -> None:
    """--api-key-priority KEY=-10: that key's priority -10 is honoured, ahead of six
    ordinary callers at the default priority; an admin key may claim any priority."""
    with flood(server.url, ORDINARY, 0, clients=6) as answered:
        for key in (TRUSTED, ADMIN):
            overtaken = passed_by(answered, key, server.url, "engine", priority=-10)
            # the one running; held to the default, the six queued would go first
            assert overtaken <= 3, f"{key[:7]}: {overtaken} flood requests went first"


def test_a_router_that_hides_its_targets_refuses_direct_calls(server: ServerProcess) -> None:
    status, doc = complete(server.url, ORDINARY, "hidden_engine")
    assert status == 403, doc
    assert "hidden_front" in doc["error"]["message"]
    assert complete(server.url, ORDINARY, "hidden_front")[0] == 200
    assert complete(server.url, ADMIN, "hidden_engine")[0] == 403  # hidden from everyone
    listed = {m["id"] for m in request(server.url, "GET", "/v1/models", None,
                                       bearer(ORDINARY)).json()["data"]}
    assert "hidden_front" in listed and "hidden_engine" not in listed
    assert "engine" in listed  # front does not hide its target
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4],
                        "data": [1.0, 2.0, 3.0, 4.0]}]}
    direct = post_json(server.url, "/v2/models/tensor/infer", body, bearer(ORDINARY))
    assert direct.status == 403 and "tensor_front" in direct.json()["error"]
    routed = post_json(server.url, "/v2/models/tensor_front/infer", body, bearer(ORDINARY))
    assert routed.status == 200, routed.body
