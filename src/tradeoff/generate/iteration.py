"""Iteration-level (continuous) batching: which sequences compute which tokens in the
next model step. Pure policy over a :class:`BlockAllocator`; the engine runs the plan.

Every step, in order:

1. **Running sequences** each get their next tokens: first every one that decodes gets
   its one token, then those still prefilling get the next chunk of their prompt from
   what is left of the budget (so a long prompt never delays the others' next token by
   more than one step of ``max_num_batched_tokens``). A sequence whose new tokens need
   a KV block when none is free preempts the running sequence served last (FCFS: the
   most recently admitted other one; by priority: the last in the order below, which
   may be the sequence itself, so none evicts one served before it): its blocks are
   freed and it goes back to the waiting queue, to be recomputed later (preemption by
   recompute).
2. **Waiting sequences** are admitted (FCFS, or in the order below) while fewer than
   ``max_num_seqs`` run, the step's ``max_num_batched_tokens`` budget lasts and free
   blocks hold their prompt chunk. A prompt longer than the budget is prefilled in chunks.

The order by priority ages: a sequence that arrived ``aging_steps`` steps ago or more
(preempted or not) is served ahead of every younger one, older first; the younger ones
by priority (lower first), then arrival. A stream of urgent requests therefore delays a
less urgent one by about ``aging_steps`` steps, never for ever, and an aged sequence is
evicted only for an older one.

Finished sequences are retired by the engine at once, so their slots and blocks serve the
next step. With prefix caching, an admitted sequence first takes the cached blocks of the
longest cached prefix of its prompt (all but its last token) and computes only the rest;
the engine registers every block it fills (``cache_full_blocks``). ``static`` mode is the
baseline: a batch is admitted only when nothing runs, and runs until all its sequences
end.
"""

from __future__ import annotations

import enum
import itertools
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from tradeoff.errors import InvalidValue, Unavailable
from tradeoff.generate.kv_blocks import BlockAllocator, BlockKey, block_key
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority

__all__ = ["AGING_STEPS", "GenSequence", "IterationScheduler", "PrefillPacer", "SeqState",
           "StepPlan"]

AGING_STEPS = 200  # steps after its arrival when a sequence goes ahead of younger ones


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False)
class GenSequence:
    """One generation request's tokens, cache blocks and progress."""

    prompt: list[int]
    max_tokens: int
    priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY
    output: list[int] = field(default_factory=list)
    blocks: list[int] = field(default_factory=list)
    computed: int = 0          # tokens whose keys and values are in the cache
    state: SeqState = SeqState.WAITING
    preemptions: int = 0
    finish_reason: str | None = None
    cached_tokens: int = 0     # prompt tokens found in the prefix cache at admission
    block_keys: list[BlockKey] = field(default_factory=list)  # keys of its full blocks
    seq_id: int = field(default_factory=lambda: next(_ids))
    arrived: int = 0           # the scheduler's step count when it was queued

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output

    def tokens_between(self, start: int, end: int) -> list[int]:
        """``tokens[start:end]`` without joining the whole prompt and output."""
        prompt = len(self.prompt)
        if end <= prompt:
            return self.prompt[start:end]
        if start >= prompt:
            return self.output[start - prompt:end - prompt]
        return self.prompt[start:] + self.output[:end - prompt]

    @property
    def pending(self) -> int:
        """Tokens not yet in the cache (the whole prompt at first, then one)."""
        return len(self.prompt) + len(self.output) - self.computed


@dataclass
class StepPlan:
    """What the next model step computes: (sequence, number of new tokens) pairs."""

    work: list[tuple[GenSequence, int]]
    preempted: list[GenSequence]

    @property
    def tokens(self) -> int:
        return sum(n for _, n in self.work)


