"""The replicas of one Ray Serve deployment, kept in step through one Ray actor.

Ray Serve's proxy sends each request to one replica, so a repository load or unload, or
a statistics request, reaches only one of them. The replica that gets it works on its own
models first, then tells the others through :class:`ReplicaCoordinator`, a Ray actor
owned by ``tradeoff serve --ray``:

- a load or unload becomes a numbered change; every replica long-polls the coordinator,
  applies what it has not applied and acknowledges it, and the first replica answers its
  client once all live replicas did (or names those that failed);
- the coordinator keeps the last change of each model, so a replica that Ray starts
  later (a replacement, or autoscaling) replays them and serves the same models;
- a statistics request is asked of every live replica through the same poll, and the
  answers are summed;
- a replica that leaves (it stopped, or died and ``serve --workers`` started another)
  leaves its counters behind: the counters and histograms of the last ``/metrics`` it
  answered are counted in every later one, so the server's counters do not step back.

A replica that has not polled for ``LIVE_S`` seconds is taken for dead and not waited for.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from tradeoff.errors import InferenceFailed
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.metrics import counts_only

__all__ = [
    "APPLY_TIMEOUT_S",
    "GATHER_TIMEOUT_S",
    "LIVE_S",
    "POLL_S",
    "ReplicaCoordinator",
    "ReplicaLink",
]

log = logging.getLogger("tradeoff.server")

POLL_S = 2.0  # longest a poll waits for news
LIVE_S = 10.0  # a replica not heard from this long is taken for dead
APPLY_TIMEOUT_S = 120.0  # longest a load waits for the other replicas
GATHER_TIMEOUT_S = 5.0  # longest a statistics request waits for the other replicas


class ReplicaCoordinator:
    """The shared state of a deployment's replicas (run as a Ray actor, no CPU)."""

    def __init__(self) -> None:
        self.generation = 0
        self.latest: dict[str, dict[str, Any]] = {}  # model -> its last change
        self.members: dict[str, dict[str, Any]] = {}
        self.errors: dict[tuple[str, int], str] = {}
        self.mail: dict[str, list[dict[str, Any]]] = {}
        self.wake: dict[str, asyncio.Event] = {}
        self.answers: dict[tuple[int, str], dict[str, Any]] = {}
        self.news = asyncio.Event()  # set on every acknowledgement and answer
        self.queries = 0
        self.families: dict[str, list[dict[str, Any]]] = {}  # each one's last /metrics
        self.retired: list[list[dict[str, Any]]] = []  # the counts of those that left

    def _live(self, exclude: str | None = None) -> list[str]:
        now = time.monotonic()
        return [r for r, m in self.members.items()
                if r != exclude and not m["left"] and now - m["seen"] < LIVE_S]

    def _notify(self) -> None:
        self.news.set()
        self.news = asyncio.Event()

    async def register(self, replica: str, node: str, pid: int,
                       metrics_url: str | None) -> list[dict[str, Any]]:
        """A replica joins; it gets every model's last change to replay."""
        self.members[replica] = {"replica": replica, "node": node, "pid": pid,
                                 "metrics_url": metrics_url, "applied": 0,
                                 "seen": time.monotonic(), "left": False,
                                 "joined": time.time()}
        self.mail[replica] = []
        self.wake[replica] = asyncio.Event()
        return sorted(self.latest.values(), key=lambda c: c["generation"])

    async def poll(self, replica: str, applied: int) -> dict[str, Any]:
        """Changes after ``applied`` and queries for this replica, waiting up to
        ``POLL_S`` for either."""
        member = self.members.get(replica)
        if member is None or member["left"]:
            return {"changes": [], "queries": [], "known": False}
        member["seen"] = time.monotonic()
        if self.generation <= applied and not self.mail[replica]:
            self.wake[replica].clear()
            try:
                await asyncio.wait_for(self.wake[replica].wait(), POLL_S)
            except asyncio.TimeoutError:
                pass
            member["seen"] = time.monotonic()
        changes = sorted((c for c in self.latest.values() if c["generation"] > applied),
                         key=lambda c: c["generation"])
        queries, self.mail[replica] = self.mail[replica], []
        return {"changes": changes, "queries": queries, "known": True}

    async def acknowledge(self, replica: str, generation: int, error: str | None) -> None:
        member = self.members.get(replica)
        if member is not None:
            member["applied"] = max(member["applied"], generation)
            member["seen"] = time.monotonic()
        if error is not None:
            self.errors[(replica, generation)] = error
        self._notify()

    async def publish(self, origin: str, change: dict[str, Any]) -> int:
        """Record a change the origin has applied; the others pick it up on their poll."""
        self.generation += 1
        self.latest[change["model"]] = {**change, "generation": self.generation,
                                        "origin": origin}
        if origin in self.members:
            self.members[origin]["applied"] = self.generation
        for event in self.wake.values():
            event.set()
        return self.generation

    async def wait_applied(self, generation: int, timeout_s: float) -> dict[str, str]:
        """Wait until every live replica applied ``generation``; the replicas that failed
        it or did not apply it in time, with why."""
        deadline = time.monotonic() + timeout_s
        while True:
            behind = [r for r in self._live() if self.members[r]["applied"] < generation]
            left = deadline - time.monotonic()
            if not behind or left <= 0:
                break
            try:
                await asyncio.wait_for(self.news.wait(), min(left, POLL_S))
            except asyncio.TimeoutError:
                pass
        failed = {r: self.errors[(r, generation)] for r in self.members
                  if (r, generation) in self.errors}
        failed.update({r: f"did not apply it within {timeout_s:g} s" for r in behind})
        return failed

    async def gather(self, origin: str, query: dict[str, Any], timeout_s: float
                     ) -> list[dict[str, Any]]:
        """Ask every other live replica ``query``; the answers that came in time."""
        self.queries += 1
        number = self.queries
        asked = self._live(exclude=origin)
        for replica in asked:
            self.mail[replica].append({**query, "query": number})
            self.wake[replica].set()
        deadline = time.monotonic() + timeout_s
        while True:
            got = [r for r in asked if (number, r) in self.answers]
            left = deadline - time.monotonic()
            if len(got) == len(asked) or left <= 0:
                break
            try:
                await asyncio.wait_for(self.news.wait(), left)
            except asyncio.TimeoutError:
                pass
        answers = [self.answers.pop((number, r)) for r in got]
        if query.get("kind") == "metrics":
            answers += [{"families": counts} for counts in self.retired]
        return answers

    async def answer(self, replica: str, number: int, document: dict[str, Any]) -> None:
        self.answers[(number, replica)] = document
        if document.get("families"):
            self.families[replica] = document["families"]
        self._notify()

    async def leave(self, replica: str) -> None:
        if replica in self.members:
            self.members[replica]["left"] = True
        last = self.families.pop(replica, None)
        if last:
            self.retired.append(counts_only(last))
        self._notify()

    async def replicas(self) -> list[dict[str, Any]]:
        """The replicas that are live now: id, node, pid, metrics URL, applied change."""
        return [dict(self.members[r]) for r in self._live()]


