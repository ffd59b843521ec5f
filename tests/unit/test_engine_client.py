"""The engine client and its core exchange messages only: every generation runs the same
with each message encoded to msgpack bytes and decoded on the other side (as between
processes), errors keep their status across, an abort before the core takes the request
never queues it, and a core that stops on its own fails what is in flight and refuses
what comes. The request types and sampling settings load without torch."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tradeoff.errors import InferenceFailed, InvalidInput, Overloaded, RequestError, Unavailable
from tradeoff.generate.engine_messages import (
    Abort,
    Add,
    CoreEnded,
    Drain,
    EngineLoad,
    ErrorOut,
    Finish,
    FinishedOut,
    StepOutputs,
    as_error,
    decode_inbound,
    decode_outbound,
    encode,
    error_out,
)
from tradeoff.generate.events import Done, Failed, Token
from tradeoff.generate.sampling_params import SamplingParams


def test_the_request_types_and_sampling_settings_load_without_torch() -> None:
    code = ("import sys, tradeoff.server.openai_requests, tradeoff.generate.sampling_params, "
            "tradeoff.generate.engine_messages; print('torch' in sys.modules)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert run.stdout.strip() == "False"


def test_every_message_survives_the_wire() -> None:
    params = SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, top_k=3, seed=2**64 - 1,
                            stop=("\n", "end"), ignore_eos=True)
    inbound = [Add(3, [1, 2, 3], params, -5), Abort(3), Finish(3, 1.5), Drain(2.5)]
    for message in inbound:
        assert decode_inbound(encode(message)) == message
    outbound = [StepOutputs(12.5, [3, 5], [42, 7], [(5, 16)], [FinishedOut(4, "stop")],
                            [ErrorOut(5, "InvalidInput", "too long")], 2,
                            EngineLoad(1, 2, 0.25, 64, 32)),
                CoreEnded(None), CoreEnded("the engine stopped (RuntimeError: lost)")]
    for message in outbound:
        assert decode_outbound(encode(message)) == message


def test_a_bad_setting_is_refused_on_the_wire_too() -> None:
    data = msgspec.msgpack.encode(["Add", 1, [1], {"temperature": 4.0}, 0])
    with pytest.raises(InvalidInput, match="temperature must be in"):
        decode_inbound(data)


def test_errors_keep_their_status_across() -> None:
    for error, kind, status in [(InvalidInput("bad prompt"), InvalidInput, 400),
                                (Overloaded("full"), Unavailable, 503),
                                (InferenceFailed("nan"), InferenceFailed, 500)]:
        back = as_error(decode_outbound(encode(StepOutputs(
            0.0, [], [], [], [], [error_out(1, error)], 0, EngineLoad()))).errors[0])
        assert type(back) is kind and back.status == status and str(back) == str(error)
    other = as_error(error_out(1, RuntimeError("device lost")))
    assert type(other) is RequestError and str(other) == "generation failed: device lost"


torch = pytest.importorskip("torch")
pytest.importorskip("tokenizers")

from tradeoff.generate.engine_client import EngineClient  # noqa: E402
from tradeoff.generate.engine_core import EngineCore  # noqa: E402
from tradeoff.generate.loader import load_generative  # noqa: E402
from tradeoff.models.generative import write_synthetic_llm  # noqa: E402


class OverTheWire:
    """An engine core whose every message in and out is encoded to msgpack bytes and
    decoded again, as it would be between processes."""

    def __init__(self, core: EngineCore) -> None:
        self.core = core
        self.info = msgspec.msgpack.decode(msgspec.msgpack.encode(core.info),
                                           type=type(core.info))
        self.sent: list[bytes] = []

    def start(self, publish: Callable[[Any], None]) -> None:
        self.core.start(lambda message: publish(decode_outbound(encode(message))))

    def send(self, message: Any) -> None:
        data = encode(message)
        self.sent.append(data)
        self.core.send(decode_inbound(data))

    def stop(self) -> None:
        self.core.stop()

    def join(self, timeout_s: float) -> None:
        self.core.join(timeout_s)

    def snapshot(self) -> Any:
        stats, load = self.core.snapshot()
        return (msgspec.msgpack.decode(msgspec.msgpack.encode(stats), type=type(stats)),
                decode_outbound(encode(StepOutputs(0.0, [], [], [], [], [], 0, load))).load)


def with_client(tmp_path: Path, scenario: Callable[[EngineClient], Awaitable[Any]],
                wire: bool, settings: dict[str, Any] | None = None, **model: float) -> Any:
    directory = write_synthetic_llm(tmp_path, model={"step_ms": 1.0, **model},
                                    **(settings or {}))
    config, decoder, tokenizer = load_generative(directory)

    async def run() -> Any:
        core = EngineCore("llm", 1, config, decoder)
        client = EngineClient("llm", 1, config, tokenizer,
                              OverTheWire(core) if wire else core,
                              asyncio.get_running_loop())
        try:
            return await scenario(client)
        finally:
            await client.stop()

    return asyncio.run(run())


async def answer(client: EngineClient, prompt: list[int], params: SamplingParams
                 ) -> tuple[list[int], str, str]:
    handle = client.submit(prompt, params)
    tokens, text = [], ""
    while isinstance(event := await asyncio.wait_for(handle.events.get(), 30), Token):
        tokens.append(event.token)
        text += event.text
    assert isinstance(event, Done), event
    return tokens, text, event.reason


def test_generations_over_the_wire_match_those_in_process(tmp_path: Path) -> None:
    prompts = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 3, 9]]
    settings = [SamplingParams(max_tokens=8, temperature=0.0),
                SamplingParams(max_tokens=6, temperature=0.9, seed=7),
                SamplingParams(max_tokens=5, temperature=0.0, stop=("x",))]

    async def scenario(client: EngineClient) -> Any:
        answers = await asyncio.gather(*(answer(client, p, s)
                                         for p, s in zip(prompts, settings, strict=True)))
        stats = client.stats
        return answers, stats.to_dict(), stats.load, client.active, client.pending

    results = {wire: with_client(tmp_path / str(wire), scenario, wire) for wire in (False, True)}
    assert results[True][0] == results[False][0]
    for answers, statistics, load, active, pending in results.values():
        assert [len(tokens) for tokens, _, _ in answers][:2] == [8, 6]
        assert statistics["inference_count"] == 3 and statistics["execution_count"] > 0
        assert load.running == load.waiting == 0 and load.prefix_queries > 0
        assert active == 0 and pending == 0


def test_an_abort_before_the_core_takes_the_request_never_queues_it(tmp_path: Path) -> None:
    config, decoder, _ = load_generative(write_synthetic_llm(tmp_path))
    core = EngineCore("llm", 1, config, decoder)
    core.send(Add(0, [1, 2, 3], SamplingParams(max_tokens=50), 0))
    core.send(Abort(0))
    core.send(Add(1, [4, 5], SamplingParams(max_tokens=2, temperature=0.0), 0))
    published: list[Any] = []
    core.start(published.append)  # its first turn takes all three
    try:
        for _ in range(3000):
            if any(isinstance(m, StepOutputs) and m.finished for m in published):
                break
            time.sleep(0.01)
    finally:
        core.stop()
        core.join(30)
    steps = [m for m in published if isinstance(m, StepOutputs)]
    assert steps[0].taken == 2 and sum(m.taken for m in steps) == 2  # both adds
    assert {r for m in steps for r in m.request_ids} == {1}
    assert [f.request_id for m in steps for f in m.finished] == [1]
    assert core.snapshot()[0].prompt_tokens == 2  # the second request's alone
    assert published[-1] == CoreEnded(None)


def test_a_core_that_stops_on_its_own_fails_what_runs_and_refuses_what_comes(
        tmp_path: Path) -> None:
    async def scenario(client: EngineClient) -> Any:
        wire: Any = client._core

        def broken(*args: Any) -> Any:
            raise RuntimeError("the device was lost")

        running = client.submit([1, 2, 3], SamplingParams(max_tokens=500, temperature=0.0))
        assert isinstance(await asyncio.wait_for(running.events.get(), 30), Token)
        wire.core.engine.has_work = broken  # the core's loop itself fails now
        while not isinstance(event := await asyncio.wait_for(running.events.get(), 30),
                             Failed):
            assert isinstance(event, Token)
        await asyncio.to_thread(wire.join, 30)  # the core's thread has said its last
        await asyncio.sleep(0)  # and the loop has heard it
        assert client.failed is not None
        with pytest.raises(Unavailable, match="the device was lost"):
            client.submit([1], SamplingParams())
        return event.error, client.active

    error, active = with_client(tmp_path, scenario, wire=True, step_ms=5.0)
    assert isinstance(error, Unavailable) and "RuntimeError: the device was lost" in str(error)
    assert active == 0


def test_a_stop_string_ends_the_answer_in_the_client_and_the_core_counts_it_finished(
        tmp_path: Path) -> None:
    """The core sends token ids only; the client makes the text, and when a stop string
    completes it ends the answer at once ("stop", the stop string never shown, no token
    after it) and tells the core, which counts the generation finished, not failed, and
    frees its sequence. Over the wire and in process alike."""
    free = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompt = [1, 2, 3]

    async def scenario(client: EngineClient) -> Any:
        tokens, text, _ = await answer(client, prompt, free)
        stop = text[5:8]  # three characters the answer holds, one token each
        stopped = await answer(client, prompt, SamplingParams(
            max_tokens=24, temperature=0.0, ignore_eos=True, stop=(stop,)))
        for _ in range(300):  # the core hears of it after the answer ended
            if client.stats.load.running == 0:
                break
            await asyncio.sleep(0.01)
        return tokens, text, stopped, client.stats.to_dict(), client.stats.load

    for wire in (False, True):
        tokens, text, (kept, cut, reason), statistics, load = with_client(
            tmp_path / str(wire), scenario, wire)
        stop_at = text.index(text[5:8])
        assert reason == "stop" and cut == text[:stop_at]
        assert kept == tokens[:stop_at + 3]  # the token that completed it, none after
        assert statistics["inference_count"] == 2
        assert statistics["inference_stats"]["fail"]["count"] == 0
        assert load.running == load.waiting == 0 and load.kv_usage == 0


def test_steps_one_by_one_give_the_answers_of_overlapped_steps(tmp_path: Path) -> None:
    """``overlap: false`` launches each step once the last is collected: the same
    tokens, and the core ends every generation."""
    prompts = [[1, 2, 3], [4, 5, 6, 7], [1, 2, 3, 9]]
    settings = [SamplingParams(max_tokens=8, temperature=0.0),
                SamplingParams(max_tokens=6, temperature=0.9, seed=7),
                SamplingParams(max_tokens=5, temperature=0.0, stop=("x",))]

    async def scenario(client: EngineClient) -> Any:
        engine = client._core.engine  # type: ignore[attr-defined]
        launch, behind = engine.launch, []

        def launched(running: Any = None) -> Any:  # was a step still running?
            behind.append(running is not None)
            return launch(running)

        engine.launch = launched
        answers = await asyncio.gather(*(answer(client, p, s)
                                         for p, s in zip(prompts, settings, strict=True)))
        return answers, client.stats.to_dict()["inference_count"], any(behind)

    answers, count, behind = with_client(tmp_path / "overlap", scenario, wire=False)
    assert count == 3 and behind  # steps launched behind a running one
    assert with_client(tmp_path / "one", scenario, wire=False,
                       settings={"overlap": False}) == (answers, 3, False)
