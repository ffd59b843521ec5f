"""Continuous vs static batching vs one request at a time, for a served LLM.

`tradeoff serve` (pinned to one core) serves the same model three times: `continuous`
(iteration-level batching), `static` (a batch runs until all its sequences end) and `one`
(max_num_seqs 1). A client on another core sends each the same requests, output lengths
drawn uniformly from --min-tokens..--max-tokens (`ignore_eos`, so every request generates
exactly what it asked for), streams every answer and times it. The requests come as
Poisson arrivals at --rate or, with --concurrency N, N at a time in a closed loop (each
answer's end sends the next request); N = max_num_seqs keeps the batch full without a
queue: saturation. Then the in-process ceiling: the engine alone given the same requests
at once (or N at a time), the most tokens/s it gets out of them.

For every run: output tokens/s, p50/p99 TTFT, TPOT and end-to-end latency; the engine's
steps (the server's batch_stats): tokens per step (how full the batch was), milliseconds
per step, and the share of the run it was stepping (busy); and the share of a core the
server process used (busy near 100% with core below it: other work had its core).
tokens/s = tokens/step x busy / (ms/step). Writes JSON.

--steps-only times one decode step with 1, 4 and max_num_seqs sequences instead: the
engine's step (what serving runs: schedule, decoder, sampling) beside transformers'
(`LlamaForCausalLM` holding the same weights, one token per sequence over its KV cache),
in interleaved rounds, one torch thread on the server's core.

    .venv/bin/python benchmarks/continuous_batching.py                  # SmolLM2-135M
    .venv/bin/python benchmarks/continuous_batching.py --concurrency 16 # at saturation
    .venv/bin/python benchmarks/continuous_batching.py --steps-only
    .venv/bin/python benchmarks/continuous_batching.py --device cuda    # on a GPU host
    .venv/bin/python benchmarks/continuous_batching.py --model tinyllama --requests 8
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from harness import cpu_seconds, engine_steps, server_and_client_cores

from tradeoff.bench.adapters import split_url
from tradeoff.bench.openai_stream import (
    GenerationTiming,
    generation_body,
    generation_request,
    stream_once,
)
from tradeoff.models.generative import write_generative
from tradeoff.server.process import ServerProcess

WORDS = ("the cat sat on a mat while rain fell over quiet hills and an old river ran "
         "past the mill toward the sea").split()
STEP_PROMPT_TOKENS = 32  # every prompt of --steps-only: transformers batches them unpadded


def workload(requests: int, rate: float, min_tokens: int, max_tokens: int,
             seed: int) -> list[tuple[float, str, int]]:
    """(arrival offset in s, prompt, output tokens) per request: Poisson arrivals."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
    arrivals -= arrivals[0]
    lengths = rng.integers(min_tokens, max_tokens + 1, requests)
    prompt_words = rng.integers(8, 40, requests)
    prompts = [" ".join(rng.choice(WORDS, n)) for n in prompt_words]
    return [(float(a), p, int(n)) for a, p, n in zip(arrivals, prompts, lengths, strict=True)]


async def drive(url: str, model: str, work: list[tuple[float, str, int]],
                concurrency: int | None) -> list[GenerationTiming]:
    """Stream every request of ``work``: at its arrival time, or ``concurrency`` at a time."""
    host, port, _ = split_url(url)
    raws = [generation_request(host, "/v1", generation_body(
        model, prompt=prompt, max_tokens=tokens, ignore_eos=True), chat=False)
        for _, prompt, tokens in work]
    if concurrency is None:
        start = time.perf_counter_ns() + 50_000_000
        return list(await asyncio.gather(*(stream_once(host, port, raw, False,
                                                       at_ns=start + int(at * 1e9))
                                           for (at, _, _), raw in zip(work, raws, strict=True))))
    timings: dict[int, GenerationTiming] = {}
    order = iter(range(len(raws)))  # shared: each client takes the next request

    async def client() -> None:
        for index in order:
            timings[index] = await stream_once(host, port, raws[index], False)

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return [timings[i] for i in range(len(raws))]


