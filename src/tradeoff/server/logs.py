"""The server's log, bounded: a line that clients can cause (a malformed request, an
internal error) is written at most ``burst`` times a window, then counted.

Without it, every malformed request adds a warning line, and a client sending them in a
loop fills the disk the log goes to.

    install_rate_limit()   # on the loggers of the server and of uvicorn
"""

from __future__ import annotations

import logging
import time

__all__ = ["CLIENT_DRIVEN", "RateLimit", "install_rate_limit"]

# loggers whose lines a client's request can cause: the server logs what a request
# caused on tradeoff.server.requests; model loads and other operator lines stay on
# tradeoff.server, whole
CLIENT_DRIVEN = ("tradeoff.server.requests", "uvicorn.error", "asyncio")


class RateLimit(logging.Filter):
    """Pass at most ``burst`` records of one message template per ``window_s``; the first
    record of a later window says how many were dropped."""

    def __init__(self, burst: int = 10, window_s: float = 60.0) -> None:
        super().__init__()
        self.burst = burst
        self.window_s = window_s
        self._windows: dict[tuple[str, str], list[float | int]] = {}  # start, seen

    def filter(self, record: logging.LogRecord) -> bool:
        # a message's first line is its kind (asyncio puts object reprs on later lines)
        key = (record.name, str(record.msg).split("\n", 1)[0])
        now = time.monotonic()
        window = self._windows.get(key)
        if window is None or now - window[0] >= self.window_s:
            dropped = 0 if window is None else max(int(window[1]) - self.burst - 1, 0)
            self._windows[key] = [now, 1]
            if dropped:
                record.msg = f"{record.msg} ({dropped} more like this in the last " \
                             f"{self.window_s:g} s were not logged)"
            if len(self._windows) > 10_000:  # templates are few; this is a backstop
                self._windows.clear()
            return True
        window[1] += 1
        if window[1] == self.burst + 1:
            record.msg = f"{record.msg} (more like this in the next " \
                         f"{self.window_s - (now - window[0]):.0f} s are counted, not logged)"
            return True
        return window[1] <= self.burst


def install_rate_limit(burst: int = 10, window_s: float = 60.0) -> None:
    """Put one :class:`RateLimit` on each client-driven logger."""
    limit = RateLimit(burst, window_s)
    for name in CLIENT_DRIVEN:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RateLimit) for f in logger.filters):
            logger.addFilter(limit)
