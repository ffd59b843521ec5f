"""The synthetic generative model: its answers follow one rule through the cache's slots,
its steps take the time its file sets, and it loads through the registry like a Llama."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tokenizers.pre_tokenizers import ByteLevel  # noqa: E402

from tradeoff.backends.llama import SequenceStep  # noqa: E402
from tradeoff.backends.registry import BackendRegistry  # noqa: E402
from tradeoff.backends.synthetic_generative import (  # noqa: E402
    ANSWER_ALPHABET,
    EOS_ID,
    SyntheticDecoder,
    SyntheticLLMConfig,
    build_tokenizer,
    continuation,
)
from tradeoff.errors import ModelLoadError  # noqa: E402
from tradeoff.generate.engine import GenerationEngine  # noqa: E402
from tradeoff.generate.loader import load_generative  # noqa: E402
from tradeoff.generate.sampling_params import SamplingParams  # noqa: E402
from tradeoff.models.generative import write_synthetic_llm  # noqa: E402

BLOCK = 4


def slots(blocks: list[int], length: int) -> torch.Tensor:
    """The cache slots of positions 0..length-1 of a sequence holding ``blocks``."""
    table = torch.tensor(blocks)
    return (table[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:length]


def chosen(logits: torch.Tensor) -> list[int]:
    return logits.argmax(dim=-1).tolist()


def run(decoder: SyntheticDecoder, prompt: list[int], count: int, blocks: list[int],
        chunk: int = 3) -> list[int]:
    """Prefill ``prompt`` in chunks, then decode ``count`` tokens, one sequence alone."""
    cache = decoder.new_cache(16, BLOCK)
    tokens, out, start = list(prompt), [], 0
    while len(out) < count:
        end = min(start + chunk, len(tokens)) if start < len(prompt) else len(tokens)
        step = SequenceStep(torch.tensor(tokens[start:end]), start, slots(blocks, end))
        logits = decoder.step([step], cache)
        start = end
        if end == len(tokens):
            out.append(chosen(logits)[0])
            tokens.append(out[-1])
    return out


def test_tokenizer_is_byte_level_with_a_chat_template() -> None:
    tokenizer = build_tokenizer()
    text = "Grüße, ✓ 2"
    ids = tokenizer.encode(text)
    assert ids[0] == tokenizer.token_id("<|bos|>") and ids[1:] == list(text.encode())
    assert tokenizer.decode(ids) == text
    assert tokenizer.token_id("<|eos|>") == EOS_ID == SyntheticLLMConfig().eos_token_id
    assert tokenizer.has_chat_template
    assert tokenizer.chat([{"role": "user", "content": "hi"}]).endswith("assistant\n")
    assert set(tokenizer.backend.get_vocab()) >= set(ByteLevel.alphabet())
    assert tokenizer.decode(list(ANSWER_ALPHABET)) == ANSWER_ALPHABET.decode()


def test_answers_follow_the_rule_whatever_the_chunks_and_blocks() -> None:
    decoder = SyntheticDecoder(SyntheticLLMConfig(step_ms=0))
    prompt = build_tokenizer().encode("the same prompt")
    expected = continuation(prompt, 12)
    assert run(decoder, prompt, 12, blocks=[0, 1, 2, 3, 4, 5, 6]) == expected
    assert run(decoder, prompt, 12, blocks=[9, 3, 12, 0, 5, 1, 7], chunk=16) == expected
    assert set(expected) <= set(ANSWER_ALPHABET)
    assert continuation(prompt, 12) != continuation(prompt[:-1], 12)


def test_the_token_before_the_last_is_read_back_from_the_cache() -> None:
    decoder = SyntheticDecoder(SyntheticLLMConfig(step_ms=0))
    cache = decoder.new_cache(4, BLOCK)
    prompt = [104, 105, 106]
    first = decoder.step([SequenceStep(torch.tensor(prompt), 0, slots([0], 3))], cache)
    token = chosen(first)[0]
    assert token == continuation(prompt, 1)[0]
    right = decoder.step([SequenceStep(torch.tensor([token]), 3, slots([0], 4))], cache)
    cache.keys.view(-1)[2] = 0  # what a wrong slot or a bad prefix-cache hit would hold
    wrong = decoder.step([SequenceStep(torch.tensor([token]), 3, slots([0], 4))], cache)
    assert chosen(right) == continuation(prompt, 2)[1:] and chosen(wrong) != chosen(right)


def test_a_batch_gives_each_sequence_its_own_answer_and_all_logits() -> None:
    decoder = SyntheticDecoder(SyntheticLLMConfig(step_ms=0, vocab_size=300))
    cache = decoder.new_cache(8, BLOCK)
    a, b = [10, 20, 30, 40, 50], [60, 70]
    steps = [SequenceStep(torch.tensor(a), 0, slots([1, 2], 5)),
             SequenceStep(torch.tensor(b), 0, slots([5], 2))]
    logits = decoder.step(steps, cache)
    assert logits.shape == (2, 300) and logits.dtype == torch.float32
    assert chosen(logits) == [continuation(a, 1)[0], continuation(b, 1)[0]]
    assert [row.tolist().count(0.0) for row in logits] == [1, 1]
    every = decoder.step(steps, cache, all_logits=True)
    assert [r.shape[0] for r in every] == [5, 2]
    assert chosen(every[0]) == [continuation(a[:i], 1)[0] for i in range(1, 6)]
    assert decoder.tokens_computed == 14


def test_forward_decode_agrees_with_step_and_padding_rows_write_nothing() -> None:
    decoder = SyntheticDecoder(SyntheticLLMConfig(step_ms=0))
    cache = decoder.new_cache(8, BLOCK)
    prompt = [1, 2, 3, 4, 5, 6]
    first = chosen(decoder.step([SequenceStep(torch.tensor(prompt), 0, slots([3, 6], 6))],
                                cache))[0]
    before = cache.keys.clone()
    table = torch.tensor([[3, 6, 99], [99, 99, 99]], dtype=torch.int32)  # 99: past the cache
    logits = decoder.forward_decode(torch.tensor([first, 0]), torch.tensor([6, 0]), table,
                                    cache)
    assert chosen(logits)[0] == continuation(prompt, 2)[1]
    changed = (cache.keys != before).view(-1).nonzero().view(-1).tolist()
    assert changed == [6 * BLOCK + 2]  # the one decoded token, at position 6's slot


def test_eos_from_the_position_set() -> None:
    config = SyntheticLLMConfig(step_ms=0, eos_at_position=6)
    decoder = SyntheticDecoder(config)
    prompt = [65, 66, 67, 68]
    out = run(decoder, prompt, 4, blocks=[0, 1, 2])
    assert out == continuation(prompt, 4, eos_at_position=6)
    assert out[2:] == [EOS_ID, EOS_ID] and EOS_ID not in out[:2]


def test_a_step_takes_at_least_its_set_time() -> None:
    config = SyntheticLLMConfig(step_ms=20.0, per_token_ms=4.0)
    assert config.step_seconds(5) == pytest.approx(0.040)
    decoder = SyntheticDecoder(config)
    cache = decoder.new_cache(4, BLOCK)
    started = time.perf_counter()
    decoder.step([SequenceStep(torch.tensor([1, 2, 3, 4, 5]), 0, slots([0, 1], 5))], cache)
    decoder.synchronize()
    assert time.perf_counter() - started >= 0.040
    assert decoder.steps == 1 and decoder.tokens_computed == 5


def test_steps_launched_together_run_one_after_the_other() -> None:
    """As on a GPU stream: the second step starts when the first ends, and the host
    waits for both where it reads back."""
    decoder = SyntheticDecoder(SyntheticLLMConfig(step_ms=30.0))
    cache = decoder.new_cache(4, BLOCK)
    started = time.perf_counter()
    for position in (0, 1):
        decoder.step([SequenceStep(torch.tensor([7]), position, slots([0], position + 1)[-1:])],
                     cache)
    decoder.synchronize()
    assert time.perf_counter() - started >= 0.060
    assert decoder.steps == 2


def test_the_engine_serves_it(tmp_path: Path) -> None:
    directory = write_synthetic_llm(tmp_path, model={"step_ms": 0.0}, max_num_seqs=4,
                                    num_blocks=64, block_size=BLOCK)
    config, decoder, tokenizer = load_generative(directory, BackendRegistry())
    assert config.format == "synthetic" and isinstance(decoder, SyntheticDecoder)
    engine = GenerationEngine(decoder, num_blocks=config.num_blocks,
                              block_size=config.block_size, max_num_seqs=config.max_num_seqs,
                              max_num_batched_tokens=8, prefix_caching=True)
    prompts = [tokenizer.encode(f"prompt {i % 3} shares a prefix") for i in range(7)]
    seqs = engine.generate(prompts, SamplingParams(max_tokens=9, temperature=0.8,
                                                   ignore_eos=True))
    assert [s.output for s in seqs] == [continuation(p, 9) for p in prompts]
    assert all(tokenizer.decode(s.output).isascii() for s in seqs)


def test_model_json_is_checked(tmp_path: Path) -> None:
    path = tmp_path / "model.json"
    for doc, message in (({"step_ms": -1}, "step_ms must be >= 0"),
                         ({"per_token_ms": 1e9}, "per_token_ms must be at most 10,000 ms"),
                         ({"step_ms": "3"}, "step_ms must be a number"),
                         ({"vocab_size": 100}, "vocab_size must be >= 261"),
                         ({"vocab_size": 300.0}, "vocab_size must be an integer"),
                         ({"stepms": 3}, "unknown setting(s) stepms")):
        path.write_text(json.dumps(doc))
        with pytest.raises(ModelLoadError, match=message.replace("(", r"\(").replace(")", r"\)")):
            SyntheticLLMConfig.read(path)
    path.write_text(json.dumps({"step_ms": 2, "eos_at_position": None}))
    assert SyntheticLLMConfig.read(path) == SyntheticLLMConfig(step_ms=2.0)
    backend = BackendRegistry().generative("synthetic")
    with pytest.raises(ModelLoadError, match="device 'cuda'"):
        backend.load(path, "synthetic", "cuda", "fp32")


def test_the_original_measured_alone_is_timed_but_not_scored(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch
                                                             ) -> None:
    """Scoring (a prefill of the whole scored text) grades a precision against the
    original; with no other precision (``plan --precision none``) it has nothing to
    grade, and on a slow model it took most of the measuring."""
    from tradeoff.optimize import generative

    def scored(*args: object) -> None:
        raise AssertionError("the original alone was scored")

    monkeypatch.setattr(generative, "_score", scored)
    directory = write_synthetic_llm(tmp_path, model={"step_ms": 1.0})
    (report,), precision = generative.optimize_generative(directory, (), 0.2, lambda _: None)
    assert precision == "fp32" and report.accuracy == []
    assert report.throughput_by_batch and report.prefill_ms
