"""stop_runs, the signal handler's way to stop a load run: it stops a run busy in protocol
callbacks (where uvloop would log an exception raised by the handler and carry on), and
refuses later runs until resume_runs."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import textwrap

import pytest

from tradeoff.bench.runner import resume_runs, run_coroutine, stop_runs
from tradeoff.errors import RunStopped

CHILD = textwrap.dedent("""
    import asyncio, signal, sys
    from tradeoff.bench.runner import run_coroutine, stop_runs
    from tradeoff.errors import RunStopped

    signal.signal(signal.SIGHUP, lambda _signum, _frame: stop_runs())

    class Echo(asyncio.Protocol):
        first = False

        def connection_made(self, transport):
            self.transport = transport
            if self.first:
                transport.write(b"x" * 100)

        def data_received(self, data):
            sum(range(300))  # Python work in the callback: where the signal tends to land
            self.transport.write(data)

    class Client(Echo):
        first = True

    async def ping_pong():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Echo, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        for _ in range(4):
            await loop.create_connection(Client, "127.0.0.1", port)
        print("ready", flush=True)
        await asyncio.sleep(30)

    try:
        run_coroutine(ping_pong())
    except RunStopped:
        sys.exit(3)
    sys.exit(0)
""")


@pytest.mark.parametrize("attempt", range(3))
def test_a_signal_stops_a_run_busy_in_protocol_callbacks(attempt: int) -> None:
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "ready\n"
        child.send_signal(1)  # SIGHUP
        _, stderr = child.communicate(timeout=20)
    finally:
        child.kill()
    assert child.returncode == 3, stderr


def test_after_stop_runs_a_run_is_refused_until_resume_runs() -> None:
    async def answer() -> int:
        await asyncio.sleep(0)
        return 42

    stop_runs()
    try:
        with pytest.raises(RunStopped, match="before it began"):
            run_coroutine(answer())
    finally:
        resume_runs()
    assert run_coroutine(answer()) == 42


def test_a_cancellation_that_is_not_a_stop_stays_a_cancellation() -> None:
    async def cancelled() -> None:
        task = asyncio.current_task()
        assert task is not None
        task.cancel()
        await asyncio.sleep(1)

    with pytest.raises(asyncio.CancelledError):
        run_coroutine(cancelled())
