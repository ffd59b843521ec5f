"""Clients that hold a server's connections on purpose, over raw sockets: a connection
from a chosen loopback address, a request head written by hand, a head dripped a byte at
a time. benchmarks/hostile_clients.py measures what they cost everyone else;
tests/integration/test_hostile_transport.py checks how the server answers them (it
imports this module as ``benchmarks.slow_clients``).

    slow = [connect(server, "127.0.0.3") for _ in range(10)]
    with HeadDrip(slow, head("/v2/models/mlp/infer", 2), every_s=0.2):
        ...                      # the server should close them with 408
"""

from __future__ import annotations

import contextlib
import socket
import threading

from tradeoff.server.process import ServerProcess


def connect(server: ServerProcess, source: str = "127.0.0.1") -> socket.socket:
    """A connection to the server's HTTP port from ``source`` (127.0.0.x: each address is
    a client of its own to the server's per-client limits)."""
    return socket.create_connection((server.host, server.http_port), timeout=60,
                                    source_address=(source, 0))


def head(path: str, length: int, method: str = "POST") -> bytes:
    """An HTTP/1.1 request head announcing a JSON body of ``length`` bytes."""
    return (f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
            f"\r\nContent-Length: {length}\r\n\r\n").encode()


class HeadDrip:
    """Sends ``message`` to every socket of ``socks`` one byte at a time, a byte each
    ``every_s`` seconds, on a thread, until stopped or the message is sent."""

    def __init__(self, socks: list[socket.socket], message: bytes, every_s: float) -> None:
        self.socks = socks
        self.message = message
        self.every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, daemon=True)

    def _drip(self) -> None:
        for index in range(len(self.message)):
            for sock in self.socks:
                with contextlib.suppress(OSError):  # the server closed it: that is allowed
                    sock.send(self.message[index:index + 1])
            if self._stop.wait(self.every_s):
                return

    def start(self) -> HeadDrip:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def __enter__(self) -> HeadDrip:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
