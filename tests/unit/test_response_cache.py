"""The response cache's keys, stored values, LRU bound and --cache parsing."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tradeoff.generate.sampling import SamplingParams
from tradeoff.protocol.v2 import TensorOutput
from tradeoff.server.cache import (
    CHECK_BYTES,
    CacheSpec,
    LocalStore,
    ResponseCache,
    decode_outputs,
    encode_outputs,
    generation_key,
    tensor_key,
)

NUMERIC = ["FP32", "FP16", "INT8", "INT64", "UINT8", "BOOL"]


@st.composite
def requests(draw: st.DrawFn) -> dict:
    """One tensor request's key material: model, version, inputs, outputs, parameters."""
    count = draw(st.integers(1, 3))
    names = draw(st.lists(st.text("abcXYZ_0", min_size=1, max_size=6), min_size=count,
                          max_size=count, unique=True))
    inputs = []
    for name in names:
        datatype = draw(st.sampled_from(NUMERIC))
        size = draw(st.integers(1, 12))
        data = draw(st.binary(min_size=size * 8, max_size=size * 8))
        array = np.frombuffer(data, np.uint8)[:size * _itemsize(datatype)]
        inputs.append((name, datatype, array.view(_dtype(datatype)).reshape(1, size).copy()))
    outputs = [(draw(st.sampled_from(["OUT0", "OUT1"])), draw(st.booleans()))]
    parameters = draw(st.dictionaries(st.sampled_from(["threshold", "mode", "k"]),
                                      st.integers(-3, 3) | st.text("ab", max_size=2),
                                      max_size=2))
    return {"model": draw(st.sampled_from(["mlp", "mlp2"])), "version": draw(st.integers(1, 3)),
            "inputs": inputs, "outputs": outputs, "parameters": parameters}


def _dtype(datatype: str) -> np.dtype:
    return np.dtype({"FP32": np.float32, "FP16": np.float16, "INT8": np.int8,
                     "INT64": np.int64, "UINT8": np.uint8, "BOOL": np.bool_}[datatype])


def _itemsize(datatype: str) -> int:
    return _dtype(datatype).itemsize


def _key(r: dict):
    return tensor_key(r["model"], r["version"], r["inputs"], r["outputs"], r["parameters"])


def _changes(r: dict) -> list[tuple[str, dict]]:
    """Every way of changing the request by one thing that may change its answer."""
    name, datatype, array = r["inputs"][0]
    out = [("model", {**r, "model": r["model"] + "x"}),
           ("version", {**r, "version": r["version"] + 1}),
           ("input name", {**r, "inputs": [(name + "x", datatype, array), *r["inputs"][1:]]}),
           ("output", {**r, "outputs": [("OTHER", r["outputs"][0][1])]}),
           ("binary flag", {**r, "outputs": [(r["outputs"][0][0], not r["outputs"][0][1])]}),
           ("an extra output", {**r, "outputs": [*r["outputs"], ("OUT9", False)]}),
           ("parameter", {**r, "parameters": {**r["parameters"], "threshold": 99}})]
    flipped = array.copy()
    flipped.view(np.uint8).reshape(-1)[0] ^= 1  # one bit of the data
    out.append(("data", {**r, "inputs": [(name, datatype, flipped), *r["inputs"][1:]]}))
    if array.size > 1:  # the same bytes in another shape
        out.append(("shape", {**r, "inputs": [(name, datatype, array.reshape(-1, 1)),
                                              *r["inputs"][1:]]}))
    other = "UINT8" if datatype == "INT8" else "INT8" if datatype in ("UINT8", "BOOL") else None
    if other is not None:  # the same bytes read as another datatype
        out.append(("datatype", {**r, "inputs": [(name, other, array.view(_dtype(other))),
                                                 *r["inputs"][1:]]}))
    return out


@settings(max_examples=150, deadline=None)
@given(requests())
def test_a_key_differs_on_every_change_that_may_change_the_answer(r: dict) -> None:
    key = _key(r)
    for what, changed in _changes(r):
        other = _key(changed)
        assert other.key != key.key and other.check != key.check, what


@settings(max_examples=60, deadline=None)
@given(requests())
def test_a_key_ignores_input_order_and_scheduling_parameters(r: dict) -> None:
    key = _key(r)
    same = {**r, "inputs": list(reversed(r["inputs"])),
            "parameters": {**r["parameters"], "priority": 3, "timeout": 1000, "cache": True,
                           "binary_data_output": True}}
    assert _key(same) == key
    assert len(key.key) == 16 and len(key.check) == CHECK_BYTES


def test_a_generation_key_covers_the_prompt_tokens_and_every_sampling_parameter() -> None:
    params = SamplingParams(max_tokens=8, temperature=0.0)
    key = generation_key("tinyllama", 1, [1, 2, 3], params)
    assert generation_key("tinyllama", 1, [1, 2, 3], params) == key
    changed = [generation_key("tinyllama", 1, [1, 2, 4], params),
               generation_key("tinyllama", 2, [1, 2, 3], params),
               generation_key("smollm2", 1, [1, 2, 3], params)]
    for field in ("max_tokens", "seed", "top_k"):
        changed.append(generation_key("tinyllama", 1, [1, 2, 3],
                                      dataclasses.replace(params, **{field: 5})))
    changed.append(generation_key("tinyllama", 1, [1, 2, 3],
                                  dataclasses.replace(params, stop=("x",))))
    assert len({k.key for k in changed} | {key.key}) == len(changed) + 1


