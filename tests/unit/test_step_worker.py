"""The engine's step thread: steps run in order, the next one is launched before the
last one's result is handed over, and errors reach the step's own waiter."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tradeoff.generate.step_worker import StepWorker


def step(events: list[str], name: str, gate: threading.Event | None = None
         ) -> Callable[[], Callable[[], str]]:
    def launch() -> Callable[[], str]:
        events.append(f"launch {name}")

        def read() -> str:
            if gate is not None:
                gate.wait(5)
            events.append(f"read {name}")
            return name
        return read
    return launch


def test_the_next_step_is_launched_before_a_result_is_handed_over() -> None:
    events: list[str] = []
    gate = threading.Event()
    worker: StepWorker[str] = StepWorker("test-step")
    first = worker.submit(step(events, "1", gate))
    second = worker.submit(step(events, "2"))  # queued while the first is read
    first.add_done_callback(lambda _: events.append("published 1"))
    gate.set()
    assert first.result(5) == "1" and second.result(5) == "2"
    worker.close()
    assert events == ["launch 1", "read 1", "launch 2", "published 1", "read 2"]


def test_a_step_alone_is_handed_over_once_read() -> None:
    events: list[str] = []
    worker: StepWorker[str] = StepWorker("test-step")
    assert worker.submit(step(events, "1")).result(5) == "1"
    assert worker.submit(step(events, "2")).result(5) == "2"
    worker.close()
    assert events == ["launch 1", "read 1", "launch 2", "read 2"]


def test_a_failed_launch_or_read_reaches_that_step_only() -> None:
    def bad_launch() -> Callable[[], str]:
        raise RuntimeError("launch failed")

    def bad_read() -> Callable[[], str]:
        def read() -> str:
            raise ValueError("read failed")
        return read

    worker: StepWorker[str] = StepWorker("test-step")
    launched = worker.submit(bad_launch)
    read = worker.submit(bad_read)
    fine = worker.submit(step([], "ok"))
    with pytest.raises(RuntimeError, match="launch failed"):
        launched.result(5)
    with pytest.raises(ValueError, match="read failed"):
        read.result(5)
    assert fine.result(5) == "ok"
    worker.close()


def test_close_finishes_what_is_queued_and_setup_runs_on_the_thread() -> None:
    names: list[str] = []
    worker: StepWorker[str] = StepWorker(
        "test-step", setup=lambda: names.append(threading.current_thread().name))
    futures = [worker.submit(step([], str(i))) for i in range(5)]
    worker.close()
    assert [f.result(0) for f in futures] == ["0", "1", "2", "3", "4"]
    assert names == ["test-step"]
