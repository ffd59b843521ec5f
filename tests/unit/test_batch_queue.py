"""Triton's dynamic batching rules, driven by a fake clock (the queue never reads time)."""

from __future__ import annotations

import pytest

from tradeoff.errors import InvalidInput, Unavailable
from tradeoff.repository.config import DynamicBatching, QueuePolicy
from tradeoff.scheduling.batch_queue import BatchQueue
from tradeoff.scheduling.request import InferenceRequest

US = 1_000  # nanoseconds per microsecond


class Clock:
    """Nanoseconds, moved by hand."""

    def __init__(self) -> None:
        self.now = 1_000_000_000

    def advance_us(self, us: int) -> int:
        self.now += us * US
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


class Named(InferenceRequest):
    """An InferenceRequest with a name, so that batches read as lists of names."""

    name = ""


def make(name: str, **fields) -> InferenceRequest:
    request = Named(inputs={}, **fields)
    request.name = name
    return request


def names(batch: list[InferenceRequest] | None) -> list[str] | None:
    return None if batch is None else [r.name for r in batch]  # type: ignore[attr-defined]


def queue(max_batch_size: int = 8, delay_us: int = 0) -> BatchQueue:
    return BatchQueue("m", max_batch_size, DynamicBatching(max_queue_delay_us=delay_us))


def push_all(q: BatchQueue, clock: Clock, *requests: InferenceRequest) -> None:
    for r in requests:
        q.push(r, clock.now)


def take_all(q: BatchQueue, now: int) -> list[list[str]]:
    """Every batch the queue sends at ``now``, until it wants to wait or is empty."""
    batches = []
    while True:
        batch, _ = q.next_batch(now)
        if batch is None:
            return batches
        batches.append(names(batch))


# --------------------------------------------------------------------- batch size


def test_empty_queue_has_nothing_and_no_wake_up(clock: Clock) -> None:
    q = queue()
    assert q.next_batch(clock.now) == (None, None)
    assert len(q) == 0


def test_largest_batch_up_to_max_batch_size(clock: Clock) -> None:
    q = queue(max_batch_size=4)
    push_all(q, clock, *(make(f"r{i}") for i in range(6)))
    assert len(q) == 6
    assert take_all(q, clock.now) == [["r0", "r1", "r2", "r3"], ["r4", "r5"]]
    assert len(q) == 0


def test_rows_of_a_request_all_count(clock: Clock) -> None:
    q = queue(max_batch_size=8, delay_us=1_000_000)
    push_all(q, clock, make("a", rows=3), make("b", rows=4), make("c", rows=2))
    # a+b = 7 rows; c would make 9: the batch cannot grow, so it goes now
    batch, wake = q.next_batch(clock.now)
    assert names(batch) == ["a", "b"] and wake is None
    # c alone waits for the delay
    assert q.next_batch(clock.now) == (None, clock.now + 1_000_000 * US)


def test_full_batch_goes_without_waiting(clock: Clock) -> None:
    q = queue(max_batch_size=4, delay_us=1_000_000)
    push_all(q, clock, make("a", rows=2), make("b", rows=2), make("c"))
    batch, wake = q.next_batch(clock.now)
    assert names(batch) == ["a", "b"] and wake is None


def test_one_request_of_max_rows_goes_alone(clock: Clock) -> None:
    q = queue(max_batch_size=4, delay_us=1_000_000)
    push_all(q, clock, make("big", rows=4), make("small"))
    assert names(q.next_batch(clock.now)[0]) == ["big"]


def test_request_larger_than_max_batch_size_is_refused(clock: Clock) -> None:
    q = queue(max_batch_size=4)
    with pytest.raises(InvalidInput, match="5 rows exceeds max_batch_size 4"):
        q.push(make("huge", rows=5), clock.now)
    assert len(q) == 0


# ------------------------------------------------------------------ preferred sizes


