"""Config files written to hurt: YAML alias bombs and deep nesting in every YAML file the
project reads, values too large to echo, router weights whose sum overflows, a router
that targets itself, and generate.yaml sizes past their bounds. Each is one short
ConfigError naming the file and the field."""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tradeoff.errors import MESSAGE_LIMIT, ConfigError, ModelLoadError, capped, shown
from tradeoff.generate.config import SIZE_LIMITS, GenerativeConfig
from tradeoff.repository.config import load_config_file
from tradeoff.repository.edit import add_versions
from tradeoff.repository.router import MAX_WEIGHT, Route, RouterConfig, Target
from tradeoff.repository.safe_yaml import MAX_ALIAS_NODES, MAX_DEPTH, parse_yaml

SHORT = 300  # characters: the most a message about a hostile file may take


def alias_bomb(field: str) -> str:
    """About 260 bytes whose ``field`` expands to 9^7 (4.8 million) strings: 24 MB as text."""
    levels = ["&a [x, x, x, x, x, x, x, x, x]"]
    levels += [f"&{name} [{', '.join([f'*{below}'] * 9)}]"
               for below, name in zip("abcdef", "bcdefg", strict=True)]
    return f"{field}: [{', '.join(levels)}]\n"


def read_generate(directory: Path) -> object:
    return GenerativeConfig.read(directory / "generate.yaml")


def read_router(directory: Path) -> object:
    return RouterConfig.read(directory / "router.yaml")


def read_config(directory: Path) -> object:
    return load_config_file(directory / "config.yaml", default_name=directory.name)


def edit_config(directory: Path) -> object:
    return add_versions(directory, {2: {"precision": "int8"}})


def sibling(directory: Path) -> object:
    from tradeoff.optimize.generative import write_sibling  # imports torch

    return write_sibling(directory, "bf16")


# each reader of YAML: (file it reads, a field whose value is echoed when it is wrong)
READERS: dict[str, tuple[str, str, Callable[[Path], object]]] = {
    "generate.yaml": ("generate.yaml", "max_num_seqs", read_generate),
    "router.yaml": ("router.yaml", "routes", read_router),
    "config.yaml": ("config.yaml", "max_batch_size", read_config),
    "edit config.yaml": ("config.yaml", "parameters", edit_config),
    "optimize generate.yaml": ("generate.yaml", "path", sibling),
}


def refusal(tmp_path: Path, reader: str, text: str) -> str:
    file, _, read = READERS[reader]
    directory = tmp_path / "model"
    directory.mkdir()
    (directory / file).write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError) as info:
        read(directory)
    assert time.monotonic() - started < 5
    message = str(info.value)
    assert message.startswith(str(directory / file)), message
    assert len(message) < SHORT and "\n" not in message, message[:SHORT]
    return message


# ------------------------------------------------------------------ YAML

@pytest.mark.parametrize("reader", list(READERS))
def test_an_alias_bomb_is_refused_by_every_reader(tmp_path: Path, reader: str) -> None:
    text = alias_bomb(READERS[reader][1])
    assert len(text) < 400
    assert f"aliases repeat more than {MAX_ALIAS_NODES:,} nodes" in \
        refusal(tmp_path, reader, text)


@pytest.mark.parametrize("reader", list(READERS))
def test_deep_nesting_names_the_file(tmp_path: Path, reader: str) -> None:
    text = f"{READERS[reader][1]}: {'[' * 20_000}{']' * 20_000}\n"
    assert f"nested deeper than {MAX_DEPTH} levels" in refusal(tmp_path, reader, text)


@pytest.mark.parametrize("text, says", [
    ("a: &x [1, *x]\n", "an alias refers to a node that holds it"),
    ("a: " + "9" * 5000 + "\n", "not valid YAML: Exceeds the limit"),
    ("a: [1, 2\n", "not valid YAML at line 2, column 1: while parsing a flow sequence"),
])
def test_other_hostile_yaml_is_one_line_naming_the_file(tmp_path: Path, text: str,
                                                        says: str) -> None:
    assert says in refusal(tmp_path, "generate.yaml", text)


def test_aliases_within_the_bound_and_merge_keys_still_read() -> None:
    text = "base: &b {x: 1, y: [1, 2]}\ncopy: *b\nmerged: {<<: *b, z: 3}\n" + \
        "many: [" + ", ".join(["*b"] * 100) + "]\n"
    doc = parse_yaml(text, "f.yaml")
    assert doc["copy"] == {"x": 1, "y": [1, 2]} and doc["merged"]["z"] == 3
    assert len(doc["many"]) == 100
    nested = "a: " + "[" * (MAX_DEPTH - 1) + "]" * (MAX_DEPTH - 1) + "\n"
    assert parse_yaml(nested, "f.yaml") is not None


# ------------------------------------------------------------------ messages

def test_a_long_value_is_named_not_echoed(tmp_path: Path) -> None:
    items = ", ".join(f"item{i}" for i in range(20_000))  # 200 KB, no alias
    message = refusal(tmp_path, "generate.yaml", f"path: [{items}]\n")
    assert "path: expected a string, got ['item0', 'item1', 'item2', 'item3', ...]" in message


