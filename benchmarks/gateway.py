"""The gateway's policies and its cost, measured side by side on loopback (replicas on
addresses of their own, 127.0.0.2 and up; servers on core 0, the load on core 1).

Scenarios (--scenario, several comma-separated):

* `prefix`: 4 replicas of the synthetic LLM with prefix caching, each cache a quarter of
  the prompts' working set. 16 system prompts of 512 tokens, each followed by a distinct
  user text; Poisson arrivals. Gateways with policy `prefix` and `round_robin`, and one
  replica with four times the cache and slots taking all of it (the reference), rounds
  interleaved. Per target: the replicas' prefix-cache hit ratio (their own counters),
  TTFT p50/p99, and how far the busiest replica's in-flight count was above the mean
  (the gateway's statistics, sampled every 50 ms). Each target runs on replicas (and a
  gateway) started for it: empty caches, an empty prefix index.
* `skew`: the same with one system prompt taking half the requests: does prefix routing
  keep the busiest replica within 1.5x of the mean?
* `slow`: 4 replicas of a synthetic tensor model (2 ms a request), one of them 5x slower.
  Gateways with `least_outstanding` and `round_robin`; p50 and p99 each.
* `cost`: `mlp` (and `tiny`) direct and through a gateway with one replica, at the same
  concurrency; the synthetic LLM direct and through the gateway, streamed. The gateway
  shares the load's core.
* `cost-own-core`: the same with the gateway on a core of its own (core 0) and the
  replica beside the load (core 1) in both runs: the hop's cost when the gateway has a
  core, which a machine of two cannot give it besides the replica's and the load's.
* `floor`: `mlp` direct, through benchmarks/bare_relay.py (a relay that does nothing but
  pass bytes on: the least a Python hop costs) and through the gateway, the hops on a
  core of their own; with the replica's mean batch.
* `pytriton`: `mlp` on Triton (PyTriton, its own venv, installed as benchmarks/peers.py
  does) behind the gateway, against it directly: a replica that is not ours.

    .venv/bin/python benchmarks/gateway.py --scenario prefix,skew,slow,cost --rounds 3
    .venv/bin/python benchmarks/gateway.py --scenario cost --duration 5 --rounds 1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

from harness import command_line, cpu_seconds, server_and_client_cores, write_results

from tradeoff.models import build_repository
from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess, free_ports, started

HOSTS = [f"127.0.0.{i}" for i in range(2, 6)]
LLM = "synthetic-llm"
SYSTEM_TOKENS = 512
BLOCK = 16
OUTPUT_TOKENS = 32
SLOTS = 8
# per replica: four system prompts' worth of cache, and room for two sequences running
# (the load keeps one or two at each): a quarter of the prompts' working set, so a
# replica sent every prompt evicts what it cached
SEQUENCE_BLOCKS = (SYSTEM_TOKENS + 64 + OUTPUT_TOKENS) // BLOCK + 1
REPLICA_BLOCKS = 4 * SYSTEM_TOKENS // BLOCK + 2 * SEQUENCE_BLOCKS


def get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())


def metric(server: ServerProcess, name: str) -> float:
    """The sum of a family's samples in a server's /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name) and not line.startswith("#"))


def bench(url: str, model: str, cpu: int, args: argparse.Namespace, *extra: str
          ) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = ["taskset", "-c", str(cpu), sys.executable, "-m", "tradeoff", "bench", url,
                   "--model", model, "--duration", f"{args.duration:g}", "--warmup",
                   f"{args.warmup:g}", "--json", out.name, *extra]
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(command)}:\n{done.stderr[-2000:]}")
        return json.loads(Path(out.name).read_text())


def gateway_repo(root: Path, name: str, pool: dict[str, Any]) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    (root / name / "router.yaml").write_text(json.dumps(
        {"pools": {f"{name}_pool": pool}, "routes": [{"to": f"{name}_pool"}]}))