def test_largest_reachable_preferred_size_goes_at_once(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(4, 2),
                                           max_queue_delay_us=1_000_000))
    push_all(q, clock, *(make(f"r{i}") for i in range(5)))
    batch, wake = q.next_batch(clock.now)
    assert names(batch) == ["r0", "r1", "r2", "r3"] and wake is None
    # one left: no preferred size reachable, so it waits for the delay
    assert q.next_batch(clock.now) == (None, clock.now + 1_000_000 * US)


def test_preferred_prefix_smaller_than_what_is_queued(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(2,),
                                           max_queue_delay_us=1_000_000))
    push_all(q, clock, make("a"), make("b"), make("c"))
    assert names(q.next_batch(clock.now)[0]) == ["a", "b"]


def test_preferred_size_counts_rows(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(4,),
                                           max_queue_delay_us=1_000_000))
    push_all(q, clock, make("a", rows=3), make("b", rows=1), make("c", rows=1))
    assert names(q.next_batch(clock.now)[0]) == ["a", "b"]


def test_request_past_the_largest_preferred_size_sends_the_batch_before_it(
        clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(4,),
                                           max_queue_delay_us=500))
    push_all(q, clock, make("a", rows=3), make("b", rows=3))  # 3, then 6 > 4
    batch, wake = q.next_batch(clock.now)
    assert names(batch) == ["a"] and wake is None  # Triton's rule: no waiting
    start = clock.now
    assert q.next_batch(clock.now) == (None, start + 500 * US)  # b alone waits


def test_after_the_delay_everything_goes_even_past_preferred(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(2,),
                                           max_queue_delay_us=500))
    start = clock.now
    push_all(q, clock, make("a"), make("b"), make("c"))
    batch, _ = q.next_batch(start + 500 * US)
    assert names(batch) == ["a", "b", "c"]


def test_reaching_the_largest_preferred_size_sends_at_once(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(preferred_batch_sizes=(2, 4),
                                           max_queue_delay_us=1_000_000))
    push_all(q, clock, make("a", rows=3))
    assert q.next_batch(clock.now)[0] is None  # 3 rows: below every stop, waits
    q.push(make("b", rows=2), clock.now)  # 5 > 4: "a" alone is the batch to send
    assert names(q.next_batch(clock.now)[0]) == ["a"]


# ----------------------------------------------------------------------- delay


def test_partial_batch_waits_until_oldest_plus_delay(clock: Clock) -> None:
    q = queue(max_batch_size=8, delay_us=100)
    start = clock.now
    q.push(make("a"), clock.now)
    clock.advance_us(60)
    q.push(make("b"), clock.now)
    assert q.next_batch(clock.now) == (None, start + 100 * US)
    assert q.next_batch(start + 100 * US - 1) == (None, start + 100 * US)
    batch, wake = q.next_batch(start + 100 * US)
    assert names(batch) == ["a", "b"] and wake is None
    assert len(q) == 0


def test_zero_delay_sends_immediately(clock: Clock) -> None:
    q = queue(max_batch_size=8)
    q.push(make("a"), clock.now)
    batch, wake = q.next_batch(clock.now)
    assert names(batch) == ["a"] and wake is None


def test_push_records_enqueue_time(clock: Clock) -> None:
    q = queue()
    request = make("a")
    q.push(request, clock.now)
    assert request.enqueue_ns == clock.now


# ----------------------------------------------------------------------- shapes


def test_incompatible_shape_ends_the_batch_without_skipping(clock: Clock) -> None:
    q = queue(max_batch_size=8, delay_us=1_000)
    push_all(q, clock, make("a1", shape_key=((3,),)), make("a2", shape_key=((3,),)),
             make("b", shape_key=((5,),)), make("a3", shape_key=((3,),)))
    # a3 fits a1's shape but must not jump ahead of b
    assert take_all(q, clock.now) == [["a1", "a2"], ["b"]]
    # a3 alone can still grow: it waits for the delay
    assert q.next_batch(clock.now) == (None, clock.now + 1_000 * US)
    assert names(q.next_batch(clock.now + 1_000 * US)[0]) == ["a3"]


