"""What a response-cache hit costs in process: the key's digests, the lookup, the MAC
check and the decoding, for answers of several sizes; this tree and, with
``--baseline-src``, another checkout, run side by side in one run (interleaved rounds,
medians reported).

    .venv/bin/python benchmarks/cache_hit_cost.py --baseline-src /tmp/before/src

Writes benchmarks/results/cache_hit_cost.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from tradeoff.server.process import source_tree

SIZES = (40, 1_536, 65_536)  # answer bytes: mlp's 10 floats, minilm's 384, a 64 KiB one
ROUNDS = 5

MEASURE = r"""
import asyncio, json, sys, time
import numpy as np
from tradeoff.protocol.v2 import TensorOutput
import tradeoff.server.cache as c

size = int(sys.argv[1])
cache = c.ResponseCache.from_spec(c.CacheSpec.parse("local,size=64MB", {}) if
                                  "env" in c.CacheSpec.parse.__code__.co_varnames
                                  else c.CacheSpec.parse("local,size=64MB"))
inputs = [("INPUT0", "FP32", np.ones((1, 256), np.float32))]
wanted = [("OUTPUT0", False)]
out = [TensorOutput("OUTPUT0", np.ones((1, size // 4), np.float32), "FP32", False)]
new = hasattr(cache, "tensor_key")
key_of = (lambda: cache.tensor_key(b"t" * 32, "mlp", 1, inputs, wanted, {})) if new else \
    (lambda: c.tensor_key("mlp", 1, inputs, wanted, {}))
expected = [("OUTPUT0", "FP32", False, [1, size // 4])]
cache.keep(key_of(), out)
loop = asyncio.new_event_loop()

async def hits(n):
    for _ in range(n):
        key = key_of()
        found = await (cache.lookup(key, expected) if new else cache.lookup(key))
        assert found is not None

n = 20_000 if size < 10_000 else 4_000
loop.run_until_complete(hits(200))
started = time.perf_counter()
loop.run_until_complete(hits(n))
print(json.dumps({"us_per_hit": (time.perf_counter() - started) / n * 1e6}))
"""


def measure(src: Path, size: int) -> float:
    env = dict(os.environ, PYTHONPATH=str(src))
    done = subprocess.run([sys.executable, "-c", MEASURE, str(size)], env=env,
                          capture_output=True, text=True, check=True)
    return float(json.loads(done.stdout)["us_per_hit"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline-src", type=source_tree,
                        help="the src folder of another checkout to measure beside this one")
    parser.add_argument("--out", type=Path,
                        default=Path(__file__).parent / "results" / "cache_hit_cost.json")
    args = parser.parse_args()
    trees = {"this tree": Path(__file__).resolve().parents[1] / "src"}
    if args.baseline_src:
        trees["baseline"] = args.baseline_src
    runs: dict[str, dict[int, list[float]]] = {t: {s: [] for s in SIZES} for t in trees}
    for _ in range(ROUNDS):  # interleaved: both trees see the same machine state
        for size in SIZES:
            for name, src in trees.items():
                runs[name][size].append(measure(src, size))
    result = {name: {str(size): sorted(v)[len(v) // 2] for size, v in sizes.items()}
              for name, sizes in runs.items()}
    print(f"{'answer bytes':>12}  " + "  ".join(f"{t:>12}" for t in trees)
          + ("  ratio" if len(trees) == 2 else ""))
    for size in SIZES:
        cells = [result[t][str(size)] for t in trees]
        ratio = f"  {cells[0] / cells[1]:.2f}x" if len(cells) == 2 else ""
        print(f"{size:>12,}  " + "  ".join(f"{v:>9.1f} us" for v in cells) + ratio)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"us_per_hit_median": result, "rounds": ROUNDS}, indent=2))
    print(f"results: {args.out}")


if __name__ == "__main__":
    main()
