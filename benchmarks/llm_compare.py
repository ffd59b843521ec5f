"""Continuous vs static batching of one LLM, measured through `tradeoff compare`.

Serves the model twice from one `tradeoff serve` (pinned to one core): `continuous` and
`static` (a batch runs until all its sequences end), then runs, pinned to another core,

    tradeoff compare --protocol openai --endpoint continuous=... --endpoint static=...

(interleaved rounds, bootstrap intervals on tokens/s, TTFT and TPOT ratios) and
`tradeoff report` on the result. Prints the comparison; writes the JSON and the HTML.

    .venv/bin/python benchmarks/llm_compare.py
    .venv/bin/python benchmarks/llm_compare.py --model tinyllama --duration 5 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tradeoff.models.generative import write_generative
from tradeoff.server.process import ServerProcess


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m", choices=("smollm2-135m", "tinyllama"))
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--warmup", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--input-tokens", default="32:64")
    parser.add_argument("--output-tokens", default="16:128")
    parser.add_argument("--slo", default="ttft_ms=2000,tpot_ms=400")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    args = parser.parse_args()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit("needs two cores: one for the server, one for the client")
    args.out.mkdir(parents=True, exist_ok=True)
    result, report = args.out / "llm_compare.json", args.out / "llm_compare.html"
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        for name in ("continuous", "static"):
            write_generative(repo, args.model, directory=name, batching=name, max_num_seqs=16)
        with ServerProcess(repo, cpus=str(cores[0])) as server:
            base = f"{server.url}/v1"
            command = [
                "taskset", "-c", str(cores[1]), sys.executable, "-m", "tradeoff", "compare",
                "--protocol", "openai", "--endpoint", f"continuous={base},model=continuous",
                "--endpoint", f"static={base},model=static",
                "--concurrency", str(args.concurrency), "--duration", str(args.duration),
                "--warmup", str(args.warmup), "--rounds", str(args.rounds),
                "--input-tokens", args.input_tokens, "--output-tokens", args.output_tokens,
                "--ignore-eos", "--slo", args.slo, "--timeout", "120", "--json", str(result)]
            print("$", " ".join(command[3:]), flush=True)
            subprocess.run(command, check=True)
    subprocess.run([sys.executable, "-m", "tradeoff", "report", str(result), "-o", str(report),
                    "--title", f"{args.model}: continuous vs static batching"], check=True)


if __name__ == "__main__":
    main()
