"""The LLM engine's decode on a GPU, side by side in one run: the engine in process (its
decode step, what the server runs), the same model served (`tradeoff serve` +
`tradeoff bench --protocol openai`), and transformers' `generate` with a static KV cache
and `torch.compile` on the same weights (the anchor a user gets in two lines).

For each batch size it reports output tokens/s and the time per output token, and for the
engine a `torch.profiler` count per decode step of what the host launched: kernels,
graph launches, copies and synchronisations. Writes JSON (`--json`).

    # on a GPU host, a generative model directory (generate.yaml + a Hugging Face dir):
    python benchmarks/gpu_decode.py MODEL_DIR --batches 1,16,64,256 --json gpu-out/decode.json
    # a CPU smoke run of the same script on tinyllama:
    python benchmarks/gpu_decode.py --tinyllama --device cpu --batches 1,4 --steps 4 \\
        --skip-served --skip-transformers

`--input-tokens` and `--output-tokens` (128 each) match the GPU figures in
`benchmarks/RESULTS.md`; `max_num_seqs` is raised to the largest batch.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.loader import load_generative, new_engine
from tradeoff.generate.sampling_params import SamplingParams

HOST_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cudaGraphLaunch", "cudaMemcpyAsync",
              "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def synchronize(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def engine_decode(model_dir: Path, batch: int, steps: int, input_tokens: int,
                  device: str) -> dict[str, Any]:
    """The engine in process: ``batch`` sequences prefilled, then ``steps`` timed pure
    decode steps, then a profiled few."""
    config, decoder, _ = load_generative(model_dir)
    config = GenerativeConfig(**{**config.__dict__, "max_num_seqs": max(batch, 1),
                                 "max_num_batched_tokens": max(batch * input_tokens, 2048)})
    engine = new_engine(config, decoder)
    generator = torch.Generator().manual_seed(0)
    vocab = decoder.config.vocab_size
    params = SamplingParams(max_tokens=steps + 16, temperature=0.0, ignore_eos=True)
    for _ in range(batch):
        engine.add(torch.randint(3, vocab, (input_tokens,), generator=generator).tolist(),
                   params)
    while any(s.pending > 1 for s in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    for _ in range(3):  # the graphs of this shape are captured here
        engine.step()
    synchronize(device)
    started = time.perf_counter()
    for _ in range(steps):
        engine.step()
    synchronize(device)
    step_ms = (time.perf_counter() - started) / steps * 1e3
    profiled = 5
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as profile:
        for _ in range(profiled):
            engine.step()
        synchronize(device)
    counts = {e.key: e.count / profiled for e in profile.key_averages() if e.key in HOST_CALLS}
    capture = engine.decode_step.capture_seconds if engine.decode_step is not None else 0.0
    return {"batch": batch, "step_ms": step_ms, "tokens_per_s": batch / step_ms * 1e3,
            "host_calls_per_step": counts, "graph_capture_s": capture}


def served(model_dir: Path, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    """`tradeoff serve` on a copy of the model with max_num_seqs >= ``batch``, driven by
    `tradeoff bench --protocol openai` at concurrency ``batch``."""
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "repo"
        copy = repo / model_dir.name
        copy.mkdir(parents=True)
        for entry in model_dir.iterdir():  # the weights by link, generate.yaml edited
            if entry.name != "generate.yaml":
                (copy / entry.name).symlink_to(entry.resolve())
        text = (model_dir / "generate.yaml").read_text()
        lines = [line for line in text.splitlines() if not line.startswith("max_num_seqs")]
        lines.append(f"max_num_seqs: {max(batch, 16)}")
        (copy / "generate.yaml").write_text("\n".join(lines) + "\n")
        port = str(args.port)
        server = subprocess.Popen([sys.executable, "-m", "tradeoff", "serve",
                                   "--model-repository", str(repo), "--http-port", port,
                                   "--no-grpc"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.STDOUT)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                ready = subprocess.run(["curl", "-sf", f"{url}/v2/health/ready"],
                                       check=False, capture_output=True).returncode == 0
                if ready:
                    break
                time.sleep(0.5)
            result = Path(tmp) / "bench.json"
            subprocess.run([sys.executable, "-m", "tradeoff", "bench", f"{url}/v1",
                            "--protocol", "openai", "--model", model_dir.name,
                            "--concurrency", str(batch), "--duration", args.duration,
                            "--warmup", "3s", "--input-tokens", str(args.input_tokens),
                            "--output-tokens", str(args.output_tokens), "--ignore-eos",
                            "--json", str(result)], check=True)
            doc: dict[str, Any] = json.loads(result.read_text())
            return {"batch": batch, "bench": doc}
        finally:
            server.terminate()
            server.wait(60)


def transformers_compiled(model_dir: Path, batch: int, args: argparse.Namespace
                          ) -> dict[str, Any]:
    """transformers' generate, static cache (its automatic torch.compile), greedy,
    exactly ``--output-tokens`` new tokens per sequence."""
    from transformers import AutoModelForCausalLM

    config = GenerativeConfig.of_model(model_dir)
    dtype = torch.bfloat16 if config.precision == "bf16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir / config.path, dtype=dtype)
    model = model.to(args.device).eval()
    model.generation_config.cache_implementation = "static"
    prompt = torch.randint(3, model.config.vocab_size, (batch, args.input_tokens),
                           device=args.device)
    mask = torch.ones_like(prompt)

    def generate(new: int) -> float:
        synchronize(args.device)
        started = time.perf_counter()
        with torch.no_grad():
            model.generate(prompt, attention_mask=mask, max_new_tokens=new,
                           min_new_tokens=new, do_sample=False)
        synchronize(args.device)
        return time.perf_counter() - started

    generate(args.output_tokens)  # compiles
    generate(args.output_tokens)
    first = generate(1)
    whole = generate(args.output_tokens)
    return {"batch": batch, "tokens_per_s": batch * args.output_tokens / whole,
            "tpot_ms": (whole - first) / (args.output_tokens - 1) * 1e3}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, nargs="?", help="a generative model directory")
    parser.add_argument("--tinyllama", action="store_true",
                        help="write and use tinyllama (random weights) instead")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--batches", default="1,16,64,256")
    parser.add_argument("--steps", type=int, default=50, help="timed decode steps")
    parser.add_argument("--input-tokens", type=int, default=128)
    parser.add_argument("--output-tokens", type=int, default=128)
    parser.add_argument("--duration", default="20s", help="of each served run")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--skip-transformers", action="store_true")
    parser.add_argument("--json", type=Path, default=Path("gpu_decode.json"))
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp())
    try:
        model_dir = args.model
        if args.tinyllama:
            from tradeoff.models.tinyllama import write_tinyllama

            model_dir = workdir / "tinyllama"
            write_tinyllama(model_dir / "1")
            (model_dir / "generate.yaml").write_text(f"format: hf\npath: \"1\"\n"
                                                     f"device: {args.device}\n")
        if model_dir is None:
            parser.error("name a model directory, or pass --tinyllama")
        batches = [int(b) for b in args.batches.split(",")]
        out: dict[str, Any] = {"device": (torch.cuda.get_device_name()
                                          if args.device.startswith("cuda") else "cpu"),
                               "torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                               "engine": [], "served": [], "transformers": []}
        for batch in batches:
            row = engine_decode(model_dir, batch, args.steps, args.input_tokens, args.device)
            out["engine"].append(row)
            print(f"engine b{batch}: {row['step_ms']:.2f} ms/step, "
                  f"{row['tokens_per_s']:,.0f} tok/s, host calls/step "
                  f"{row['host_calls_per_step']}", flush=True)
            if not args.skip_transformers:
                try:
                    hf = transformers_compiled(model_dir, batch, args)
                except Exception as exc:  # an anchor that does not run is reported
                    hf = {"batch": batch, "error": repr(exc)[:300]}
                out["transformers"].append(hf)
                print(f"transformers b{batch}: {hf}", flush=True)
            if not args.skip_served:
                out["served"].append(served(model_dir, batch, args))
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {args.json}")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
