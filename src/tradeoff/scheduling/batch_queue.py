"""Triton's dynamic batching rules as a pure data structure (no threads, no event loop).

The caller passes the time in, which keeps every rule testable with a fake clock.

Rules (see docs/batching.md):

* Requests wait in one FIFO per priority level (level 1 is the highest); a request whose
  queue-policy timeout expired with ``timeout_action: DELAY`` moves to its level's
  delayed FIFO, served after the level's other requests; with ``REJECT`` it leaves the
  queue with a timeout error.
* A batch is taken from the head, in order, while the rows fit in ``max_batch_size`` and
  the non-batch dims equal those of the first request. It never skips a request.
* Until the oldest request has waited ``max_queue_delay_microseconds``: the largest prefix
  whose rows are a ``preferred_batch_size`` goes at once; so does the prefix before the
  request that would take the batch past the largest preferred size. Otherwise the batch
  goes at once when it cannot grow (full, the next request does not fit, or it reached
  the largest preferred size), or when the delay is 0; else the batcher waits.
* Once the delay has passed, everything taken goes, up to ``max_batch_size``.
* With the adaptive batcher (:mod:`tradeoff.scheduling.adaptive`) the delay and a cap on
  the batch's rows (``cap``, at most ``max_batch_size``) change as the load does.
* A priority level may have a delay of its own (parameters
  ``priority_N_max_queue_delay_microseconds``): a batch waits no longer than the shortest
  delay of the requests it holds, so a latency-class request (delay 0) goes at once and
  takes whatever is queued with it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

from tradeoff.errors import InvalidInput, Unavailable
from tradeoff.repository.config import DynamicBatching, QueuePolicy
from tradeoff.scheduling.priority import TensorPriority
from tradeoff.scheduling.request import InferenceRequest

__all__ = ["BatchQueue"]


class BatchQueue:
    """Pending requests of one model, and the decision of what to run next."""

    def __init__(self, model: str, max_batch_size: int, batching: DynamicBatching | None) -> None:
        self.model = model
        self.batching = batching is not None and max_batch_size > 0
        self.max_rows = max(max_batch_size, 1)
        self.cap = self.max_rows  # rows a batch may take now (the adaptive batcher lowers it)
        cfg = batching or DynamicBatching()
        self.delay_ns = cfg.max_queue_delay_us * 1000
        self.preferred = tuple(sorted(cfg.preferred_batch_sizes))
        self.max_preferred = self.preferred[-1] if self.preferred else self.max_rows
        self.levels = max(cfg.priority_levels, 1)
        self.default_level = cfg.default_priority_level or 1
        self.policies: list[QueuePolicy] = [cfg.policy_for(level)
                                            for level in range(1, self.levels + 1)]
        # a level's own delay (ns), or None: the model's (which the adaptive batcher moves)
        self.level_delay_ns = [None if level not in cfg.priority_queue_delay_us
                               else cfg.priority_queue_delay_us[level] * 1000
                               for level in range(1, self.levels + 1)]
        self.level_delays = bool(cfg.priority_queue_delay_us)
        # a queued request's priority: its level's, by index
        self._level_priority = [TensorPriority(level) for level in range(1, self.levels + 1)]
        self._queues: list[deque[InferenceRequest]] = [deque() for _ in range(self.levels)]
        self._delayed: list[deque[InferenceRequest]] = [deque() for _ in range(self.levels)]
        self._with_deadline = 0
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def level_of(self, priority: TensorPriority) -> int:
        """0-based queue index of a request ``priority``.

        As in Triton, 0 and levels beyond ``priority_levels`` mean the default level.
        """
        level = priority if 1 <= priority <= self.levels else self.default_level
        return level - 1

    def push(self, request: InferenceRequest, now_ns: int) -> None:
        """Queue a request, or raise :class:`Unavailable` when its level is full."""
        index = self.level_of(request.priority)
        if request.rows > self.max_rows:  # could never be taken: next_batch would return []
            raise InvalidInput(f"model {self.model!r}: a request of {request.rows} rows exceeds"
                               f" max_batch_size {self.max_rows}")
        policy = self.policies[index]
        waiting = len(self._queues[index]) + len(self._delayed[index])
        if policy.max_queue_size and waiting >= policy.max_queue_size:
            raise Unavailable(f"model {self.model!r} queue is full ({policy.max_queue_size} "
                              "requests waiting, max_queue_size); retry later")
        timeout_us = policy.default_timeout_us
        if request.timeout_us and policy.allow_timeout_override:
            # As in Triton: a request may shorten the model's timeout, never lengthen it,
            # and the parameter is ignored unless the policy allows it.
            timeout_us = (min(request.timeout_us, timeout_us) if timeout_us
                          else request.timeout_us)
        request.enqueue_ns = now_ns
        if timeout_us:
            request.deadline_ns = now_ns + timeout_us * 1000
            self._with_deadline += 1
        request.priority = self._level_priority[index]
        self._queues[index].append(request)
        self._size += 1

    def _pending(self) -> Iterator[InferenceRequest]:
        for normal, delayed in zip(self._queues, self._delayed, strict=True):
            yield from normal
            yield from delayed

    def expire(self, now_ns: int) -> list[InferenceRequest]:
        """Apply queue-policy timeouts; returns the requests rejected (REJECT action)."""
        if not self._with_deadline:
            return []
        rejected: list[InferenceRequest] = []
        for index, queue in enumerate(self._queues):
            if not any(r.deadline_ns is not None and r.deadline_ns <= now_ns for r in queue):
                continue
            keep: deque[InferenceRequest] = deque()
            for request in queue:
                if request.deadline_ns is None or request.deadline_ns > now_ns:
                    keep.append(request)
                    continue
                request.deadline_ns = None
                self._with_deadline -= 1
                if self.policies[index].timeout_action == "DELAY":
                    self._delayed[index].append(request)
                else:
                    rejected.append(request)
                    self._size -= 1
            self._queues[index] = keep
        return rejected

    def next_deadline(self) -> int | None:
        """Earliest queue-policy deadline still pending, if any."""
        if not self._with_deadline:
            return None
        return min(r.deadline_ns for q in self._queues for r in q if r.deadline_ns is not None)

    def drop_cancelled(self) -> list[InferenceRequest]:
        """Remove requests whose client went away; returns them."""
        removed: list[InferenceRequest] = []
        for queues in (self._queues, self._delayed):
            for index, queue in enumerate(queues):
                if any(r.cancelled for r in queue):
                    gone = [r for r in queue if r.cancelled]
                    queues[index] = deque(r for r in queue if not r.cancelled)
                    self._with_deadline -= sum(r.deadline_ns is not None for r in gone)
                    removed.extend(gone)
        self._size -= len(removed)
        return removed

    def next_batch(self, now_ns: int) -> tuple[list[InferenceRequest] | None, int | None]:
        """``(batch, None)`` to run now, or ``(None, wake_at_ns)`` to wait (None: empty)."""
        if not self._size:
            return None, None
        if not self.batching:
            return self._take(1), None

        count = rows = 0
        can_grow = True
        cap = min(self.cap, self.max_rows)
        largest = min(self.max_preferred, cap)
        best_preferred = 0  # requests in the batch to send when a preferred size is met
        first_key = None
        oldest = None
        due = None  # with priority delays: when the batch's most urgent request is due
        for request in self._pending():
            if first_key is None:
                first_key = request.shape_key
            else:
                if rows + request.rows > largest and not best_preferred:
                    # Past the largest preferred size: the batch so far is the one to send.
                    best_preferred = count
                if rows + request.rows > cap or request.shape_key != first_key:
                    can_grow = False
                    break
            count += 1
            rows += request.rows
            if oldest is None or request.enqueue_ns < oldest:
                oldest = request.enqueue_ns
            if self.level_delays:
                own = self.level_delay_ns[request.priority - 1]
                mine = request.enqueue_ns + (self.delay_ns if own is None else own)
                due = mine if due is None else min(due, mine)
            if rows in self.preferred:
                best_preferred = count
        assert oldest is not None
        if due is None:
            due = oldest + self.delay_ns
            immediate = not self.delay_ns
        else:
            immediate = due <= oldest  # a request of a level without delay
        delay_exceeded = not immediate and now_ns >= due
        if best_preferred and not delay_exceeded:
            return self._take(best_preferred), None
        if not can_grow or rows >= largest or delay_exceeded or immediate:
            return self._take(count), None
        return None, due

    def _take(self, count: int) -> list[InferenceRequest]:
        batch: list[InferenceRequest] = []
        for normal, delayed in zip(self._queues, self._delayed, strict=True):
            for queue in (normal, delayed):
                while queue and len(batch) < count:
                    request = queue.popleft()
                    if request.deadline_ns is not None:
                        self._with_deadline -= 1
                    batch.append(request)
            if len(batch) == count:
                break
        self._size -= len(batch)
        return batch

    def drain(self) -> list[InferenceRequest]:
        """Remove and return everything still queued."""
        batch = list(self._pending())
        for queue in (*self._queues, *self._delayed):
            queue.clear()
        self._size = 0
        self._with_deadline = 0
        return batch