def spy(pid: int, svg: Path | None) -> subprocess.Popen[bytes] | None:
    """py-spy sampling process ``pid`` (every thread, idle stacks too, without pausing
    it) into the flame graph ``svg``; None when no ``svg`` is asked."""
    if svg is None:
        return None
    tool = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    svg.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen([tool, "record", "--pid", str(pid), "--output", str(svg),
                             "--idle", "--threads", "--nonblocking"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) * 1000 if values else None


def summarize(timings: list[GenerationTiming], asked: list[int]) -> dict[str, Any]:
    ok = [t for t in timings if t.error is None]
    ttft = [t.ttft_s for t in ok if t.ttft_s is not None]
    tpot = [t.tpot_s for t in ok if t.tpot_s is not None]
    tokens = sum(t.output_tokens for t in ok)
    span = (max(t.end_ns for t in timings) - min(t.start_ns for t in timings)) / 1e9
    return {"requests": len(timings), "errors": len(timings) - len(ok),
            "errors_seen": sorted({t.error for t in timings if t.error})[:3],
            "lengths_honoured": all(t.output_tokens == n
                                    for t, n in zip(timings, asked, strict=True)
                                    if t.error is None),
            "output_tokens": tokens, "seconds": span, "output_tokens_per_s": tokens / span,
            "ttft_p50_ms": pct(ttft, 50), "ttft_p99_ms": pct(ttft, 99),
            "tpot_p50_ms": pct(tpot, 50), "tpot_p99_ms": pct(tpot, 99),
            "latency_p50_ms": pct([t.latency_s for t in ok], 50),
            "latency_p99_ms": pct([t.latency_s for t in ok], 99)}


def _engine(model_dir: Path, cpu: int) -> tuple[Any, Any]:
    """The engine of ``model_dir`` (its generate.yaml names the device) in this process,
    on ``cpu`` with one torch thread."""
    import torch

    from tradeoff.generate.loader import load_generative, new_engine

    os.sched_setaffinity(0, {cpu})
    torch.set_num_threads(1)
    config, decoder, tokenizer = load_generative(model_dir)
    return new_engine(config, decoder), tokenizer


def ceiling(engine: Any, tokenizer: Any, work: list[tuple[float, str, int]],
            in_flight: int | None = None) -> dict[str, Any]:
    """Tokens/s of the engine alone (no server) on the requests of ``work``: all at once,
    or ``in_flight`` at a time (the next one added as one ends, as a closed loop sends)."""
    from tradeoff.generate.sampling_params import SamplingParams

    queued = [(tokenizer.encode(prompt),
               SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
              for _, prompt, tokens in work]
    limit = in_flight or len(queued)
    seqs = [engine.add(*queued.pop(0)) for _ in range(min(limit, len(queued)))]
    running, steps = len(seqs), 0
    start, cpu = time.perf_counter(), time.process_time()
    while engine.has_work():
        running -= len(engine.step().finished)
        steps += 1
        while queued and running < limit:
            seqs.append(engine.add(*queued.pop(0)))
            running += 1
    seconds = time.perf_counter() - start
    tokens = sum(len(s.output) for s in seqs)
    return {"requests": len(work), "output_tokens": tokens, "seconds": seconds,
            "output_tokens_per_s": tokens / seconds, "steps": steps,
            "tokens_per_step": tokens / steps, "ms_per_step": seconds / steps * 1000,
            "busy_share": 1.0, "core_share": (time.process_time() - cpu) / seconds}


def transformers_twin(decoder: Any) -> Any:
    """``transformers.LlamaForCausalLM`` holding the weights of ``decoder``."""
    import transformers

    config = {k: v for k, v in decoder.config.to_hf().items()
              if k not in ("architectures", "model_type")}
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**config))
    model.load_state_dict(decoder.hf_state_dict())
    return model.to(decoder.device).eval()