def test_every_error_message_is_capped() -> None:
    giant = "x" * 10_000_000
    for error in (ModelLoadError(f"model 'm': {giant}"), ConfigError("f.yaml", "a", giant)):
        message = str(error)
        assert len(message) < MESSAGE_LIMIT + 40 and message.endswith("more characters)")
    assert ConfigError("f", "a", giant).problem == capped(giant)
    assert shown("4") == "'4'" and len(shown(list(range(10**6)))) < 40


# ------------------------------------------------------------------ routers

def write_router(tmp_path: Path, name: str, text: str) -> Path:
    directory = tmp_path / name
    directory.mkdir()
    (directory / "router.yaml").write_text(text)
    return directory / "router.yaml"


@pytest.mark.parametrize("weight", ["1.0e+308", "1.0e+7", "1000001"])
def test_an_arm_weight_past_the_bound_is_refused(tmp_path: Path, weight: str) -> None:
    path = write_router(tmp_path, "r", f"routes: [{{to: [{{model: a, weight: {weight}}}, "
                                       f"{{model: b, weight: {weight}}}]}}]\n")
    with pytest.raises(ConfigError, match=r"routes\[0\]\.to\[0\]\.weight: must be a "
                                          r"positive number of at most 1,000,000$"):
        RouterConfig.read(path)


def split(route: Route, draws: int = 10_000) -> Counter[int]:
    rng = random.Random(7)
    return Counter(route.arm_at(rng.random()) for _ in range(draws))


@pytest.mark.parametrize("weights", [(MAX_WEIGHT, MAX_WEIGHT), (MAX_WEIGHT, MAX_WEIGHT / 3),
                                     (1e-300, 3e-300), (1e308, 1e308)])
def test_extreme_weights_split_as_the_weights_say(weights: tuple[float, float]) -> None:
    route = Route(tuple(Target(name, weight=w) for name, w in zip("ab", weights, strict=True)))
    counts = split(route)
    share = 1 / (1 + weights[1] / weights[0])  # the sum of 1e308s would overflow
    assert abs(counts[0] / 10_000 - share) < 0.02, counts


def test_the_largest_legal_weights_split_evenly_when_read(tmp_path: Path) -> None:
    path = write_router(tmp_path, "r", "routes: [{to: [{model: a, weight: 1.0e+6}, "
                                       "{model: b, weight: 1000000}]}]\n")
    counts = split(RouterConfig.read(path).routes[0])
    assert abs(counts[0] - 5_000) < 200, counts


@pytest.mark.parametrize("text, field", [
    ("routes: [{to: r}]", "routes[0].to"),
    ("routes: [{to: [a, {model: r, weight: 2}]}]", "routes[0].to[1].model"),
    ("routes: [{to: a}]\nfallback: [r]", "fallback[0]"),
    ("routes: [{to: a}]\nshadow: {to: r}", "shadow.to"),
])
def test_a_router_cannot_target_itself(tmp_path: Path, text: str, field: str) -> None:
    path = write_router(tmp_path, "r", text + "\n")
    with pytest.raises(ConfigError) as info:
        RouterConfig.read(path)
    assert str(info.value) == f"{path}: {field}: a router cannot target itself"
    assert RouterConfig.read(write_router(tmp_path, "other", text + "\n")).models()


# ------------------------------------------------------------------ generate.yaml sizes

@pytest.mark.parametrize("field, value", [("max_num_seqs", 10**9),
                                          ("max_num_batched_tokens", 10**15),
                                          ("max_num_queued_requests", 10**7),
                                          ("num_blocks", 10**9), ("block_size", 10**6)])
def test_sizes_past_their_bound_are_refused(tmp_path: Path, field: str, value: int) -> None:
    path = tmp_path / "generate.yaml"
    path.write_text(f"format: synthetic\n{field}: {value}\n")
    with pytest.raises(ConfigError) as info:
        GenerativeConfig.read(path, ("synthetic",))
    assert str(info.value) == \
        f"{path}: {field}: must be at most {SIZE_LIMITS[field]:,}, got {value}"


def test_sizes_at_their_bound_load(tmp_path: Path) -> None:
    path = tmp_path / "generate.yaml"
    path.write_text("format: synthetic\n" +
                    "".join(f"{field}: {limit}\n" for field, limit in SIZE_LIMITS.items()))
    config: Any = GenerativeConfig.read(path, ("synthetic",))
    assert all(getattr(config, field) == limit for field, limit in SIZE_LIMITS.items())


def test_deeply_nested_json_model_files_name_the_file(tmp_path: Path) -> None:
    """model.json (both synthetic kinds) and the tokenizer's config: 20,000 nested ``[``
    used to end in a bare RecursionError."""
    from tradeoff.backends.synthetic import _read
    from tradeoff.backends.synthetic_generative import SyntheticLLMConfig

    deep = tmp_path / "model.json"
    deep.write_text("[" * 20_000 + "]" * 20_000)
    for read in (_read, SyntheticLLMConfig.read):
        with pytest.raises(ModelLoadError) as caught:
            read(deep)
        assert str(deep) in str(caught.value) and len(str(caught.value)) < 500
