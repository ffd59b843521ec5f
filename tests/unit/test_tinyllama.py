"""``tinyllama`` as written by ``models build``: a Hugging Face directory that loads back
into the decoder and the tokenizer, with byte-level text round trips and a chat template."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from tradeoff.backends.llama import load_hf_directory  # noqa: E402
from tradeoff.backends.text import Tokenizer  # noqa: E402
from tradeoff.generate.engine import GenerationEngine  # noqa: E402
from tradeoff.generate.sampling_params import SamplingParams  # noqa: E402
from tradeoff.models.tinyllama import write_tinyllama  # noqa: E402


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tinyllama(tmp_path_factory.mktemp("tinyllama"))


def test_text_round_trips_byte_by_byte(tiny: Path) -> None:
    tokenizer = Tokenizer.from_directory(tiny)
    for text in ("hello world", "naïve café ☕", "tabs\tand\nnewlines", ""):
        ids = tokenizer.encode(text)
        assert ids[0] == 257  # <|bos|>
        assert len(ids) == len(text.encode()) + 1
        assert tokenizer.decode(ids) == text


def test_chat_template(tiny: Path) -> None:
    tokenizer = Tokenizer.from_directory(tiny)
    prompt = tokenizer.chat([{"role": "system", "content": "Be brief."},
                             {"role": "user", "content": "Hi"}])
    assert prompt == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>"
                      "\n<|im_start|>assistant\n")
    ids = tokenizer.encode(prompt)
    assert tokenizer.token_id("<|im_start|>") in ids


def test_the_written_model_loads_and_generates_the_same_every_time(tiny: Path,
                                                                   tmp_path: Path) -> None:
    decoder = load_hf_directory(tiny)
    assert decoder.config.vocab_size == 261 and decoder.config.eos_token_id == 258
    tokenizer = Tokenizer.from_directory(tiny)
    params = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    first = GenerationEngine(decoder).generate([tokenizer.encode("abc")], params)[0].output
    again = write_tinyllama(tmp_path / "again")  # fixed seed: the same weights
    second = GenerationEngine(load_hf_directory(again)).generate(
        [tokenizer.encode("abc")], params)[0].output
    assert first == second and len(first) == 8
