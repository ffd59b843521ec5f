"""The generation engine: an :class:`IterationScheduler` plan, one decoder step, one
sampled token per sequence, repeat. Blocking (it runs the model); the server runs it on a
thread of its own.

    engine = GenerationEngine(decoder, num_blocks=512, block_size=16)
    seq = engine.add([1, 2, 3], SamplingParams(max_tokens=8, temperature=0))
    while engine.has_work():
        engine.step()
    print(seq.output, seq.finish_reason)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from tradeoff.backends.decoding import Decoder, SequenceStep
from tradeoff.errors import InvalidInput
from tradeoff.generate.decode_step import DecodeStep
from tradeoff.generate.iteration import (
    AGING_STEPS,
    GenSequence,
    IterationScheduler,
    PrefillPacer,
    SeqState,
    StepPlan,
)
from tradeoff.generate.kv_blocks import BlockAllocator, BlockTable
from tradeoff.generate.sampling import FAILED, SamplingBatch, sample_tokens
from tradeoff.generate.sampling_params import SamplingParams, as_seed, sampling_kind
from tradeoff.generate.step_worker import StepWorker
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority

__all__ = ["UNKNOWN_TOKEN", "GenerationEngine", "Launch", "StepReport"]


@dataclass
class StepReport:
    """What one step did (for metrics): tokens computed, sequences that got a token (with
    the token, in the same order), sequences preempted, and its
    duration; ``failed``: sequences retired because choosing their token failed (each
    with the error), while the others went on; ``sequences``: how many the step ran."""

    prefill_tokens: int
    decoded: list[GenSequence]
    finished: list[GenSequence]
    preempted: int
    seconds: float
    failed: list[tuple[GenSequence, Exception]] = field(default_factory=list)
    sequences: int = 0
    tokens: list[int] = field(default_factory=list)  # each decoded sequence's new token


# a token chosen by a step still running: in a sequence's output until it is known
UNKNOWN_TOKEN = -2


@dataclass
class Launch:
    """A step under way: its plan and the tokens it will choose (sequence id -> token;
    None when the plan had no work). ``decodes``,
    ``prompt_tokens`` and ``prefill`` count its work as planned; ``advanced``: the
    sequences already count its tokens as computed (the next step was scheduled on
    them), and ``ready`` holds each sequence it chooses a token for, with the place of
    that token in the sequence's output."""

    plan: StepPlan
    tokens: Future[dict[int, int]] | None
    decodes: int = 0
    prompt_tokens: int = 0
    prefill: int = 0
    advanced: bool = False
    ready: list[tuple[GenSequence, int]] = field(default_factory=list)
    # sequences this step's token ends by length whatever it is: retired when it was
    # advanced, so the next step gives their slots to others
    ending: set[int] = field(default_factory=set)
    ran_s: float = 0.0  # how long the worker ran it
    picked: dict[int, int] | None = None  # its tokens, once the worker has read them


def _use_threads(threads: int) -> None:
    """The CPU threads a step's operators use (0: torch's default, the process's cores),
    set on the thread that runs the steps: OpenMP keeps the count per calling thread, so
    engines in one server each keep theirs."""
    if threads:
        torch.set_num_threads(threads)


