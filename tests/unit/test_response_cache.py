"""The response cache's keys, MACs, stored values, tenants, LRU bound and --cache
parsing."""

from __future__ import annotations

import asyncio
import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tradeoff.generate.sampling_params import SamplingParams
from tradeoff.protocol.v2 import TensorOutput
from tradeoff.server.cache import ResponseCache
from tradeoff.server.cache.keys import CHECK_BYTES, MAC_BYTES, Keys
from tradeoff.server.cache.spec import SECRET_ENV, CacheSpec
from tradeoff.server.cache.stores import LocalStore
from tradeoff.server.cache.values import decode_outputs, encode_generation, encode_outputs

SECRET = b"unit-test-secret-0123456789"
KEYS = Keys(SECRET)
tensor_key = KEYS.tensor_key
generation_key = KEYS.generation_key
ALICE, BOB = b"a" * 32, b"b" * 32

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
    return tensor_key(b"", r["model"], r["version"], r["inputs"], r["outputs"],
                      r["parameters"])


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
    key = generation_key(b"", "tinyllama", 1, [1, 2, 3], params)
    assert generation_key(b"", "tinyllama", 1, [1, 2, 3], params) == key
    changed = [generation_key(b"", "tinyllama", 1, [1, 2, 4], params),
               generation_key(b"", "tinyllama", 2, [1, 2, 3], params),
               generation_key(b"", "smollm2", 1, [1, 2, 3], params),
               generation_key(ALICE, "tinyllama", 1, [1, 2, 3], params)]
    for field in ("max_tokens", "seed", "top_k"):
        changed.append(generation_key(b"", "tinyllama", 1, [1, 2, 3],
                                      dataclasses.replace(params, **{field: 5})))
    changed.append(generation_key(b"", "tinyllama", 1, [1, 2, 3],
                                  dataclasses.replace(params, stop=("x",))))
    assert len({k.key for k in changed} | {key.key}) == len(changed) + 1


def test_keys_depend_on_the_secret_and_on_the_tenant_unless_the_scope_is_global() -> None:
    inputs = [("X", "FP32", np.ones((1, 2), np.float32))]
    mine = tensor_key(ALICE, "mlp", 1, inputs, [], {})
    assert tensor_key(BOB, "mlp", 1, inputs, [], {}).key != mine.key
    assert Keys(b"another-secret-0123456789").tensor_key(ALICE, "mlp", 1, inputs, [], {}) \
        .key != mine.key
    shared = Keys(SECRET, scope="global")
    assert shared.tensor_key(ALICE, "mlp", 1, inputs, [], {}).key == \
        shared.tensor_key(BOB, "mlp", 1, inputs, [], {}).key
    assert shared.tensor_key(ALICE, "mlp", 1, inputs, [], {}).tenant == ALICE  # charged


def test_stored_outputs_come_back_exactly() -> None:
    outputs = [TensorOutput("scores", np.arange(12, dtype=np.float32).reshape(3, 4), "FP32",
                            True),
               TensorOutput("labels", np.array([[b"cat", b""], [b"\x00\xff", b"dog"]],
                                               dtype=object), "BYTES", False),
               TensorOutput("empty", np.zeros((0, 5), np.int64), "INT64", False)]
    back = decode_outputs(encode_outputs(outputs), _expected(outputs))
    assert [(o.name, o.datatype, o.binary, o.array.shape) for o in back] == \
        [(o.name, o.datatype, o.binary, o.array.shape) for o in outputs]
    for got, want in zip(back, outputs, strict=True):
        assert np.array_equal(got.array, want.array)


def _expected(outputs: list[TensorOutput]) -> list:
    return [(o.name, o.datatype, o.binary, list(o.array.shape)) for o in outputs]


def _cache(spec: str = "local,size=1MB") -> ResponseCache:
    return ResponseCache.from_spec(CacheSpec.parse(spec, {}))


def _outputs(value: float) -> list[TensorOutput]:
    return [TensorOutput("OUT0", np.full((1, 4), value, np.float32), "FP32", False)]


EXPECTED = [("OUT0", "FP32", False, [1, 4])]


def _input_key(cache: ResponseCache, value: float, tenant: bytes = b""):
    return cache.tensor_key(tenant, "mlp", 1, [("X", "FP32", np.full((1, 2), value,
                                                                     np.float32))], [], {})


