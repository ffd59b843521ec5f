"""A BERT-base-shaped encoder at sequence length 128 (or, with ``--shape resnet50``, a
ResNet-50-shaped classifier at 224x224) through the pytorch backend, by precision (fp32,
tf32, bf16, fp16), side by side in one run:

* the in-process ceiling: the backend's own ``run`` (the call the server's instances make,
  host-to-device and device-to-host copies included) at batch 1 (p50 latency) and at each
  batch size (samples/s, peak device memory), the knee found by the project's rule, and
  the GIL hand-offs of a batch at the knee (``gil_waits``);
* served: `tradeoff serve` with dynamic batching and `tradeoff bench` (binary tensors)
  at concurrency 1 (p50) and at twice the knee (throughput), a server per precision
  (TF32 is a process-wide switch in PyTorch, so a TF32 model would change an FP32 one
  served beside it); ``--also 8:v2`` adds requests of 8 rows, ``--switch-interval-ms``
  a server with a lower GIL switch interval;
* `tradeoff tune batch-size --device cuda` on the FP32 model: its knee and its memory per
  sample against the figures torch.cuda reported here.

    # on a GPU host (about 3-4 minutes on one H200):
    python benchmarks/gpu_tensor.py --device cuda --out gpu-out
    # what is still open there: the GIL hand-offs and the switch interval on the fast
    # precisions, and the classifier
    python benchmarks/gpu_tensor.py --device cuda --out gpu-out --precisions bf16,fp16 \
        --served-instances 1 --also 8:v2 --switch-interval-ms 0.5 --skip-checks \
        --skip-tune --compile ""
    python benchmarks/gpu_tensor.py --device cuda --out gpu-resnet --shape resnet50 \
        --precisions fp32,bf16 --skip-checks --compile ""
    # a CPU smoke run of the same script on a small encoder:
    python benchmarks/gpu_tensor.py --device cpu --shape tiny --out /tmp/gpu-tensor \\
        --batches 1,2,4,8 --seconds 1

Writes ``gpu_tensor.json`` (and the bench and tune JSON it read) under ``--out``, and
prints one table.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gil_handoff import SwitchIntervalServer, gil_waits

from tradeoff.backends.pytorch import TorchBackend
from tradeoff.models.torch_models import EncoderShape, ResNetShape, write_encoder, write_resnet
from tradeoff.repository.repository import ModelRepository
from tradeoff.server.process import ServerProcess
from tradeoff.stats.knee import find_knee

SHAPES: dict[str, EncoderShape | ResNetShape] = {
    "base": EncoderShape(max_batch=256),
    "tiny": EncoderShape(vocab=1000, hidden=64, layers=2, heads=4, intermediate=128,
                         sequence=32, max_batch=16),
    "resnet50": ResNetShape(max_batch=256),
    "resnet-tiny": ResNetShape(blocks=(1, 1), width=8, classes=10, image=32, max_batch=16)}


def family(shape: EncoderShape | ResNetShape) -> str:
    """The models' name prefix: ``bert`` or ``resnet``."""
    return "bert" if isinstance(shape, EncoderShape) else "resnet"


def build(root: Path, shape: EncoderShape | ResNetShape, precisions: list[str],
          kind: str) -> None:
    """FAMILY_fp32 written once; every other precision a model of its own on the same file
    (its version directory a link), differing only in its parameters."""
    first = f"{family(shape)}_fp32"
    if isinstance(shape, EncoderShape):
        write_encoder(root, first, shape, kind=kind)
    else:
        write_resnet(root, first, shape, kind=kind)
    base = (root / first / "config.pbtxt").read_text()
    for precision in precisions:
        name = f"{family(shape)}_{precision}"
        if name == first:
            continue
        (root / name).mkdir()
        (root / name / "1").symlink_to((root / first / "1").resolve())
        (root / name / "config.pbtxt").write_text(
            base.replace(f'name: "{first}"', f'name: "{name}"')
            + f'parameters {{ key: "precision" value: {{ string_value: "{precision}" }} }}\n'
            + 'parameters { key: "precision_mode" value: { string_value: "cast" } }\n')