# ------------------------------------------------------------------- priorities


def prioritized(**policy) -> BatchQueue:
    return BatchQueue("m", 8, DynamicBatching(priority_levels=3, default_priority_level=2,
                                              **policy))


def test_higher_priority_level_first(clock: Clock) -> None:
    q = prioritized()
    push_all(q, clock, make("low", priority=3), make("default", priority=0),
             make("high1", priority=1), make("mid", priority=2), make("high2", priority=1))
    assert take_all(q, clock.now) == [["high1", "high2", "default", "mid", "low"]]


def test_priority_levels_order_one_request_batches(clock: Clock) -> None:
    q = BatchQueue("m", 1, DynamicBatching(priority_levels=2, default_priority_level=2))
    push_all(q, clock, make("d1"), make("h", priority=1), make("d2"))
    assert take_all(q, clock.now) == [["h"], ["d1"], ["d2"]]


def test_priority_zero_uses_default_level(clock: Clock) -> None:
    q = prioritized()
    request = make("a", priority=0)
    q.push(request, clock.now)
    assert request.priority == 2
    assert q.level_of(0) == 1  # 0-based index of level 2


@pytest.mark.parametrize("priority", [4, 100])
def test_priority_out_of_range_takes_the_default_level(clock: Clock, priority: int) -> None:
    q = prioritized()
    request = make("a", priority=priority)
    q.push(request, clock.now)
    assert request.priority == 2  # the default level, as Triton does
    assert len(q) == 1


def test_priority_on_model_without_levels(clock: Clock) -> None:
    q = queue()
    first, second = make("a", priority=1), make("b", priority=2)
    q.push(first, clock.now)  # the one level there is
    q.push(second, clock.now)
    assert first.priority == second.priority == 1


# ------------------------------------------------------------------ queue policy


def test_max_queue_size_refuses_with_unavailable(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(max_queue_size=2)))
    push_all(q, clock, make("a"), make("b"))
    with pytest.raises(Unavailable, match="queue is full") as info:
        q.push(make("c"), clock.now)
    assert info.value.status == 503
    assert len(q) == 2
    q.next_batch(clock.now)
    q.push(make("c"), clock.now)  # room again
    assert len(q) == 1


def test_max_queue_size_is_per_level(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(
        priority_levels=2, default_priority_level=2,
        priority_queue_policy={1: QueuePolicy(max_queue_size=1)}))
    q.push(make("h1", priority=1), clock.now)
    with pytest.raises(Unavailable):
        q.push(make("h2", priority=1), clock.now)
    push_all(q, clock, *(make(f"d{i}") for i in range(5)))  # level 2 has no limit
    assert len(q) == 6


def test_default_timeout_reject(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(
        max_queue_delay_us=10**9,
        default_queue_policy=QueuePolicy("REJECT", default_timeout_us=100)))
    start = clock.now
    a, b = make("a"), make("b")
    q.push(a, clock.now)
    clock.advance_us(50)
    q.push(b, clock.now)
    assert q.next_deadline() == start + 100 * US
    assert q.expire(start + 100 * US - 1) == []
    assert names(q.expire(start + 100 * US)) == ["a"]
    assert len(q) == 1
    assert q.next_deadline() == start + 150 * US
    assert names(q.expire(start + 200 * US)) == ["b"]
    assert len(q) == 0 and q.next_deadline() is None
    assert q.next_batch(start + 200 * US) == (None, None)


def test_no_timeout_means_no_deadline(clock: Clock) -> None:
    q = queue()
    q.push(make("a"), clock.now)
    assert q.next_deadline() is None
    assert q.expire(clock.now + 10**15) == []
    assert len(q) == 1