def test_a_local_value_found_under_another_key_is_a_miss() -> None:
    cache = _cache()
    mine, theirs = _input_key(cache, 1.0), _input_key(cache, 0.0)
    cache.keep(theirs, _outputs(7.0))
    assert isinstance(cache.store, LocalStore)
    # another request's answer found under my key: a collision, or a writer moving it
    cache.store.put(mine.key, cache.store.get(theirs.key))  # type: ignore[arg-type]
    assert asyncio.run(cache.lookup(mine, EXPECTED)) is None
    assert cache.rejected == 1
    found = asyncio.run(cache.lookup(theirs, EXPECTED))
    assert found is not None and float(found[0].array[0, 0]) == 7.0


def test_a_value_sealed_without_the_secret_never_opens() -> None:
    """What Redis holds: any MAC a writer without the secret can make fails, and a
    server with the same secret opens what another wrote."""
    key = KEYS.tensor_key(b"", "mlp", 1, [("X", "FP32", np.ones((1, 2), np.float32))], [],
                          {})
    planted = encode_outputs(_outputs(1337.0))
    for forged in (b"\0" * MAC_BYTES + planted, key.check + planted,
                   Keys(b"guessed-secret-0123456").seal(key, planted)):
        assert KEYS.open(key, forged) is None
    sealed = Keys(SECRET).seal(key, planted)
    assert bytes(KEYS.open(key, sealed) or b"") == planted
    other = KEYS.tensor_key(b"", "mlp", 1, [("X", "FP32", np.zeros((1, 2), np.float32))],
                            [], {})
    assert KEYS.open(other, sealed) is None  # moved under another key
    assert KEYS.open(key, sealed[:-1] + b"\1") is None  # one bit of the value


def test_an_authentic_value_the_model_cannot_have_made_is_a_miss_not_a_500() -> None:
    cache = _cache()
    key = _input_key(cache, 1.0)
    assert isinstance(cache.store, LocalStore)
    cache.store.put(key.key, key.check + b"\x05\x00\x00\x00[[[[[")
    assert asyncio.run(cache.lookup(key, EXPECTED)) is None and cache.unreadable == 1
    for wrong in ([TensorOutput("OUT0", np.ones((1, 5), np.float32), "FP32", False)],
                  [TensorOutput("OUT0", np.ones((1, 4), np.float64), "FP64", False)],
                  [TensorOutput("OTHER", np.ones((1, 4), np.float32), "FP32", False)],
                  [*_outputs(1.0), *_outputs(2.0)]):
        cache.store.put(key.key, key.check + encode_outputs(wrong))
        assert asyncio.run(cache.lookup(key, EXPECTED)) is None
    assert asyncio.run(cache.lookup(key, [("OUT0", "FP32", False, [1, -1])])) is None
    assert cache.unreadable == 6
    params = SamplingParams(max_tokens=4, temperature=0.0)
    gen = cache.generation_key(b"", "llm", 1, [1, 2], params)
    for tokens, reason in (([1, 10**12], "stop"), ([1, -1], "stop"), ([1, 2], "abort"),
                           ([1] * 5, "length"), ([True, 2], "stop")):
        cache.store.put(gen.key, gen.check + encode_generation(tokens, reason))
        assert asyncio.run(cache.lookup_generation(gen, 300, 4)) is None
    cache.store.put(gen.key, gen.check + encode_generation([1, 299], "length"))
    assert asyncio.run(cache.lookup_generation(gen, 300, 4)) == ([1, 299], "length")


def test_one_tenant_sees_only_its_own_answers_unless_the_scope_is_global() -> None:
    for spec, shared in (("local,size=1MB", False), ("local,size=1MB,scope=global", True)):
        cache = _cache(spec)
        cache.keep(_input_key(cache, 1.0, ALICE), _outputs(5.0))
        found = asyncio.run(cache.lookup(_input_key(cache, 1.0, BOB), EXPECTED))
        assert (found is not None) is shared, spec
        assert asyncio.run(cache.lookup(_input_key(cache, 1.0, ALICE), EXPECTED)) is not None


