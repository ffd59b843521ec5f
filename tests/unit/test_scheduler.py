"""The scheduler with a Python backend: batching, failures, ordering, draining."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest

from tradeoff.backends.base import Backend
from tradeoff.errors import InferenceFailed, Unavailable
from tradeoff.repository.config import (
    DynamicBatching,
    InstanceGroup,
    ModelConfig,
    QueuePolicy,
    TensorConfig,
)
from tradeoff.scheduling.request import InferenceRequest
from tradeoff.scheduling.scheduler import INLINE_STREAK, Scheduler
from tradeoff.scheduling.stats import ModelStats


class Doubler(Backend):
    """y = 2x; can be told to block until released, or to fail on a marker value."""

    def __init__(self) -> None:
        self.batches: list[int] = []
        self.gate = threading.Event()
        self.gate.set()

    def run(self, inputs, output_names):
        self.gate.wait(5)
        x = inputs["x"]
        if (x == -1).any():
            raise RuntimeError("poisoned input")
        self.batches.append(x.shape[0])
        return {"y": x * 2}


def config(batching: DynamicBatching | None = DynamicBatching(), max_batch: int = 8,
           instances: int = 1) -> ModelConfig:
    return ModelConfig(name="double", max_batch_size=max_batch,
                       inputs=(TensorConfig("x", "FP32", (2,)),),
                       outputs=(TensorConfig("y", "FP32", (2,)),),
                       instance_groups=(InstanceGroup(count=instances),),
                       dynamic_batching=batching)


def request(value: float, rows: int = 1) -> InferenceRequest:
    return InferenceRequest(inputs={"x": np.full((rows, 2), value, np.float32)}, rows=rows,
                            shape_key=((2,),))


async def _start(cfg: ModelConfig, backends: list[Backend]) -> Scheduler:
    scheduler = Scheduler(cfg, backends, ModelStats(cfg.name, 1))
    await scheduler.start()
    return scheduler


def test_requests_queued_behind_a_busy_instance_run_as_one_batch() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(), [backend])
        backend.gate.clear()
        first = asyncio.ensure_future(scheduler.infer(request(0)))
        await asyncio.sleep(0.05)  # the first batch is now blocked on the instance
        rest = [asyncio.ensure_future(scheduler.infer(request(i))) for i in range(1, 6)]
        await asyncio.sleep(0.05)
        backend.gate.set()
        results = await asyncio.gather(first, *rest)
        for i, (_, outputs) in enumerate(results):
            np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 2 * i, np.float32))
        assert backend.batches == [1, 5]
        assert results[-1][0].batch_size == 5
        stats = scheduler.stats.to_dict()
        assert stats["inference_count"] == 6 and stats["execution_count"] == 2
        assert {b["batch_size"] for b in stats["batch_stats"]} == {1, 5}
        await scheduler.stop()

    asyncio.run(scenario())


def test_without_dynamic_batching_every_request_runs_alone() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(batching=None), [backend])
        backend.gate.clear()
        tasks = [asyncio.ensure_future(scheduler.infer(request(i, rows=2))) for i in range(4)]
        await asyncio.sleep(0.05)
        backend.gate.set()
        await asyncio.gather(*tasks)
        assert backend.batches == [2, 2, 2, 2]
        await scheduler.stop()

    asyncio.run(scenario())


def test_a_failing_batch_fails_each_of_its_requests_and_the_next_batch_runs() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(), [backend])
        backend.gate.clear()
        blocker = asyncio.ensure_future(scheduler.infer(request(1)))
        await asyncio.sleep(0.05)
        doomed = [asyncio.ensure_future(scheduler.infer(request(v))) for v in (-1, 3)]
        await asyncio.sleep(0.05)
        backend.gate.set()
        await blocker
        for task in doomed:
            with pytest.raises(InferenceFailed, match="poisoned input"):
                await task
        _, outputs = await scheduler.infer(request(4))
        np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 8, np.float32))
        assert scheduler.stats.fail[0] == 2
        assert scheduler.stats.fail_reasons == {"BACKEND": 2}
        assert scheduler.in_flight == 0
        await scheduler.stop()

    asyncio.run(scenario())


def test_queue_full_is_refused_at_once() -> None:
    async def scenario() -> None:
        backend = Doubler()
        batching = DynamicBatching(default_queue_policy=QueuePolicy(max_queue_size=2))
        scheduler = await _start(config(batching=batching, max_batch=1), [backend])
        backend.gate.clear()
        running = asyncio.ensure_future(scheduler.infer(request(0)))
        await asyncio.sleep(0.05)
        queued = [asyncio.ensure_future(scheduler.infer(request(i))) for i in (1, 2)]
        await asyncio.sleep(0)
        with pytest.raises(Unavailable, match="queue is full"):
            await scheduler.infer(request(3))
        assert scheduler.stats.fail_reasons == {"REJECTED": 1}
        backend.gate.set()
        await asyncio.gather(running, *queued)
        await scheduler.stop()

    asyncio.run(scenario())


def test_preserve_ordering_answers_in_arrival_order_across_instances() -> None:
    class Slow(Backend):
        def run(self, inputs, output_names):
            # the first request is the slowest, so without ordering it would finish last
            value = float(inputs["x"][0, 0])
            threading.Event().wait(0.2 if value == 0 else 0.01)
            return {"y": inputs["x"]}

    async def scenario() -> None:
        batching = DynamicBatching(preserve_ordering=True)
        scheduler = await _start(config(batching=batching, max_batch=1, instances=3),
                                 [Slow(), Slow(), Slow()])
        finished: list[int] = []

        async def one(i: int) -> None:
            await scheduler.infer(request(i))
            finished.append(i)

        await asyncio.gather(*(one(i) for i in range(3)))
        assert finished == [0, 1, 2]
        await scheduler.stop()

    asyncio.run(scenario())


def test_stop_answers_queued_requests_then_refuses_new_ones() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(batching=DynamicBatching(max_queue_delay_us=10_000_000)),
                                 [backend])
        # a 10 s delay would hold this request; stopping must run it at once
        pending = asyncio.ensure_future(scheduler.infer(request(7)))
        await asyncio.sleep(0.05)
        assert not pending.done()
        await asyncio.wait_for(scheduler.stop(), 5)
        _, outputs = await pending
        np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 14, np.float32))
        with pytest.raises(Unavailable):
            await scheduler.infer(request(1))

    asyncio.run(scenario())


def test_cancelled_request_is_dropped_before_it_runs() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(max_batch=1), [backend])
        backend.gate.clear()
        running = asyncio.ensure_future(scheduler.infer(request(1)))
        await asyncio.sleep(0.05)
        abandoned = asyncio.ensure_future(scheduler.infer(request(2)))
        await asyncio.sleep(0)
        abandoned.cancel()
        await asyncio.sleep(0.01)
        backend.gate.set()
        await running
        await asyncio.sleep(0.05)
        assert backend.batches == [1]  # request 2 never reached the backend
        assert scheduler.stats.fail_reasons == {"CANCELED": 1}
        assert scheduler.in_flight == 0 and scheduler.queue_depth == 0
        await scheduler.stop()

    asyncio.run(scenario())


def test_drain_flushes_delayed_requests_and_refuses_new_ones() -> None:
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(batching=DynamicBatching(max_queue_delay_us=10_000_000)),
                                 [backend])
        pending = [asyncio.ensure_future(scheduler.infer(request(i))) for i in (1, 2)]
        await asyncio.sleep(0.05)
        assert not any(p.done() for p in pending)  # held by the 10 s delay
        scheduler.drain()
        with pytest.raises(Unavailable):
            await scheduler.infer(request(3))
        results = await asyncio.wait_for(asyncio.gather(*pending), 5)
        assert [float(out["y"][0, 0]) for _, out in results] == [2.0, 4.0]
        assert backend.batches == [2]
        await scheduler.stop()

    asyncio.run(scenario())


def test_preserve_ordering_holds_a_failure_behind_earlier_answers() -> None:
    class FailSecond(Backend):
        def run(self, inputs, output_names):
            value = float(inputs["x"][0, 0])
            threading.Event().wait(0.2 if value == 0 else 0.01)
            if value == 1:
                raise RuntimeError("second one fails")
            return {"y": inputs["x"]}

    async def scenario() -> None:
        batching = DynamicBatching(preserve_ordering=True)
        scheduler = await _start(config(batching=batching, max_batch=1, instances=2),
                                 [FailSecond(), FailSecond()])
        finished: list[str] = []

        async def one(i: int) -> None:
            try:
                await scheduler.infer(request(i))
                finished.append(f"ok{i}")
            except InferenceFailed:
                finished.append(f"failed{i}")

        await asyncio.gather(one(0), one(1))
        assert finished == ["ok0", "failed1"]
        await scheduler.stop()

    asyncio.run(scenario())


class ThreadNoting(Backend):
    """y = 2x, noting the thread of every batch; ``slow_s`` makes the next batch compute
    that long."""

    inline = True

    def __init__(self) -> None:
        self.threads: list[int] = []
        self.slow_s = 0.0

    def run(self, inputs, output_names):
        self.threads.append(threading.get_ident())
        if self.slow_s:  # busy: a batch is timed by its thread's CPU time
            until = time.thread_time() + self.slow_s
            while time.thread_time() < until:
                pass
            self.slow_s = 0.0
        return {"y": inputs["x"] * 2}


async def _one_by_one(scheduler: Scheduler, count: int, rows: int = 1) -> None:
    for i in range(count):
        _, outputs = await scheduler.infer(request(i, rows))
        np.testing.assert_array_equal(outputs["y"], np.full((rows, 2), 2 * i, np.float32))


def test_short_batches_run_on_the_loop_once_a_streak_shows_them_short() -> None:
    async def scenario() -> None:
        backend = ThreadNoting()
        scheduler = Scheduler(config(), [backend], ModelStats("double", 1),
                              inline_limit_ns=50_000_000)
        await scheduler.start()
        loop_thread = threading.get_ident()
        await _one_by_one(scheduler, INLINE_STREAK + 5)
        assert loop_thread not in backend.threads[:INLINE_STREAK]
        assert backend.threads[INLINE_STREAK:] == [loop_thread] * 5
        assert scheduler.inline_batches == 5

        # more rows than any batch of the streak: a thread again, then the loop
        await _one_by_one(scheduler, 2, rows=4)
        assert backend.threads[-2] != loop_thread and backend.threads[-1] == loop_thread

        # one batch on the loop over the limit: back to threads for a streak twice as long
        backend.slow_s = 0.08
        await _one_by_one(scheduler, 1)
        assert backend.threads[-1] == loop_thread
        await _one_by_one(scheduler, 2 * INLINE_STREAK + 1)
        assert loop_thread not in backend.threads[-2 * INLINE_STREAK - 1:-1]
        assert backend.threads[-1] == loop_thread
        stats = scheduler.stats.to_dict()
        assert stats["execution_count"] == 3 * INLINE_STREAK + 9
        assert stats["inference_count"] == 3 * INLINE_STREAK + 9 + 2 * 3  # two of 4 rows
        await scheduler.stop()

    asyncio.run(scenario())


@pytest.mark.parametrize("inline_backend, limit_ns", [(False, 50_000_000), (True, 0)])
def test_batches_stay_on_threads_unless_backend_and_limit_allow(inline_backend: bool,
                                                                limit_ns: int) -> None:
    async def scenario() -> None:
        backend = ThreadNoting()
        backend.inline = inline_backend
        scheduler = Scheduler(config(), [backend], ModelStats("double", 1),
                              inline_limit_ns=limit_ns)
        await scheduler.start()
        await _one_by_one(scheduler, INLINE_STREAK + 5)
        assert threading.get_ident() not in backend.threads
        assert scheduler.inline_batches == 0
        await scheduler.stop()

    asyncio.run(scenario())


def test_a_failing_batch_on_the_loop_fails_its_requests_only() -> None:
    async def scenario() -> None:
        backend = Doubler()
        backend.inline = True
        scheduler = Scheduler(config(), [backend], ModelStats("double", 1),
                              inline_limit_ns=50_000_000)
        await scheduler.start()
        await _one_by_one(scheduler, INLINE_STREAK + 1)
        assert scheduler.inline_batches == 1
        with pytest.raises(InferenceFailed, match="poisoned"):
            await scheduler.infer(request(-1))
        await _one_by_one(scheduler, 3)  # the instance still serves
        await scheduler.stop()

    asyncio.run(scenario())


def test_submit_call_answers_through_the_callback_and_never_after_cancel() -> None:
    """The hot path's submit without a future: every request of a batch gets its own
    outputs (or error) through its callback, even when another request's callback
    raises; a cancelled request's callback is never called."""
    async def scenario() -> None:
        backend = Doubler()
        scheduler = await _start(config(), [backend])
        backend.gate.clear()
        answers: dict[int, object] = {}

        def keep(i: int) -> Callable[[object], None]:
            def on_done(result: object) -> None:
                answers[i] = result
                if i == 1:
                    raise RuntimeError("a caller's callback failed")
            return on_done

        scheduler.submit_call(request(0), keep(0))  # runs alone, held at the gate
        await asyncio.sleep(0.05)
        queued = [request(i) for i in range(1, 5)]
        for i, r in enumerate(queued, start=1):
            scheduler.submit_call(r, keep(i))
        scheduler.cancel(queued[2])  # request 3: its client left
        backend.gate.set()
        await asyncio.sleep(0.1)
        assert backend.batches == [1, 3]
        scheduler.submit_call(request(-1), keep(-1))  # a batch that fails
        await asyncio.sleep(0.1)
        assert set(answers) == {0, 1, 2, 4, -1}
        for i in (0, 1, 2, 4):
            _, outputs = answers[i]  # type: ignore[misc]
            np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 2 * i, np.float32))
        assert isinstance(answers[-1], InferenceFailed)
        assert scheduler.in_flight == 0 and scheduler.queue_depth == 0
        await scheduler.stop()

    asyncio.run(scenario())


