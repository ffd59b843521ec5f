"""The generation engine on a tiny random-weight Llama: iteration-level batching,
chunked prefill, preemption by recompute, static batching, sampling and stopping."""

from __future__ import annotations

from collections.abc import Callable

import pytest

torch = pytest.importorskip("torch")

from tradeoff.backends.llama import LlamaConfig, LlamaDecoder  # noqa: E402
from tradeoff.errors import InvalidInput, Unavailable  # noqa: E402
from tradeoff.generate.engine import GenerationEngine, StepReport  # noqa: E402
from tradeoff.generate.events import Done, Event, Failed, Token  # noqa: E402
from tradeoff.generate.iteration import GenSequence, IterationScheduler, SeqState  # noqa: E402
from tradeoff.generate.kv_blocks import BlockAllocator  # noqa: E402
from tradeoff.generate.sampling_params import SamplingParams  # noqa: E402

CONFIG = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2,
                     num_heads=4, num_kv_heads=2, bos_token_id=1, eos_token_id=2)
GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
PROMPTS = [[1, 5, 9, 13], [1, 40], [1, 7, 7, 7, 7, 7, 7, 7, 7, 30, 31, 32, 33], [1, 3, 4]]


def random_weights(config: LlamaConfig, seed: int = 3) -> dict:
    generator = torch.Generator().manual_seed(seed)
    d, kv = config.hidden_size, config.num_kv_heads * config.head_dim

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator) * 0.3

    weights = {"model.embed_tokens.weight": rand(config.vocab_size, d),
               "model.norm.weight": 1 + rand(d), "lm_head.weight": rand(config.vocab_size, d)}
    for i in range(config.num_layers):
        p = f"model.layers.{i}."
        weights.update({
            p + "input_layernorm.weight": 1 + rand(d),
            p + "post_attention_layernorm.weight": 1 + rand(d),
            p + "self_attn.q_proj.weight": rand(d, d), p + "self_attn.k_proj.weight": rand(kv, d),
            p + "self_attn.v_proj.weight": rand(kv, d), p + "self_attn.o_proj.weight": rand(d, d),
            p + "mlp.gate_proj.weight": rand(config.intermediate_size, d),
            p + "mlp.up_proj.weight": rand(config.intermediate_size, d),
            p + "mlp.down_proj.weight": rand(d, config.intermediate_size)})
    return weights


@pytest.fixture(scope="module")
def decoder() -> LlamaDecoder:
    return LlamaDecoder(CONFIG, random_weights(CONFIG))


def run(decoder: LlamaDecoder, prompts: list[list[int]], params: SamplingParams = GREEDY,
        **options: object) -> tuple[list[list[int]], GenerationEngine, int]:
    engine = GenerationEngine(decoder, **options)  # type: ignore[arg-type]
    seqs = [engine.add(p, params) for p in prompts]
    steps = 0
    while engine.has_work():
        engine.step()
        steps += 1
        assert steps < 500
    return [s.output for s in seqs], engine, steps


def test_batched_output_equals_alone(decoder: LlamaDecoder) -> None:
    alone = [run(decoder, [p])[0][0] for p in PROMPTS]
    together, engine, _ = run(decoder, PROMPTS)
    assert together == alone
    assert all(len(o) == 12 for o in together)
    assert engine.blocks.usage == 0  # every block back once all finished


def test_chunked_prefill_and_small_budgets_give_the_same_tokens(decoder: LlamaDecoder) -> None:
    alone = [run(decoder, [p])[0][0] for p in PROMPTS]
    chunked, _, _ = run(decoder, PROMPTS, max_num_batched_tokens=3, max_num_seqs=2)
    assert chunked == alone


def test_preemption_by_recompute_gives_the_same_tokens(decoder: LlamaDecoder) -> None:
    alone = [run(decoder, [p])[0][0] for p in PROMPTS]
    # 8 blocks of 4 tokens cannot hold all four sequences (up to 25 tokens each) at once
    squeezed, engine, _ = run(decoder, PROMPTS, num_blocks=8, block_size=4)
    assert squeezed == alone
    assert engine.scheduler.preemptions > 0


def overlapped(engine: GenerationEngine,
               collected: Callable[[StepReport], None] = lambda report: None) -> int:
    """Run the engine as its core does: step N+1 launched on step N's outcome before N
    is collected, then N collected (and handed to ``collected``). The steps launched."""
    running, steps = None, 0
    while engine.has_work() or running is not None:
        launched = engine.launch(running) if engine.has_work() else None
        if running is not None:
            collected(engine.collect(running))
        running = launched
        steps += 1
        assert steps < 500
    return steps


