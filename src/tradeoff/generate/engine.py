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

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tradeoff.backends.llama import LlamaDecoder, SequenceStep
from tradeoff.generate.iteration import GenSequence, IterationScheduler, SeqState
from tradeoff.generate.kv_blocks import BlockAllocator
from tradeoff.generate.sampling import SamplingParams, sample


@dataclass
class StepReport:
    """What one step did (for metrics): tokens computed, sequences that got a token,
    sequences preempted, and its duration; ``failed``: sequences retired because choosing
    their token raised (each with the error), while the others went on; ``sequences``:
    how many the step ran."""

    prefill_tokens: int
    decoded: list[GenSequence]
    finished: list[GenSequence]
    preempted: int
    seconds: float
    failed: list[tuple[GenSequence, Exception]] = field(default_factory=list)
    sequences: int = 0


STOP_WINDOW_TOKENS_PER_CHAR = 4  # UTF-8 bytes of a character, each at worst a token


def _sample_one(row: torch.Tensor, params: SamplingParams,
                generator: torch.Generator | None) -> int | Exception:
    """One row's token, or the error that choosing it raised."""
    try:
        return sample(row, [params], [generator])[0]
    except Exception as exc:
        return exc


class GenerationEngine:
    """Continuous (or static) batching over one decoder and its paged KV cache."""

    def __init__(self, decoder: LlamaDecoder, *, num_blocks: int = 512, block_size: int = 16,
                 max_num_seqs: int = 16, max_num_batched_tokens: int = 512,
                 max_num_queued: int = 256, policy: str = "fcfs", mode: str = "continuous",
                 prefix_caching: bool = False,
                 detokenize: Callable[[list[int]], str] | None = None) -> None:
        self.decoder = decoder
        self.cache = decoder.new_cache(num_blocks, block_size)  # first: it checks the memory
        self.blocks = BlockAllocator(num_blocks, block_size, prefix_caching)
        self.scheduler = IterationScheduler(
            self.blocks, max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens, max_num_queued=max_num_queued,
            policy=policy, mode=mode)
        self.detokenize = detokenize
        self.params: dict[int, SamplingParams] = {}
        self.generators: dict[int, torch.Generator] = {}

    def add(self, prompt: list[int], params: SamplingParams, priority: int = 0) -> GenSequence:
        """Queue a prompt (token ids); raises Unavailable when the queue is full."""
        # the generator first: a seed torch refuses must leave nothing half-added
        generator = None if params.seed is None else torch.Generator().manual_seed(params.seed)
        seq = GenSequence(list(prompt), params.max_tokens, priority)
        self.scheduler.add(seq)
        self.params[seq.seq_id] = params
        if generator is not None:
            self.generators[seq.seq_id] = generator
        return seq

    def abort(self, seq: GenSequence) -> None:
        if seq.state is not SeqState.FINISHED:
            self.scheduler.abort(seq)
        self._forget(seq)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def _slots(self, seq: GenSequence, length: int) -> torch.Tensor:
        size = self.blocks.block_size
        table = torch.tensor(seq.blocks, dtype=torch.int64)
        return (table[:, None] * size + torch.arange(size)[None, :]).reshape(-1)[:length]

    def _forget(self, seq: GenSequence) -> None:
        self.params.pop(seq.seq_id, None)
        self.generators.pop(seq.seq_id, None)

    def step(self) -> StepReport:
        started = time.perf_counter()
        plan = self.scheduler.schedule()
        if not plan.work:
            return StepReport(0, [], [], len(plan.preempted), 0.0)
        steps = []
        for seq, n in plan.work:
            tokens = seq.tokens
            end = seq.computed + n
            steps.append(SequenceStep(torch.tensor(tokens[seq.computed:end], dtype=torch.int64),
                                      seq.computed, self._slots(seq, end)))
        logits = self.decoder.step(steps, self.cache)
        ready = []
        prefill = 0
        for (seq, n), row in zip(plan.work, logits, strict=True):
            seq.computed += n
            self.scheduler.cache_full_blocks(seq)
            if seq.pending == 0:  # everything is in the cache: this row predicts the next
                ready.append((seq, row))
            if n > 1 or not seq.output:
                prefill += n
        decoded, finished = [], []
        failed: list[tuple[GenSequence, Exception]] = []
        if ready:
            rows = torch.stack([row for _, row in ready]).cpu()  # sampling runs on the CPU
            params = [self.params[s.seq_id] for s, _ in ready]
            generators = [self.generators.get(s.seq_id) for s, _ in ready]
            states = [g.get_state() if g is not None else None for g in generators]
            picked: list[int | Exception]
            try:
                picked = list(sample(rows, params, generators))
            except Exception:  # one row's logits (NaN, say): find it, spare the others
                for generator, state in zip(generators, states, strict=True):
                    if generator is not None and state is not None:
                        generator.set_state(state)  # seeded rows draw as if alone
                picked = [_sample_one(rows[i:i + 1], params[i], generators[i])
                          for i in range(len(ready))]
            for (seq, _), token, p in zip(ready, picked, params, strict=True):
                if isinstance(token, Exception):
                    self.scheduler.finish(seq, "error")
                    self._forget(seq)
                    failed.append((seq, token))
                    continue
                seq.output.append(token)
                decoded.append(seq)
                reason = self._finish_reason(seq, token, p)
                if reason:
                    self.scheduler.finish(seq, reason)
                    self._forget(seq)
                    finished.append(seq)
        return StepReport(prefill, decoded, finished, len(plan.preempted),
                          time.perf_counter() - started, failed, len(plan.work))

    def _finish_reason(self, seq: GenSequence, token: int, params: SamplingParams) -> str | None:
        eos = self.decoder.config.eos_token_id
        if not params.ignore_eos and eos is not None and token == eos:
            return "stop"
        if params.stop and self.detokenize is not None:
            # a stop string that was not in the text before this token ends inside it:
            # the last tokens cover it (a character takes at most 4 byte tokens)
            window = STOP_WINDOW_TOKENS_PER_CHAR * max(map(len, params.stop)) + 1
            text = self.detokenize(seq.output[-window:])
            if any(s in text for s in params.stop):
                return "stop"
        if len(seq.output) >= params.max_tokens:
            return "length"
        return None

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[GenSequence]:
        """Run prompts to the end (tests, benchmarks)."""
        seqs = [self.add(p, params) for p in prompts]
        while self.has_work():
            self.step()
        return seqs
