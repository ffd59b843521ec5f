"""Hostile config files in a real `tradeoff serve`: a YAML alias bomb in generate.yaml,
20,000 nested ``[`` in config.yaml, generate.yaml sizes past their bounds, router weights
whose sum overflows and a router that targets itself. Each model is ``UNAVAILABLE`` with a
short reason naming the file and the field (in ``/v2/repository/index``, in the load
answer and in the log), loading them again does not hold up a client of another model,
and a router with the largest legal weights splits its requests as the weights say."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess

from .helpers import background_load, infer_json, post_json, running_server
from .model_repo import CONSTANT_CONFIG, _write, add_constant_model

pytestmark = pytest.mark.integration

SHORT = 300  # characters: the most a reason about a hostile file may take
LEVELS = ["&a [x, x, x, x, x, x, x, x, x]"] + [
    f"&{name} [{', '.join([f'*{below}'] * 9)}]"
    for below, name in zip("abcdef", "bcdefg", strict=True)]
ALIAS_BOMB = f"format: synthetic\nmax_num_seqs: [{', '.join(LEVELS)}]\n"  # 9^7 strings
HUGE = {"max_num_seqs": 10**9, "max_num_batched_tokens": 10**15}
ARMS = "routes: [{{to: [{{model: one, weight: {w}}}, {{model: two, weight: {w}}}]}}]\n"

# model -> (file, its text, what the reason says after the file's path)
HOSTILE: dict[str, tuple[str, str, str]] = {
    "bomb": ("generate.yaml", ALIAS_BOMB, ": line 2: aliases repeat more than 10,000 nodes"),
    "deep": ("config.yaml", "max_batch_size: " + "[" * 20_000 + "]" * 20_000 + "\n",
             ": line 1: nested deeper than 64 levels"),
    "huge": ("generate.yaml", yaml.safe_dump({"format": "synthetic", **HUGE}),
             ": max_num_seqs: must be at most 4,096, got 1000000000"),
    "overflow": ("router.yaml", ARMS.format(w="1.0e+308"),
                 ": routes[0].to[0].weight: must be a positive number of at most 1,000,000"),
    "selfish": ("router.yaml", "routes: [{to: [one, selfish]}]\n",
                ": routes[0].to[1]: a router cannot target itself"),
}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile_config")
    _write(root, "one", {1: add_constant_model(1.0)}, CONSTANT_CONFIG.format(name="one", extra=""))
    _write(root, "two", {1: add_constant_model(2.0)}, CONSTANT_CONFIG.format(name="two", extra=""))
    (root / "heavy").mkdir()
    (root / "heavy" / "router.yaml").write_text(ARMS.format(w="1.0e+6"))
    for name, (file, text, _) in HOSTILE.items():
        directory = _write(root, name, {1: add_constant_model(3.0)}, None) \
            if file == "config.yaml" else root / name
        directory.mkdir(exist_ok=True)
        (directory / file).write_text(text)
    try:  # the synthetic model itself, as it would load without the bounds
        write_synthetic_llm(root, "huge", **HUGE)
    except ValueError:
        pass  # without torch: the generate.yaml alone
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    yield from running_server(repo)


def index(server: ServerProcess) -> dict[str, dict[str, str]]:
    response = post_json(server.url, "/v2/repository/index", {})
    assert response.status == 200, response.body
    return {row["name"]: row for row in response.json()}


def ask(server: ServerProcess, model: str) -> tuple[int, float | None]:
    response = infer_json(server.url, model, [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [0.0] * 4}])
    if response.status != 200:
        return response.status, None
    return response.status, response.json()["outputs"][0]["data"][0]


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_file_leaves_its_model_unavailable_with_a_short_reason(
        server: ServerProcess, repo: Path, name: str) -> None:
    file, _, says = HOSTILE[name]
    rows = index(server)
    assert rows[name]["state"] == "UNAVAILABLE", rows[name]
    assert rows[name]["reason"][:SHORT] == f"{repo / name / file}{says}"
    assert rows["one"]["state"] == rows["heavy"]["state"] == "READY"
    log = [line for line in server.log_text().splitlines() if f"model {name}:" in line]
    assert log and max(len(line) for line in log) < 2 * SHORT, [line[:SHORT] for line in log]


def test_loading_them_again_is_refused_at_once_while_another_model_serves(
        server: ServerProcess, repo: Path) -> None:
    with background_load(lambda: ask(server, "one")[0], threads=2) as statuses:
        for name, (file, _, says) in HOSTILE.items():
            response = post_json(server.url, f"/v2/repository/models/{name}/load", {})
            assert response.status == 400, response.body
            assert len(response.body) < SHORT + 100 and \
                f"{repo / name / file}{says}" in response.json()["error"]
    assert statuses and set(statuses) == {200}, Counter(statuses)


def test_the_largest_legal_weights_split_the_requests_evenly(server: ServerProcess) -> None:
    answers = Counter(ask(server, "heavy") for _ in range(200))
    assert set(answers) == {(200, 1.0), (200, 2.0)}, answers  # 0 + one's 1, or two's 2
    assert answers[(200, 1.0)] > 60 and answers[(200, 2.0)] > 60, answers