def test_stored_outputs_come_back_exactly() -> None:
    outputs = [TensorOutput("scores", np.arange(12, dtype=np.float32).reshape(3, 4), "FP32",
                            True),
               TensorOutput("labels", np.array([[b"cat", b""], [b"\x00\xff", b"dog"]],
                                               dtype=object), "BYTES", False),
               TensorOutput("empty", np.zeros((0, 5), np.int64), "INT64", False)]
    back = decode_outputs(encode_outputs(outputs))
    assert [(o.name, o.datatype, o.binary, o.array.shape) for o in back] == \
        [(o.name, o.datatype, o.binary, o.array.shape) for o in outputs]
    for got, want in zip(back, outputs, strict=True):
        assert np.array_equal(got.array, want.array)


def _cache(spec: str = "local,size=1MB") -> ResponseCache:
    return ResponseCache.from_spec(CacheSpec.parse(spec))


def _outputs(value: float) -> list[TensorOutput]:
    return [TensorOutput("OUT0", np.full((1, 4), value, np.float32), "FP32", False)]


def test_a_stored_value_whose_check_digest_differs_is_a_miss_not_an_answer() -> None:
    cache = _cache()
    mine = tensor_key("mlp", 1, [("X", "FP32", np.ones((1, 2), np.float32))], [], {})
    theirs = tensor_key("mlp", 1, [("X", "FP32", np.zeros((1, 2), np.float32))], [], {})
    cache.keep(theirs, _outputs(7.0))
    assert isinstance(cache.store, LocalStore)
    # another request's answer found under my key: what a 128-bit collision looks like
    cache.store.put(mine.key, cache.store.get(theirs.key))  # type: ignore[arg-type]
    assert asyncio.run(cache.lookup(mine)) is None
    assert cache.collisions == 1
    found = asyncio.run(cache.lookup(theirs))
    assert found is not None and float(found[0].array[0, 0]) == 7.0


def test_an_unreadable_stored_value_is_a_miss() -> None:
    cache = _cache()
    key = tensor_key("mlp", 1, [("X", "FP32", np.ones((1, 2), np.float32))], [], {})
    assert isinstance(cache.store, LocalStore)
    cache.store.put(key.key, key.check + b"\x05\x00\x00\x00[[[[[")
    assert asyncio.run(cache.lookup(key)) is None and cache.unreadable == 1


def test_the_lru_stays_under_its_byte_bound_and_evicts_the_least_recent() -> None:
    store = LocalStore(10_000)
    rng = np.random.default_rng(0)
    keys = []
    for i in range(400):
        key = i.to_bytes(16, "little")
        keys.append(key)
        assert store.put(key, bytes(int(rng.integers(1, 900))))
        if i % 7 == 0:
            store.get(keys[0])  # kept warm: never the least recent
        assert store.bytes <= store.capacity
        assert store.bytes == sum(store.cost(k, v) for k, v in store.entries.items())
    assert store.evictions > 300
    assert keys[0] in store.entries and keys[1] not in store.entries
    assert not store.put(b"k" * 16, bytes(20_000))  # larger than the whole cache
    assert store.bytes <= store.capacity


def test_answers_over_max_item_are_not_kept() -> None:
    cache = _cache("local,size=1MB,max_item=64")
    key = tensor_key("mlp", 1, [("X", "FP32", np.ones((1, 2), np.float32))], [], {})
    cache.keep(key, [TensorOutput("OUT0", np.ones((1, 100), np.float32), "FP32", False)])
    assert cache.too_large == 1 and cache.insertions == 0
    assert asyncio.run(cache.lookup(key)) is None


@pytest.mark.parametrize(("text", "want"), [
    ("local", CacheSpec("local", size_bytes=256_000_000)),
    ("local,size=64MiB", CacheSpec("local", size_bytes=64 << 20)),
    ("local,size=1.5GB,max_item=4MB", CacheSpec("local", size_bytes=1_500_000_000,
                                                 max_item_bytes=4_000_000)),
    ("redis://127.0.0.1:6379/0", CacheSpec("redis", url="redis://127.0.0.1:6379/0")),
    ("redis://h:1/2,ttl=60", CacheSpec("redis", url="redis://h:1/2", ttl_s=60)),
    ("redis://h:1/2,ttl=0", CacheSpec("redis", url="redis://h:1/2", ttl_s=None)),
])
def test_cache_specs(text: str, want: CacheSpec) -> None:
    assert CacheSpec.parse(text) == want


@pytest.mark.parametrize(("text", "message"), [
    ("memcached://x", "use local[,size=256MB] or redis://"),
    ("local,size=lots", "size='lots': give bytes"),
    ("local,ttl=5", "unknown option 'ttl'"),
    ("redis://h:1/0,size=5MB", "unknown option 'size'"),
    ("redis://h:1/0,ttl=1h", "give whole seconds"),
    ("local,size", "write NAME=VALUE"),
])
def test_bad_cache_specs_say_what_to_write(text: str, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        CacheSpec.parse(text)
    assert message in str(caught.value)