def test_server_timing_gives_each_request_its_own_queue_time_and_its_batch_s_compute() -> None:
    from tradeoff.scheduling.request import Timings

    first = Timings(queue_ns=1_000_000, compute_input_ns=20_000, compute_infer_ns=300_000,
                    compute_output_ns=4_000, batch_size=2)
    second = Timings(queue_ns=2_500_000, compute_input_ns=20_000, compute_infer_ns=300_000,
                     compute_output_ns=4_000, batch_size=2)
    other = Timings(queue_ns=1_000_000, compute_input_ns=10_000, compute_infer_ns=700_000,
                    compute_output_ns=4_000, batch_size=5)
    assert first.server_timing() == (
        'queue;dur=1.000, compute_input;dur=0.020, compute_infer;dur=0.300, '
        'compute_output;dur=0.004, batch;desc="2"')
    assert second.server_timing().startswith("queue;dur=2.500, compute_input;dur=0.020,")
    assert other.server_timing() == (
        'queue;dur=1.000, compute_input;dur=0.010, compute_infer;dur=0.700, '
        'compute_output;dur=0.004, batch;desc="5"')
    other.route, other.cache, other.cache_ns = "mlp/2", "miss", 50_000
    assert other.server_timing().startswith(
        'route;desc="mlp/2", cache;desc=miss;dur=0.050, queue;dur=1.000,')


