"""What a batch's GIL hand-offs cost a served GPU model, reproduced on a CPU.

On an H200, BERT-base in bf16 ran 128 rows in 7.8 ms in process but 12.1 ms inside
`tradeoff serve` under 8,000 one-row requests/s, and 7.75 ms under 1,700 eight-row ones
(benchmarks/results/gpu_tensor_h200_run3.json). The batch's thread gives up the GIL while
kernels launch and while it waits on the stream, and takes it back from an event loop busy
with requests. This script serves a stand-in with that model's shape and cost curve: the
`synthetic` backend, whose batch sleeps (GIL free) in `gil_releases` parts. For each number
of hand-offs per batch, and for one-row and eight-row requests, it measures the stand-in's
batch in process (the ceiling: 128 rows over the median batch time, and the hand-offs
counted by ``gil_waits``, which gpu_tensor.py runs on a GPU) and served (`tradeoff serve`
pinned to one core, the load from this process on another, at twice the batch in rows),
interleaved and repeated, and reports served/ceiling with the server's own compute time
per batch. One variant runs the server with a lower GIL switch interval; the last ones
run the batches in an executor process (`--executors process`), and behind several front
ends (`--workers`), all on the server's core.

    .venv/bin/python benchmarks/gil_handoff.py --duration 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import server_and_client_cores

from tradeoff.backends.base import Backend
from tradeoff.backends.registry import InstanceSpec
from tradeoff.backends.synthetic import SyntheticBackend
from tradeoff.bench.adapters import V2Adapter
from tradeoff.bench.load import LoadSpec
from tradeoff.bench.session import run_benchmark
from tradeoff.server.process import ServerProcess

MAX_BATCH = 128
SEQUENCE = 128
# H200 bf16 BERT-base in process: 2.03 ms at batch 1, 7.78 ms at 128 (a straight line)
FIXED_MS, PER_ROW_MS = 1.9, 0.046

CONFIG = f"""name: "NAME"
backend: "synthetic"
max_batch_size: {MAX_BATCH}
input [ {{ name: "input_ids" data_type: TYPE_INT64 dims: [{SEQUENCE}] }},
        {{ name: "attention_mask" data_type: TYPE_INT64 dims: [{SEQUENCE}] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_INT64 dims: [{SEQUENCE}] }} ]
