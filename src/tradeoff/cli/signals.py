"""Stopping a long command on a signal so that it cleans up: SIGINT, SIGTERM and SIGHUP
alike (a supervisor or a closed terminal sends the last two), each exiting 128 + n.

    with SignalStop() as stop:        # tune serve: the search stops at its own points
        ...; stop.check()
    with RaiseOnSignal():             # plan: unwinds at once, as Ctrl-C does
        ...
"""

from __future__ import annotations

import signal
from typing import Any

__all__ = ["RaiseOnSignal", "SignalStop", "Stopped"]

WANTED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP: unwinds the command so that its ``finally`` blocks run
    (servers it started stopped, scratch removed, configs restored)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Handlers:
    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, _frame: object) -> None:
        raise NotImplementedError

    def __enter__(self) -> Any:
        self._previous = {sig: signal.signal(sig, self._handle) for sig in WANTED}
        return self

    def __exit__(self, *_exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


class SignalStop(_Handlers):
    """While entered, the first SIGINT, SIGTERM or SIGHUP stops the load run in progress
    and makes :meth:`check` raise :class:`Stopped`; later ones are ignored while the
    server's config is put back. The handler itself raises nothing (see
    :func:`~tradeoff.bench.runner.stop_runs`): the search stops at its own points."""

    def check(self) -> None:
        if self.signum is not None:
            raise Stopped(self.signum)

    def _handle(self, signum: int, _frame: object) -> None:
        from tradeoff.bench.runner import stop_runs

        if self.signum is None:
            self.signum = signum
            stop_runs()

    def __exit__(self, *exc: object) -> None:
        from tradeoff.bench.runner import resume_runs

        super().__exit__(*exc)
        resume_runs()


class RaiseOnSignal(_Handlers):
    """While entered, the first SIGINT, SIGTERM or SIGHUP raises :class:`Stopped` where
    the command is, as Ctrl-C raises KeyboardInterrupt; later ones are ignored, so the
    clean-up they set off runs to its end."""

    def _handle(self, signum: int, _frame: object) -> None:
        if self.signum is None:
            self.signum = signum
            raise Stopped(signum)