MIXED = [SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
         SamplingParams(max_tokens=9, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True),
         SamplingParams(max_tokens=30, temperature=0.0),  # ends on EOS if it comes
         SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)]


@pytest.mark.parametrize("options", [
    pytest.param({}, id="batched"),
    pytest.param({"max_num_batched_tokens": 3, "max_num_seqs": 2}, id="chunked"),
    pytest.param({"num_blocks": 12, "block_size": 4}, id="preempting"),
    pytest.param({"prefix_caching": True, "block_size": 2}, id="prefix cache"),
    pytest.param({"mode": "static", "max_num_seqs": 2}, id="static"),
    pytest.param({"stop": True}, id="stop strings")])
def test_overlapped_steps_give_the_tokens_of_steps_one_by_one(decoder: LlamaDecoder,
                                                              options: dict) -> None:
    """Overlap scheduling changes when the host works, never what is chosen: the same
    tokens and endings as stepping one at a time, every block back at the end. With
    "stop strings", the first sequence is finished (as its client does on a stop string)
    once it has a token with a 1 in it: overlapped, its next step already runs then, and
    the token that step chooses is dropped."""
    options = dict(options)
    stop = options.pop("stop", False)
    prompts = [*PROMPTS, [1, 5, 9, 13, 20], [1, 5, 9, 13, 21, 22]]  # shared prefixes
    outcomes = []
    for overlap in (False, True):
        engine = GenerationEngine(decoder, **options)
        seqs = [engine.add(prompt, MIXED[i % len(MIXED)]) for i, prompt in enumerate(prompts)]

        def collected(report: StepReport, engine: GenerationEngine = engine,
                      first: GenSequence = seqs[0]) -> None:
            if stop and first in report.decoded and "1" in str(first.output[-1]):
                engine.finish(first)

        if overlap:
            overlapped(engine, collected)
        else:
            while engine.has_work():
                collected(engine.step())
        outcomes.append([(s.output, s.finish_reason) for s in seqs])
        assert engine.blocks.usage == 0 or engine.blocks.prefix_caching
        assert all(s.state is SeqState.FINISHED for s in seqs)
    assert outcomes[1] == outcomes[0]
    if "num_blocks" in options:
        assert engine.scheduler.preemptions > 0


def test_static_batching_waits_for_the_whole_batch(decoder: LlamaDecoder) -> None:
    short = SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True)
    long = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)
    for mode in ("static", "continuous"):
        engine = GenerationEngine(decoder, mode=mode, max_num_seqs=2)
        a, b, c = engine.add([1, 4], long), engine.add([1, 5], short), engine.add([1, 6], short)
        while b.state is not SeqState.FINISHED:
            engine.step()
        engine.step()
        if mode == "static":  # the batch (a, b) still runs: c may not start
            assert c.state is SeqState.WAITING and not c.output
        else:  # b's slot went to c at once
            assert c.state is not SeqState.WAITING and c.output
        while engine.has_work():
            engine.step()
        assert len(a.output) == 20 and len(c.output) == 2


def test_limits_on_sequences_and_tokens_per_step() -> None:
    blocks = BlockAllocator(num_blocks=64, block_size=4)
    scheduler = IterationScheduler(blocks, max_num_seqs=2, max_num_batched_tokens=5)
    from tradeoff.generate.iteration import GenSequence

    for prompt in ([1] * 4, [1] * 9, [1] * 3):
        scheduler.add(GenSequence(prompt, max_tokens=4))
    plan = scheduler.schedule()
    assert plan.tokens <= 5 and len(scheduler.running) <= 2
    assert [n for _, n in plan.work] == [4, 1]  # the second prompt starts in chunks


def test_the_queue_and_the_cache_refuse_what_they_cannot_hold(decoder: LlamaDecoder) -> None:
    engine = GenerationEngine(decoder, max_num_queued=2, num_blocks=4, block_size=4)
    engine.add([1, 2], GREEDY)
    engine.add([1, 3], GREEDY)
    with pytest.raises(Unavailable, match="max_num_queued 2"):
        engine.add([1, 4], GREEDY)
    big = GenerationEngine(decoder, num_blocks=4, block_size=4)
    with pytest.raises(Unavailable, match="does not fit the KV cache"):
        big.add([1] * 10, SamplingParams(max_tokens=10))