def step_prompts(tokenizer: Any, work: list[tuple[float, str, int]], n: int) -> list[list[int]]:
    """The first ``n`` prompts of ``work`` as token ids, each repeated or cut to
    STEP_PROMPT_TOKENS."""
    out = []
    for _, prompt, _ in work[:n]:
        ids = tokenizer.encode(prompt)
        out.append((ids * (STEP_PROMPT_TOKENS // len(ids) + 1))[:STEP_PROMPT_TOKENS])
    return out


def engine_step(engine: Any, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """Median seconds of the engine's decode steps with ``prompts`` running, and the share
    of those seconds the process was on a core (the engine computes on a worker thread
    of its own)."""
    from tradeoff.generate.sampling_params import SamplingParams

    for prompt in prompts:
        engine.add(prompt, SamplingParams(max_tokens=steps + 1, temperature=0,
                                          ignore_eos=True))
    walls, cpus = [], []
    while engine.has_work():
        wall, cpu = time.perf_counter(), time.process_time()
        report = engine.step()
        if report.prefill_tokens == 0 and len(report.decoded) == len(prompts):
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), sum(cpus) / sum(walls)


def transformers_step(model: Any, prompts: list[list[int]], steps: int) -> tuple[float, float]:
    """As :func:`engine_step`, for ``model``'s forward of one greedy token per sequence
    over its KV cache (``DynamicCache``)."""
    import torch
    import transformers

    try:
        cache = transformers.DynamicCache(config=model.config)
    except TypeError:  # transformers 4
        cache = transformers.DynamicCache()
    key = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"
    device = model.device
    walls, cpus = [], []
    with torch.inference_mode():
        tokens = torch.tensor(prompts, device=device)
        for index in range(steps + 1):
            wall, cpu = time.perf_counter(), time.process_time()
            logits = model(input_ids=tokens, use_cache=True, logits_to_keep=1,
                           **{key: cache}).logits
            tokens = logits[:, -1].argmax(-1, keepdim=True).cpu().to(device)
            if index:  # the first was the prefill
                walls.append(time.perf_counter() - wall)
                cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), sum(cpus) / sum(walls)


def step_times(model_dir: Path, cpu: int, work: list[tuple[float, str, int]],
               sizes: list[int], rounds: int, steps: int = 16) -> dict[str, Any]:
    """Decode step milliseconds of the engine and of transformers at each size, the median
    of ``rounds`` interleaved rounds, and the least core share seen."""
    engine, tokenizer = _engine(model_dir, cpu)
    runners = {"engine": lambda p: engine_step(engine, p, steps)}
    try:
        twin = transformers_twin(engine.decoder)
        runners["transformers"] = lambda p: transformers_step(twin, p, steps)
    except ImportError:
        print("transformers is not installed: timing the engine alone")
    seen: dict[str, dict[int, list[float]]] = {name: {n: [] for n in sizes} for name in runners}
    share = 1.0
    for _ in range(rounds):
        for n in sizes:
            prompts = step_prompts(tokenizer, work, n)
            for name, run in runners.items():
                seconds, core = run(prompts)
                seen[name][n].append(seconds * 1000)
                share = min(share, core)
    return {"ms": {name: {n: float(np.median(v)) for n, v in by_size.items()}
                   for name, by_size in seen.items()},
            "rounds": rounds, "steps": steps, "prompt_tokens": STEP_PROMPT_TOKENS,
            "least_core_share": share}


def print_steps(result: dict[str, Any], device: str) -> None:
    ms = result["ms"]
    names = list(ms)
    print(f"decode step on {device}, median of {result['rounds']} interleaved rounds, "
          f"{result['prompt_tokens']}-token prompts, one torch thread")
    print("{:>5}".format("seqs") + "".join(f"{n + ' ms':>17}{'tok/s':>8}" for n in names)
          + ("   engine / transformers" if len(names) > 1 else ""))
    for n in ms["engine"]:
        line = f"{n:>5}" + "".join(f"{ms[name][n]:>17.1f}{n / ms[name][n] * 1000:>8.1f}"
                                   for name in names)
        if len(names) > 1:
            line += f"{ms['engine'][n] / ms['transformers'][n]:>24.2f}"
        print(line)
    if result["least_core_share"] < 0.9:
        print(f"warning: a measured step had its core only "
              f"{result['least_core_share']:.0%} of the time: other work ran there")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "tinyllama"))
    parser.add_argument("--rate", type=float, default=0.25,
                        help="Poisson arrivals, requests per second")
    parser.add_argument("--concurrency", type=int, metavar="N",
                        help="instead of arrivals: N requests in flight (closed loop)")
    parser.add_argument("--requests", type=int, default=32,
                        help="requests for continuous and static batching")
    parser.add_argument("--one-requests", type=int, default=10,
                        help="requests one at a time (the first N of the same workload)")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-only", action="store_true",
                        help="only time decode steps (engine and transformers) at 1, 4 and "
                             "max-num-seqs sequences")
    parser.add_argument("--step-rounds", type=int, default=3,
                        help="interleaved rounds of --steps-only")
    parser.add_argument("--profile", type=Path, metavar="SVG",
                        help="py-spy flame graph of the server during the continuous run")
    parser.add_argument("--json", type=Path, help="where the results go (default: "
                        "benchmarks/results/continuous_batching[_steps].json)")
    args = parser.parse_args()
    server_cpu, client_cpu = server_and_client_cores()
    work = workload(args.requests, args.rate, args.min_tokens, args.max_tokens, args.seed)
    asked = [n for _, _, n in work]
    configs = {"continuous": {"batching": "continuous", "max_num_seqs": args.max_num_seqs},
               "static": {"batching": "static", "max_num_seqs": args.max_num_seqs},
               "one": {"batching": "continuous", "max_num_seqs": 1}}
    rows: dict[str, dict[str, Any]] = {}
    results = Path("benchmarks/results")
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name, settings in configs.items():
            write_generative(repo, args.model, directory=name, device=args.device, **settings)
        if args.steps_only:
            steps = step_times(repo / "continuous", server_cpu, work,
                               sorted({1, 4, args.max_num_seqs}), args.step_rounds)
            print_steps(steps, args.device)
            target = args.json or results / "continuous_batching_steps.json"
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps({"schema": "tradeoff.bench.decode_steps/1",
                                          "args": {k: str(v) for k, v in vars(args).items()},
                                          **steps}, indent=2))
            print(f"wrote {target}")
            return
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            assert server.process is not None
            pid = server.process.pid
            load = f"{args.rate}/s" if args.concurrency is None \
                else f"{args.concurrency} at a time"
            for name in configs:
                os.sched_setaffinity(0, {client_cpu})
                subset = work if name != "one" else work[:args.one_requests]
                print(f"{name}: {len(subset)} requests, {load} ...", flush=True)
                profiler = spy(pid, args.profile if name == "continuous" else None)
                (steps_before, busy_before), cpu_before = (engine_steps(server.url, name),
                                                           cpu_seconds(pid))
                timings = asyncio.run(drive(server.url, name, subset, args.concurrency))
                cpu_used = cpu_seconds(pid) - cpu_before
                steps_after, busy_after = engine_steps(server.url, name)
                steps_taken, busy = steps_after - steps_before, busy_after - busy_before
                if profiler is not None:
                    profiler.send_signal(signal.SIGINT)
                    profiler.wait()
                row = rows[name] = summarize(timings, asked[:len(subset)])
                row.update(steps=steps_taken,
                           tokens_per_step=row["output_tokens"] / max(steps_taken, 1),
                           ms_per_step=busy / max(steps_taken, 1) * 1000,
                           busy_share=busy / row["seconds"],
                           core_share=cpu_used / row["seconds"])
                if name == "continuous":  # next to it: this machine's speed drifts
                    print("ceiling: the engine alone (the server idles), the same requests, "
                          + ("at once" if args.concurrency is None
                             else f"{args.concurrency} at a time") + " ...", flush=True)
                    engine, tokenizer = _engine(repo / "continuous", server_cpu)
                    ceiling_row = ceiling(engine, tokenizer, work, args.concurrency)
                    del engine
        rows["ceiling"] = ceiling_row

    print(f"\n{args.model} on {args.device}, "
          + (f"Poisson {args.rate} req/s" if args.concurrency is None
             else f"closed loop, {args.concurrency} in flight")
          + f", output {args.min_tokens}-{args.max_tokens} tokens, one run each")
    header = ("config", "reqs", "err", "tok/s", "tok/step", "ms/step", "busy", "core",
              "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99", "e2e p99")
    print("{:<11}{:>5}{:>5}{:>8}{:>9}{:>8}{:>6}{:>6}{:>10}{:>10}{:>10}{:>10}{:>10}".format(
        *header))
    for name, row in rows.items():
        def ms(key: str, row: dict[str, Any] = row) -> str:
            return "-" if row.get(key) is None else f"{row[key]:.0f}"
        print(f"{name:<11}{row['requests']:>5}{row.get('errors', 0):>5}"
              f"{row['output_tokens_per_s']:>8.1f}{row['tokens_per_step']:>9.1f}"
              f"{row['ms_per_step']:>8.1f}{row['busy_share']:>6.0%}{row['core_share']:>6.0%}"
              f"{ms('ttft_p50_ms'):>10}{ms('ttft_p99_ms'):>10}"
              f"{ms('tpot_p50_ms'):>10}{ms('tpot_p99_ms'):>10}{ms('latency_p99_ms'):>10}")
    cont, static, one, top = rows["continuous"], rows["static"], rows["one"], rows["ceiling"]
    print(f"continuous / static tokens/s: "
          f"{cont['output_tokens_per_s'] / static['output_tokens_per_s']:.2f}x; "
          f"continuous / one-at-a-time: "
          f"{cont['output_tokens_per_s'] / one['output_tokens_per_s']:.2f}x; "
          f"continuous / ceiling: {cont['output_tokens_per_s'] / top['output_tokens_per_s']:.2f}; "
          f"static / continuous TTFT p99: {static['ttft_p99_ms'] / cont['ttft_p99_ms']:.1f}x")
    if args.concurrency is None:
        offered = args.rate * float(np.mean(asked))
        if offered < top["output_tokens_per_s"]:
            print(f"note: the arrivals ask {offered:.1f} tokens/s, below the ceiling's "
                  f"{top['output_tokens_per_s']:.1f}: continuous batching is not saturated "
                  "(--concurrency max-num-seqs saturates it)")
    for name in ("continuous", "static", "one"):
        if not rows[name]["lengths_honoured"] or rows[name]["errors"]:
            print(f"warning: {name}: {rows[name]['errors']} errors "
                  f"{rows[name]['errors_seen']}, lengths honoured: "
                  f"{rows[name]['lengths_honoured']}")
    target = args.json or results / "continuous_batching.json"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps({"schema": "tradeoff.bench.continuous_batching/2",
                                  "args": {k: str(v) for k, v in vars(args).items()},
                                  "rows": rows}, indent=2))
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
