"""Time flags and the one builder of LoadSpec: what each flag means when given, and when
left out."""

from __future__ import annotations

import math

import pytest

from tradeoff.bench.load import LOAD_DEFAULTS, LoadSpec, parse_duration


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("90s", 90.0), ("5m", 300.0), ("1h", 3600.0), ("1.5", 1.5),
    ("500ms", 0.5), (".5s", 0.5), (" 2 s ", 2.0), ("5M", 300.0), ("30m", 1800.0),
    (30.0, 30.0), (2, 2.0),
])
def test_durations_are_seconds_or_a_number_with_a_unit(text: str | float,
                                                       seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "   ", "x", "5x", "m", "1.2.3", "--5", "5mm", "nan",
                                  "NaN", "inf", "1e3", "5 minutes"])
def test_what_is_not_a_duration_says_what_to_write(text: str) -> None:
    with pytest.raises(ValueError, match=r"is not a duration; write 90 \(seconds\), "
                                         r"1\.5, 500ms, 90s, 5m or 1h$"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["-5", "-1m", "0", "0s", "0.0", -2.0])
def test_a_duration_is_more_than_zero(text: str | float) -> None:
    with pytest.raises(ValueError, match=r"a duration must be more than 0, e\.g\. 90s or 5m"):
        parse_duration(text)


def test_zero_is_allowed_where_asked_but_never_a_negative() -> None:
    assert parse_duration("0", allow_zero=True) == 0.0
    assert parse_duration("0s", allow_zero=True) == 0.0
    with pytest.raises(ValueError, match="must be 0 or more"):
        parse_duration("-1s", allow_zero=True)


@pytest.mark.parametrize("value", [math.nan, math.inf, "9" * 400])
def test_nan_and_infinite_durations_are_refused(value: str | float) -> None:
    with pytest.raises(ValueError, match="write 90"):
        parse_duration(value)


def test_builder_defaults_are_the_table() -> None:
    spec = LoadSpec.from_flags()
    assert spec.mode == "closed" and spec.concurrency == LOAD_DEFAULTS.concurrency == 1
    assert spec.arrival == LOAD_DEFAULTS.arrival == "constant"
    assert spec.warmup_s == LOAD_DEFAULTS.warmup_s == 0.0
    assert spec.timeout_s == LOAD_DEFAULTS.timeout_s == 30.0
    assert spec.max_connections == LOAD_DEFAULTS.max_connections == 1024
    assert spec.seed == LOAD_DEFAULTS.seed == 0
    assert spec.stability_percent == 10.0 and spec.max_windows == 10
    assert spec.duration_s is None and spec.requests is None and not spec.fixed_length


def test_builder_takes_given_values_even_when_falsy() -> None:
    spec = LoadSpec.from_flags(rate=50.0, arrival="poisson", warmup_s=2.0, seed=0,
                               duration_s=2.0, window_s=0.5, timeout_s=0.5)
    assert spec.mode == "open" and spec.concurrency is None and spec.rate == 50.0
    assert spec.arrival == "poisson" and spec.warmup_s == 2.0 and spec.timeout_s == 0.5
    assert spec.duration_s == 2.0 and spec.window_s == 0.5


def test_builder_uses_the_command_length_only_without_duration_or_requests() -> None:
    point = LOAD_DEFAULTS.point_duration_s
    assert LoadSpec.from_flags(default_duration_s=point).duration_s == point
    assert LoadSpec.from_flags(duration_s=2.0, default_duration_s=point).duration_s == 2.0
    counted = LoadSpec.from_flags(requests=10, default_duration_s=point)
    assert counted.requests == 10 and counted.duration_s is None
    trace = LoadSpec.from_flags(intervals=(0.0, 0.1))
    assert trace.mode == "trace" and trace.concurrency is None


def test_builder_refuses_two_load_modes() -> None:
    with pytest.raises(ValueError, match="exactly one of --concurrency, --rate"):
        LoadSpec.from_flags(concurrency=2, rate=10.0)