def test_seeded_sampling_does_not_depend_on_the_batch(decoder: LlamaDecoder) -> None:
    seeded = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.9, seed=11,
                            ignore_eos=True)
    alone = run(decoder, [PROMPTS[0]], seeded)[0][0]
    engine = GenerationEngine(decoder)
    mine = engine.add(PROMPTS[0], seeded)
    for p in PROMPTS[1:]:
        engine.add(p, SamplingParams(max_tokens=10, temperature=1.0, ignore_eos=True))
    while engine.has_work():
        engine.step()
    assert mine.output == alone
    assert run(decoder, [PROMPTS[0]], seeded)[0][0] == alone  # reproducible


def test_top_k_one_and_a_tiny_top_p_are_greedy(decoder: LlamaDecoder) -> None:
    greedy = run(decoder, PROMPTS)[0]
    for params in (SamplingParams(max_tokens=12, temperature=1.5, top_k=1, ignore_eos=True),
                   SamplingParams(max_tokens=12, temperature=1.0, top_p=1e-6,
                                  ignore_eos=True)):
        assert run(decoder, PROMPTS, params)[0] == greedy


def test_stopping_on_eos_on_length_and_when_finished(decoder: LlamaDecoder) -> None:
    free = run(decoder, [PROMPTS[0]], SamplingParams(max_tokens=30, temperature=0.0,
                                                      ignore_eos=True))[0][0]
    engine = GenerationEngine(decoder)
    eos_at = engine.add(PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.0))
    finished = engine.add(PROMPTS[0], SamplingParams(max_tokens=30, temperature=0.0,
                                                     ignore_eos=True))
    length = engine.add(PROMPTS[0], SamplingParams(max_tokens=5, temperature=0.0,
                                                   ignore_eos=True))
    while engine.has_work():
        engine.step()
        if len(finished.output) == 4 and finished.state is not SeqState.FINISHED:
            engine.finish(finished)  # its client found a stop string in its text
    if 2 in free:
        assert eos_at.finish_reason == "stop" and eos_at.output == free[:free.index(2) + 1]
    else:
        assert eos_at.finish_reason == "length"
    assert finished.finish_reason == "stop" and finished.output == free[:4]
    assert length.finish_reason == "length" and length.output == free[:5]
    assert engine.blocks.usage == 0 and not engine.params


def test_sampling_settings_are_checked() -> None:
    for bad in ({"max_tokens": 0}, {"temperature": 3.0}, {"top_p": 0.0}, {"top_k": -1}):
        with pytest.raises(InvalidInput):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_a_prompt_the_engine_refuses_leaves_nothing_behind(decoder: LlamaDecoder) -> None:
    engine = GenerationEngine(decoder)
    with pytest.raises(InvalidInput, match="outside the vocabulary"):
        engine.add([1, CONFIG.vocab_size], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidInput, match="seed"):
        SamplingParams(max_tokens=2, seed=2**70)
    assert not engine.has_work() and not engine.params
    outputs, _, _ = run(decoder, [[1, 5]])
    assert len(outputs[0]) == 12


def test_one_request_that_cannot_be_queued_fails_alone(decoder: LlamaDecoder) -> None:
    """The engine thread survives a request the engine refuses with any exception, and
    the next request is answered."""
    import asyncio

    from tradeoff.generate.config import GenerativeConfig
    from tradeoff.generate.engine_client import EngineClient

    class Tokens:
        def decode(self, ids: list[int]) -> str:
            return " ".join(map(str, ids))

    async def scenario() -> tuple[Event, list[Event]]:
        model = EngineClient.in_process("m", 1, GenerativeConfig(), decoder, Tokens(),
                                asyncio.get_running_loop())
        try:
            bad = model.submit([1, CONFIG.vocab_size], SamplingParams(max_tokens=2))
            good = model.submit([1, 5], SamplingParams(max_tokens=2, temperature=0.0))
            refused = await asyncio.wait_for(bad.events.get(), 30)
            events = [await asyncio.wait_for(good.events.get(), 30) for _ in range(3)]
            assert model.active == 0 and model.failed is None
            return refused, events
        finally:
            await model.stop()

    refused, events = asyncio.run(scenario())
    assert isinstance(refused, Failed)
    assert [type(e) for e in events] == [Token, Token, Done]