class ReplicaLink:
    """One replica's side: joins, follows the changes, answers queries, and is the
    :class:`~tradeoff.server.dataplane.Peers` of its data plane."""

    def __init__(self, coordinator: Any, dataplane: DataPlane, replica: str, node: str,
                 pid: int, metrics_url: str | None) -> None:
        self.coordinator = coordinator
        self.dataplane = dataplane
        self.replica = replica
        self.identity = (node, pid, metrics_url)
        self.applied = 0
        self.metrics: Callable[[], list[dict[str, Any]]] | None = None  # the registry's
        self._follower: asyncio.Task[None] | None = None
        self._answers: set[asyncio.Task[None]] = set()

    async def join(self) -> None:
        """Replay the changes made before this replica started, then follow."""
        changes = await self.coordinator.register.remote(self.replica, *self.identity)
        for change in changes:
            await self._apply(change)
        self._follower = asyncio.create_task(self._follow())
        self.dataplane.peers = self

    async def close(self) -> None:
        self.dataplane.peers = None
        if self._follower is not None:
            self._follower.cancel()
        try:
            await self.coordinator.leave.remote(self.replica)
        except Exception as exc:  # the coordinator went first
            log.debug("leaving the replica group: %s", exc)

    async def _follow(self) -> None:
        while True:
            try:
                news = await self.coordinator.poll.remote(self.replica, self.applied)
                if not news["known"]:  # taken for dead while stalled: join again
                    await self.coordinator.register.remote(self.replica, *self.identity)
                for change in news["changes"]:
                    await self._apply(change)
                for query in news["queries"]:
                    task = asyncio.create_task(self._answer(query))
                    self._answers.add(task)
                    task.add_done_callback(self._answers.discard)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("replica group: %s; retrying in 1 s", exc)
                await asyncio.sleep(1.0)

    async def _apply(self, change: dict[str, Any]) -> None:
        generation = change["generation"]
        error = None
        if change["origin"] != self.replica:
            try:
                if change["op"] == "load":
                    await self.dataplane.load_model(change["model"], change["parameters"],
                                                    publish=False, share=change.get("share"))
                else:
                    await self.dataplane.unload_model(change["model"], publish=False)
                log.info("replica group: %s %s", change["op"], change["model"])
            except Exception as exc:
                error = str(exc)
                log.error("replica group: %s %s failed: %s", change["op"], change["model"],
                          error)
        self.applied = max(self.applied, generation)
        await self.coordinator.acknowledge.remote(self.replica, generation, error)

    async def _answer(self, query: dict[str, Any]) -> None:
        document: dict[str, Any]
        try:
            if query["kind"] == "metrics":
                document = {"families": self.metrics() if self.metrics else []}
            else:
                document = self.dataplane.statistics(query["model"], query["version"])
        except Exception as exc:  # this replica has no such model (yet)
            document = {"model_stats": [], "families": [], "error": str(exc)}
        await self.coordinator.answer.remote(self.replica, query["query"], document)

    async def publish(self, change: dict[str, Any]) -> None:
        generation = await self.coordinator.publish.remote(self.replica, change)
        failed = await self.coordinator.wait_applied.remote(generation, APPLY_TIMEOUT_S)
        if failed:
            detail = "; ".join(f"replica {r}: {why}" for r, why in sorted(failed.items()))
            raise InferenceFailed(f"{change['op']} of {change['model']!r} done on this "
                                  f"replica but not on {len(failed)} other(s): {detail}")

    async def statistics(self, name: str | None, version: str | None
                         ) -> list[dict[str, Any]]:
        return await self.coordinator.gather.remote(
            self.replica, {"kind": "statistics", "model": name, "version": version},
            GATHER_TIMEOUT_S)

    async def metric_families(self) -> list[list[dict[str, Any]]]:
        """The other replicas' metric families (:func:`~tradeoff.server.metrics.families`)."""
        answers = await self.coordinator.gather.remote(self.replica, {"kind": "metrics"},
                                                       GATHER_TIMEOUT_S)
        return [answer.get("families", []) for answer in answers]