def test_one_tenant_cannot_flush_the_others() -> None:
    cache = _cache("local,size=400KB,tenant_size=100KB")
    store = cache.store
    assert isinstance(store, LocalStore)
    bob = [_input_key(cache, float(i), BOB) for i in range(50)]
    for key in bob:
        cache.keep(key, _outputs(1.0))
    for i in range(3000):  # Alice's flood of distinct inputs
        cache.keep(_input_key(cache, 1e6 + i, ALICE), _outputs(2.0))
        assert store.tenant_bytes[ALICE] <= store.tenant_capacity
    assert all(asyncio.run(cache.lookup(key, EXPECTED)) is not None for key in bob)
    assert store.bytes <= store.capacity
    assert store.bytes == sum(store.cost(k, v) for k, v in store.entries.items())
    assert store.tenant_bytes[BOB] + store.tenant_bytes[ALICE] == store.bytes


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
    key = _input_key(cache, 1.0)
    cache.keep(key, [TensorOutput("OUT0", np.ones((1, 100), np.float32), "FP32", False)])
    assert cache.too_large == 1 and cache.insertions == 0
    assert asyncio.run(cache.lookup(key, [("OUT0", "FP32", False, [1, 100])])) is None


ENV = {SECRET_ENV: SECRET.decode()}


@pytest.mark.parametrize(("text", "want"), [
    ("local", CacheSpec("local", size_bytes=256_000_000, tenant_bytes=64_000_000)),
    ("local,size=64MiB", CacheSpec("local", size_bytes=64 << 20, tenant_bytes=16 << 20)),
    ("local,size=1.5GB,max_item=4MB,scope=global,tenant_size=1GB",
     CacheSpec("local", size_bytes=1_500_000_000, max_item_bytes=4_000_000, scope="global",
               tenant_bytes=1_000_000_000)),
    ("redis://127.0.0.1:6379/0", CacheSpec("redis", url="redis://127.0.0.1:6379/0",
                                           tenant_bytes=256_000_000)),
    ("redis://h:1/2,ttl=60", CacheSpec("redis", url="redis://h:1/2", ttl_s=60,
                                       tenant_bytes=256_000_000)),
    ("redis://h:1/2,ttl=0", CacheSpec("redis", url="redis://h:1/2", ttl_s=None,
                                      tenant_bytes=256_000_000)),
])
def test_cache_specs(text: str, want: CacheSpec) -> None:
    got = CacheSpec.parse(text, ENV)
    assert dataclasses.replace(got, secret=b"") == want
    assert got.secret == SECRET


def test_secrets_and_passwords_come_from_files_and_never_reach_the_banner(tmp_path) -> None:
    secret, password = tmp_path / "secret", tmp_path / "password"
    secret.write_text("s" * 40 + "\n")
    password.write_text("hunter2-redis\n")
    spec = CacheSpec.parse(f"redis://:pw-in-url@h:1/0,secret_file={secret},"
                           f"password_file={password}", {})
    assert spec.secret == b"s" * 40 and spec.password == "hunter2-redis"
    assert "pw-in-url" not in spec.describe() and "hunter2" not in spec.describe()
    assert CacheSpec.parse("local", {}).secret == b""  # a local cache makes its own


@pytest.mark.parametrize(("text", "env", "message"), [
    ("memcached://x", ENV, "use local[,size=256MB] or redis://"),
    ("local,size=lots", ENV, "size='lots': give bytes"),
    ("local,ttl=5", ENV, "unknown option 'ttl'"),
    ("redis://h:1/0,size=5MB", ENV, "unknown option 'size'"),
    ("redis://h:1/0,ttl=1h", ENV, "give whole seconds"),
    ("local,size", ENV, "write NAME=VALUE"),
    ("local,scope=tenant", ENV, "use scope=key"),
    ("local,tenant_size=0", ENV, "tenant_size must be at least 1 byte"),
    ("redis://h:1/0", {}, "need one secret: secret_file=PATH or $TRADEOFF_CACHE_SECRET"),
    ("redis://h:1/0", {SECRET_ENV: "short"}, "at least 16 bytes"),
    ("redis://h:1/0,secret_file=/nonexistent/x", {}, "cannot read it"),
])
def test_bad_cache_specs_say_what_to_write(text: str, env: dict, message: str) -> None:
    with pytest.raises(ValueError) as caught:
        CacheSpec.parse(text, env)
    assert message in str(caught.value)