class PoisonedLogits:
    """The decoder, but a sequence whose tokens hold ``poison`` gets NaN logits (a
    numerical fault of one input that the random-weight model cannot produce alone)."""

    def __init__(self, decoder: LlamaDecoder, poison: int) -> None:
        self.decoder, self.poison = decoder, poison

    def __getattr__(self, name: str) -> object:
        return getattr(self.decoder, name)

    def step(self, steps: list, cache: object) -> list:
        logits = self.decoder.step(steps, cache)
        for index, part in enumerate(steps):
            if self.poison in part.tokens.tolist():
                logits[index] = torch.full_like(logits[index], float("nan"))
        return logits


def test_a_sampling_failure_fails_only_its_own_sequence(decoder: LlamaDecoder) -> None:
    """NaN logits in one row made the whole step raise: every request on the model
    failed. Only the sequence whose token could not be chosen fails now; the others get
    the tokens they would have got alone (seeded draws included)."""
    sampled = SamplingParams(max_tokens=6, temperature=0.8, seed=11, ignore_eos=True)
    alone, _, _ = run(decoder, [[1, 5, 9]], sampled)
    engine = GenerationEngine(PoisonedLogits(decoder, poison=60))  # type: ignore[arg-type]
    poisoned = engine.add([1, 60, 60], sampled)
    healthy = engine.add([1, 5, 9], sampled)
    failures = []
    while engine.has_work():
        failures += engine.step().failed
    assert [seq for seq, _ in failures] == [poisoned]
    assert "probabilities" in str(failures[0][1])
    assert poisoned.finish_reason == "error" and poisoned.output == []
    assert healthy.output == alone[0] and healthy.finish_reason == "length"
    assert engine.blocks.usage == 0 and not engine.params  # nothing is left held


def test_decodes_go_first_so_a_stream_of_long_prompts_never_skips_a_token() -> None:
    """Prompts longer than the step's budget keep arriving while others decode, and the
    running list holds a prefilling prompt ahead of the decoders: every decoding
    sequence still gets its token in every step (its inter-token time is one step), and
    the prompts are prefilled in chunks from what is left of the budget."""
    from tradeoff.generate.iteration import GenSequence

    blocks = BlockAllocator(num_blocks=512, block_size=4)
    scheduler = IterationScheduler(blocks, max_num_seqs=8, max_num_batched_tokens=16)
    decoding = [GenSequence([1, 2], max_tokens=100) for _ in range(3)]
    for seq in decoding:
        scheduler.add(seq)
    scheduler.schedule()
    for seq in decoding:  # prompts computed: from now on each decodes one token a step
        seq.computed = len(seq.prompt)
        seq.output.append(7)
    for step in range(12):
        if step % 3 == 0:
            scheduler.add(GenSequence([1] * 40, max_tokens=4))  # 40 tokens > the budget
        plan = scheduler.schedule()
        # whatever order the running list holds them in: prompts first, here
        scheduler.running.sort(key=lambda s: s.pending <= 1)
        work = {id(seq): n for seq, n in plan.work}
        assert all(work.get(id(seq)) == 1 for seq in decoding), step
        prompts = [s for s in (*scheduler.running, *scheduler.waiting) if s.pending > 1]
        assert plan.tokens == 16 or not prompts  # the rest of the budget went to prompts
        for seq, n in plan.work:
            seq.computed += n
            if seq.pending == 0:
                seq.output.append(7)


def test_the_pacer_sizes_prompt_chunks_to_the_stretch_it_is_given() -> None:
    """A pure decode step of 10 ms and 0.1 ms per prompt token: a stretch of 2 leaves
    100 prompt tokens a step (10 ms more), 3 leaves 200; within floor and ceiling; no
    limit before both costs are known, or with a stretch of 0."""
    from tradeoff.generate.iteration import PrefillPacer

    pacer = PrefillPacer(stretch=2.0, floor=16, ceiling=512)
    assert pacer.limit() is None
    pacer.observe(decodes=8, prompt_tokens=0, seconds=0.010)
    assert pacer.limit() is None  # the prompt tokens' cost is not known yet
    pacer.observe(decodes=8, prompt_tokens=300, seconds=0.040)  # 30 ms for 300 tokens
    assert pacer.limit() == 100
    pacer.stretch = 3.0
    assert pacer.limit() == 200
    pacer.stretch = 50.0
    assert pacer.limit() == 512
    pacer.observe(decodes=0, prompt_tokens=10, seconds=1.0)  # very slow prompt tokens
    pacer.stretch = 2.0
    assert pacer.limit() == 16
    assert PrefillPacer(stretch=0.0, floor=16, ceiling=512).limit() is None


