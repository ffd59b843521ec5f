"""Can `tradeoff bench --protocol openai` drive and time GPU token rates? Streamed tokens/s
of the load generator against the synthetic generative model, on a CPU.

Two servers, each pinned to the first core, the client (`tradeoff bench`, closed loop, or
Poisson arrivals at --rate; --ignore-eos) pinned to the last:

* `stub`: an asyncio server in this file that streams what `tradeoff serve` streams
  (the same SSE events, chunked, one per token, then usage and [DONE]) on an engine's
  clock: every --step-ms, one token to each of up to --max-num-seqs answers at once. It
  costs a few microseconds a token, so it measures the client's ceiling;
* `serve`: `tradeoff serve` of `synthetic-llm` (`tradeoff.backends.synthetic_generative`)
  with the same step and batch: the whole serving path, whose own limit on one core
  shows in its CPU share;
* `serve-process`: the same with the engine in a process of its own (`process: true`),
  on the same core as the server (it inherits the server's pinning);
* `serve-workers`: `tradeoff serve --workers 2`, two front ends feeding one engine
  process, all on the server's core.

For each: output tokens/s as the client measured it, the rate the step allows
(max_num_seqs / step), the client's CPU share (the busiest worker's, from its result)
and verdict (client-bound or not), and the server's CPU share over the bench run
(/proc). --workers runs the client with that many processes (on the client core).

    .venv/bin/python benchmarks/llm_load_generator.py
    .venv/bin/python benchmarks/llm_load_generator.py --targets stub --step-ms 1.5
    .venv/bin/python benchmarks/llm_load_generator.py --workers 1,2 --duration 10
    .venv/bin/python benchmarks/llm_load_generator.py --targets serve --prefill-stretch 0
    .venv/bin/python benchmarks/llm_load_generator.py --targets serve,serve-process
    .venv/bin/python benchmarks/llm_load_generator.py --targets serve --no-overlap
    .venv/bin/python benchmarks/llm_load_generator.py --targets serve --rate 120
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any

import orjson
from harness import cpu_seconds, engine_steps

from tradeoff.models.generative import write_synthetic_llm
from tradeoff.server.process import ServerProcess, free_port

MODEL = "synthetic-llm"


# ------------------------------------------------------------------ the stub server

class _Answer:
    """One streamed answer: its prebuilt token event and how many tokens are left."""

    def __init__(self, writer: asyncio.StreamWriter, doc: dict[str, Any], prompt: int) -> None:
        self.writer = writer
        self.left = int(doc.get("max_tokens", 16))
        self.asked = self.left
        self.prompt = prompt
        self.usage = bool((doc.get("stream_options") or {}).get("include_usage"))
        self.id = f"cmpl-{id(self):x}"
        self.token = self._frame(self._event("x", None))
        self.done = asyncio.get_running_loop().create_future()

    def _event(self, text: str, reason: str | None) -> bytes:
        return b"data: " + orjson.dumps({
            "id": self.id, "object": "text_completion", "created": 0, "model": MODEL,
            "choices": [{"index": 0, "text": text, "finish_reason": reason,
                         "logprobs": None}]}) + b"\n\n"

    @staticmethod
    def _frame(data: bytes) -> bytes:
        return b"%x\r\n%s\r\n" % (len(data), data)

    def step(self) -> bool:
        """Send one token; True when the answer is complete."""
        self.left -= 1
        if self.left > 0:
            self.writer.write(self.token)
            return False
        last = self._event("x", "length")
        if self.usage:
            last += b"data: " + orjson.dumps({
                "id": self.id, "object": "text_completion", "created": 0, "model": MODEL,
                "choices": [], "usage": {"prompt_tokens": self.prompt,
                                         "completion_tokens": self.asked,
                                         "total_tokens": self.prompt + self.asked}}) + b"\n\n"
        self.writer.write(self._frame(last + b"data: [DONE]\n\n") + b"0\r\n\r\n")
        return True


class StubEngine:
    """Streams every admitted answer one token per step, like a continuous batcher."""

    def __init__(self, step_s: float, max_num_seqs: int) -> None:
        self.step_s = step_s
        self.max_num_seqs = max_num_seqs
        self.waiting: deque[_Answer] = deque()
        self.running: list[_Answer] = []
        self.wake = asyncio.Event()

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        at = loop.time()
        while True:
            if not self.running and not self.waiting:
                self.wake.clear()
                await self.wake.wait()
                at = loop.time()
            while self.waiting and len(self.running) < self.max_num_seqs:
                self.running.append(self.waiting.popleft())
            at += self.step_s
            await asyncio.sleep(max(at - loop.time(), 0))
            still = []
            for answer in self.running:
                if answer.writer.is_closing():
                    answer.done.set_result(None)
                elif answer.step():
                    answer.done.set_result(None)
                else:
                    still.append(answer)
            self.running = still

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.split(b"\r\n")
                method, target = lines[0].split(b" ")[:2]
                length = next((int(line.split(b":", 1)[1]) for line in lines[1:]
                               if line.lower().startswith(b"content-length:")), 0)
                body = await reader.readexactly(length)
                if method == b"GET" and target.endswith(b"/models"):
                    doc = orjson.dumps({"object": "list", "data": [
                        {"id": MODEL, "object": "model", "owned_by": "stub"}]})
                    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(doc), doc))
                    continue
                request = orjson.loads(body)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n")
                answer = _Answer(writer, request, len(str(request.get("prompt", ""))))
                self.waiting.append(answer)
                self.wake.set()
                await answer.done
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


async def _serve_stub(port: int, step_s: float, max_num_seqs: int) -> None:
    engine = StubEngine(step_s, max_num_seqs)
    server = await asyncio.start_server(engine.handle, "127.0.0.1", port, backlog=1024)
    async with server:
        await asyncio.gather(server.serve_forever(), engine.run())


def stub_main(port: int, step_ms: float, max_num_seqs: int) -> None:
    import uvloop

    uvloop.run(_serve_stub(port, step_ms / 1e3, max_num_seqs))


# ---------------------------------------------------------------------- measuring

def bench(url: str, cpu: int, args: argparse.Namespace, workers: int) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        command = ["taskset", "-c", str(cpu), sys.executable, "-m", "tradeoff", "bench", url,
                   "--protocol", "openai", "--model", MODEL, "--ignore-eos",
                   *(("--rate", f"{args.rate:g}", "--arrival", "poisson") if args.rate
                     else ("--concurrency", str(args.concurrency))),
                   "--duration", f"{args.duration:g}",
                   "--warmup", f"{args.warmup:g}", "--input-tokens", str(args.input_tokens),
                   "--output-tokens", str(args.output_tokens), "--workers", str(workers),
                   "--json", out.name]
        subprocess.run(command, check=True, capture_output=True)
        return json.loads(Path(out.name).read_text())


def measure(name: str, pid: int, url: str, cpu: int, args: argparse.Namespace,
            workers: int) -> dict[str, Any]:
    served = name != "stub"  # a tradeoff serve: its statistics count the engine's steps
    steps = engine_steps(url.removesuffix("/v1"), MODEL) if served else (0, 0.0)
    before, started = cpu_seconds(pid), time.monotonic()
    doc = bench(url, cpu, args, workers)
    elapsed = time.monotonic() - started
    server_cpu = (cpu_seconds(pid) - before) / elapsed * 100
    if served:  # every step of the run, warmup included: what a step took on the worker
        after = engine_steps(url.removesuffix("/v1"), MODEL)
        steps = (after[0] - steps[0], after[1] - steps[1])
    summary, client = doc["summary"], doc["client"]
    generation = summary  # the generation figures are written flat into it
    row = {"target": name, "workers": workers,
           "output_tokens_per_s": generation["output_tokens_per_s"],
           "step_allows_tokens_per_s": args.max_num_seqs / args.step_ms * 1e3,
           "tpot_p50_ms": (generation.get("tpot_ms") or {}).get("p50"),
           "ttft_p50_ms": (generation.get("ttft_ms") or {}).get("p50"),
           "ttft_p99_ms": (generation.get("ttft_ms") or {}).get("p99"),
           "mean_step_ms": steps[1] / steps[0] * 1e3 if steps[0] else None,
           "steps_busy_percent": steps[1] / elapsed * 100 if steps[0] else None,
           "itl_p99_ms": (generation.get("itl_ms") or {}).get("p99"),
           "errors": summary["errors"],
           "exact_lengths": generation["output_length"]["exact"],
           "requests": summary["requests"],
           "client_cpu_percent": client["cpu_percent"],
           "client_loop_lag_p99_ms": (client.get("loop_lag_ms") or {}).get("p99"),
           "client_bound": client["client_bound"], "client_reasons": client["reasons"],
           "server_cpu_percent": server_cpu}
    print(f"{name:5} workers {workers}: {row['output_tokens_per_s']:,.0f} tok/s "
          f"(step allows {row['step_allows_tokens_per_s']:,.0f}), TPOT p50 "
          f"{row['tpot_p50_ms'] or 0:.2f} ms, TTFT p50 {row['ttft_p50_ms'] or 0:.1f} ms "
          f"p99 {row['ttft_p99_ms'] or 0:.1f} ms, "
          + (f"mean step {row['mean_step_ms']:.2f} ms (busy {row['steps_busy_percent']:.0f}%), "
             if row["mean_step_ms"] else "") +
          f"errors {row['errors']}, exact "
          f"{row['exact_lengths']}/{row['requests']}, client CPU "
          f"{row['client_cpu_percent']:.0f}%{' CLIENT-BOUND' if row['client_bound'] else ''}"
          f", server CPU {server_cpu:.0f}%", flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="stub,serve",
                        help="comma-separated: stub, serve, serve-process (the engine in a "
                             "process of its own; the server's CPU counts its children), "
                             "serve-workers (two front ends, one engine process)")
    parser.add_argument("--step-ms", type=float, default=3.0)
    parser.add_argument("--max-num-seqs", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rate", type=float,
                        help="requests/s, Poisson arrivals (an open loop) instead of "
                             "--concurrency")
    parser.add_argument("--input-tokens", type=int, default=32)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=2.0)
    parser.add_argument("--workers", default="1", help="comma-separated worker counts")
    parser.add_argument("--prefill-stretch", type=float,
                        help="serve: generate.yaml's prefill_stretch (default: its default)")
    parser.add_argument("--no-overlap", action="store_true",
                        help="serve: generate.yaml's overlap: false (steps one by one)")
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/llm_load_generator.json"))
    parser.add_argument("--stub-port", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.stub_port:  # the child that serves the stub
        stub_main(args.stub_port, args.step_ms, args.max_num_seqs)
        return
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    workers = [int(w) for w in args.workers.split(",")]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for target in args.targets.split(","):
            if target == "stub":
                port = free_port()
                child = subprocess.Popen(
                    ["taskset", "-c", str(server_cpu), sys.executable, __file__,
                     "--stub-port", str(port), "--step-ms", str(args.step_ms),
                     "--max-num-seqs", str(args.max_num_seqs)])
                try:
                    time.sleep(1.5)
                    for n in workers:
                        rows.append(measure("stub", child.pid, f"http://127.0.0.1:{port}/v1",
                                            client_cpu, args, n))
                finally:
                    child.terminate()
                    child.wait(10)
            elif target in ("serve", "serve-process", "serve-workers"):
                repo = Path(scratch) / target
                settings: dict[str, Any] = \
                    {"process": True} if target == "serve-process" else {}
                if args.prefill_stretch is not None:
                    settings["prefill_stretch"] = args.prefill_stretch
                if args.no_overlap:
                    settings["overlap"] = False
                write_synthetic_llm(repo, model={"step_ms": args.step_ms},
                                    max_num_seqs=args.max_num_seqs, **settings)
                extra = ("--workers", "2") if target == "serve-workers" else ()
                with ServerProcess(repo, cpus=str(server_cpu), extra_args=extra) as server:
                    assert server.process is not None
                    for n in workers:
                        rows.append(measure(target, server.process.pid, f"{server.url}/v1",
                                            client_cpu, args, n))
            else:
                parser.error(f"unknown target {target!r}: stub, serve, serve-process or "
                             "serve-workers")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"settings": {k: v for k, v in vars(args).items()
                                                  if k not in ("json", "stub_port")},
                                     "server_cpu": server_cpu, "client_cpu": client_cpu,
                                     "rows": rows}, indent=2, default=str))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