def test_a_replica_s_server_timing_is_passed_on_after_the_route() -> None:
    from tradeoff.scheduling.request import Timings

    relayed = Timings(route="pool@127.0.0.2:8000",
                      upstream='queue;dur=0.100, batch;desc="3"')
    assert relayed.server_timing() == \
        'route;desc="pool@127.0.0.2:8000", queue;dur=0.100, batch;desc="3"'
    relayed.upstream = ""  # the replica sent none (Triton): no zeros of the gateway's own
    assert relayed.server_timing() == 'route;desc="pool@127.0.0.2:8000"'


def test_a_replica_s_server_timing_is_passed_on_only_when_short_printable_text() -> None:
    from tradeoff.server.gateway import MAX_SERVER_TIMING, passed_on_timing

    entries = b'queue;dur=0.120, compute_infer;dur=1.5, batch;desc="4"'
    assert passed_on_timing(entries) == entries.decode()
    assert passed_on_timing(entries.decode()) == entries.decode()  # gRPC metadata: str
    assert passed_on_timing(None) == ""
    assert passed_on_timing(b"x" * (MAX_SERVER_TIMING + 1)) == ""
    for bad in (b"queue;dur=1\r\nset-cookie: a=b", b"queue;dur=1\x00", b"queue;dur=\xe9"):
        assert passed_on_timing(bad) == ""