def test_default_timeout_delay_moves_behind_its_level(clock: Clock) -> None:
    q = BatchQueue("m", 1, DynamicBatching(
        default_queue_policy=QueuePolicy("DELAY", default_timeout_us=100)))
    start = clock.now
    q.push(make("late"), clock.now)
    clock.advance_us(50)
    q.push(make("other"), clock.now)
    clock.advance_us(10)
    q.push(make("new"), clock.now)
    assert q.expire(start + 100 * US) == []  # DELAY never rejects
    assert len(q) == 3
    assert q.next_deadline() == start + 150 * US  # "late" has none any more
    assert take_all(q, start + 100 * US) == [["other"], ["new"], ["late"]]


def test_delayed_request_joins_only_after_its_level(clock: Clock) -> None:
    q = BatchQueue("m", 4, DynamicBatching(
        default_queue_policy=QueuePolicy("DELAY", default_timeout_us=10)))
    q.push(make("d", rows=3), clock.now)
    q.expire(clock.advance_us(10))
    push_all(q, clock, make("n1", rows=2), make("n2", rows=2))
    # n1 + n2 fill the batch; d (3 rows) waits, though it arrived first
    assert take_all(q, clock.now) == [["n1", "n2"], ["d"]]


def test_delayed_request_stays_ahead_of_lower_levels(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(
        priority_levels=2, default_priority_level=2,
        priority_queue_policy={1: QueuePolicy("DELAY", default_timeout_us=10)}))
    start = clock.now
    push_all(q, clock, make("h_late", priority=1), make("low", priority=2))
    clock.advance_us(20)
    q.push(make("h_new", priority=1), clock.now)
    assert q.expire(start + 10 * US) == []
    assert take_all(q, clock.now) == [["h_new", "h_late", "low"]]


def test_delayed_request_counts_toward_max_queue_size(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(
        default_queue_policy=QueuePolicy("DELAY", default_timeout_us=10, max_queue_size=1)))
    q.push(make("a"), clock.now)
    q.expire(clock.advance_us(10))
    with pytest.raises(Unavailable):
        q.push(make("b"), clock.now)


def test_per_request_timeout_when_override_allowed(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        default_timeout_us=1_000, allow_timeout_override=True)))
    short, default = make("short", timeout_us=10), make("default")
    q.push(short, clock.now)
    q.push(default, clock.now)
    assert short.deadline_ns == clock.now + 10 * US
    assert default.deadline_ns == clock.now + 1_000 * US
    assert names(q.expire(clock.now + 10 * US)) == ["short"]


def test_per_request_timeout_cannot_lengthen_the_default(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        default_timeout_us=1_000, allow_timeout_override=True)))
    request = make("long", timeout_us=10_000_000)
    q.push(request, clock.now)
    assert request.deadline_ns == clock.now + 1_000 * US


def test_per_request_timeout_without_default(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        allow_timeout_override=True)))
    q.push(make("a", timeout_us=5), clock.now)
    assert q.next_deadline() == clock.now + 5 * US


def test_per_request_timeout_ignored_without_override(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        default_timeout_us=1_000)))
    request = make("a", timeout_us=10)
    q.push(request, clock.now)
    assert request.deadline_ns == clock.now + 1_000 * US  # the model's timeout, as Triton does


def test_taken_request_deadline_is_forgotten(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        default_timeout_us=100)))
    q.push(make("a"), clock.now)
    assert names(q.next_batch(clock.now)[0]) == ["a"]
    assert q.next_deadline() is None
    assert q.expire(clock.now + 10**9) == []


# --------------------------------------------------------------- cancel and drain


def test_drop_cancelled(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        default_timeout_us=100)))
    a, b, c = make("a"), make("b"), make("c")
    push_all(q, clock, a, b, c)
    assert q.drop_cancelled() == []
    b.cancelled = True
    assert q.drop_cancelled() == [b]
    assert len(q) == 2
    assert names(q.next_batch(clock.now)[0]) == ["a", "c"]
    assert q.next_deadline() is None