def inputs(shape: EncoderShape | ResNetShape, rows: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(rows)
    if isinstance(shape, ResNetShape):
        return {"INPUT__0": rng.standard_normal((rows, 3, shape.image, shape.image),
                                                dtype=np.float32)}
    return {"INPUT__0": rng.integers(0, shape.vocab, (rows, shape.sequence), dtype=np.int64),
            "INPUT__1": np.ones((rows, shape.sequence), np.int64)}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def in_process(root: Path, name: str, shape: EncoderShape | ResNetShape, batches: list[int],
               seconds: float, device: str) -> dict[str, Any]:
    """The backend's run at batch 1 (p50 of individual calls) and per batch size."""
    source = ModelRepository(root).read(name)
    spec = source.config.instance_spec(source.versions[1], intra_op_threads=0,
                                       kind="KIND_GPU" if device == "cuda" else "KIND_CPU",
                                       device_id=0)
    backend = TorchBackend(spec)
    one = inputs(shape, 1)

    def b1_times_ms() -> list[float]:
        times: list[float] = []
        deadline = time.perf_counter() + seconds
        while time.perf_counter() < deadline or len(times) < 20:
            started = time.perf_counter()
            backend.run(one, ["OUTPUT__0"])
            times.append((time.perf_counter() - started) * 1e3)
        return times

    try:
        for _ in range(20):
            backend.run(one, ["OUTPUT__0"])
        b1 = b1_times_ms()
        points = []
        for rows in batches:
            feed = inputs(shape, rows)
            try:
                backend.run(feed, ["OUTPUT__0"])
                sync(device)
                if device == "cuda":
                    torch.cuda.reset_peak_memory_stats()
                runs, started = 0, time.perf_counter()
                while time.perf_counter() - started < seconds / 2 or runs < 3:
                    backend.run(feed, ["OUTPUT__0"])
                    runs += 1
                elapsed = time.perf_counter() - started
            except Exception as exc:
                points.append({"batch": rows, "error": f"{type(exc).__name__}: {exc}"[:300]})
                break
            points.append({"batch": rows, "samples_per_s": runs * rows / elapsed,
                           "batch_ms": elapsed / runs * 1e3,
                           "peak_mb": torch.cuda.max_memory_allocated() / 2**20
                           if device == "cuda" else None})
        good = [p for p in points if "error" not in p]
        knee = find_knee([p["batch"] for p in good], [p["samples_per_s"] for p in good])
        knee_batch = good[knee]["batch"] if knee is not None else good[-1]["batch"]
        handoffs = gil_waits(backend, inputs(shape, knee_batch), ["OUTPUT__0"], seconds)
        # a served instance has run every batch size by the time batch 1 arrives: a
        # TorchScript executor that specialised on the first shapes it saw is slower now
        b1_after = statistics.median(b1_times_ms())
    finally:
        backend.close()
    return {"b1_p50_ms": statistics.median(b1), "b1_calls": len(b1),
            "b1_p50_ms_after_sweep": b1_after, "points": points,
            "knee_batch": knee_batch,
            "knee_samples_per_s": next(p["samples_per_s"] for p in good
                                       if p["batch"] == knee_batch),
            "gil_at_knee": handoffs}


def bench(server: ServerProcess, name: str, concurrency: int, seconds: float,
          out: Path, workers: int, rows: int = 1, protocol: str = "v2") -> dict[str, Any]:
    path = out / f"bench_{name}_c{concurrency}_r{rows}_{protocol}.json"
    url = server.url if protocol == "v2" else server.grpc_url
    command = [sys.executable, "-m", "tradeoff", "bench", url, "--model", name,
               "--protocol", protocol, "--concurrency", str(concurrency),
               "--duration", f"{seconds}s", "--warmup", "2s", "--batch-size", str(rows),
               "--json", str(path)]
    if workers > 1 and concurrency >= 2 * workers:
        command += ["--workers", str(workers)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=600, check=False)
    if run.returncode:
        return {"error": (run.stderr or run.stdout)[-800:]}
    document = json.loads(path.read_text())
    summary = document["summary"]
    server_ms = summary.get("server_ms") or {}
    return {"concurrency": concurrency, "rows": rows, "protocol": protocol,
            "infer_per_s": summary["inferences_per_s"],
            "p50_ms": summary["latency_ms"]["p50"], "p99_ms": summary["latency_ms"]["p99"],
            "errors": summary.get("errors", 0),
            "server_p50_ms": {k: v["p50"] for k, v in server_ms.items()
                              if isinstance(v, dict) and "p50" in v},
            "server_counts": summary.get("server_counts")}


def served(root: Path, name: str, knee: int, seconds: float, out: Path, workers: int,
           instances: int, extra: list[tuple[int, str]],
           switch_interval_s: float | None = None) -> dict[str, Any]:
    """A server holding ``name`` alone, its max_batch_size the knee and ``instances``
    instances (each its own stream: one copies and prepares while another computes),
    benched at c1 and at twice the knee (a batch running, the next one queued); with
    ``switch_interval_s``, served again at the knee with that GIL switch interval."""
    alone = Path(tempfile.mkdtemp(prefix="gpu-tensor-one-"))
    (alone / name).mkdir()
    (alone / name / "1").symlink_to((root / name / "1").resolve())
    config = (root / name / "config.pbtxt").read_text()
    config = re.sub(r"max_batch_size: \d+", f"max_batch_size: {knee}", config)
    config = config.replace("count: 1 kind:", f"count: {instances} kind:")
    (alone / name / "config.pbtxt").write_text(config)
    try:
        server = ServerProcess(alone, extra_args=("--log-level", "warning")).start(timeout=600)
        try:
            runs: dict[str, Any] = {"max_batch_size": knee, "instances": instances,
                                    "c1": bench(server, name, 1, seconds, out, workers),
                                    "knee": bench(server, name, max(2 * knee, 2), seconds,
                                                  out, workers)}
            for rows, protocol in extra:  # where the served path's own ceiling lies
                runs[f"knee_r{rows}_{protocol}"] = bench(
                    server, name, max(2 * knee // rows, 2), seconds, out, workers, rows,
                    protocol)
        finally:
            stop(server, out, name)
        if switch_interval_s is not None:
            server = SwitchIntervalServer(alone, switch_interval_s,
                                          extra_args=("--log-level", "warning")
                                          ).start(timeout=600)
            try:
                runs[f"knee_switch_{switch_interval_s * 1e3:g}ms"] = bench(
                    server, name, max(2 * knee, 2), seconds, out, workers)
            finally:
                stop(server, out, f"{name}_switch")
        return runs
    finally:
        shutil.rmtree(alone, ignore_errors=True)


def stop(server: ServerProcess, out: Path, name: str) -> None:
    """Stop ``server``, keeping its log under ``out`` when it logged an error."""
    server.stop()
    log = server.close_log()
    if "Traceback" in log or "ERROR" in log:
        (out / f"serve_{name}.log").write_text(log[-20000:])


def tune(root: Path, name: str, device: str, out: Path, max_memory: str) -> dict[str, Any]:
    path = out / f"tune_{name}.json"
    run = subprocess.run([sys.executable, "-m", "tradeoff", "tune", "batch-size",
                          str(root / name), "--device", device, "--max-memory", max_memory,
                          "--seconds", "0.5", "--json", str(path)],
                         capture_output=True, text=True, timeout=900, check=False)
    if run.returncode:
        return {"error": (run.stderr or run.stdout)[-800:]}
    document = json.loads(path.read_text())
    return {"knee": document.get("knee"), "recommended": document.get("recommended"),
            "memory": document.get("memory"), "stdout_tail": run.stdout[-1500:]}


def guarded(stage: str, call: Any, *args: Any) -> Any:
    """``call(*args)``, or what it raised as a record: one failed stage must not cost the
    others their figures (a GPU run is paid for once)."""
    try:
        return call(*args)
    except Exception as exc:
        import traceback

        print(f"{stage} failed:\n{traceback.format_exc()[-3000:]}", flush=True)
        return {"error": f"{type(exc).__name__}: {exc}"[:1000]}


def checks(device: str, compile_mode: str) -> dict[str, Any]:
    """On a small encoder: both formats on the device against eager PyTorch on the CPU,
    16-bit precisions against FP32, a real out-of-memory batch (the allocator capped)
    failing alone, and torch.compile's load time and answer."""
    from torch.nn import functional

    from tradeoff.backends.registry import InstanceSpec
    from tradeoff.errors import InferenceFailed
    from tradeoff.models.torch_models import encoder_module

    shape = SHAPES["tiny"]
    root = Path(tempfile.mkdtemp(prefix="gpu-tensor-checks-"))
    kind = "KIND_GPU" if device == "cuda" else "KIND_CPU"
    write_encoder(root, "pt", shape, kind=kind)
    write_encoder(root, "pt2", shape, exported=True, kind=kind)
    feed = inputs(shape, 8)
    with torch.inference_mode():
        eager = encoder_module(shape)(*(torch.from_numpy(feed[k]) for k in sorted(feed))).numpy()
    result: dict[str, Any] = {}
    repository = ModelRepository(root)

    def backend(name: str, **parameters: str) -> TorchBackend:
        source = repository.read(name)
        config = source.config
        spec = config.instance_spec(source.versions[1], intra_op_threads=0, kind=kind,
                                    device_id=0, parameters={**config.parameters,
                                                             **parameters})
        return TorchBackend(spec)

    def answer(instance: TorchBackend, rows: dict[str, np.ndarray]) -> np.ndarray:
        names = list(instance.positions)
        return instance.run(dict(zip(names, rows.values(), strict=True)), ["OUTPUT__0"])[
            "OUTPUT__0"]

    for name in ("pt", "pt2") if not compile_mode else ():
        instance = backend(name)
        got = answer(instance, feed)
        result[f"{name}_max_abs_diff_vs_eager_cpu"] = float(np.abs(got - eager).max())
        for precision in ("bf16", "fp16"):
            low = answer(backend(name, precision=precision, precision_mode="cast"), feed)
            result[f"{name}_{precision}_cosine_min"] = float(functional.cosine_similarity(
                torch.from_numpy(low), torch.from_numpy(got)).min())
        if device == "cuda":
            result[f"{name}_streams_differ"] = backend(name).stream != instance.stream
    if device == "cuda" and not compile_mode:  # a real OOM: the allocator capped
        instance = backend("pt")
        torch.cuda.empty_cache()
        torch.cuda.set_per_process_memory_fraction(0.002)
        try:
            answer(instance, inputs(shape, 4096 * 8))
            result["oom"] = "no OOM at this cap"
        except InferenceFailed as exc:
            result["oom"] = str(exc)[:300]
        except Exception as exc:  # the wrong error: recorded, the checks go on
            result["oom"] = f"not InferenceFailed: {type(exc).__name__}: {exc}"[:300]
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        result["after_oom_max_abs_diff"] = float(np.abs(answer(instance, feed) - eager).max())
    if compile_mode:
        source = repository.read("pt2")
        spec = InstanceSpec("pt2", source.versions[1], parameters={"compile": compile_mode},
                            kind=kind, device_id=0, inputs=source.config.instance_spec(
                                source.versions[1], intra_op_threads=0).inputs,
                            outputs=source.config.instance_spec(
                                source.versions[1], intra_op_threads=0).outputs,
                            max_batch_size=4)
        compiled = TorchBackend(spec)
        result["compile_seconds_batches_1_2_4"] = compiled.compile_seconds
        four = {k: v[:4] for k, v in feed.items()}
        result["compile_max_abs_diff_vs_eager_cpu"] = float(np.abs(
            answer(compiled, four) - eager[:4]).max())
    shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--shape", choices=tuple(SHAPES), default="base")
    parser.add_argument("--precisions", default="fp32,tf32,bf16,fp16")
    parser.add_argument("--batches", default="1,2,4,8,16,32,64,128,256")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--workers", type=int, default=4, help="bench load processes")
    parser.add_argument("--served-instances", type=int, default=2,
                        help="instances of the served model (one stream each)")
    parser.add_argument("--also", default="",
                        help="more served runs at the knee: ROWS:PROTOCOL,... e.g. "
                             "8:v2,1:v2-grpc (ROWS per request)")
    parser.add_argument("--switch-interval-ms", type=float, default=None,
                        help="also serve at the knee with this GIL switch interval")
    parser.add_argument("--skip-checks", action="store_true")
    parser.add_argument("--knees", default="",
                        help="PRECISION=BATCH,... the served max_batch_size instead of the "
                             "knee measured in process")
    parser.add_argument("--max-memory", default="60GB", help="tune batch-size --max-memory")
    parser.add_argument("--skip-served", action="store_true")
    parser.add_argument("--skip-tune", action="store_true")
    parser.add_argument("--compile", default="default",
                        help="torch.compile mode for the checks ('' skips it)")
    parser.add_argument("--out", type=Path, default=Path("gpu-out"))
    parser.add_argument("--budget-s", type=float, default=1e9,
                        help="skip the tune and compile stages once this much time is spent")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    precisions = args.precisions.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    root = Path(tempfile.mkdtemp(prefix="gpu-tensor-"))
    scratch = Path(tempfile.mkdtemp(prefix="gpu-tensor-runs-"))  # bench and tune JSON
    kind = "KIND_GPU" if args.device == "cuda" else "KIND_CPU"
    began = started = time.perf_counter()
    extra = [(int(r), p) for r, p in (item.split(":") for item in args.also.split(",") if item)]
    report_checks = {} if args.skip_checks else guarded("checks", checks, args.device, "")
    print(f"checks ({time.perf_counter() - started:.1f} s): {json.dumps(report_checks)}",
          flush=True)
    started = time.perf_counter()
    build(root, shape, precisions, kind)
    print(f"built in {time.perf_counter() - started:.1f} s", flush=True)
    report: dict[str, Any] = {
        "schema": "tradeoff.gpu_tensor/1", "shape": vars(shape), "device": args.device,
        "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
        "torch": torch.__version__, "checks": report_checks, "precisions": {}}
    # fp32 first: tf32, once on, stays on in this process
    for precision in precisions:
        name = f"{family(shape)}_{precision}"
        entry: dict[str, Any] = {"in_process": guarded(
            f"{name} in process", in_process, root, name, shape, batches, args.seconds,
            args.device)}
        report["precisions"][precision] = entry
        if "error" in entry["in_process"]:
            continue
        print(f"{name} in process: b1 p50 {entry['in_process']['b1_p50_ms']:.3f} ms "
              f"({entry['in_process']['b1_p50_ms_after_sweep']:.3f} after every batch "
              f"size), knee "
              f"{entry['in_process']['knee_batch']} at "
              f"{entry['in_process']['knee_samples_per_s']:,.0f}/s, GIL waits a batch "
              f"{entry['in_process']['gil_at_knee']['gil_waits_per_batch']:.1f}", flush=True)
    if not args.skip_served:
        for precision in precisions:
            name = f"{family(shape)}_{precision}"
            entry = report["precisions"][precision]
            if "error" in entry["in_process"]:
                continue
            given = dict(pair.split("=") for pair in args.knees.split(",") if pair)
            knee = int(given.get(precision, entry["in_process"]["knee_batch"]))
            entry["served"] = guarded(f"{name} served", served, root, name, knee,
                                      args.seconds, scratch, args.workers,
                                      args.served_instances, extra,
                                      None if args.switch_interval_ms is None
                                      else args.switch_interval_ms / 1e3)
            print(f"{name} served: {json.dumps(entry['served'])}", flush=True)
    (args.out / "gpu_tensor.json").write_text(json.dumps(report, indent=2))
    if not args.skip_tune and time.perf_counter() - began < args.budget_s:
        report["tune_fp32"] = guarded("tune", tune, root, f"{family(shape)}_fp32",
                                      args.device, scratch, args.max_memory)
        print(report["tune_fp32"].get("stdout_tail") or report["tune_fp32"], flush=True)
    if args.compile and time.perf_counter() - began < args.budget_s:
        report["compile_check"] = guarded("compile", checks, args.device, args.compile)
        print(f"compile check: {json.dumps(report['compile_check'])}", flush=True)
    (args.out / "gpu_tensor.json").write_text(json.dumps(report, indent=2))
    print_table(report)
    shutil.rmtree(root, ignore_errors=True)


def print_table(report: dict[str, Any]) -> None:
    print(f"\n{report['gpu'] or report['device']}, torch {report['torch']}")
    print("precision | b1 p50 ms in process | served c1 p50 ms | knee batch | in process/s "
          "| served/s at 2x knee | served/ceiling at the served max batch")
    for precision, entry in report["precisions"].items():
        ceiling = entry["in_process"]
        if "error" in ceiling:
            print(f"{precision} | failed: {ceiling['error'][:200]}")
            continue
        row = entry.get("served", {})
        c1 = row.get("c1", {}).get("p50_ms")
        at_knee = row.get("knee", {}).get("infer_per_s")
        batch = row.get("max_batch_size", ceiling["knee_batch"])
        same = next((p["samples_per_s"] for p in ceiling["points"]
                     if p["batch"] == batch and "samples_per_s" in p), None)
        ratio = at_knee / same if at_knee and same else None
        print(f"{precision} | {ceiling['b1_p50_ms']:.3f} | "
              f"{c1 if c1 is None else f'{c1:.3f}'} | {ceiling['knee_batch']} | "
              f"{ceiling['knee_samples_per_s']:,.0f} | "
              f"{at_knee if at_knee is None else f'{at_knee:,.0f}'} | "
              f"{ratio if ratio is None else f'{ratio:.2f}'}")


if __name__ == "__main__":
    main()