def test_stop_returns_only_once_every_answer_is_given() -> None:
    """A stop that begins on the loop turn a batch finished, before that batch's answers
    are handed on (they go on the next turn), still gives them before it returns: an
    executor process tells its front end a model is unloaded right after, and an answer
    sent after that was lost."""
    async def scenario() -> tuple[list[object], list[int]]:
        scheduler = await _start(config(), [Doubler()])
        answers: list[object] = []
        given_when_stopped: list[int] = []
        stopped = asyncio.Event()
        tasks: list[asyncio.Future[None]] = []
        finish = scheduler._finish

        async def stop() -> None:
            await scheduler.stop()
            given_when_stopped.append(len(answers))  # in the step stop returned in
            stopped.set()

        def finish_then_stop(*args: object) -> None:
            tasks.append(asyncio.ensure_future(stop()))  # its first step runs first
            finish(*args)

        scheduler._finish = finish_then_stop  # type: ignore[method-assign]
        scheduler.submit_call(request(3.0), answers.append)
        await asyncio.wait_for(stopped.wait(), 5)
        return answers, given_when_stopped

    answers, given_when_stopped = asyncio.run(scenario())
    assert given_when_stopped == [1]
    (answer,) = answers
    _, outputs = answer  # type: ignore[misc]
    np.testing.assert_array_equal(outputs["y"], np.full((1, 2), 6.0, np.float32))