class InFlightSampler:
    """The gateway's per-replica in-flight counts, read every 50 ms during a run."""

    def __init__(self, gateway: ServerProcess, router: str) -> None:
        self.url = f"{gateway.url}/v2/models/{router}/stats"
        self.samples: list[list[int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            doc = get_json(self.url)
            replicas = doc["model_stats"][0]["pools"][0]["replicas"]
            self.samples.append([r["in_flight"] for r in replicas])

    def __enter__(self) -> InFlightSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def imbalance(self) -> dict[str, float | None]:
        """The busiest replica's mean in-flight count over the replicas' mean, and the
        95th percentile of the same ratio sample by sample (samples with load only)."""
        if not self.samples:
            return {"busiest_over_mean": None, "p95_sample_ratio": None}
        means = [statistics.fmean(column) for column in zip(*self.samples, strict=True)]
        overall = statistics.fmean(means)
        ratios = sorted(max(s) / statistics.fmean(s) for s in self.samples if sum(s))
        return {"busiest_over_mean": max(means) / overall if overall else None,
                "p95_sample_ratio": ratios[int(0.95 * (len(ratios) - 1))] if ratios else None}


# ---------------------------------------------------------------- prefix and skew

def prompts_file(path: Path, count: int, skew: bool, seed: int = 7) -> Path:
    """16 system prompts of SYSTEM_TOKENS characters (one token each), each followed by
    a distinct user text; with ``skew`` the first takes half the requests."""
    rng = random.Random(seed)
    systems = []
    for index in range(16):
        words = " ".join(rng.choice(["alpha", "beta", "gamma", "delta", "omega", "sigma"])
                         for _ in range(200))
        systems.append(f"system {index:02d}: {words}"[:SYSTEM_TOKENS])
    lines = []
    for number in range(count):
        index = 0 if skew and rng.random() < 0.5 else rng.randrange(16)
        lines.append(json.dumps({"prompt": f"{systems[index]} user {number}: "
                                           f"{rng.randrange(10**9)}",
                                 "max_tokens": OUTPUT_TOKENS}))
    path.write_text("\n".join(lines) + "\n")
    return path


def llm_replica(root: Path, host: str, cpu: int, blocks: int, slots: int) -> ServerProcess:
    write_synthetic_llm(root, model={"step_ms": 2.0, "per_token_ms": 0.02},
                        max_num_seqs=slots, num_blocks=blocks, block_size=BLOCK,
                        prefix_caching=True, max_num_batched_tokens=2048)
    return ServerProcess(root, host=host, cpus=str(cpu))


def hit_ratio(replicas: list[ServerProcess], before: list[tuple[float, float]]) -> float:
    hits = queries = 0.0
    for replica, (h0, q0) in zip(replicas, before, strict=True):
        hits += metric(replica, "tradeoff_generation_prefix_cache_hits_total") - h0
        queries += metric(replica, "tradeoff_generation_prefix_cache_queries_total") - q0
    return hits / queries if queries else 0.0


def counters(replicas: list[ServerProcess]) -> list[tuple[float, float]]:
    return [(metric(r, "tradeoff_generation_prefix_cache_hits_total"),
             metric(r, "tradeoff_generation_prefix_cache_queries_total")) for r in replicas]


def run_prefix(args: argparse.Namespace, scratch: Path, server_cpu: int, client_cpu: int,
               skew: bool) -> dict[str, Any]:
    """Each target on replicas started for it, with empty caches (and a gateway with an
    empty prefix index): one target's traffic never leaves another's in the caches."""
    prompts = prompts_file(scratch / f"prompts_{skew}.jsonl", 4000, skew)
    rows: dict[str, list[dict[str, Any]]] = {}
    load = ("--protocol", "openai", "--prompts", str(prompts), "--rate", f"{args.rate:g}",
            "--arrival", "poisson", "--ignore-eos")
    for round_ in range(args.rounds):
        for target in ("prefix", "round_robin", "one replica"):
            run = scratch / f"{'skew' if skew else 'prefix'}_{round_}_{target.replace(' ', '_')}"
            if target == "one replica":
                pool = [llm_replica(run / "one", HOSTS[0], server_cpu, 4 * REPLICA_BLOCKS,
                                    4 * SLOTS)]
            else:
                pool = [llm_replica(run / h, h, server_cpu, REPLICA_BLOCKS, SLOTS)
                        for h in HOSTS]
            with started(pool):
                gateway = None
                if target != "one replica":
                    gateway_repo(run / "gateway", target, {
                        "protocol": "openai", "model": LLM, "policy": target,
                        "replicas": [f"{r.url}/v1" for r in pool]})
                    gateway = ServerProcess(run / "gateway", cpus=str(server_cpu))
                with started([gateway] if gateway else []):
                    before = counters(pool)
                    url = f"{(gateway or pool[0]).url}/v1"
                    sampler = InFlightSampler(gateway, target) if gateway else None
                    with sampler or contextlib.nullcontext():
                        doc = bench(url, target if gateway else LLM, client_cpu, args,
                                    *load)
                    ratio = hit_ratio(pool, before)
            summary = doc["summary"]
            row = {"round": round_ + 1, "target": target, "hit_ratio": ratio,
                   "ttft_p50_ms": summary["ttft_ms"]["p50"],
                   "ttft_p99_ms": summary["ttft_ms"]["p99"],
                   "throughput": summary["throughput_rps"], "errors": summary["errors"],
                   **(sampler.imbalance() if sampler else {})}
            rows.setdefault(target, []).append(row)
            print(f"{'skew' if skew else 'prefix'} round {round_ + 1} {target:12}: "
                  f"hit {row['hit_ratio']:.3f}, TTFT p50 {row['ttft_p50_ms']:.1f} ms "
                  f"p99 {row['ttft_p99_ms']:.1f} ms, {row['throughput']:.1f} req/s, "
                  f"errors {row['errors']}" + (
                      f", busiest/mean {row['busiest_over_mean']:.2f}"
                      f" (p95 sample {row['p95_sample_ratio']:.2f})"
                      if row.get("busiest_over_mean") else ""), flush=True)
    return {"rows": rows, "medians": {t: medians(r) for t, r in rows.items()}}


def medians(rows: list[dict[str, Any]]) -> dict[str, float]:
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and k != "round"]
    return {k: statistics.median(r[k] for r in rows if r.get(k) is not None)
            for k in keys if any(r.get(k) is not None for r in rows)}


# ---------------------------------------------------------------- slow replica

SYNTHETIC_CONFIG = """name: "work"
backend: "synthetic"
max_batch_size: 0
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""


def tensor_replica(root: Path, host: str, cpu: int, cost_ms: float) -> ServerProcess:
    directory = root / "work"
    (directory / "1").mkdir(parents=True)
    (directory / "1" / "model.json").write_text(json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [16],
                     "copy_of": "INPUT0"}],
        "cost": {"fixed_ms": cost_ms, "per_row_ms": 0.0}}))
    (directory / "config.pbtxt").write_text(SYNTHETIC_CONFIG)
    return ServerProcess(root, host=host, cpus=str(cpu))


def run_slow(args: argparse.Namespace, scratch: Path, server_cpu: int, client_cpu: int
             ) -> dict[str, Any]:
    replicas = [tensor_replica(scratch / f"work_{h}", h, server_cpu,
                               10.0 if i == len(HOSTS) - 1 else 2.0)
                for i, h in enumerate(HOSTS)]
    root = scratch / "gateway_slow"
    rows: dict[str, list[dict[str, Any]]] = {}
    with started(replicas):
        for policy in ("least_outstanding", "round_robin"):
            gateway_repo(root, policy, {"protocol": "v2", "model": "work", "policy": policy,
                                        "replicas": [r.url for r in replicas]})
        with started([ServerProcess(root, cpus=str(server_cpu))]) as (gateway,):
            for round_ in range(args.rounds):
                for policy in ("least_outstanding", "round_robin"):
                    doc = bench(gateway.url, policy, client_cpu, args, "--rate",
                                f"{args.slow_rate:g}", "--arrival", "poisson")
                    latency = doc["summary"]["latency_ms"]
                    row = {"round": round_ + 1, "policy": policy, "p50_ms": latency["p50"],
                           "p99_ms": latency["p99"], "throughput": doc["summary"]["throughput_rps"],
                           "errors": doc["summary"]["errors"]}
                    rows.setdefault(policy, []).append(row)
                    print(f"slow round {round_ + 1} {policy:17}: p50 {row['p50_ms']:.2f} ms, "
                          f"p99 {row['p99_ms']:.2f} ms, {row['throughput']:.0f} req/s, "
                          f"errors {row['errors']}", flush=True)
    return {"rows": rows, "medians": {p: medians(r) for p, r in rows.items()}}


# ---------------------------------------------------------------- the gateway's cost

def run_cost(args: argparse.Namespace, scratch: Path, server_cpu: int, client_cpu: int,
             own_core: bool = False) -> dict[str, Any]:
    """Each model direct and through a gateway of one replica, same concurrency. This
    machine has two cores: the gateway on the client's core and the replica on the other,
    or (``own_core``) the gateway on a core of its own and the replica beside the client,
    where it is the same in both runs."""
    models_root = scratch / "models"
    if not models_root.exists():
        build_repository(models_root, ("tiny", "mlp"))
        write_synthetic_llm(models_root, model={"step_ms": 3.0}, max_num_seqs=64)
    gateway_cpu = server_cpu if own_core else client_cpu
    replica = ServerProcess(models_root, host=HOSTS[0],
                            cpus=str(client_cpu if own_core else server_cpu))
    rows: dict[str, list[dict[str, Any]]] = {}
    with started([replica]):
        root = scratch / ("gateway_cost_own" if own_core else "gateway_cost")
        for model in ("tiny", "mlp"):
            gateway_repo(root, f"via_{model}", {"protocol": "v2", "model": model,
                                                "replicas": [replica.url]})
        gateway_repo(root, "via_llm", {"protocol": "openai", "model": LLM,
                                       "replicas": [f"{replica.url}/v1"]})
        with started([ServerProcess(root, cpus=str(gateway_cpu))]) as (gateway,):
            cases = [(m, c) for m in ("tiny", "mlp") for c in args.concurrency] + \
                [(LLM, 64)]
            for round_ in range(args.rounds):
                for model, concurrency in cases:
                    for via in ("direct", "gateway"):
                        llm = model == LLM
                        url = replica.url if via == "direct" else gateway.url
                        name = model if via == "direct" else \
                            ("via_llm" if llm else f"via_{model}")
                        extra = ("--protocol", "openai", "--ignore-eos", "--output-tokens",
                                 "128", "--input-tokens", "32") if llm else ()
                        process = (replica if via == "direct" else gateway).process
                        assert process is not None
                        cpu_before, wall_before = cpu_seconds(process.pid), time.monotonic()
                        doc = bench(f"{url}/v1" if llm else url, name, client_cpu, args,
                                    "--concurrency", str(concurrency), *extra)
                        busy = (cpu_seconds(process.pid) - cpu_before) / \
                            (time.monotonic() - wall_before)
                        summary = doc["summary"]
                        value = summary["output_tokens_per_s"] if llm else \
                            summary["throughput_rps"]
                        key = f"{model} c{concurrency}"
                        requests_per_s = summary["throughput_rps"]
                        # the CPU of the server measured (the gateway's, or the replica's
                        # when direct) per request, over the whole bench run
                        row = {"round": round_ + 1, "case": key, "via": via, "rate": value,
                               "p50_ms": summary["latency_ms"]["p50"],
                               "errors": summary["errors"],
                               "server_cpu_percent": busy * 100,
                               "cpu_us_per_request": busy / requests_per_s * 1e6
                               if requests_per_s else None}
                        rows.setdefault(f"{key} {via}", []).append(row)
                        print(f"cost round {round_ + 1} {key:20} {via:8}: {value:,.0f} "
                              f"{'tok' if llm else 'req'}/s, p50 {row['p50_ms']:.2f} ms, "
                              f"{'gateway' if via == 'gateway' else 'replica'} CPU "
                              f"{row['server_cpu_percent']:.0f}%, errors {row['errors']}",
                              flush=True)
    return {"rows": rows, "medians": {k: medians(r) for k, r in rows.items()}}


# ---------------------------------------------------------------- the floor of a hop

def run_floor(args: argparse.Namespace, scratch: Path, server_cpu: int, client_cpu: int
              ) -> dict[str, Any]:
    """`mlp` direct, through benchmarks/bare_relay.py (a hop that does nothing else) and
    through the gateway, at each concurrency: the hops on a core of their own, the
    replica beside the load. Also the replica's mean batch over each run."""
    models_root = scratch / "models_floor"
    build_repository(models_root, ("mlp",))
    replica = ServerProcess(models_root, host=HOSTS[0], cpus=str(client_cpu))
    rows: dict[str, list[dict[str, Any]]] = {}
    with started([replica]):
        (port,) = free_ports(1)
        relay = subprocess.Popen(
            ["taskset", "-c", str(server_cpu), sys.executable,
             str(Path(__file__).with_name("bare_relay.py")), replica.host,
             str(replica.http_port), str(port)], stdout=subprocess.PIPE, text=True)
        try:
            assert relay.stdout is not None and relay.stdout.readline().strip() == "READY"
            root = scratch / "gateway_floor"
            gateway_repo(root, "via_mlp", {"protocol": "v2", "model": "mlp",
                                           "replicas": [replica.url]})
            with started([ServerProcess(root, cpus=str(server_cpu))]) as (gateway,):
                hops = {"direct": (replica.url, "mlp", replica.process),
                        "bare relay": (f"http://127.0.0.1:{port}", "mlp", relay),
                        "gateway": (gateway.url, "via_mlp", gateway.process)}
                for round_ in range(args.rounds):
                    for concurrency in args.concurrency:
                        for via, (url, model, process) in hops.items():
                            assert process is not None
                            served = metric(replica, "tradeoff_inference_count")
                            runs = metric(replica, "tradeoff_inference_exec_count")
                            cpu_before, wall_before = cpu_seconds(process.pid), \
                                time.monotonic()
                            doc = bench(url, model, client_cpu, args,
                                        "--concurrency", str(concurrency))
                            busy = (cpu_seconds(process.pid) - cpu_before) / \
                                (time.monotonic() - wall_before)
                            batch = (metric(replica, "tradeoff_inference_count") - served) / \
                                max(1.0, metric(replica, "tradeoff_inference_exec_count") - runs)
                            summary = doc["summary"]
                            row = {"round": round_ + 1, "rate": summary["throughput_rps"],
                                   "p50_ms": summary["latency_ms"]["p50"],
                                   "errors": summary["errors"], "replica_batch": batch,
                                   "cpu_percent": busy * 100}
                            rows.setdefault(f"mlp c{concurrency} {via}", []).append(row)
                            print(f"floor round {round_ + 1} mlp c{concurrency:<3} {via:10}: "
                                  f"{row['rate']:,.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
                                  f"replica batch {batch:.1f}, "
                                  f"{'replica' if via == 'direct' else via} CPU "
                                  f"{row['cpu_percent']:.0f}%, errors {row['errors']}",
                                  flush=True)
        finally:
            relay.terminate()
            relay.wait(10)
    return {"rows": rows, "medians": {k: medians(r) for k, r in rows.items()}}


# ---------------------------------------------------------------- a replica not ours

def run_pytriton(args: argparse.Namespace, scratch: Path, server_cpu: int, client_cpu: int
                 ) -> dict[str, Any]:
    """`mlp` on Triton through PyTriton (its own venv, as benchmarks/peers.py installs
    it), directly and behind a gateway whose v2 pool is that one replica."""
    from peers import PEERS, default_cache, install, start_pytriton, write_repositories
    from rich.console import Console

    cache = default_cache()
    packages = install(PEERS["pytriton"], cache, Console())
    _, _, files = write_repositories(scratch / "pytriton_models")
    peer = start_pytriton(cache, {"mlp": files["mlp"]}, server_cpu, scratch)
    rows: dict[str, list[dict[str, Any]]] = {}
    try:
        root = scratch / "gateway_pytriton"
        gateway_repo(root, "via_pytriton", {"protocol": "v2", "model": "mlp",
                                            "replicas": [peer.url]})
        with started([ServerProcess(root, cpus=str(client_cpu))]) as (gateway,):
            for round_ in range(args.rounds):
                for concurrency in args.concurrency:
                    for via, url, name in (("direct", peer.url, "mlp"),
                                           ("gateway", gateway.url, "via_pytriton")):
                        doc = bench(url, name, client_cpu, args, "--concurrency",
                                    str(concurrency))
                        summary = doc["summary"]
                        row = {"round": round_ + 1, "via": via, "concurrency": concurrency,
                               "rate": summary["throughput_rps"],
                               "p50_ms": summary["latency_ms"]["p50"],
                               "errors": summary["errors"]}
                        rows.setdefault(f"mlp c{concurrency} {via}", []).append(row)
                        print(f"pytriton round {round_ + 1} mlp c{concurrency} {via:8}: "
                              f"{row['rate']:,.0f} req/s, p50 {row['p50_ms']:.2f} ms, "
                              f"errors {row['errors']}", flush=True)
    finally:
        peer.stop()
    return {"packages": packages, "rows": rows,
            "medians": {k: medians(r) for k, r in rows.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="prefix,skew,slow,cost")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", type=float, default=15.0)
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--rate", type=float, default=40.0,
                        help="prefix, skew: requests/s (Poisson)")
    parser.add_argument("--slow-rate", type=float, default=300.0,
                        help="slow: requests/s (Poisson)")
    parser.add_argument("--concurrency", type=lambda s: [int(c) for c in s.split(",")],
                        default=[1, 16], help="cost: the tensor models' concurrencies")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/gateway.json"))
    args = parser.parse_args()
    server_cpu, client_cpu = server_and_client_cores()
    doc: dict[str, Any] = {"schema": "tradeoff.bench.gateway/1", "command": command_line(),
                           "server_cpu": server_cpu, "client_cpu": client_cpu,
                           "settings": {k: v for k, v in vars(args).items() if k != "json"}}
    with tempfile.TemporaryDirectory() as scratch_dir:
        scratch = Path(scratch_dir)
        for scenario in args.scenario.split(","):
            started = time.monotonic()
            if scenario in ("prefix", "skew"):
                doc[scenario] = run_prefix(args, scratch, server_cpu, client_cpu,
                                           skew=scenario == "skew")
            elif scenario == "slow":
                doc[scenario] = run_slow(args, scratch, server_cpu, client_cpu)
            elif scenario in ("cost", "cost-own-core"):
                doc[scenario] = run_cost(args, scratch, server_cpu, client_cpu,
                                         own_core=scenario == "cost-own-core")
            elif scenario == "floor":
                doc[scenario] = run_floor(args, scratch, server_cpu, client_cpu)
            elif scenario == "pytriton":
                doc[scenario] = run_pytriton(args, scratch, server_cpu, client_cpu)
            else:
                parser.error(f"unknown scenario {scenario!r}")
            print(f"{scenario}: {time.monotonic() - started:.0f} s", flush=True)
            write_results(args.json, doc)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