class IterationScheduler:
    """Waiting and running queues under a sequence limit, a token budget and KV blocks."""

    def __init__(self, blocks: BlockAllocator, *, max_num_seqs: int = 16,
                 max_num_batched_tokens: int = 512, max_num_queued: int = 256,
                 policy: str = "fcfs", mode: str = "continuous",
                 aging_steps: int = AGING_STEPS) -> None:
        if policy not in ("fcfs", "priority"):
            raise InvalidValue(f"scheduling policy must be fcfs or priority, got {policy!r}")
        if mode not in ("continuous", "static"):
            raise InvalidValue(f"batching mode must be continuous or static, got {mode!r}")
        if isinstance(aging_steps, bool) or not isinstance(aging_steps, int) or \
                aging_steps < 1:
            raise InvalidValue(f"aging_steps must be a whole number of steps >= 1, got "
                               f"{aging_steps!r}")
        self.blocks = blocks
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_num_queued = max_num_queued
        self.policy = policy
        self.mode = mode
        self.aging_steps = aging_steps
        self.steps = 0  # schedule() calls: the clock sequences age by
        self.waiting: deque[GenSequence] = deque()
        self.running: list[GenSequence] = []
        self.preemptions = 0
        # prompt tokens a step may carry beside its decodes (None: the budget's rest);
        # the engine's PrefillPacer sets it from measured step times
        self.prefill_limit: int | None = None

    def add(self, seq: GenSequence) -> None:
        """Queue a sequence, or refuse it (503) when ``max_num_queued`` already wait."""
        if len(self.waiting) >= self.max_num_queued:
            raise Unavailable(f"{len(self.waiting)} requests already wait "
                              f"(max_num_queued {self.max_num_queued}); retry later")
        if self.blocks.needed(len(seq.prompt) + seq.max_tokens) > self.blocks.num_blocks:
            raise Unavailable(f"a prompt of {len(seq.prompt)} tokens with max_tokens "
                              f"{seq.max_tokens} does not fit the KV cache "
                              f"({self.blocks.num_blocks} blocks of {self.blocks.block_size})")
        seq.arrived = self.steps
        self.waiting.append(seq)

    def finish(self, seq: GenSequence, reason: str) -> None:
        """Retire a sequence now: its slot and blocks serve the next step."""
        seq.state = SeqState.FINISHED
        seq.finish_reason = reason
        self.blocks.free(seq.blocks)
        seq.blocks = []
        if seq in self.running:
            self.running.remove(seq)

    def abort(self, seq: GenSequence) -> None:
        if seq in self.waiting:
            self.waiting.remove(seq)
            seq.state = SeqState.FINISHED
            seq.finish_reason = "abort"
        else:
            self.finish(seq, "abort")

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def _grow(self, seq: GenSequence, new_tokens: int) -> bool:
        """Give ``seq`` the blocks its next ``new_tokens`` need; False if none are free."""
        extra = self.blocks.needed(seq.computed + new_tokens) - len(seq.blocks)
        if extra <= 0:
            return True
        if not self.blocks.can_allocate(extra):
            return False
        seq.blocks += self.blocks.allocate(extra)
        return True

    def _preempt(self, victim: GenSequence) -> None:
        self.running.remove(victim)
        self.blocks.free(victim.blocks)
        victim.blocks = []
        victim.block_keys = []
        victim.computed = 0  # recompute prompt and output so far when readmitted
        victim.state = SeqState.WAITING
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _take_cached_prefix(self, seq: GenSequence) -> None:
        """Share the cached blocks of the sequence's longest cached prefix; at least the
        last token is left to compute (its logits give the next token)."""
        blocks, keys = self.blocks.match(seq.tokens, len(seq.tokens) - 1)
        seq.blocks, seq.block_keys = blocks, keys
        seq.computed = len(blocks) * self.blocks.block_size
        if not seq.preemptions:
            seq.cached_tokens = seq.computed

    def _release(self, seq: GenSequence) -> None:
        """A sequence that could not be admitted gives back what it held."""
        self.blocks.free(seq.blocks)
        seq.blocks, seq.block_keys, seq.computed = [], [], 0

    def cache_full_blocks(self, seq: GenSequence) -> None:
        """Register the blocks ``seq`` has filled since the last call (prefix caching)."""
        if not self.blocks.prefix_caching:
            return
        size = self.blocks.block_size
        for index in range(len(seq.block_keys), seq.computed // size):
            key = block_key(seq.block_keys[-1] if seq.block_keys else None,
                            seq.tokens_between(index * size, (index + 1) * size))
            seq.block_keys.append(key)
            self.blocks.register(seq.blocks[index], key)

    def _rank(self) -> Callable[[GenSequence], tuple[int, int, int]]:
        """The order of service under priority, as a sort key (lowest first): aged
        sequences (arrived ``aging_steps`` ago or more) first, oldest first; then the
        others by priority, then arrival."""
        aged = self.steps - self.aging_steps

        def rank(seq: GenSequence) -> tuple[int, int, int]:
            if seq.arrived <= aged:
                return (0, 0, seq.seq_id)
            return (1, seq.priority, seq.seq_id)

        return rank

    def _victim(self, seq: GenSequence, work: list[tuple[GenSequence, int]]) -> GenSequence:
        """The running sequence that gives way so that ``seq`` grows, of those this step
        has not planned yet. FCFS: the most recently admitted other one (``seq`` itself
        when there is none). By priority: the last in the order of service, ``seq``
        included, so no sequence evicts one served before it."""
        planned = {id(w) for w, _ in work}
        if self.policy == "priority":
            return max((v for v in self.running if id(v) not in planned),
                       key=self._rank())
        return next((v for v in reversed(self.running)
                     if v is not seq and id(v) not in planned), seq)

    def schedule(self) -> StepPlan:
        """The next step's plan: what each running sequence computes, the waiting
        sequences admitted, and those preempted."""
        self.steps += 1
        budget = self.max_num_batched_tokens
        decodes = sum(1 for seq in self.running if seq.pending == 1)
        # prompt tokens: what the decodes leave, within the prefill limit when one is set
        # and some sequence decodes (with none, no token waits for the prompts)
        prompts = budget if self.prefill_limit is None or not decodes else \
            max(min(self.prefill_limit, budget - decodes), 1)
        work: list[tuple[GenSequence, int]] = []
        preempted: list[GenSequence] = []
        # decodes first, then prompt chunks: a long prompt being prefilled never takes
        # the budget its running neighbours need for their next token
        for seq in sorted(self.running, key=lambda s: s.pending > 1):
            if seq.state is not SeqState.RUNNING:
                continue  # preempted earlier in this loop
            n = min(seq.pending, budget) if seq.pending == 1 else \
                min(seq.pending, budget, prompts)
            if n <= 0:
                continue
            while not self._grow(seq, n):
                victim = self._victim(seq, work)
                self._preempt(victim)
                preempted.append(victim)
                if victim is seq:
                    break
            if seq.state is SeqState.RUNNING:
                work.append((seq, n))
                budget -= n
                if seq.pending > 1:
                    prompts -= n
        admit = self.mode == "continuous" or not self.running
        if admit and not preempted and self.waiting and \
                len(self.running) < self.max_num_seqs:
            if self.policy == "priority":
                self.waiting = deque(sorted(self.waiting, key=self._rank()))
            while self.waiting and len(self.running) < self.max_num_seqs and \
                    min(budget, prompts) > 0:
                seq = self.waiting[0]
                if not seq.blocks:
                    self._take_cached_prefix(seq)
                n = min(seq.pending, budget, prompts)
                if not self._grow(seq, n):
                    self._release(seq)
                    break
                self.waiting.popleft()
                seq.state = SeqState.RUNNING
                self.running.append(seq)
                work.append((seq, n))
                budget -= n
                prompts -= n
        return StepPlan(work, preempted)


class PrefillPacer:
    """How many prompt tokens a step may carry beside its decodes, so that a step that
    prefills takes at most ``stretch`` times a pure decode step: the decodes' next
    token (their inter-token latency) waits at most that much longer while new prompts
    keep coming. Learns from the engine's own steps: the time of a pure decode step, and
    what prompt tokens add to a step, fitted as a fixed cost (a second launch, say) plus
    a cost per token (moving averages and a weighted least-squares line).

    When the fixed cost alone leaves no room for a block of tokens, the stretch cannot
    be met: prompts then go in chunks as large as the budget allows, so that the fixed
    cost is paid by as few steps as possible.

        pacer = PrefillPacer(stretch=2.0, floor=16, ceiling=512)
        scheduler.prefill_limit = pacer.limit()        # before a step
        pacer.observe(decodes, prompt_tokens, seconds)  # after it
    """

    SMOOTHING = 0.2  # weight of the newest step in the moving averages

    def __init__(self, stretch: float, floor: int, ceiling: int) -> None:
        self.stretch = stretch
        self.floor = max(floor, 1)
        self.ceiling = max(ceiling, self.floor)
        self.decode_s: float | None = None  # a step of decodes only
        # weighted sums over steps with prompt tokens: weight, tokens, extra seconds,
        # tokens squared, tokens x extra seconds
        self._sums = [0.0] * 5

    def _average(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.SMOOTHING * (new - old)

    def observe(self, decodes: int, prompt_tokens: int, seconds: float) -> None:
        """One step's make-up and duration."""
        if prompt_tokens == 0:
            if decodes:
                self.decode_s = self._average(self.decode_s, seconds)
            return
        base = self.decode_s if decodes and self.decode_s is not None else 0.0
        x, y = float(prompt_tokens), max(seconds - base, 0.0)
        keep = 1 - self.SMOOTHING
        self._sums = [keep * old + new for old, new in
                      zip(self._sums, (1.0, x, y, x * x, x * y), strict=True)]

    def costs(self) -> tuple[float, float] | None:
        """(fixed seconds, seconds per token) that prompt tokens add to a step; None
        before any step carried some."""
        weight, x, y, xx, xy = self._sums
        if not weight:
            return None
        mean_x, mean_y = x / weight, y / weight
        spread = xx / weight - mean_x * mean_x
        if spread > 0.01 * mean_x * mean_x:  # token counts varied enough to fit a line
            per_token = (xy / weight - mean_x * mean_y) / spread
            if per_token > 0:
                fixed = max(mean_y - per_token * mean_x, 0.0)
                return fixed, (mean_y - fixed) / mean_x
        return 0.0, mean_y / mean_x  # all of it per token, as far as can be told

    def limit(self) -> int | None:
        """The prompt tokens the next step may carry; None until both costs are known
        (or with ``stretch`` 0: no limit but the step's budget)."""
        costs = self.costs()
        if not self.stretch or self.decode_s is None or costs is None:
            return None
        fixed, per_token = costs
        room = (self.stretch - 1) * self.decode_s - fixed
        if per_token <= 0:
            return self.ceiling
        tokens = room / per_token
        if tokens < self.floor:  # the stretch cannot be met
            return self.ceiling if fixed >= per_token * self.floor else self.floor
        return int(min(round(tokens, 6), self.ceiling))  # 19.999999 tokens are 20
