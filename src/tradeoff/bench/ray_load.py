"""Load generators as Ray actors on the nodes of a Ray cluster.

Worker k runs on node k mod n (nodes in address order), so the load comes from every
node. Each worker times its own requests on its own monotonic clock; only the start is
shared. The coordinating process reads each worker's wall clock a few times (NTP-style:
the offset of the reading with the shortest round trip), asks every worker to start at
one instant of its clock, and after the run moves each worker's records onto its own
clock by the same offsets. The start skew reported is the largest half round trip of
those readings: how far apart the starts may have been.
"""

from __future__ import annotations

import time
from typing import Any

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.records import Records
from tradeoff.bench.runner import Runner, RunOutcome, run_coroutine
from tradeoff.bench.workers import START_MARGIN_S, WorkerRuns, merge_runs, split_spec
from tradeoff.errors import BenchSetupError, MissingDependency

__all__ = ["CLOCK_READINGS", "NAMESPACE", "LoadWorker", "connect", "run_ray_workers"]

CLOCK_READINGS = 5
NAMESPACE = "tradeoff-bench"


class LoadWorker:
    """One worker's share of the load (run as a Ray actor)."""

    def __init__(self, adapter: Adapter, requests: list[bytes], spec: LoadSpec) -> None:
        self.runner = Runner(adapter, requests, spec)

    def node(self) -> str:
        import ray

        return str(ray.util.get_node_ip_address())

    def wall_clock_ns(self) -> int:
        return time.time_ns()

    def run(self, start_wall_ns: int) -> tuple[RunOutcome, int]:
        """Run from ``start_wall_ns`` of this host's wall clock; the outcome, and the
        start on this worker's monotonic clock (its records' clock)."""
        start_ns = time.perf_counter_ns() + (start_wall_ns - time.time_ns())
        outcome = run_coroutine(self.runner.run(cold_start=False, start_at_ns=start_ns,
                                                read_server_stats=False))
        return outcome, start_ns


def connect(address: str) -> Any:
    """The ``ray`` module, connected to the cluster at ``address``."""
    try:
        import ray
    except ImportError:
        raise MissingDependency("--ray", "ray", "ray") from None
    if not ray.is_initialized():
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                     configure_logging=False)
        except ray.exceptions.AuthenticationError:
            raise BenchSetupError(f"--ray {address}: the Ray cluster refused this "
                                  "process's token: give the cluster's token as "
                                  "RAY_AUTH_TOKEN (or a file holding it as "
                                  "RAY_AUTH_TOKEN_PATH)") from None
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise BenchSetupError(f"--ray {address}: cannot reach the Ray cluster: {exc}"
                                  ) from None
    return ray


def _clock_offset(ray: Any, worker: Any) -> tuple[int, int]:
    """(worker's wall clock minus ours, half the round trip of that reading), ns."""
    best = None
    for _ in range(CLOCK_READINGS):
        sent = time.time_ns()
        theirs = ray.get(worker.wall_clock_ns.remote())
        back = time.time_ns()
        reading = (theirs - (sent + back) // 2, (back - sent) // 2)
        if best is None or reading[1] < best[1]:
            best = reading
    assert best is not None
    return best


def run_ray_workers(adapter: Adapter, requests: list[bytes], spec: LoadSpec,
                    cold_start: Records) -> RunOutcome:
    """Run ``spec.workers`` actors spread over the cluster's nodes from one instant, and
    merge their records into one outcome."""
    return merge_runs(spec, _run(adapter, requests, spec, split_spec(spec, spec.workers)),
                      cold_start)


def _run(adapter: Adapter, requests: list[bytes], spec: LoadSpec, shares: list[LoadSpec]
         ) -> WorkerRuns:
    assert spec.ray_address is not None
    ray = connect(spec.ray_address)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = sorted((n for n in ray.nodes() if n["Alive"]), key=lambda n: n["NodeManagerAddress"])
    remote = ray.remote(num_cpus=0)(LoadWorker)
    workers = [remote.options(scheduling_strategy=NodeAffinitySchedulingStrategy(
        nodes[k % len(nodes)]["NodeID"], soft=False)).remote(adapter, requests, share)
        for k, share in enumerate(shares)]
    try:
        placed = ray.get([w.node.remote() for w in workers], timeout=120)
        clocks = [_clock_offset(ray, w) for w in workers]
        start_wall = time.time_ns() + int(START_MARGIN_S * 1e9)
        mono_start = time.perf_counter_ns() + (start_wall - time.time_ns())
        runs = [w.run.remote(start_wall + offset) for w, (offset, _) in
                zip(workers, clocks, strict=True)]
        time.sleep(max(start_wall + int(spec.warmup_s * 1e9) - time.time_ns(), 0) / 1e9)
        server_before = adapter.server_stats()
        try:
            done = ray.get(runs, timeout=(spec.duration_s or 0) + spec.warmup_s + 3600)
        except ray.exceptions.RayError as exc:
            raise BenchSetupError(f"a Ray load worker failed: {exc}") from None
        server_after = adapter.server_stats()
    finally:
        for worker in workers:
            ray.kill(worker)
    outcomes = [outcome for outcome, _ in done]
    offsets = [mono_start - own_start for _, own_start in done]
    skew_ms = max(half for _, half in clocks) / 1e6
    hosts = [{"worker": k, "node": node, "requests": len(outcome.records),
              "clock_offset_ms": offset / 1e6, "uncertainty_ms": half / 1e6}
             for k, (node, outcome, (offset, half)) in
             enumerate(zip(placed, outcomes, clocks, strict=True))]
    notes = [f"{len(shares)} Ray workers on {len(set(placed))} node(s) "
             f"({', '.join(sorted(set(placed)))}); each timed its own requests; the starts "
             f"were at most {skew_ms:.3f} ms apart (clock offsets up to "
             f"{max(abs(h['clock_offset_ms']) for h in hosts):.3f} ms); client CPU is the "
             "busiest worker's"]
    return WorkerRuns(outcomes, offsets, server_before, server_after, notes, hosts, skew_ms)
