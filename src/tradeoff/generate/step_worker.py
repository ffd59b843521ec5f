"""The thread that runs an engine's steps on the device, in the order they were queued.

A step comes as a ``launch`` callable that starts the device work and returns a ``read``
callable, which waits for that work and returns the step's result. The worker launches
step N+1 before it hands step N's result to whoever waits on it: the launching thread,
woken by N's result, then competes for the GIL and the core with a device that is
already busy, not with the launch of its next step.

    worker = StepWorker(name="engine-step", setup=lambda: torch.set_num_threads(4))
    future = worker.submit(lambda: (lambda: 42))   # launch, then read
    assert future.result() == 42
    worker.close()
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Generic, TypeVar

__all__ = ["StepWorker"]

T = TypeVar("T")

Launch = Callable[[], Callable[[], T]]


class StepWorker(Generic[T]):
    """One thread running queued steps: each step's ``launch``, then the previous step's
    result published, then its ``read``. ``setup`` runs first on the thread."""

    def __init__(self, name: str, setup: Callable[[], Any] | None = None) -> None:
        self._queue: queue.SimpleQueue[tuple[Launch[T], Future[T]] | None] = \
            queue.SimpleQueue()
        self._setup = setup
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, launch: Launch[T]) -> Future[T]:
        """Queue a step; its future holds what its ``read`` returns (or raises)."""
        future: Future[T] = Future()
        self._queue.put((launch, future))
        return future

    def close(self) -> None:
        """Stop once the queued steps are done."""
        self._queue.put(None)
        self._thread.join()

    def _run(self) -> None:
        if self._setup is not None:
            self._setup()
        done: _Outcome[T] | None = None  # a step read, its result not published yet
        while True:
            if done is None:
                item = self._queue.get()
            else:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:  # nothing to launch first
                    done.publish()
                    done = None
                    item = self._queue.get()
            if item is None:
                if done is not None:
                    done.publish()
                return
            launch, future = item
            outcome = _Outcome(future)
            try:
                read = launch()
            except BaseException as exc:  # its waiter hears it
                outcome.error = exc
            if done is not None:
                done.publish()
            if outcome.error is None:
                try:
                    outcome.value = read()
                except BaseException as exc:  # its waiter hears it
                    outcome.error = exc
            done = outcome


class _Outcome(Generic[T]):
    """A step's result or error, held until it is handed to its future."""

    def __init__(self, future: Future[T]) -> None:
        self.future = future
        self.value: T | None = None
        self.error: BaseException | None = None

    def publish(self) -> None:
        if self.error is not None:
            self.future.set_exception(self.error)
        else:
            self.future.set_result(self.value)  # type: ignore[arg-type]