def test_the_pacer_tells_a_fixed_cost_from_a_cost_per_token() -> None:
    """Prompt tokens that cost 8 ms whatever their number (a second launch) plus 0.1 ms
    each: with a 10 ms decode step and a stretch of 2, 20 tokens fit; when the fixed
    cost alone is over the stretch, prompts go in the largest chunks instead (as few
    steps as possible pay it)."""
    from tradeoff.generate.iteration import PrefillPacer

    def pacer(fixed_s: float) -> PrefillPacer:
        made = PrefillPacer(stretch=2.0, floor=16, ceiling=512)
        made.observe(decodes=8, prompt_tokens=0, seconds=0.010)
        for tokens in (16, 40, 100, 16, 64, 300, 20):
            made.observe(decodes=8, prompt_tokens=tokens,
                         seconds=0.010 + fixed_s + 0.0001 * tokens)
        return made

    paced = pacer(0.008)
    fixed, per_token = paced.costs()  # type: ignore[misc]
    assert fixed == pytest.approx(0.008) and per_token == pytest.approx(0.0001)
    assert paced.limit() == 20
    assert pacer(0.012).limit() == 512
    assert pacer(0.0).limit() == 100


def test_a_prefill_limit_bounds_the_prompt_tokens_of_every_step() -> None:
    from tradeoff.generate.iteration import GenSequence

    blocks = BlockAllocator(num_blocks=512, block_size=4)
    scheduler = IterationScheduler(blocks, max_num_seqs=8, max_num_batched_tokens=64)
    decoding = GenSequence([1, 2], max_tokens=100)
    scheduler.add(decoding)
    scheduler.schedule()
    decoding.computed, decoding.output = 2, [7]
    scheduler.prefill_limit = 10
    for _ in range(3):
        scheduler.add(GenSequence([1] * 25, max_tokens=4))
    chunks = []
    for _ in range(10):
        plan = scheduler.schedule()
        assert (decoding, 1) in plan.work
        chunks.append(sum(n for seq, n in plan.work if seq is not decoding))
        for seq, n in plan.work:
            seq.computed += n
            if seq.pending == 0:
                seq.output.append(7)
    assert max(chunks) <= 10 + 3  # a prompt's chunks, and the finished prompts' decodes
    assert chunks[:2] == [10, 10]
    alone = IterationScheduler(blocks, max_num_seqs=8, max_num_batched_tokens=64)
    alone.prefill_limit = 10
    alone.add(GenSequence([1] * 25, max_tokens=4))
    assert alone.schedule().tokens == 25  # nothing decodes: nothing to protect


def test_the_engine_paces_prefill_from_its_own_steps(decoder: LlamaDecoder) -> None:
    """With a stretch set, the engine learns both costs from its steps and gives the
    scheduler a limit; the tokens are those of an unpaced engine."""
    prompts = [[1] + [5] * 40, [1, 7, 7], [1] + [9] * 30]
    plain, _, _ = run(decoder, prompts, max_num_batched_tokens=64)
    paced, engine, _ = run(decoder, prompts, max_num_batched_tokens=64, prefill_stretch=2.0)
    assert paced == plain
    assert engine.pacer.decode_s is not None and engine.pacer.costs() is not None
    assert engine.pacer.limit() is not None


def test_a_sequence_longer_than_the_model_s_positions_is_refused() -> None:
    short = LlamaConfig(vocab_size=61, hidden_size=32, intermediate_size=64, num_layers=2,
                        num_heads=4, num_kv_heads=2, max_position=16, eos_token_id=2)
    engine = GenerationEngine(LlamaDecoder(short, random_weights(short)), block_size=4)
    with pytest.raises(InvalidInput, match="over the model's 16 positions"):
        engine.add([1] * 10, SamplingParams(max_tokens=7))
    assert not engine.has_work()
    engine.add([1] * 10, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True))
    while engine.has_work():
        engine.step()


def test_threads_hold_on_the_engines_own_step_thread(decoder: LlamaDecoder) -> None:
    """``threads`` sets the step thread's operator threads; the same answers come."""
    import torch

    before = torch.get_num_threads()
    plain = run(decoder, PROMPTS[:2])[0]
    outputs, engine, _ = run(decoder, PROMPTS[:2], threads=1)
    assert outputs == plain
    assert engine._worker.submit(lambda: torch.get_num_threads).result() == 1
    engine.close()
    assert torch.get_num_threads() == before or before == 1  # this thread keeps its own
