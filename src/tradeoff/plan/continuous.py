"""What engine settings will do to a generative traffic, predicted by running the engine's
own scheduler over modelled step times.

    cost = StepCost.of({1: 40.0, 4: 120.0, 16: 320.0}, prefill_fixed_ms=2.0,
                       prefill_ms_per_token=0.4)                 # decode tokens/s per batch
    run = simulate_engine(arrivals, Lengths(prompt=128, output=64), EngineSettings(
        max_num_seqs=16, max_num_batched_tokens=512, num_blocks=512, block_size=16), cost)
    run.ttft_ms, run.tpot_ms, run.rejected

No second scheduler: every step is planned by :class:`~tradeoff.generate.iteration.
IterationScheduler` over a real :class:`~tradeoff.generate.kv_blocks.BlockAllocator` (so
the token budget, chunked prefill, KV blocks, preemption and prefix caching behave as
served), paced by the engine's own :class:`~tradeoff.generate.iteration.PrefillPacer`,
and retired as the engine's ``collect`` does. Only the model is replaced by its measured
cost: a step of ``d`` decodes takes ``decode_ms(d)``, a step of ``p`` prompt tokens alone
``prefill_fixed_ms + prefill_ms_per_token x p``, and a step of both what the engine runs:
on the CPU one forward pass over all ``d + p`` tokens, on a GPU the decode step and then
a prompt launch (:meth:`StepCost.step_ms`). The clock jumps from step to step,
and to the next arrival when nothing runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tradeoff.errors import Unavailable
from tradeoff.generate.iteration import GenSequence, IterationScheduler, PrefillPacer
from tradeoff.generate.kv_blocks import BlockAllocator
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority

__all__ = ["MAX_LENGTH", "EngineRun", "EngineSettings", "Lengths", "StepCost",
           "simulate_engine"]

_TAIL_TOKEN = 1 << 20  # unique prompt tails: token ids no shared prefix uses
MAX_LENGTH = 1 << 16  # words of a prompt, tokens of an answer: a plan writes its prompts out


@dataclass(frozen=True)
class StepCost:
    """Milliseconds one engine step takes: decodes by batch (measured at some sizes,
    interpolated, extrapolated on the last two), plus what prompt tokens add."""

    sizes: tuple[int, ...]
    decode_ms: tuple[float, ...]
    prefill_fixed_ms: float
    prefill_ms_per_token: float
    # a step with prompt chunks runs as one forward pass over all its tokens (the CPU);
    # False: the decode step, then a prompt launch (a GPU's padded decode graph)
    one_pass: bool = True

    @classmethod
    def of(cls, tokens_per_s: dict[int, float], prefill_fixed_ms: float,
           prefill_ms_per_token: float, one_pass: bool = True) -> StepCost:
        """From decode tokens per second at each batch (``tradeoff optimize``'s figures)."""
        sizes = sorted(b for b, v in tokens_per_s.items() if v > 0)
        return cls(tuple(sizes), tuple(1e3 * b / tokens_per_s[b] for b in sizes),
                   prefill_fixed_ms, prefill_ms_per_token, one_pass)

    def decode(self, decodes: int) -> float:
        if decodes <= 0:
            return 0.0
        sizes, times = self.sizes, self.decode_ms
        if decodes > sizes[-1] and len(sizes) >= 2:
            slope = (times[-1] - times[-2]) / (sizes[-1] - sizes[-2])
            return times[-1] + slope * (decodes - sizes[-1])
        return float(np.interp(decodes, sizes, times))

    def step_ms(self, decodes: int, prompt_tokens: int) -> float:
        """A step of ``decodes`` sequences and ``prompt_tokens`` of prompts. Decodes alone:
        the decode step. With prompt tokens, as the engine runs it: one forward pass over
        every token of the step (``one_pass``, at the prompt's cost, never less than the
        decode step), or the decode step and then a prompt launch."""
        if not prompt_tokens:
            return self.decode(decodes)
        if not decodes:
            return self.prefill_fixed_ms + self.prefill_ms_per_token * prompt_tokens
        if self.one_pass:
            return max(self.decode(decodes), self.prefill_fixed_ms
                       + self.prefill_ms_per_token * (decodes + prompt_tokens))
        return self.decode(decodes) + self.prefill_fixed_ms \
            + self.prefill_ms_per_token * prompt_tokens

    def tokens_per_s(self, decodes: int) -> float:
        """Decode tokens per second with ``decodes`` sequences each step."""
        return 1e3 * decodes / self.decode(decodes)


@dataclass(frozen=True)
class EngineSettings:
    """The ``generate.yaml`` settings the prediction moves or holds."""

    max_num_seqs: int
    max_num_batched_tokens: int
    num_blocks: int
    block_size: int
    prefix_caching: bool = True
    max_num_queued_requests: int = 256
    prefill_stretch: float = 2.0
    scheduling: str = "fcfs"  # fcfs | priority (each request's own, lower first)


@dataclass(frozen=True)
class Lengths:
    """Each request's prompt and answer in tokens; the first ``shared_prefix`` tokens of
    every prompt are the same (a system prompt, say)."""

    prompt: int
    output: int
    shared_prefix: int = 0

    def describe(self) -> dict[str, int]:
        """What the plan document records of the lengths."""
        return {"prompt_tokens": self.prompt, "output_tokens": self.output,
                "shared_prefix_tokens": self.shared_prefix}


@dataclass(frozen=True)
class EngineRun:
    """Per request (in arrival order; NaN where it was refused): time to first token,
    time per output token after it, end to end; and the run's figures."""

    ttft_ms: np.ndarray
    tpot_ms: np.ndarray
    e2e_ms: np.ndarray
    rejected: int
    mean_running: float  # sequences per step, over the steps
    prefix_hit_ratio: float  # prompt tokens found in the prefix cache, of those looked up
    preemptions: int
    busy: float  # the share of the time a step ran
    # whether max_num_seqs ever held a waiting request back: when not, a larger
    # max_num_seqs runs the very same steps
    seqs_bound: bool = True

    def percentile(self, values: np.ndarray, q: float) -> float:
        """A percentile over the requests; a refused one counts as never answered."""
        filled = np.where(np.isnan(values), np.inf, values)
        return float(np.percentile(filled, q, method="inverted_cdf")) if filled.size \
            else float("inf")


def simulate_engine(arrivals_s: np.ndarray, lengths: Lengths, settings: EngineSettings,
                    cost: StepCost, priorities: np.ndarray | None = None) -> EngineRun:
    """The engine over these arrivals (seconds), step by step (see the module docstring);
    ``priorities``: each request's (under ``scheduling: priority``)."""
    blocks = BlockAllocator(settings.num_blocks, settings.block_size, settings.prefix_caching)
    scheduler = IterationScheduler(blocks, max_num_seqs=settings.max_num_seqs,
                                   max_num_batched_tokens=settings.max_num_batched_tokens,
                                   max_num_queued=settings.max_num_queued_requests,
                                   policy=settings.scheduling)
    pacer = PrefillPacer(settings.prefill_stretch, floor=settings.block_size,
                         ceiling=settings.max_num_batched_tokens)
    count = arrivals_s.size
    first = np.full(count, np.nan)
    end = np.full(count, np.nan)
    shared = list(range(1, min(lengths.shared_prefix, lengths.prompt) + 1))
    tail = lengths.prompt - len(shared)
    index_of: dict[int, int] = {}
    rejected = steps = running = 0
    seqs_bound = False
    busy_s = 0.0
    clock = float(arrivals_s[0]) if count else 0.0
    nxt = 0
    while nxt < count or scheduler.has_work():
        while nxt < count and arrivals_s[nxt] <= clock:
            seq = GenSequence(shared + [_TAIL_TOKEN + nxt] * tail, lengths.output,
                              GenerationPriority(int(priorities[nxt])) if priorities is not None
                              else DEFAULT_GENERATION_PRIORITY)
            try:
                scheduler.add(seq)
                index_of[seq.seq_id] = nxt
            except Unavailable:
                rejected += 1
            nxt += 1
        if not scheduler.has_work():
            clock = float(arrivals_s[nxt])
            continue
        scheduler.prefill_limit = pacer.limit()
        plan = scheduler.schedule()
        seqs_bound = seqs_bound or (bool(scheduler.waiting)
                                    and len(scheduler.running) >= settings.max_num_seqs)
        if not plan.work:  # nothing fits (every block held): wait for the next arrival
            if nxt >= count:
                break  # nothing runs and nothing will come: what waits is never served
            clock = float(arrivals_s[nxt])
            continue
        decodes = sum(1 for seq, _ in plan.work if seq.pending == 1)
        prompt_tokens = sum(n for seq, n in plan.work if seq.pending > 1)
        seconds = cost.step_ms(decodes, prompt_tokens) / 1e3
        clock += seconds
        busy_s += seconds
        steps += 1
        running += len(plan.work)
        for seq, n in plan.work:
            seq.computed += n
            scheduler.cache_full_blocks(seq)
            if seq.pending:
                continue
            seq.output.append(0)
            at = index_of[seq.seq_id]
            if len(seq.output) == 1:
                first[at] = clock
            if len(seq.output) >= seq.max_tokens:
                scheduler.finish(seq, "length")
                end[at] = clock
        pacer.observe(decodes, prompt_tokens, seconds)
    ttft = (first - arrivals_s) * 1e3
    tpot = (end - first) * 1e3 / max(lengths.output - 1, 1)
    span = (np.nanmax(end) - float(arrivals_s[0])) if count and not np.isnan(end).all() \
        else 0.0
    looked = blocks.query_tokens
    return EngineRun(ttft, tpot, (end - arrivals_s) * 1e3, rejected,
                     running / steps if steps else 0.0,
                     blocks.hit_tokens / looked if looked else 0.0,
                     scheduler.preemptions, busy_s / span if span > 0 else 0.0, seqs_bound)
