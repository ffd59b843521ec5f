"""The rate limit on client-driven log lines (server/logs.py)."""

from __future__ import annotations

import logging

import pytest

from tradeoff.server.logs import RateLimit


def record(msg: str, name: str = "uvicorn.error") -> logging.LogRecord:
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, None, None)


def test_a_flood_of_one_line_is_cut_to_the_burst(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr("tradeoff.server.logs.time.monotonic", lambda: clock[0])
    limit = RateLimit(burst=3, window_s=60)
    passed = [r for r in (record("Invalid HTTP request received.") for _ in range(1000))
              if limit.filter(r)]
    assert len(passed) == 4  # the burst, then one that says the rest are counted
    assert "counted, not logged" in passed[-1].getMessage()
    assert limit.filter(record("another line"))  # other lines are not affected
    clock[0] += 61
    later = record("Invalid HTTP request received.")
    assert limit.filter(later)
    assert "996 more like this in the last 60 s were not logged" in later.getMessage()
    assert limit.filter(record("Invalid HTTP request received."))


def test_the_same_text_on_another_logger_has_its_own_budget() -> None:
    limit = RateLimit(burst=1, window_s=60)
    assert limit.filter(record("x", "uvicorn.error"))
    assert limit.filter(record("x", "tradeoff.server"))
    assert limit.filter(record("x", "uvicorn.error"))  # the "counted" line
    assert not limit.filter(record("x", "uvicorn.error"))


def test_lines_that_differ_after_their_first_line_share_a_budget() -> None:
    """asyncio writes a task's repr on the lines after "Task exception was never
    retrieved": each is unique, and each would pass a limit keyed on the whole text."""
    limit = RateLimit(burst=2, window_s=60)
    passed = sum(limit.filter(record(f"Task exception was never retrieved\nfuture: <Task {i}>",
                                     "asyncio")) for i in range(50))
    assert passed == 3


def test_operator_lines_are_not_limited() -> None:
    """Model loads log on tradeoff.server, which carries no limit: 15 models, 15 lines."""
    import logging as logging_module

    from tradeoff.server.logs import install_rate_limit

    install_rate_limit()
    server = logging_module.getLogger("tradeoff.server")
    assert not any(isinstance(f, RateLimit) for f in server.filters)
    assert any(isinstance(f, RateLimit)
               for f in logging_module.getLogger("tradeoff.server.requests").filters)
