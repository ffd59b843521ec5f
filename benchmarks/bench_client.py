"""How fast is the load generator itself? `tradeoff bench` next to wrk on a trivial endpoint.

nginx (Debian's nginx-light, one worker process, `return 200`) on one core is so cheap
per request that the client is the bottleneck. wrk and `tradeoff bench` (one worker, then
`--workers 2`) each drive it in turn from the other core, closed loop at concurrency 64.
Medians of several runs. Needs `nginx` and `wrk` (apt-get install nginx-light wrk).

    .venv/bin/python benchmarks/bench_client.py --duration 5 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tradeoff.server.process import free_port

NGINX_CONF = """
worker_processes 1;
daemon off;
pid {tmp}/nginx.pid;
error_log {tmp}/error.log;
events {{ worker_connections 4096; }}
http {{
    access_log off;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    keepalive_requests 1000000;
    server {{
        listen 127.0.0.1:{port};
        location / {{ return 200 "ok"; }}
    }}
}}
"""


def wrk(url: str, cpu: int, concurrency: int, duration: float) -> float:
    out = subprocess.run(["taskset", "-c", str(cpu), "wrk", "-t1", f"-c{concurrency}",
                          f"-d{duration:g}s", url], capture_output=True, text=True, check=True)
    match = re.search(r"Requests/sec:\s+([\d.]+)", out.stdout)
    if not match:
        raise RuntimeError(f"cannot read wrk's output:\n{out.stdout}")
    return float(match.group(1))


def tradeoff_bench(url: str, cpus: str, concurrency: int, duration: float,
                   workers: int) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        subprocess.run(["taskset", "-c", cpus, sys.executable, "-m", "tradeoff", "bench", url,
                        "--protocol", "http", "--method", "GET", "--concurrency",
                        str(concurrency), "--duration", f"{duration:g}", "--warmup", "1",
                        "--workers", str(workers), "--json", out.name],
                       check=True, capture_output=True)
        return json.loads(Path(out.name).read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/bench_client.json"))
    args = parser.parse_args()
    for tool in ("nginx", "wrk", "taskset"):
        if not shutil.which(tool):
            sys.exit(f"{tool} not found: apt-get install nginx-light wrk util-linux")
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    runs: dict[str, list[float]] = {"wrk": [], "tradeoff bench": [],
                                    "tradeoff bench --workers 2": []}
    cpu_notes: dict[str, list[float]] = {"tradeoff bench": [], "tradeoff bench --workers 2": []}
    with tempfile.TemporaryDirectory() as tmp:
        conf = Path(tmp) / "nginx.conf"
        conf.write_text(NGINX_CONF.format(tmp=tmp, port=port))
        nginx = subprocess.Popen(["taskset", "-c", str(server_cpu), "nginx", "-c", str(conf)],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            time.sleep(1)
            for _ in range(args.repeats):
                runs["wrk"].append(wrk(url, client_cpu, args.concurrency, args.duration))
                one = tradeoff_bench(url, str(client_cpu), args.concurrency, args.duration, 1)
                runs["tradeoff bench"].append(one["summary"]["throughput_rps"])
                cpu_notes["tradeoff bench"].append(one["client"]["cpu_percent"])
                two = tradeoff_bench(url, ",".join(map(str, cores)), args.concurrency,
                                     args.duration, 2)
                runs["tradeoff bench --workers 2"].append(two["summary"]["throughput_rps"])
                cpu_notes["tradeoff bench --workers 2"].append(two["client"]["cpu_percent"])
                print({k: round(v[-1]) for k, v in runs.items()}, flush=True)
        finally:
            nginx.terminate()
            nginx.wait()
    medians = {k: statistics.median(v) for k, v in runs.items()}
    print()
    print("| client | req/s (median) | vs wrk | client CPU |")
    print("|---|---:|---:|---:|")
    for name, value in medians.items():
        cpu = f"{statistics.median(cpu_notes[name]):.0f}%" if name in cpu_notes else "-"
        print(f"| {name} | {value:,.0f} | {value / medians['wrk']:.2f} | {cpu} |")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.client/1",
                                     "command": " ".join(sys.argv), "runs": runs,
                                     "medians": medians}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