dynamic_batching {{ }}
"""


class SwitchIntervalServer(ServerProcess):
    """``tradeoff serve`` with ``sys.setswitchinterval`` set before it starts."""

    def __init__(self, repository: Path, interval_s: float, **kwargs: Any) -> None:
        super().__init__(repository, **kwargs)
        self.interval_s = interval_s

    def command(self) -> list[str]:
        cmd = super().command()
        start = cmd.index("-m")
        code = (f"import sys; sys.setswitchinterval({self.interval_s}); "
                "sys.argv[0] = 'tradeoff'; from tradeoff.cli import main; main()")
        return [*cmd[:start], "-c", code, *cmd[start + 2:]]


def write_model(repository: Path, releases: int) -> str:
    name = f"standin_gil{releases}"
    directory = repository / name
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.json").write_text(json.dumps({
        "inputs": [{"name": n, "datatype": "INT64", "shape": [-1, SEQUENCE]}
                   for n in ("input_ids", "attention_mask")],
        "outputs": [{"name": "OUTPUT0", "datatype": "INT64", "shape": [-1, SEQUENCE],
                     "copy_of": "input_ids"}],
        "cost": {"fixed_ms": FIXED_MS, "per_row_ms": PER_ROW_MS, "gil_releases": releases}}))
    (directory / "config.pbtxt").write_text(CONFIG.replace("NAME", name))
    return name


def in_process(repository: Path, name: str, seconds: float) -> dict[str, float]:
    """The stand-in's own run at the largest batch, in this process: alone (the ceiling)
    and beside a busy thread (its GIL hand-offs counted)."""
    backend = SyntheticBackend(InstanceSpec(name=name,
                                            path=repository / name / "1" / "model.json"))
    batch = {n: np.ones((MAX_BATCH, SEQUENCE), np.int64) for n in ("input_ids",
                                                                     "attention_mask")}
    waits = gil_waits(backend, batch, ["OUTPUT0"], seconds)
    return {**waits, "ceiling": MAX_BATCH / waits["alone_ms"] * 1e3}


def gil_waits(backend: Backend, feed: dict[str, np.ndarray], outputs: list[str],
              seconds: float) -> dict[str, float]:
    """A batch alone and beside a thread that runs Python without pause (an event loop
    that never waits), at a 5 ms GIL switch interval. Each time the batch's thread gives
    the GIL up for long enough, it waits about one interval to take it back, so the
    difference over the interval counts the batch's GIL hand-offs, the waits that a busy
    server's event loop makes longer. The count holds where the batch's own CPU threads do
    not share a core with that thread: a GPU host, or a CPU run with one intra-op thread
    and a core to spare."""
    interval = 0.005
    previous = sys.getswitchinterval()
    sys.setswitchinterval(interval)

    def median_ms() -> float:
        times, deadline = [], time.perf_counter() + seconds / 2
        while time.perf_counter() < deadline or len(times) < 5:
            started = time.perf_counter()
            backend.run(feed, outputs)
            times.append((time.perf_counter() - started) * 1e3)
        return statistics.median(times)

    stop = threading.Event()

    def spin() -> None:
        count = 0
        while not stop.is_set():
            count += 1

    try:
        alone = median_ms()
        spinner = threading.Thread(target=spin, daemon=True)
        spinner.start()
        try:
            beside = median_ms()
        finally:
            stop.set()
            spinner.join()
    finally:
        sys.setswitchinterval(previous)
    return {"alone_ms": alone, "beside_busy_thread_ms": beside,
            "gil_waits_per_batch": (beside - alone) / (interval * 1e3)}


def measure(server: ServerProcess, model: str, rows: int, duration: float) -> dict:
    concurrency = 2 * MAX_BATCH // rows
    result, _, _ = run_benchmark(V2Adapter(server.url, model, batch_size=rows, seed=1),
                                 LoadSpec(concurrency=concurrency, duration_s=duration,
                                          warmup_s=1.0))
    summary = result.summary
    parts = summary.server_ms or {}
    return {"samples_per_s": summary.inferences_per_s, "p50_ms": summary.latency("p50"),
            "errors": summary.errors, "concurrency": concurrency,
            "compute_infer_ms": (parts.get("compute_infer") or {}).get("p50"),
            "queue_ms": (parts.get("queue") or {}).get("p50"),
            "overhead_ms": (parts.get("overhead") or {}).get("p50")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0, help="seconds per point")
    parser.add_argument("--repeats", type=int, default=3, help="runs per point (median)")
    parser.add_argument("--releases", default="1,4,16", help="GIL hand-offs per batch")
    parser.add_argument("--switch-interval-ms", type=float, default=0.5,
                        help="the last variant's GIL switch interval (most hand-offs)")
    parser.add_argument("--process-releases", default="1,16",
                        help="hand-offs per batch also served with --executors process")
    parser.add_argument("--workers-releases", default="",
                        help="hand-offs per batch also served with --workers (front ends)")
    parser.add_argument("--workers", type=int, default=2, help="front ends of --workers")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/gil_handoff.json"))
    args = parser.parse_args()
    releases = [int(r) for r in args.releases.split(",")]
    server_cpu, client_cpu = server_and_client_cores()

    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        names = {r: write_model(repo, r) for r in releases}
        # the batch and the busy thread of the count each on a core of their own
        os.sched_setaffinity(0, {server_cpu, client_cpu})
        alone = {r: in_process(repo, names[r], 4.0) for r in releases}
        os.sched_setaffinity(0, {client_cpu})
        plain: tuple[str, ...] = ("--no-grpc",)
        variants = [(f"{r} per batch", names[r], r, None, plain) for r in releases]
        most = max(releases)
        variants.append((f"{most} per batch, switch {args.switch_interval_ms:g} ms",
                         names[most], most, args.switch_interval_ms / 1e3, plain))
        variants += [(f"{r} per batch, executor process", names[r], r, None,
                      (*plain, "--executors", "process"))
                     for r in (int(x) for x in args.process_releases.split(",") if x)]
        variants += [(f"{r} per batch, {args.workers} front ends", names[r], r, None,
                      (*plain, "--workers", str(args.workers)))
                     for r in (int(x) for x in args.workers_releases.split(",") if x)]
        runs: dict[tuple[str, int], list[dict]] = {}
        for repeat in range(args.repeats):
            for label, name, _, interval, extra in variants:
                server = ServerProcess(repo, cpus=str(server_cpu), extra_args=extra) \
                    if interval is None else \
                    SwitchIntervalServer(repo, interval, cpus=str(server_cpu),
                                         extra_args=extra)
                with server:
                    for rows in (1, 8):
                        point = measure(server, name, rows, args.duration)
                        runs.setdefault((label, rows), []).append(point)
                        print(f"[{repeat + 1}/{args.repeats}] {label:26s} rows {rows} "
                              f"{point['samples_per_s']:8.0f}/s compute "
                              f"{point['compute_infer_ms']} ms errors {point['errors']}",
                              flush=True)

    table = []
    for label, _, r, interval, _ in variants:
        for rows in (1, 8):
            points = runs[(label, rows)]
            row = {k: statistics.median(p[k] for p in points)
                   for k in ("samples_per_s", "p50_ms", "compute_infer_ms", "queue_ms",
                             "overhead_ms", "errors")}
            row.update(variant=label, releases=r, switch_interval_s=interval, rows=rows,
                       ceiling=alone[r]["ceiling"], batch_ms_in_process=alone[r]["alone_ms"],
                       gil_waits_counted=alone[r]["gil_waits_per_batch"],
                       served_over_ceiling=row["samples_per_s"] / alone[r]["ceiling"])
            table.append(row)
    print()
    print("| GIL hand-offs | counted | rows/request | in process, batch 128 | served compute | "
          "queue | outside the server | served | served / ceiling |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for t in table:
        print(f"| {t['variant']} | {t['gil_waits_counted']:.1f} | {t['rows']} | "
              f"{t['batch_ms_in_process']:.2f} ms | "
              f"{t['compute_infer_ms']:.2f} ms | {t['queue_ms']:.2f} ms | "
              f"{t['overhead_ms']:.2f} ms | {t['samples_per_s']:,.0f}/s | "
              f"**{t['served_over_ceiling']:.2f}** |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.gil_handoff/1",
                                     "command": " ".join(sys.argv), "rows": table},
                                    indent=1))
    print(f"\nwritten: {args.json}")


if __name__ == "__main__":
    main()
