"""A generation's typed outputs (server/generation.py), from a real generative model (the
synthetic LLM on its engine thread): deltas that join into the answer, one Finished with
the usage, the data plane's hook told of a whole answer once, refusals raised before any
output, and an abort that ends the outputs and stops the engine's work."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tradeoff.errors import RequestError
from tradeoff.generate.engine_client import EngineClient, Handle
from tradeoff.generate.loader import load_generative
from tradeoff.generate.sampling_params import SamplingParams
from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.generation import Finished, Generation, TextDelta

Whole = list[tuple[list[int], str]]


def with_model(tmp_path: Path, scenario: Callable[[EngineClient, Whole],
                                                  Awaitable[Any]]) -> Any:
    directory = write_synthetic_llm(tmp_path, model={"step_ms": 1.0})
    config, decoder, tokenizer = load_generative(directory)

    async def run() -> Any:
        model = EngineClient.in_process("llm", 1, config, decoder, tokenizer,
                                asyncio.get_running_loop())
        try:
            return await scenario(model, [])
        finally:
            await model.stop()

    return asyncio.run(run())


def generation(model: EngineClient, whole: Whole, prompt: str, **params: Any
               ) -> Generation:
    tokens = model.tokenizer.encode(prompt)
    handle = model.submit(tokens, SamplingParams(temperature=0.0, **params))
    return Generation(model, handle, len(tokens),
                      lambda h, answer, reason: whole.append((list(answer), reason)))


def test_outputs_are_deltas_then_one_finished_with_the_usage(tmp_path: Path) -> None:
    async def scenario(model: EngineClient, whole: Whole) -> Any:
        answer = generation(model, whole, "hello there", max_tokens=6)
        async with answer:
            assert await answer.begin()
            outputs = [output async for output in answer]
        return answer, outputs, whole

    answer, outputs, whole = with_model(tmp_path, scenario)
    deltas, finished = outputs[:-1], outputs[-1]
    assert all(isinstance(d, TextDelta) for d in deltas) and len(deltas) == 6
    assert isinstance(finished, Finished) and finished.reason == "length"
    assert finished.usage.completion_tokens == 6
    assert finished.usage.prompt_tokens == answer.prompt_tokens > 0
    assert whole == [([d.token for d in deltas], "length")]  # told once, with the tokens
    assert "".join(d.text for d in deltas)  # the synthetic model answers text


def test_a_refusal_is_raised_by_begin_before_any_output(tmp_path: Path) -> None:
    async def scenario(model: EngineClient, whole: Whole) -> Any:
        vocab = model.info.vocab
        handle = model.submit([1, vocab + 5], SamplingParams(max_tokens=2))  # no such token
        answer = Generation(model, handle, 2, lambda *a: whole.append(a))
        async with answer:
            with pytest.raises(RequestError) as refused:
                await answer.begin()
        return refused.value, whole

    refused, whole = with_model(tmp_path, scenario)
    assert refused.status == 400 and whole == []


def test_an_abort_ends_the_outputs_without_an_answer(tmp_path: Path) -> None:
    async def scenario(model: EngineClient, whole: Whole) -> Any:
        answer = generation(model, whole, "a long one", max_tokens=200)
        outputs = []
        async with answer:
            assert await answer.begin()
            async for output in answer:
                outputs.append(output)
                if len(outputs) == 3:
                    answer.abort()  # the client left
        await asyncio.wait_for(model._idle.wait(), 30)  # the engine let it go
        return outputs, whole, model.active

    outputs, whole, active = with_model(tmp_path, scenario)
    assert len(outputs) < 200 and not any(isinstance(o, Finished) for o in outputs)
    assert whole == [] and active == 0


def test_leaving_the_block_early_stops_the_generation(tmp_path: Path) -> None:
    async def scenario(model: EngineClient, whole: Whole) -> Any:
        answer = generation(model, whole, "a long one", max_tokens=200)
        with pytest.raises(ConnectionResetError):
            async with answer:
                assert await answer.begin()
                async for _ in answer:
                    raise ConnectionResetError("the client's socket broke")
        handle: Handle = answer.handle
        await asyncio.wait_for(model._idle.wait(), 30)
        return handle.aborted, model.active

    aborted, active = with_model(tmp_path, scenario)
    assert aborted and active == 0
