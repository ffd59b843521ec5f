"""Prefix caching: full KV blocks shared by prompts that start alike, reference counted,
evicted least recently released first; greedy output never changes because of it."""

from __future__ import annotations

import pytest

from tradeoff.generate.kv_blocks import BlockAllocator, block_key

torch = pytest.importorskip("torch")

from tradeoff.backends.llama import LlamaDecoder  # noqa: E402
from tradeoff.generate.engine import GenerationEngine  # noqa: E402
from tradeoff.generate.sampling_params import SamplingParams  # noqa: E402

from .test_generation_engine import CONFIG, GREEDY, random_weights  # noqa: E402

SHARED = [1] + list(range(10, 30))  # 21 tokens: two full blocks of 8, and 5 more


@pytest.fixture(scope="module")
def decoder() -> LlamaDecoder:
    return LlamaDecoder(CONFIG, random_weights(CONFIG))


def test_blocks_are_shared_counted_and_evicted_lru() -> None:
    blocks = BlockAllocator(4, 2, prefix_caching=True)
    first = blocks.allocate(2)
    keys = [block_key(None, [1, 2])]
    keys.append(block_key(keys[0], [3, 4]))
    for block, key in zip(first, keys, strict=True):
        blocks.register(block, key)
    shared, found = blocks.match([1, 2, 3, 4, 5], limit=4)
    assert shared == first and found == keys and blocks.hit_tokens == 4
    assert blocks.match([9, 2, 3, 4], limit=4) == ([], [])  # same block, other prefix
    blocks.free(first)  # the first user leaves: still held by the second
    assert blocks.free_blocks == 2
    blocks.free(shared)  # nobody holds them: cached, yet free to reuse
    assert blocks.free_blocks == 4 and blocks.usage == 0
    fresh = blocks.allocate(3)  # two never-used blocks first, then the oldest cached one
    assert first[0] in fresh and first[1] not in fresh
    assert blocks.match([1, 2, 3, 4], limit=4)[0] == []  # its first block was reused
    off = BlockAllocator(4, 2)
    off.register(0, keys[0])
    assert off.match([1, 2], limit=2) == ([], [])


def test_prefixes_whose_python_hashes_collide_share_no_block() -> None:
    """An int hashes to itself modulo 2**61 - 1, so two different first blocks can have
    equal hash(); the block after them must still not be shared."""
    one, other = [1, 5], [1, 5 + (2**61 - 1)]
    assert hash(tuple(one)) == hash(tuple(other))
    blocks = BlockAllocator(4, 2, prefix_caching=True)
    table = blocks.allocate(2)
    first = block_key(None, one)
    blocks.register(table[0], first)
    blocks.register(table[1], block_key(first, [7, 8]))
    assert block_key(block_key(None, other), [7, 8]) != block_key(first, [7, 8])
    assert blocks.match([*other, 7, 8, 9], limit=4) == ([], [])
    assert blocks.match([*one, 7, 8, 9], limit=4)[0] == table


def test_a_repeated_prompt_skips_its_cached_blocks(decoder: LlamaDecoder) -> None:
    engine = GenerationEngine(decoder, num_blocks=32, block_size=8, prefix_caching=True)
    first = engine.add(SHARED, GREEDY)
    prefill = []
    while engine.has_work():
        prefill.append(engine.step().prefill_tokens)
    second = engine.add(SHARED + [40, 41], GREEDY)
    third = engine.add(SHARED, GREEDY)
    while engine.has_work():
        prefill.append(engine.step().prefill_tokens)
    assert first.cached_tokens == 0
    assert second.cached_tokens == 16 and third.cached_tokens == 16  # 2 blocks of 8
    assert third.output == first.output
    plain = GenerationEngine(decoder, num_blocks=32, block_size=8)
    alone = [plain.add(p, GREEDY) for p in (SHARED + [40, 41],)]
    while plain.has_work():
        plain.step()
    assert second.output == alone[0].output
    assert engine.blocks.hit_tokens == 32


@pytest.mark.parametrize("num_blocks", [8, 12, 64])
def test_output_is_the_same_with_and_without_the_cache(decoder: LlamaDecoder,
                                                       num_blocks: int) -> None:
    """Many prompts sharing prefixes, a cache small enough to evict and to preempt."""
    prompts = [SHARED[:n] + [50 + i] for i, n in enumerate((21, 9, 17, 21, 3, 16, 21))]
    params = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)

    def outputs(prefix_caching: bool) -> list[list[int]]:
        engine = GenerationEngine(decoder, num_blocks=num_blocks, block_size=4,
                                  max_num_seqs=3, max_num_batched_tokens=16,
                                  prefix_caching=prefix_caching)
        done = []
        for start in range(0, len(prompts), 3):  # waves: later prompts find earlier blocks
            seqs = [engine.add(p, params) for p in prompts[start:start + 3]]
            while engine.has_work():
                engine.step()
            done += seqs
        if prefix_caching:
            assert engine.blocks.hit_tokens > 0
        preempted.append(engine.scheduler.preemptions)
        assert engine.blocks.usage == 0  # every block given back
        return [s.output for s in done]

    preempted: list[int] = []
    assert outputs(True) == outputs(False)
    if num_blocks == 8:
        assert min(preempted) > 0  # the small cache preempted, with and without sharing
