"""The decode step over fixed buffers and the block table against the decoder's general
step: the same logits and tokens for padded batch sizes, sequences joining and leaving,
prefix-cache hits and preemption; the block table kept by appending against one rebuilt
from every sequence's blocks."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tradeoff.backends.llama import LlamaDecoder, SequenceStep  # noqa: E402
from tradeoff.generate.decode_step import (  # noqa: E402
    DecodeStep,
    batch_buckets,
    context_bucket,
)
from tradeoff.generate.engine import GenerationEngine  # noqa: E402
from tradeoff.generate.kv_blocks import BlockTable  # noqa: E402
from tradeoff.generate.sampling_params import SamplingParams  # noqa: E402

from .test_generation_engine import CONFIG, PROMPTS, random_weights  # noqa: E402

BLOCK = 4


@pytest.fixture(scope="module")
def decoder() -> LlamaDecoder:
    return LlamaDecoder(CONFIG, random_weights(CONFIG))


def test_forward_decode_reads_the_block_table_as_step_reads_slots(decoder: LlamaDecoder) -> None:
    """Three sequences of different lengths in scattered blocks: one decode token each
    through the block table gives the logits of the general step (which gathers slots)."""
    prompts = [[1, 5, 9, 13, 17, 21, 3], [1, 40], [1, 7, 7, 7, 7, 7, 7, 7, 7, 30, 31]]
    tables = [[9, 2, 6], [4], [0, 7, 3]]
    cache = decoder.new_cache(num_blocks=12, block_size=BLOCK)

    def slots(table: list[int], length: int) -> torch.Tensor:
        t = torch.tensor(table)
        return (t[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:length]

    # every prompt but its last token into the cache
    decoder.step([SequenceStep(torch.tensor(p[:-1]), 0, slots(t, len(p) - 1))
                  for p, t in zip(prompts, tables, strict=True)], cache)
    general = decoder.step([SequenceStep(torch.tensor(p[-1:]), len(p) - 1, slots(t, len(p)))
                            for p, t in zip(prompts, tables, strict=True)], cache)
    width = max(map(len, tables))
    table = torch.tensor([t + [11] * (width - len(t)) for t in tables])
    fixed = decoder.forward_decode(torch.tensor([p[-1] for p in prompts]),
                                   torch.tensor([len(p) - 1 for p in prompts]), table, cache)
    assert torch.allclose(torch.stack(list(general)), fixed, atol=1e-5, rtol=1e-5)


def test_buckets_cover_every_batch_and_context() -> None:
    assert batch_buckets(64) == [1, 2, 4, 8, 16, 24, 32, 48, 64]
    assert batch_buckets(20) == [1, 2, 4, 8, 16, 20]
    assert batch_buckets(1) == [1]
    assert [context_bucket(n, 40) for n in (1, 2, 3, 5, 17, 33, 40)] == [1, 2, 4, 8, 32, 40, 40]


def run(engine: GenerationEngine, prompts: list[list[int]], params: SamplingParams,
        stagger: int = 0, check_table: bool = False) -> list[list[int]]:
    """Every prompt to the end; with ``stagger``, a new prompt joins every that many
    steps while others run and leave."""
    waiting = list(prompts)
    seqs = []
    steps = 0
    while waiting or engine.has_work():
        if waiting and (not stagger or steps % stagger == 0):
            seqs.append(engine.add(waiting.pop(0), params))
        engine.step()
        steps += 1
        if check_table:
            assert_table_matches_rebuild(engine)
        assert steps < 1000
    return [s.output for s in seqs]


def assert_table_matches_rebuild(engine: GenerationEngine) -> None:
    """Every row the engine kept equals the row rebuilt from its sequence's blocks."""
    table = engine.table
    rebuilt = np.full_like(table.table, table.scratch)
    for seq in engine.scheduler.running:
        row = table._row.get(seq.seq_id)
        if row is None:
            continue  # admitted this step without a decode yet: it syncs when it decodes
        rebuilt[row, :len(seq.blocks)] = seq.blocks
        assert table.blocks_of(seq.seq_id) <= len(seq.blocks)
        held = table.blocks_of(seq.seq_id)
        assert list(table.table[row, :held]) == seq.blocks[:held]
    owned = set(table._row.values())
    for row in range(len(table.table)):
        if row not in owned:
            assert (table.table[row] == table.scratch).all()  # released rows are cleared


def general_engine(decoder: LlamaDecoder, **options: object) -> GenerationEngine:
    engine = GenerationEngine(decoder, **options)  # type: ignore[arg-type]
    engine.decode_step = None  # every token through the decoder's general step
    return engine


def padded_engine(decoder: LlamaDecoder, **options: object) -> GenerationEngine:
    """The decode step as a GPU runs it (padded batches and tables), without graphs."""
    engine = GenerationEngine(decoder, **options)  # type: ignore[arg-type]
    assert engine.decode_step is not None
    engine.decode_step = DecodeStep(decoder, engine.cache, max_seqs=engine.scheduler.max_num_seqs,
                                    max_blocks=engine.table.width,
                                    scratch_block=engine.table.scratch, graphs=False, pad=True)
    return engine


GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
SAMPLED = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, top_k=20, seed=5,
                         ignore_eos=True)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("make", [GenerationEngine, padded_engine], ids=["exact", "padded"])
def test_decode_step_gives_the_general_step_s_tokens(decoder: LlamaDecoder, make: object,
                                                     params: SamplingParams) -> None:
    """Sequences joining every other step while others leave, at batch sizes 1-5 padded
    to the buckets: the same tokens as the general step for each."""
    prompts = [*PROMPTS, [1, 9, 8, 7], [1, 2]]
    expected = run(general_engine(decoder, block_size=BLOCK), prompts, params, stagger=2)
    engine = make(decoder, block_size=BLOCK)  # type: ignore[operator]
    assert run(engine, prompts, params, stagger=2, check_table=True) == expected
    assert engine.blocks.usage == 0 and not engine.table._row


def test_prefix_hits_and_preemption_keep_the_table_right(decoder: LlamaDecoder) -> None:
    """Shared prompt prefixes (cached blocks in several tables) and preemption by
    recompute (tables released and rebuilt): the rows stay equal to a rebuild every step,
    and the tokens equal the general step's."""
    shared = [1, 3, 5, 7, 9, 11, 13, 15, 17]
    prompts = [shared + [20], shared + [21, 22], shared + [23], PROMPTS[2], shared + [24]]
    options = {"num_blocks": 14, "block_size": BLOCK, "prefix_caching": True}
    expected = run(general_engine(decoder, **options), prompts, GREEDY, stagger=1)
    engine = padded_engine(decoder, **options)
    assert run(engine, prompts, GREEDY, stagger=1, check_table=True) == expected
    assert engine.scheduler.preemptions > 0
    assert engine.blocks.hit_tokens > 0


def test_block_table_appends_and_releases() -> None:
    table = BlockTable(rows=2, width=4, scratch=99)
    a = table.sync(10, [3])
    assert list(table.table[a]) == [3, 99, 99, 99]
    assert table.sync(10, [3, 8, 1]) == a
    assert list(table.table[a]) == [3, 8, 1, 99]
    b = table.sync(11, [5])
    assert b != a
    table.release(10)
    assert list(table.table[a]) == [99] * 4
    assert table.sync(12, [2, 4]) == a  # a released row serves the next sequence
    with pytest.raises(ValueError, match="5 blocks"):
        table.sync(11, [1, 2, 3, 4, 5])
