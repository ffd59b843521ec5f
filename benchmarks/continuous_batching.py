"""Continuous vs static batching vs one request at a time, for a served LLM.

`tradeoff serve` (pinned to one core) serves the same model three times: `continuous`
(iteration-level batching), `static` (a batch runs until all its sequences end) and `one`
(max_num_seqs 1). A client on another core sends the same Poisson arrivals to each, with
output lengths drawn uniformly from --min-tokens..--max-tokens (`ignore_eos`, so every
request generates exactly what it asked for), streams every answer and times it. Then the
in-process ceiling: the engine alone with a full batch (max_num_seqs prompts of the workload,
--ceiling-tokens each, submitted at once), the most tokens/s it can give. --steps-only
times one decode step at 1, 4 and max_num_seqs sequences instead.

Reports output tokens/s, p50/p99 TTFT, p50/p99 TPOT and end-to-end latency, and writes JSON.

    .venv/bin/python benchmarks/continuous_batching.py                  # SmolLM2-135M
    .venv/bin/python benchmarks/continuous_batching.py --device cuda    # on a GPU host
    .venv/bin/python benchmarks/continuous_batching.py --model tinyllama --requests 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

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


async def drive(url: str, model: str, work: list[tuple[float, str, int]]) -> list[GenerationTiming]:
    host, port, _ = split_url(url)
    raws = [generation_request(host, "/v1", generation_body(
        model, prompt=prompt, max_tokens=tokens, ignore_eos=True), chat=False)
        for _, prompt, tokens in work]
    start = time.perf_counter_ns() + 50_000_000
    return list(await asyncio.gather(*(stream_once(host, port, raw, False,
                                                   at_ns=start + int(at * 1e9))
                                       for (at, _, _), raw in zip(work, raws, strict=True))))


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
    return new_engine(config, decoder, tokenizer), tokenizer


def ceiling(engine: Any, tokenizer: Any, work: list[tuple[float, str, int]]) -> dict[str, Any]:
    """Tokens/s of the engine alone (no server), every request of ``work`` at once."""
    from tradeoff.generate.sampling import SamplingParams

    seqs = [engine.add(tokenizer.encode(prompt),
                       SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True))
            for _, prompt, tokens in work]
    start = time.perf_counter()
    while engine.has_work():
        engine.step()
    seconds = time.perf_counter() - start
    tokens = sum(len(s.output) for s in seqs)
    return {"requests": len(work), "output_tokens": tokens, "seconds": seconds,
            "output_tokens_per_s": tokens / seconds}


def step_times(engine: Any, tokenizer: Any, prompts: list[str], sizes: list[int],
               steps: int = 16) -> dict[int, float]:
    """Median milliseconds of one decode step with ``n`` sequences, for each n in sizes."""
    from tradeoff.generate.sampling import SamplingParams

    out = {}
    for n in sizes:
        for prompt in prompts[:n]:
            engine.add(tokenizer.encode(prompt),
                       SamplingParams(max_tokens=steps + 1, temperature=0, ignore_eos=True))
        engine.step()  # prefill
        times = []
        while engine.has_work():
            report = engine.step()
            if len(report.decoded) == n:
                times.append(report.seconds)
        out[n] = float(np.median(times)) * 1000
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "tinyllama"))
    parser.add_argument("--rate", type=float, default=0.25, help="requests per second")
    parser.add_argument("--requests", type=int, default=32,
                        help="requests for continuous and static batching")
    parser.add_argument("--one-requests", type=int, default=10,
                        help="requests one at a time (the first N of the same workload)")
    parser.add_argument("--ceiling-tokens", type=int, default=128,
                        help="output tokens per sequence of the ceiling's full batch")
    parser.add_argument("--min-tokens", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--max-num-seqs", type=int, default=16)
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps-only", action="store_true",
                        help="only time decode steps at 1, 4 and max-num-seqs sequences")
    parser.add_argument("--json", type=Path,
                        default=Path("benchmarks/results/continuous_batching.json"))
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores: one for the server, one for the client")
    server_cpu, client_cpu = cores[0], cores[1]
    work = workload(args.requests, args.rate, args.min_tokens, args.max_tokens, args.seed)
    asked = [n for _, _, n in work]
    configs = {"continuous": {"batching": "continuous", "max_num_seqs": args.max_num_seqs},
               "static": {"batching": "static", "max_num_seqs": args.max_num_seqs},
               "one": {"batching": "continuous", "max_num_seqs": 1}}
    rows: dict[str, dict[str, Any]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name, settings in configs.items():
            write_generative(repo, args.model, directory=name, device=args.device, **settings)
        if args.steps_only:
            engine, tokenizer = _engine(repo / "continuous", server_cpu)
            sizes = sorted({1, 4, args.max_num_seqs})
            times = step_times(engine, tokenizer, [p for _, p, _ in work], sizes)
            for n, ms in times.items():
                print(f"decode step with {n:>2} sequences: {ms:6.1f} ms "
                      f"({n / ms * 1000:5.1f} tokens/s)")
            return
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            os.sched_setaffinity(0, {client_cpu})
            for name in configs:
                subset = work if name != "one" else work[:args.one_requests]
                print(f"{name}: {len(subset)} requests at {args.rate}/s ...", flush=True)
                timings = asyncio.run(drive(server.url, name, subset))
                rows[name] = summarize(timings, asked[:len(subset)])
        print("ceiling: the engine alone, a full batch ...", flush=True)
        full_batch = [(0.0, prompt, args.ceiling_tokens)
                      for _, prompt, _ in work[:args.max_num_seqs]]
        engine, tokenizer = _engine(repo / "continuous", server_cpu)
        rows["ceiling"] = ceiling(engine, tokenizer, full_batch)

    print(f"\n{args.model} on {args.device}, Poisson {args.rate} req/s, output "
          f"{args.min_tokens}-{args.max_tokens} tokens, one run each")
    header = ("config", "reqs", "err", "tok/s", "TTFT p50", "TTFT p99", "TPOT p50",
              "TPOT p99", "e2e p99")
    print("{:<11}{:>5}{:>5}{:>8}{:>10}{:>10}{:>10}{:>10}{:>10}".format(*header))
    for name, row in rows.items():
        def ms(key: str, row: dict[str, Any] = row) -> str:
            return "-" if row.get(key) is None else f"{row[key]:.0f}"
        print(f"{name:<11}{row['requests']:>5}{row.get('errors', 0):>5}"
              f"{row['output_tokens_per_s']:>8.1f}{ms('ttft_p50_ms'):>10}{ms('ttft_p99_ms'):>10}"
              f"{ms('tpot_p50_ms'):>10}{ms('tpot_p99_ms'):>10}{ms('latency_p99_ms'):>10}")
    cont, static, one = rows["continuous"], rows["static"], rows["one"]
    print(f"continuous / static tokens/s: "
          f"{cont['output_tokens_per_s'] / static['output_tokens_per_s']:.2f}x; "
          f"continuous / one-at-a-time: "
          f"{cont['output_tokens_per_s'] / one['output_tokens_per_s']:.2f}x; "
          f"continuous / ceiling: "
          f"{cont['output_tokens_per_s'] / rows['ceiling']['output_tokens_per_s']:.2f}")
    for name in ("continuous", "static", "one"):
        if not rows[name]["lengths_honoured"] or rows[name]["errors"]:
            print(f"warning: {name}: {rows[name]['errors']} errors "
                  f"{rows[name]['errors_seen']}, lengths honoured: "
                  f"{rows[name]['lengths_honoured']}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.continuous_batching/1",
                                     "args": {k: str(v) for k, v in vars(args).items()},
                                     "rows": rows}, indent=2))
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