def test_drop_cancelled_keeps_deadlines_of_the_others(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(max_queue_delay_us=10**9, default_queue_policy=(
        QueuePolicy(default_timeout_us=100))))
    start = clock.now
    a = make("a")
    q.push(a, clock.now)
    clock.advance_us(50)
    q.push(make("b"), clock.now)
    a.cancelled = True
    q.drop_cancelled()
    assert q.next_deadline() == start + 150 * US
    assert names(q.expire(start + 150 * US)) == ["b"]


def test_drop_cancelled_from_delayed_requests(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(default_queue_policy=QueuePolicy(
        "DELAY", default_timeout_us=10)))
    a = make("a")
    push_all(q, clock, a, make("b", timeout_us=None))
    q.expire(clock.advance_us(10))  # both delayed now
    a.cancelled = True
    assert q.drop_cancelled() == [a]
    assert len(q) == 1
    assert take_all(q, clock.now) == [["b"]]


def test_drain_returns_everything_in_order(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(priority_levels=2, default_priority_level=2,
                                           default_queue_policy=QueuePolicy(
                                               default_timeout_us=100)))
    push_all(q, clock, make("d"), make("h", priority=1))
    assert names(q.drain()) == ["h", "d"]
    assert len(q) == 0
    assert q.next_deadline() is None
    assert q.next_batch(clock.now) == (None, None)


# --------------------------------------------------------------------- batching off


@pytest.mark.parametrize(("max_batch_size", "batching"), [
    (8, None),                                      # no dynamic_batching section
    (0, DynamicBatching(max_queue_delay_us=100)),   # model does not batch
])
def test_batching_off_one_request_per_batch(clock: Clock, max_batch_size: int,
                                            batching: DynamicBatching | None) -> None:
    q = BatchQueue("m", max_batch_size, batching)
    assert not q.batching
    push_all(q, clock, make("a"), make("b"), make("c"))
    assert take_all(q, clock.now) == [["a"], ["b"], ["c"]]


def test_batching_off_keeps_multi_row_requests_whole(clock: Clock) -> None:
    q = BatchQueue("m", 8, None)
    push_all(q, clock, make("a", rows=5), make("b", rows=2))
    assert take_all(q, clock.now) == [["a"], ["b"]]


def test_a_level_with_its_own_short_delay_does_not_wait_for_a_batch_to_fill(clock: Clock
                                                                            ) -> None:
    """Level 1 (latency) has delay 0, level 2 (throughput) 10 ms: a throughput request
    waits to batch; a latency request goes at once and takes the waiting one with it."""
    q = BatchQueue("m", 8, DynamicBatching(max_queue_delay_us=10_000, priority_levels=2,
                                           default_priority_level=2,
                                           priority_queue_delay_us={1: 0}))
    q.push(make("bulk"), clock.now)
    batch, wake = q.next_batch(clock.advance_us(100))
    assert batch is None and wake == clock.now - 100 * US + 10_000 * US
    q.push(make("urgent", priority=1), clock.advance_us(100))
    batch, _ = q.next_batch(clock.now)
    assert [r.name for r in batch or []] == ["urgent", "bulk"]


def test_a_level_with_a_shorter_delay_sets_the_batch_deadline(clock: Clock) -> None:
    q = BatchQueue("m", 8, DynamicBatching(max_queue_delay_us=10_000, priority_levels=2,
                                           default_priority_level=2,
                                           priority_queue_delay_us={1: 2_000}))
    q.push(make("bulk"), clock.now)
    q.push(make("urgent", priority=1), clock.advance_us(1_000))
    batch, wake = q.next_batch(clock.now)
    assert batch is None and wake == clock.now + 2_000 * US  # urgent's own 2 ms
    batch, _ = q.next_batch(clock.advance_us(2_000))
    assert [r.name for r in batch or []] == ["urgent", "bulk"]
    q.push(make("alone"), clock.now)  # no urgent request: the level's 10 ms again
    batch, wake = q.next_batch(clock.advance_us(5_000))
    assert batch is None and wake == clock.now + 5_000 * US