class GenerationEngine:
    """Continuous (or static) batching over one decoder and its paged KV cache.

    Sequences that add one token go through a :class:`DecodeStep` (fixed buffers, the
    block table, sampling on the device; CUDA graphs on a GPU) when the decoder has
    ``forward_decode``; prompt chunks run through the decoder's ``step`` beside them (on
    the CPU, a step with prompt chunks runs whole through ``step``: one launch).
    It deals in token ids only: the engine's client makes the texts and finds the stop
    strings (:meth:`finish` ends a sequence one completed)."""

    def __init__(self, decoder: Decoder, *, num_blocks: int = 512, block_size: int = 16,
                 max_num_seqs: int = 16, max_num_batched_tokens: int = 512,
                 max_num_queued: int = 256, policy: str = "fcfs", mode: str = "continuous",
                 priority_aging_steps: int = AGING_STEPS, prefix_caching: bool = False,
                 cuda_graphs: bool | None = None, prefill_stretch: float = 0.0,
                 threads: int = 0) -> None:
        self.decoder = decoder
        # one block more than the allocator hands out: padded rows write to it
        self.cache = decoder.new_cache(num_blocks + 1, block_size)  # first: checks memory
        self.blocks = BlockAllocator(num_blocks, block_size, prefix_caching)
        self.scheduler = IterationScheduler(
            self.blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_num_queued=max_num_queued,
            policy=policy, mode=mode, aging_steps=priority_aging_steps)
        # continuous batching only: a static batch prefills before anything decodes
        self.pacer = PrefillPacer(prefill_stretch if mode == "continuous" else 0.0,
                                  floor=block_size, ceiling=max_num_batched_tokens)
        self.vocab = int(decoder.config.vocab_size)
        self.params: dict[int, SamplingParams] = {}
        self.seeds: dict[int, int] = {}
        max_position = getattr(decoder.config, "max_position", None)
        width = self.blocks.needed(max_position) if max_position else num_blocks
        width = min(width, num_blocks)
        self.table = BlockTable(max_num_seqs, width, scratch=num_blocks)
        # the device work of a step and reading its tokens back run here, so the thread
        # that launched it can do other work meanwhile
        self._worker: StepWorker[dict[int, int]] = StepWorker(
            "engine-step", setup=lambda: _use_threads(threads))
        self.decode_step = DecodeStep(
            decoder, self.cache, max_seqs=max_num_seqs, max_blocks=width,
            scratch_block=num_blocks, graphs=cuda_graphs) \
            if hasattr(decoder, "forward_decode") else None

    def add(self, prompt: list[int], params: SamplingParams,
            priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY) -> GenSequence:
        """Queue a prompt (token ids); raises Unavailable when the queue is full and
        InvalidInput for a token id the model does not have."""
        if any(not 0 <= t < self.vocab for t in prompt):
            raise InvalidInput(f"the prompt holds token ids outside the vocabulary "
                               f"(0 to {self.vocab - 1})")
        # the block table is as wide as the model's positions (when narrower than the
        # cache; else the scheduler refuses what the cache cannot hold)
        if self.blocks.needed(len(prompt) + params.max_tokens) > self.table.width and \
                self.table.width < self.blocks.num_blocks:
            raise InvalidInput(f"a prompt of {len(prompt)} tokens with max_tokens "
                               f"{params.max_tokens} is over the model's "
                               f"{self.table.width * self.blocks.block_size} positions")
        seq = GenSequence(list(prompt), params.max_tokens, priority)
        self.scheduler.add(seq)
        self.params[seq.seq_id] = params
        # a request without a seed gets one of its own: its draws are its own either way
        self.seeds[seq.seq_id] = as_seed(random.getrandbits(64) if params.seed is None
                                         else params.seed)
        return seq

    def abort(self, seq: GenSequence) -> None:
        if seq.state is not SeqState.FINISHED:
            self.scheduler.abort(seq)
        self._forget(seq)

    def finish(self, seq: GenSequence) -> None:
        """End a sequence whose answer a stop string completed ("stop"); a token a
        step still running chooses for it is dropped."""
        if seq.state is not SeqState.FINISHED:
            self._retire(seq, "stop")
        self._forget(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def _slots(self, seq: GenSequence, length: int) -> torch.Tensor:
        size = self.blocks.block_size
        table = torch.tensor(seq.blocks, dtype=torch.int64)
        return (table[:, None] * size + torch.arange(size)[None, :]).reshape(-1)[:length]

    def _forget(self, seq: GenSequence) -> None:
        self.params.pop(seq.seq_id, None)
        self.seeds.pop(seq.seq_id, None)
        self.table.release(seq.seq_id)

    def step(self) -> StepReport:
        """One whole step, nothing overlapped: :meth:`launch`, then :meth:`collect`."""
        return self.collect(self.launch())

    def launch(self, running: Launch | None = None) -> Launch:
        """Schedule the next step and start it on the engine's worker thread (the device
        work, and reading the chosen tokens back); returns at once. Until its
        :meth:`collect` the caller may do other work (the last step's events, say): a
        sequence that ends or is aborted meanwhile has its token dropped.

        ``running``: a step launched and not yet collected. The next one is then
        scheduled on its outcome before it is known (overlap scheduling): every
        sequence counts that step's tokens as computed, a token it chooses stands in the
        output as UNKNOWN_TOKEN, and the worker writes the real ones into the next step's
        inputs when that step starts after it. A sequence that ends on that token
        computes one more, which is dropped."""
        if running is not None:
            self._advance(running)
        self.scheduler.prefill_limit = self.pacer.limit()
        plan = self.scheduler.schedule()
        for seq in plan.preempted:  # its blocks are gone: its table row too
            self.table.release(seq.seq_id)
        launch = Launch(plan, None)
        if not plan.work:
            return launch
        for seq, n in plan.work:
            if seq.pending > 1:
                launch.prompt_tokens += n
            else:
                launch.decodes += 1
            if n > 1 or not seq.output:
                launch.prefill += n
        unknown = {seq.seq_id: len(seq.prompt) + index for seq, index in running.ready} \
            if running is not None else {}
        # decodes go through the decode step; in a step with prompt chunks too where it
        # runs padded, as a captured graph does (on the CPU one general step for all costs
        # one launch)
        fast = self.decode_step is not None and (
            self.decode_step.pad or all(n == 1 for _, n in plan.work))
        singles = [seq for seq, n in plan.work if n == 1] if fast else []
        chunks = [(seq, n) for seq, n in plan.work if n > 1] if fast else plan.work
        # what the device needs is read from the sequences now, on this thread; the
        # tokens the running step chooses are written in on the worker, after it
        decode = self._decode_inputs(singles) if singles else None
        prefill = self._prefill_inputs(chunks) if chunks else None
        owners = [seq.seq_id for seq in singles]
        decode_fills = [(row, seq.seq_id) for row, seq in enumerate(singles)
                        if seq.seq_id in unknown]
        chunk_fills = [(i, unknown[seq.seq_id] - seq.computed, seq.seq_id)
                       for i, (seq, n) in enumerate(chunks)
                       if seq.computed <= unknown.get(seq.seq_id, -1) < seq.computed + n]
        before = running if running is not None and (decode_fills or chunk_fills) else None

        def start() -> Callable[[], dict[int, int]]:
            """Launch the step (after the one before it: its tokens are known here)."""
            if before is not None:
                known = before.picked
                if known is None:  # that step failed: so does this one, quietly
                    return dict
                for row, owner in decode_fills:  # a failed choice (FAILED) reads as token 0
                    decode[0][row, 0] = max(known.get(owner, 0), 0)  # type: ignore[index]
                for i, offset, owner in chunk_fills:
                    prefill[0][i].tokens[offset] = max(known.get(owner, 0), 0)  # type: ignore[index]
            begun = time.perf_counter()
            count = self.decode_step.launch(*decode) if decode is not None else 0  # type: ignore[union-attr]
            read_prefill = self._prefill(*prefill) if prefill is not None else dict

            def read() -> dict[int, int]:
                picked: dict[int, int] = {}
                if decode is not None:
                    picked.update(zip(owners, self.decode_step.read(count),  # type: ignore[union-attr]
                                      strict=True))
                picked.update(read_prefill())
                launch.ran_s = time.perf_counter() - begun
                launch.picked = picked
                return picked
            return read

        launch.tokens = self._worker.submit(start)
        return launch

    def _advance(self, launched: Launch) -> None:
        """Count a launched step's tokens as computed (once): each sequence it finishes
        the pending tokens of gets its next token's place in the output, UNKNOWN_TOKEN
        until :meth:`collect`."""
        if launched.advanced:
            return
        launched.advanced = True
        for seq, n in launched.plan.work:
            if seq.state is not SeqState.RUNNING:
                continue  # ended (a stop string, an abort) while the step ran
            seq.computed += n
            self.scheduler.cache_full_blocks(seq)
            if seq.pending == 0:  # everything is in the cache: the token is the next one
                launched.ready.append((seq, len(seq.output)))
                seq.output.append(UNKNOWN_TOKEN)
                if len(seq.output) >= self.params[seq.seq_id].max_tokens:
                    self.scheduler.finish(seq, "length")  # its reason is set at collect
                    self.table.release(seq.seq_id)
                    launched.ending.add(seq.seq_id)

    def collect(self, launched: Launch) -> StepReport:
        """Wait for a launched step; record its tokens and retire the sequences that end
        on EOS or length, or whose token could not be chosen."""
        plan = launched.plan
        if launched.tokens is None:
            return StepReport(0, [], [], len(plan.preempted), 0.0)
        picked = launched.tokens.result()
        self._advance(launched)
        self.pacer.observe(launched.decodes, launched.prompt_tokens, launched.ran_s)
        report = StepReport(launched.prefill, [], [], len(plan.preempted), 0.0,
                            sequences=len(plan.work))
        eos = self.decoder.config.eos_token_id
        for seq, index in launched.ready:
            ending = seq.seq_id in launched.ending and seq.seq_id in self.params
            if seq.state is SeqState.FINISHED and not ending:  # ended (a stop string, an
                del seq.output[index:]  # abort) while the step ran: its token is dropped
                continue
            token = picked[seq.seq_id]
            if token == FAILED:
                del seq.output[index:]
                if ending:
                    seq.finish_reason = "error"
                else:
                    self._retire(seq, "error")
                self._forget(seq)
                report.failed.append((seq, ValueError(
                    "no next token: the model's probabilities for this sequence are not "
                    "finite (NaN or infinite logits)")))
                continue
            seq.output[index] = token
            report.decoded.append(seq)
            report.tokens.append(token)
            params = self.params[seq.seq_id]
            reason = None
            if not params.ignore_eos and eos is not None and token == eos:
                reason = "stop"
            elif len(seq.output) >= params.max_tokens:
                reason = "length"
            if ending:
                seq.finish_reason = reason
                report.finished.append(seq)
                self._forget(seq)
            elif reason is not None:  # retired now: its slot and blocks serve the next step
                self._retire(seq, reason)
                report.finished.append(seq)
                self._forget(seq)
        report.seconds = launched.ran_s
        return report

    def _retire(self, seq: GenSequence, reason: str) -> None:
        """End a sequence, running or (preempted while its step ran) waiting again."""
        if seq.state is SeqState.WAITING:
            self.scheduler.abort(seq)
            seq.finish_reason = reason
        else:
            self.scheduler.finish(seq, reason)

    def close(self) -> None:
        """Stop the worker thread (once the step it runs, if any, is done)."""
        self._worker.close()

    def _decode_inputs(self, seqs: list[GenSequence]) -> tuple[Any, ...]:
        """The decode step's arguments for ``seqs`` (one new token each)."""
        count = len(seqs)
        rows = np.empty((count, 6), dtype=np.int64)
        floats = np.empty((count, 2), dtype=np.float64)
        table_rows = np.empty(count, dtype=np.int64)
        longest = 1
        for i, seq in enumerate(seqs):
            params = self.params[seq.seq_id]
            position = seq.computed
            prompt = len(seq.prompt)
            token = seq.prompt[position] if position < prompt else seq.output[position - prompt]
            rows[i] = (token, position, self.seeds[seq.seq_id], len(seq.output),
                       params.kept(self.vocab), params.greedy)
            floats[i] = (params.temperature, params.top_p)
            table_rows[i] = self.table.sync(seq.seq_id, seq.blocks)
            longest = max(longest, len(seq.blocks))
        return (rows, floats, self.table.table[table_rows, :longest],
                *sampling_kind([self.params[seq.seq_id] for seq in seqs]))

    def _prefill_inputs(self, work: list[tuple[GenSequence, int]]) -> tuple[Any, ...]:
        """The general step's arguments: each sequence's new tokens and slots, and the
        sampling settings of those whose chunk ends their prompt."""
        steps = []
        for seq, n in work:
            end = seq.computed + n
            steps.append(SequenceStep(torch.tensor(seq.tokens_between(seq.computed, end),
                                                   dtype=torch.int64),
                                      seq.computed, self._slots(seq, end)))
        ends = [i for i, (seq, n) in enumerate(work) if seq.pending == n]
        seqs = [work[i][0] for i in ends]
        sampling = ([self.params[s.seq_id] for s in seqs], [self.seeds[s.seq_id] for s in seqs],
                    [len(s.output) for s in seqs])
        return steps, ends, [s.seq_id for s in seqs], sampling

    def _prefill(self, steps: list[SequenceStep], ends: list[int], owners: list[int],
                 sampling: tuple[Any, ...]) -> Callable[[], dict[int, int]]:
        """Launch prompt chunks (and, without a decode step, everything) through the
        decoder's ``step``; returns the read of the next token of each sequence whose
        chunk ends its prompt."""
        logits = self.decoder.step(steps, self.cache)
        if not ends:
            return dict
        rows = logits[ends] if isinstance(logits, torch.Tensor) else \
            torch.stack([logits[i] for i in ends])
        params, seeds, produced = sampling
        batch = SamplingBatch.of(params, seeds, produced, self.vocab, rows.device)
        chosen = sample_tokens(rows, batch)

        def read() -> dict[int, int]:
            self.decoder.synchronize()
            return dict(zip(owners, chosen.tolist(), strict=True))
        return read

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenSequence]:
        """Run prompts to the end (tests, benchmarks)."""
        seqs = [self.add(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return seqs
