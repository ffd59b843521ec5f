"""Priority scheduling in the generation engine's scheduler: a steady stream of urgent
requests goes first, but a less urgent one that has waited long enough is served, and
once served it is not evicted for ever (generate/iteration.py)."""

from __future__ import annotations

import pytest

from tradeoff.errors import ConfigError, InvalidValue, Unavailable
from tradeoff.generate.iteration import AGING_STEPS, GenSequence, IterationScheduler, SeqState
from tradeoff.generate.kv_blocks import BlockAllocator


def run_step(scheduler: IterationScheduler) -> list[GenSequence]:
    """One step as the engine runs it: each planned sequence computes its tokens, gets
    its next token once all are in, and ends at ``max_tokens``; returns those that
    ended."""
    ended = []
    for seq, n in scheduler.schedule().work:
        seq.computed += n
        if seq.pending == 0:
            seq.output.append(7)
            if len(seq.output) >= seq.max_tokens:
                scheduler.finish(seq, "length")
                ended.append(seq)
    return ended


def stream(scheduler: IterationScheduler, low: GenSequence, every: int, prompt: int,
           max_tokens: int, steps: int) -> tuple[int | None, int]:
    """Urgent requests (priority 0) arrive one every ``every`` steps while ``low`` waits
    or runs; the step ``low`` ended at (None: never in ``steps``), and how many urgent
    ones ended meanwhile."""
    urgent_done = 0
    for step in range(steps):
        if step % every == 0:
            try:
                scheduler.add(GenSequence([1] * prompt, max_tokens, priority=0))
            except Unavailable:
                pass  # the queue is full: this arrival is refused, as served
        ended = run_step(scheduler)
        urgent_done += sum(seq is not low for seq in ended)
        if low in ended:
            return step, urgent_done
    return None, urgent_done


def test_a_waiting_low_priority_request_is_admitted_under_a_stream_of_urgent_ones() -> None:
    """One sequence at a time and a new urgent request every step: strict priority never
    admits the low one; with ageing it is served after waiting, and the urgent ones are
    still served ahead of it until then."""
    scheduler = IterationScheduler(BlockAllocator(num_blocks=64, block_size=4),
                                   max_num_seqs=1, policy="priority")
    low = GenSequence([1, 2], max_tokens=1, priority=5)
    scheduler.add(low)
    ended_at, urgent_done = stream(scheduler, low, every=1, prompt=2, max_tokens=1,
                                   steps=5000)
    assert ended_at is not None, "the low-priority request waited for ever"
    assert ended_at < 2000
    assert urgent_done >= 20  # priority still orders the queue before a request ages
    assert low.preemptions == 0


def test_a_low_priority_sequence_is_not_evicted_for_ever_by_urgent_arrivals() -> None:
    """The KV cache cannot hold the low sequence's whole answer beside an urgent one:
    each urgent request that grows evicts it (its work is lost: it is recomputed), and
    strict priority then keeps it waiting behind the next urgent arrivals for ever. With
    ageing, once it has waited long enough it is readmitted first and evicted last, and
    it ends."""
    scheduler = IterationScheduler(BlockAllocator(num_blocks=4, block_size=2),
                                   max_num_seqs=2, policy="priority")
    low = GenSequence([1, 2], max_tokens=6, priority=9)
    scheduler.add(low)
    ended_at, urgent_done = stream(scheduler, low, every=4, prompt=2, max_tokens=4,
                                   steps=5000)
    assert low.preemptions >= 1  # it did give way while it was young
    assert ended_at is not None, "the low-priority sequence never ended"
    assert low.state is SeqState.FINISHED and len(low.output) == 6
    assert ended_at < 2000 and urgent_done >= 20


def test_aging_steps_are_a_setting_of_generate_yaml_with_bounds() -> None:
    from tradeoff.generate.config import GenerativeConfig

    assert GenerativeConfig().priority_aging_steps == AGING_STEPS
    config = GenerativeConfig.from_mapping({"priority_aging_steps": 50}, "generate.yaml")
    assert config.priority_aging_steps == 50
    for bad, says in ((0, "must be >= 1"), (10**7, "at most 1,000,000"), (2.5, "int")):
        with pytest.raises(ConfigError, match=says):
            GenerativeConfig.from_mapping({"priority_aging_steps": bad}, "generate.yaml")
    with pytest.raises(InvalidValue, match="aging_steps"):
        IterationScheduler(BlockAllocator(num_blocks=4, block_size=2), aging_steps=0)
