"""`tradeoff serve` side by side with the servers users pick instead: Triton (through
PyTriton) and MLServer, on the same ONNX files, the same cores and the same clients.

Four servers, all on core 0 (taskset), one intra-op thread each, serving the example
models `tiny` (FP32 [-1, 16], y = 2x + 1: all the cost is the request's path) and `mlp`
(256-1024-1024-10, ReLU) from tradeoff.models, the same ONNX files for all:

- `tradeoff serve`, `dynamic_batching { }`, max_batch_size 32;
- `tradeoff serve` without batching;
- Triton through PyTriton (benchmarks/peers/pytriton_server.py), dynamic batching with
  no delay, max_batch_size 32: the model runs in PyTriton's Python process, as
  Triton's own ONNX Runtime backend does not come from a package registry;
- MLServer without batching, the ONNX file run by benchmarks/peers/mlserver_runtime.py.

Each peer gets its own venv under the cache folder (~/.cache/tradeoff/peers by default;
`pip install nvidia-pytriton onnxruntime`, `pip install mlserver onnxruntime`) unless it
is there already; a peer that cannot be installed or started is left out, saying why.

Two clients on core 1 drive them, at concurrency 1 and 64 by default:

- perf_analyzer (.tools/bin/perf_analyzer, from scripts/get_perf_analyzer.sh), binary
  tensors where the server has the extension (MLServer gets JSON), stable windows
  (`-p 2000 -s 20`); round r measures every server at every load once, then round r+1;
  medians of the rounds;
- `tradeoff compare`, per load, in pairs that differ in the server only: tradeoff serve
  (batching) against PyTriton with binary tensors, and tradeoff serve (no batching)
  against MLServer with JSON tensors; it interleaves the pair for --repeats rounds and
  gives every ratio a 95% confidence interval and fairness checks.

The servers stay up together (idle, each takes under 1% of the core). Every measurement
also records the share of core 0 that other processes took meanwhile (/proc/stat less
the servers' own CPU time): on a shared machine, above a few percent, the figures are of
a contested core, and servers that pass each request between processes (PyTriton) lose
the most.

With --baseline-src DIR, our two servers also run from another source tree (PYTHONPATH=DIR,
e.g. a `git worktree` of the commit before a change) in the same rounds: before and after
side by side. With --peers "" only ours are measured (a concurrency sweep, say).

Prints infer/s [p50 ms] per server and load, and ours against each peer, and writes
benchmarks/results/peers.json (schema tradeoff.bench.peers/1).

    .venv/bin/python benchmarks/peers.py
    .venv/bin/python benchmarks/peers.py --quick
    .venv/bin/python benchmarks/peers.py --repeats 5 --concurrency 1,8,64
    .venv/bin/python benchmarks/peers.py --peers mlserver --cache-dir /tmp/peers
    .venv/bin/python benchmarks/peers.py --setup-only
    .venv/bin/python benchmarks/peers.py --peers "" --baseline-src /tmp/before/src
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import onnx
from harness import command_line, write_results
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from tradeoff.models import build_repository
from tradeoff.results import CompareResult, environment, load_as
from tradeoff.server.process import ServerProcess, free_port, source_tree

ROOT = Path(__file__).resolve().parent.parent
PEER_FILES = Path(__file__).resolve().parent / "peers"
PERF_ANALYZER = ROOT / ".tools" / "bin" / "perf_analyzer"
CLI = str(Path(sys.executable).with_name("tradeoff"))
MODELS = ("tiny", "mlp")
MAX_BATCH_SIZE = 32
TRITON_TOKEN = "triton-access-token:tradeoff-bench"  # PyTriton guards the statistics
SCHEMA = "tradeoff.bench.peers/1"
UNSTABLE = "did not stabilise"
CONTESTED = 0.1  # share of the server core others took above which a figure gets a *


@dataclass(frozen=True)
class Peer:
    """A server to install into a venv of its own."""

    key: str
    title: str
    packages: tuple[str, ...]  # what pip installs
    imports: tuple[str, ...]  # what must import afterwards


PEERS = {peer.key: peer for peer in (
    Peer("pytriton", "PyTriton", ("nvidia-pytriton", "onnxruntime"),
         ("pytriton.triton", "onnxruntime")),
    Peer("mlserver", "MLServer", ("mlserver", "onnxruntime"), ("mlserver", "onnxruntime")),
)}


@dataclass(frozen=True)
class Config:
    """One server as measured: its row in the tables."""

    key: str
    label: str
    peer: str | None  # None: tradeoff serve
    perf_analyzer_flags: tuple[str, ...] = ()


CONFIGS = (
    Config("tradeoff-batching", "tradeoff serve, dynamic_batching { }", None),
    Config("tradeoff", "tradeoff serve, no batching", None),
    Config("pytriton", "Triton via PyTriton, dynamic batching, delay 0", "pytriton",
           ("-H", TRITON_TOKEN)),
    Config("mlserver", "MLServer, no batching (JSON tensors)", "mlserver",
           ("--input-tensor-format=json", "--output-tensor-format=json")),
    # --baseline-src: the same two servers from another source tree
    Config("baseline-batching", "tradeoff serve (baseline tree), dynamic_batching { }",
           "baseline"),
    Config("baseline", "tradeoff serve (baseline tree), no batching", "baseline"),
)
# tradeoff compare's pairs: ours first (the baseline), then the peer it is set against
PAIRS = {"pytriton": ("tradeoff-batching", False), "mlserver": ("tradeoff", True)}
# ours against the baseline tree, configuration by configuration
BASELINE_PAIRS = (("tradeoff-batching", "baseline-batching"), ("tradeoff", "baseline"))


class PeerUnavailable(Exception):
    """A peer that cannot be installed or started; the message says why."""


# ---------------------------------------------------------------------------- install


def default_cache() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tradeoff" / "peers"


def installed_versions(python: Path, peer: Peer) -> dict[str, str] | None:
    """The versions of the peer's packages in the venv of ``python``; None when the venv is
    missing or one of ``peer.imports`` fails."""
    if not python.exists():
        return None
    probe = ("import importlib, importlib.metadata as m, json\n"
             f"for name in {list(peer.imports)!r}: importlib.import_module(name)\n"
             f"print(json.dumps({{p: m.version(p) for p in {list(peer.packages)!r}}}))")
    done = subprocess.run([str(python), "-c", probe], capture_output=True, text=True,
                          check=False, timeout=300)
    if done.returncode != 0:
        return None
    versions: dict[str, str] = json.loads(done.stdout.strip().splitlines()[-1])
    return versions


def install(peer: Peer, cache: Path, console: Console) -> dict[str, str]:
    """Make the peer's venv under ``cache`` unless it works already; its package versions."""
    venv = cache / peer.key
    python = venv / "bin" / "python"
    versions = installed_versions(python, peer)
    if versions is not None:
        return versions
    cache.mkdir(parents=True, exist_ok=True)
    log = cache / f"{peer.key}-install.log"
    console.print(f"installing {peer.title} into {venv} "
                  f"(pip install {' '.join(peer.packages)}); log: {log}")
    with log.open("w") as out:
        for command in ([sys.executable, "-m", "venv", "--clear", str(venv)],
                        [str(python), "-m", "pip", "install", *peer.packages]):
            done = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT, check=False)
            if done.returncode != 0:
                last = log.read_text(errors="replace").strip().splitlines()[-1:]
                raise PeerUnavailable(f"`{' '.join(command)}` exited with "
                                      f"{done.returncode}: {' '.join(last)} (log: {log})")
    versions = installed_versions(python, peer)
    if versions is None:
        raise PeerUnavailable(f"installed, but {', '.join(peer.imports)} do not import "
                              f"in {venv} (log: {log})")
    return versions


# ---------------------------------------------------------------------------- servers


def get_json(url: str, headers: dict[str, str] | None = None) -> Any:
    request = urllib.request.Request(url, headers=headers or {})
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


class CoreWatch:
    """How much of the servers' core other processes took while a point was measured: the
    core's busy time (/proc/stat) less what the servers' process trees used. On a shared
    machine this tells a quiet measurement from one that fought for the core.

        watch = CoreWatch(0, [server.process.pid for server in servers])
        with watch.measure() as share: ...   # share["others"]: 0.0 (quiet) .. 1.0
    """

    def __init__(self, cpu: int, pids: list[int]) -> None:
        self.cpu = cpu
        self.pids = pids

    def _core_busy(self) -> int:
        with open("/proc/stat") as handle:
            for line in handle:
                name, *ticks = line.split()
                if name == f"cpu{self.cpu}":
                    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int,
                                                                                  ticks[:8])
                    return user + nice + system + irq + softirq + steal
        raise RuntimeError(f"/proc/stat has no cpu{self.cpu}")

    def _servers_ticks(self) -> int:
        parents: dict[int, int] = {}
        used: dict[int, int] = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:  # ended meanwhile
                continue
            pid = int(stat.parent.name)
            parents[pid], used[pid] = int(fields[1]), int(fields[11]) + int(fields[12])
        tree, grown = set(self.pids), True
        while grown:
            children = {pid for pid, parent in parents.items() if parent in tree} - tree
            tree |= children
            grown = bool(children)
        return sum(used.get(pid, 0) for pid in tree)

    @contextlib.contextmanager
    def measure(self) -> Iterator[dict[str, float]]:
        share = {"others": 0.0}
        busy, ours, start = self._core_busy(), self._servers_ticks(), time.monotonic()
        yield share
        elapsed = (time.monotonic() - start) * os.sysconf("SC_CLK_TCK")
        others = (self._core_busy() - busy) - (self._servers_ticks() - ours)
        share["others"] = round(min(max(others / elapsed, 0.0), 1.0), 3) if elapsed else 0.0


class PeerProcess:
    """A peer server pinned with taskset, in a session of its own: ``stop`` ends what it
    started too (tritonserver, the Python backend's stubs)."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], http_port: int,
                 cpu: int, scratch: Path) -> None:
        self.name = name
        self.command = ["taskset", "-c", str(cpu), *command]
        self.env = dict(os.environ, PYTHONUNBUFFERED="1", **env)
        self.url = f"http://127.0.0.1:{http_port}"
        self.log = scratch / f"{name}.log"
        self.cwd = scratch  # where a peer leaves its files (MLServer: .metrics)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, models: tuple[str, ...], timeout: float = 300) -> PeerProcess:
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(self.command, stdout=out, stderr=subprocess.STDOUT,
                                            env=self.env, cwd=self.cwd,
                                            start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._exited():
                self.stop()  # what it started may still run
                raise PeerUnavailable(f"exited with {self.process.returncode}:\n"
                                      f"{self.log_tail()}")
            if all(self._ready(model) for model in models):
                return self
            time.sleep(0.5)
        self.stop()
        raise PeerUnavailable(f"not ready within {timeout:.0f}s:\n{self.log_tail()}")

    def _ready(self, model: str) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/v2/models/{model}/ready", timeout=1) as r:
                return r.status == 200
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            return False

    def log_tail(self, chars: int = 2000) -> str:
        return self.log.read_text(errors="replace")[-chars:]

    def _exited(self) -> bool:
        """Whether the leader has exited, leaving it unreaped: while it is a zombie no other
        process can take its id, so killing its process group reaches only what it started."""
        assert self.process is not None
        return os.waitid(os.P_PID, self.process.pid,
                         os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None

    def stop(self, timeout: float = 30) -> None:
        if self.process is None or self.process.returncode is not None:
            return
        if not self._exited():
            self.process.terminate()
            deadline = time.monotonic() + timeout
            while not self._exited() and time.monotonic() < deadline:
                time.sleep(0.1)
        try:  # the leader if it is still running, and whatever of its group is left
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def onnx_signature(path: Path) -> tuple[tuple[str, list[int]], tuple[str, list[int]]]:
    """(input name, dims after the batch one), (output name, dims) of a one-in one-out model."""
    graph = onnx.load(str(path), load_external_data=False).graph
    (source,), (sink,) = graph.input, graph.output

    def dims(value: onnx.ValueInfoProto) -> list[int]:
        return [d.dim_value for d in value.type.tensor_type.shape.dim[1:]]

    return (source.name, dims(source)), (sink.name, dims(sink))


def write_repositories(scratch: Path) -> tuple[Path, Path, dict[str, Path]]:
    """tradeoff's two repositories (batching, none) with the same ONNX files; the files."""
    batching, single = scratch / "batching", scratch / "single"
    build_repository(batching, MODELS)
    for model in MODELS:
        config = batching / model / "config.pbtxt"
        text = config.read_text()
        for needed in ("max_batch_size: 64", "dynamic_batching { }\n"):
            if needed not in text:
                raise RuntimeError(f"{config}: no {needed.strip()!r} to change; update "
                                   "benchmarks/peers.py to the example configs")
        text = text.replace("max_batch_size: 64", f"max_batch_size: {MAX_BATCH_SIZE}")
        text += 'parameters { key: "intra_op_thread_count" value: { string_value: "1" } }\n'
        config.write_text(text)
        shutil.copytree(batching / model, single / model)
        (single / model / "config.pbtxt").write_text(text.replace("dynamic_batching { }\n", ""))
    return batching, single, {m: batching / m / "1" / "model.onnx" for m in MODELS}


def pytriton_env(python: Path | str) -> dict[str, str]:
    """What PyTriton run by the venv's ``python`` needs in its environment: the Python
    backend's stub must load the venv's libpython, not another one."""
    libdir = subprocess.run([str(python), "-c", "import sysconfig; "
                             "print(sysconfig.get_config_var('LIBDIR'))"],
                            capture_output=True, text=True, check=True).stdout.strip()
    return {"LD_LIBRARY_PATH": libdir}


def start_pytriton(cache: Path, files: dict[str, Path], cpu: int, scratch: Path
                   ) -> PeerProcess:
    python = cache / "pytriton" / "bin" / "python"
    http_port = free_port()
    command = [str(python), str(PEER_FILES / "pytriton_server.py"), str(http_port),
               str(free_port()), str(MAX_BATCH_SIZE), *(f"{m}={p}" for m, p in files.items())]
    return PeerProcess("pytriton", command, pytriton_env(python), http_port, cpu,
                       scratch).start(tuple(files))


def start_mlserver(cache: Path, files: dict[str, Path], cpu: int, scratch: Path
                   ) -> PeerProcess:
    folder = scratch / "mlserver"
    folder.mkdir()
    http_port = free_port()
    settings = {"debug": False, "host": "127.0.0.1", "http_port": http_port,
                "grpc_port": free_port(), "metrics_port": free_port(),
                "parallel_workers": 0,  # inference in the server's process: one core
                "load_models_at_startup": True}
    (folder / "settings.json").write_text(json.dumps(settings, indent=1))
    for model, path in files.items():
        (source, source_dims), (sink, sink_dims) = onnx_signature(path)
        (folder / model).mkdir()
        (folder / model / "model-settings.json").write_text(json.dumps({
            "name": model, "implementation": "mlserver_runtime.OnnxModel",
            "parameters": {"uri": str(path)},
            "inputs": [{"name": source, "datatype": "FP32", "shape": [-1, *source_dims]}],
            "outputs": [{"name": sink, "datatype": "FP32", "shape": [-1, *sink_dims]}]},
            indent=1))
    command = [str(cache / "mlserver" / "bin" / "mlserver"), "start", str(folder)]
    return PeerProcess("mlserver", command, {"PYTHONPATH": str(PEER_FILES)}, http_port, cpu,
                       scratch).start(tuple(files))


# ------------------------------------------------------------------------ measurement


def run_perf_analyzer(url: str, model: str, concurrency: int, config: Config,
                      args: argparse.Namespace, cpu: int, scratch: Path) -> dict[str, Any]:
    """One closed-loop point; ``error`` set (and no figures) when it did not stabilise."""
    report = scratch / "perf_analyzer.csv"
    report.unlink(missing_ok=True)
    command = ["taskset", "-c", str(cpu), str(PERF_ANALYZER), "-m", model,
               "-u", url.removeprefix("http://"), "-i", "http",
               "--concurrency-range", str(concurrency), "-p", str(args.window_ms),
               "-s", str(args.stability), "--max-trials", str(args.max_trials),
               "-f", str(report), *config.perf_analyzer_flags]
    start = time.monotonic()
    try:
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              timeout=900)
    except subprocess.TimeoutExpired as exc:
        done = subprocess.CompletedProcess(command, -1, str(exc), "")
    seconds = round(time.monotonic() - start, 1)
    if done.returncode != 0 or not report.exists():
        text = (done.stdout + done.stderr).strip()
        unstable = "Failed to obtain stable measurement" in text
        return {"throughput": None, "p50_ms": None, "p99_ms": None, "seconds": seconds,
                "error": (f"{UNSTABLE} within {args.max_trials} windows" if unstable
                          else text[-600:])}
    with report.open() as handle:
        row = next(csv.DictReader(handle))
    return {"throughput": float(row["Inferences/Second"]),
            "p50_ms": int(row["p50 latency"]) / 1000, "p99_ms": int(row["p99 latency"]) / 1000,
            "seconds": seconds, "error": None}


def run_compare(ours: Config, peer: Config, urls: dict[str, str], json_tensors: bool,
                model: str, concurrency: int, args: argparse.Namespace, cpu: int,
                scratch: Path) -> tuple[list[str], CompareResult]:
    out = scratch / f"compare-{peer.key}-{model}-c{concurrency}.json"
    command = [CLI, "compare", "--endpoint", f"{ours.key}={urls[ours.key]},model={model}",
               "--endpoint", f"{peer.key}={urls[peer.key]},model={model}",
               "--concurrency", str(concurrency), "--duration", args.compare_duration,
               "--warmup", args.compare_warmup, "--rounds", str(args.repeats),
               "--json", str(out)]
    if json_tensors:
        command.append("--json-tensors")
    if peer.key == "pytriton":
        command += ["--header", TRITON_TOKEN]
    done = subprocess.run(["taskset", "-c", str(cpu), *command], capture_output=True,
                          text=True, check=False, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{done.stdout[-2000:]}"
                           f"{done.stderr[-2000:]}")
    return command, load_as(CompareResult, out)


def compare_summary(command: list[str], result: CompareResult) -> dict[str, Any]:
    """What peers.json keeps of one comparison: the figures, the ratios, the fairness."""
    return {
        "command": " ".join(["tradeoff", *command[1:]]),
        "endpoints": {e.name: {"throughput": e.result.summary.inferences_per_s,
                               "p50_ms": e.result.summary.latency("p50"),
                               "p99_ms": e.result.summary.latency("p99"),
                               "errors": e.result.summary.errors,
                               "requests": e.result.summary.requests}
                      for e in result.endpoints},
        "ratios_to_baseline": {r.name: {k: v.to_dict() for k, v in r.metrics.items()}
                               for r in result.ratios[1:]},
        "fairness_ok": result.fairness.ok,
        "fairness": [c.to_dict() for c in result.fairness.checks if c.ok is not True],
    }


def median_point(points: list[dict[str, Any]]) -> dict[str, Any]:
    """The medians of the rounds that gave figures; ``error``: the first round's error
    when none did."""
    good = [p for p in points if p["error"] is None]
    if not good:
        return {"throughput": None, "p50_ms": None, "p99_ms": None, "rounds": 0,
                "error": points[0]["error"] if points else "not measured"}
    return {**{k: statistics.median(p[k] for p in good)
               for k in ("throughput", "p50_ms", "p99_ms", "others_on_server_core")},
            "rounds": len(good), "error": None}


def contention(doc: dict[str, Any]) -> dict[str, float]:
    """The share of the server core other processes took, over every measurement."""
    shares = [p["others_on_server_core"] for per_load in doc["perf_analyzer"]["runs"].values()
              for points in per_load.values() for p in points]
    shares += [s["others_on_server_core"] for per_load in doc["compare"].values()
               for s in per_load.values() if "error" not in s]
    return {"median": statistics.median(shares), "max": max(shares)} if shares else \
        {"median": 0.0, "max": 0.0}


def inverse(ratio: dict[str, Any]) -> dict[str, Any]:
    """peer/ours (as compare gives it) turned into ours/peer, interval included."""
    value, ci = ratio["ratio"], ratio["ci95"]
    return {"ratio": 1 / value if value else None,
            "ci95": [1 / ci[1], 1 / ci[0]] if ci and ci[0] and ci[1] else None}


def ratios(doc: dict[str, Any], names: list[str]) -> dict[str, dict[str, dict[str, Any]]]:
    """Ours against each peer: from perf_analyzer's medians (both of our configurations)
    and from tradeoff compare (the pair it measured, with intervals)."""
    medians = doc["perf_analyzer"]["medians"]
    out: dict[str, dict[str, dict[str, Any]]] = {}

    def medians_ratio(ours: str, other: str) -> None:
        per_load: dict[str, Any] = {}
        for name in names:
            a, b = medians[ours][name], medians[other][name]
            if a["throughput"] is None or b["throughput"] is None:
                per_load[name] = None
                continue
            per_load[name] = {
                "throughput": {"ratio": a["throughput"] / b["throughput"], "ci95": None},
                "p50": {"ratio": a["p50_ms"] / b["p50_ms"], "ci95": None}}
        out.setdefault(f"{ours} / {other}", {})["perf_analyzer"] = per_load

    for ours, baseline in BASELINE_PAIRS:
        if baseline in medians:
            medians_ratio(ours, baseline)
    for peer in PAIRS:
        if peer not in medians:
            continue
        for ours in ("tradeoff-batching", "tradeoff"):
            medians_ratio(ours, peer)
        ours = PAIRS[peer][0]
        if peer in doc["compare"]:
            out[f"{ours} / {peer}"]["tradeoff compare"] = {
                name: None if "error" in summary else {
                    metric: inverse(summary["ratios_to_baseline"][peer][metric])
                    for metric in ("throughput", "p50")}
                for name, summary in doc["compare"][peer].items()}
    return out


# ---------------------------------------------------------------------------- report


def cell(point: dict[str, Any]) -> str:
    """infer/s [p50 ms], or why there are none."""
    if point["throughput"] is None:
        error = point.get("error") or ""
        return f"[red]{UNSTABLE if error.startswith(UNSTABLE) else 'failed (see JSON)'}[/]"
    mark = "*" if (point.get("others_on_server_core") or 0) > CONTESTED else ""
    return escape(f"{point['throughput']:,.0f} [{point['p50_ms']:.2f}]{mark}")


def compare_cell(summary: dict[str, Any], key: str) -> str:
    """One server's figures in one comparison."""
    if "error" in summary:
        return "[red]failed (see JSON)[/]"
    return cell({**summary["endpoints"][key], "error": None,
                 "others_on_server_core": summary["others_on_server_core"]})


def times(value: float | None, ci: list[float] | None = None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}x" + (f" ({ci[0]:.2f} to {ci[1]:.2f})" if ci else "")


def print_tables(console: Console, doc: dict[str, Any], loads: list[str],
                 labels: dict[str, str]) -> None:
    """perf_analyzer's medians, tradeoff compare's pairs, and ours against each peer."""
    repeats = doc["settings"]["repeats"]
    core = doc["settings"]["server_cpu"]
    caption = f"*: other processes took over {CONTESTED:.0%} of core {core} meanwhile (median)"
    table = Table(title=f"perf_analyzer: infer/s \\[p50 ms], median of {repeats} rounds "
                        f"(servers on core {core}, perf_analyzer on core "
                        f"{doc['settings']['client_cpu']})", caption=caption)
    table.add_column("server")
    for load in loads:
        table.add_column(load, justify="right")
    for key, per_load in doc["perf_analyzer"]["medians"].items():
        table.add_row(labels[key], *(cell(per_load[load]) for load in loads))
    console.print(table)
    if doc["compare"]:
        table = Table(title=f"tradeoff compare: infer/s \\[p50 ms], {repeats} interleaved "
                            f"rounds of {doc['settings']['compare_duration']} per server",
                      caption=caption.replace(" (median)", ""))
        table.add_column("server")
        for load in loads:
            table.add_column(load, justify="right")
        for peer, per_load in doc["compare"].items():
            ours = PAIRS[peer][0]
            for key in (ours, peer):
                json_tensors = key == ours and PAIRS[peer][1]
                label = labels[key] + (" [dim](JSON tensors)[/]" if json_tensors else "")
                table.add_row(label, *(compare_cell(per_load[load], key) for load in loads))
        console.print(table)
    if not doc["ratios"]:
        return
    table = Table(title="ours / peer, same run: infer/s ratio (>1: ours serves more), "
                        "p50 ratio (<1: ours answers sooner); tradeoff compare with its 95% CI")
    table.add_column("ours / peer")
    table.add_column("measured by")
    for load in loads:
        table.add_column(load, justify="right")
    for name, ratio in doc["ratios"].items():
        for tool, per_load in ratio.items():
            table.add_row(name, tool, *(
                f"{times(r['throughput']['ratio'], r['throughput']['ci95'])}\n"
                f"p50 {times(r['p50']['ratio'], r['p50']['ci95'])}" if r else "-"
                for r in (per_load.get(load) for load in loads)))
    console.print(table)


# ------------------------------------------------------------------------------ main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter,
        epilog="examples:\n" + "\n".join(
            "  " + line.strip() for line in __doc__.splitlines() if line.startswith("    .venv")))
    parser.add_argument("--repeats", type=int,
                        help="interleaved rounds (default 3; --quick: 1)")
    parser.add_argument("--concurrency",
                        help="closed-loop levels, comma-separated (default 1,64; --quick: 1,8)")
    parser.add_argument("--window-ms", type=int,
                        help="perf_analyzer's measurement window, -p (default 2000; --quick: "
                             "500)")
    parser.add_argument("--stability", type=int, default=20,
                        help="perf_analyzer's -s, percent (default 20)")
    parser.add_argument("--max-trials", type=int, default=10,
                        help="perf_analyzer's windows before it gives up (default 10)")
    parser.add_argument("--compare-duration",
                        help="tradeoff compare: measured per round and server (default 3s; "
                             "--quick: 1s)")
    parser.add_argument("--compare-warmup",
                        help="tradeoff compare: warmup per round and server (default 1s; "
                             "--quick: 0.5s)")
    parser.add_argument("--quick", action="store_true",
                        help="a smoke test: the shorter defaults above")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help=f"peers to measure, comma-separated (default {','.join(PEERS)})")
    parser.add_argument("--cache-dir", type=Path, default=default_cache(),
                        help="where the peers' venvs live (default %(default)s)")
    parser.add_argument("--baseline-src", type=source_tree,
                        help="also serve from this source tree (a `git worktree` of an "
                             "older commit's src/), to measure a change before and after")
    parser.add_argument("--setup-only", action="store_true",
                        help="install the peers' venvs and stop")
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks" / "results" /
                        "peers.json", help="where the results go (default %(default)s)")
    args = parser.parse_args()
    quick = args.quick
    for name, normal, short in (("repeats", 3, 1), ("concurrency", "1,64", "1,8"),
                                ("window_ms", 2000, 500), ("compare_duration", "3s", "1s"),
                                ("compare_warmup", "1s", "0.5s")):
        if getattr(args, name) is None:
            setattr(args, name, short if quick else normal)
    args.levels = [int(c) for c in args.concurrency.split(",")]
    args.peer_keys = [p.strip() for p in args.peers.split(",") if p.strip()]
    unknown = set(args.peer_keys) - set(PEERS)
    if unknown:
        parser.error(f"--peers: unknown {', '.join(sorted(unknown))}; "
                     f"choose from {', '.join(PEERS)}")
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    return args


def install_peers(args: argparse.Namespace, console: Console
                  ) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """Each asked peer's package versions, or why it is left out."""
    versions: dict[str, dict[str, str]] = {}
    skipped: dict[str, str] = {}
    for key in args.peer_keys:
        try:
            versions[key] = install(PEERS[key], args.cache_dir, console)
            console.print(f"{PEERS[key].title}: {versions[key]} in {args.cache_dir / key}")
        except PeerUnavailable as exc:
            skipped[key] = f"not installed: {exc}"
            console.print(f"[yellow]skipping {PEERS[key].title}: {skipped[key]}[/]")
    return versions, skipped


def start_servers(stack: contextlib.ExitStack, args: argparse.Namespace,
                  versions: dict[str, dict[str, str]], skipped: dict[str, str], cpu: int,
                  scratch: Path, console: Console) -> dict[str, ServerProcess | PeerProcess]:
    """All the servers at once on ``cpu`` (idle, each costs under 1% of it), stopped when
    ``stack`` closes; a peer that does not start joins ``skipped``."""
    batching, single, files = write_repositories(scratch)
    servers: dict[str, ServerProcess | PeerProcess] = {}
    for key, repository in (("tradeoff-batching", batching), ("tradeoff", single)):
        servers[key] = stack.enter_context(ServerProcess(repository, cpus=str(cpu)))
    if args.baseline_src is not None:
        env = {"PYTHONPATH": str(args.baseline_src)}
        for key, repository in (("baseline-batching", batching), ("baseline", single)):
            servers[key] = stack.enter_context(ServerProcess(repository, cpus=str(cpu),
                                                             env=env))
    starters = {"pytriton": start_pytriton, "mlserver": start_mlserver}
    for key in versions:
        console.print(f"starting {PEERS[key].title} on core {cpu}")
        try:
            servers[key] = starters[key](args.cache_dir, files, cpu, scratch)
        except PeerUnavailable as exc:
            skipped[key] = f"did not start: {exc}"
            console.print(f"[yellow]skipping {PEERS[key].title}: {skipped[key]}[/]")
            continue
        stack.callback(servers[key].stop)
    return servers


def describe(config: Config, url: str, packages: dict[str, str]) -> tuple[dict[str, Any], str]:
    """What the server says it is (``/v2``) with the peer's packages; its row label."""
    headers = dict([TRITON_TOKEN.split(":", 1)]) if config.key == "pytriton" else None
    server = get_json(f"{url}/v2", headers)
    name, version = server.get("name"), server.get("version")
    parts = [f"{name} {version}"] + [f"{p} {v}" for p, v in packages.items()
                                     if (p, v) != (name, version)]
    return ({"label": config.label, "server": server, "packages": packages},
            f"{config.label} [dim]({', '.join(parts)})[/]")


def measure_perf_analyzer(servers: dict[str, ServerProcess | PeerProcess],
                          configs: list[Config], loads: list[tuple[str, int]],
                          args: argparse.Namespace, cpu: int, scratch: Path, watch: CoreWatch,
                          console: Console) -> dict[str, dict[str, list[dict[str, Any]]]]:
    """Round by round, every server at every load once; the points by server and load."""
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        c.key: {load_name(m, n): [] for m, n in loads} for c in configs}
    for round_no in range(args.repeats):
        shift = round_no % len(configs)  # each round starts with another server
        for config in configs[shift:] + configs[:shift]:
            for model, concurrency in loads:
                with watch.measure() as share:
                    point = run_perf_analyzer(servers[config.key].url, model, concurrency,
                                              config, args, cpu, scratch)
                point["others_on_server_core"] = share["others"]
                runs[config.key][load_name(model, concurrency)].append(point)
                console.print(f"round {round_no + 1}/{args.repeats} perf_analyzer "
                              f"{config.key:17} {load_name(model, concurrency):8} "
                              f"{cell(point)}  others on core {watch.cpu}: "
                              f"{share['others']:.0%}"
                              + (f" {point['error']}" if point["error"] else ""))
    return runs


def measure_compare(servers: dict[str, ServerProcess | PeerProcess], configs: list[Config],
                    loads: list[tuple[str, int]], args: argparse.Namespace, cpu: int,
                    scratch: Path, watch: CoreWatch, console: Console
                    ) -> dict[str, dict[str, Any]]:
    """tradeoff compare of each pair at each load: by peer, then load."""
    urls = {key: server.url for key, server in servers.items()}
    by_key = {c.key: c for c in configs}
    out: dict[str, dict[str, Any]] = {}
    for peer, (ours, json_tensors) in PAIRS.items():
        if peer not in servers:
            continue
        out[peer] = {}
        for model, concurrency in loads:
            name = load_name(model, concurrency)
            try:
                with watch.measure() as share:
                    command, result = run_compare(by_key[ours], by_key[peer], urls,
                                                  json_tensors, model, concurrency, args, cpu,
                                                  scratch)
            except RuntimeError as exc:  # the other loads may still work
                out[peer][name] = {"error": str(exc)}
                console.print(f"[red]tradeoff compare {ours} vs {peer} {name}: {exc}[/]")
                continue
            summary = {**compare_summary(command, result),
                       "others_on_server_core": share["others"]}
            out[peer][name] = summary
            console.print(f"tradeoff compare {ours} vs {peer} {name}: "
                          + ", ".join(f"{k} {cell({**v, 'error': None})}"
                                      for k, v in summary["endpoints"].items())
                          + f"  others on core {watch.cpu}: {share['others']:.0%}"
                          + ("" if summary["fairness_ok"] else
                             f" [yellow]fairness: {summary['fairness']}[/]"))
    return out


def load_name(model: str, concurrency: int) -> str:
    return f"{model} c{concurrency}"


def main() -> int:
    args = parse_args()
    console = Console(width=160)
    load_before = os.getloadavg()
    versions, skipped = install_peers(args, console)
    if args.setup_only:
        return 1 if skipped else 0
    if not PERF_ANALYZER.exists():
        sys.exit(f"{PERF_ANALYZER} missing: run scripts/get_perf_analyzer.sh first")
    cores = sorted(os.sched_getaffinity(0))
    server_cpu, client_cpu = cores[0], cores[-1]
    if server_cpu == client_cpu:
        console.print("[yellow]one core only: servers and clients share it[/]")
    measured_on = environment()
    os.sched_setaffinity(0, {client_cpu})  # this script waits beside the load generators
    if load_before[0] > 0.5:
        console.print(f"[yellow]load average {load_before[0]:.1f} before starting: other work "
                      "on this machine makes the figures vary (more so for servers that "
                      "pass each request between processes)[/]")
    loads = [(m, c) for m in MODELS for c in args.levels]
    doc: dict[str, Any] = {
        "schema": SCHEMA, "command": command_line(),
        "environment": measured_on,
        "settings": {"repeats": args.repeats, "concurrency": args.levels,
                     "perf_analyzer": {"window_ms": args.window_ms,
                                       "stability_percent": args.stability,
                                       "max_trials": args.max_trials},
                     "compare_duration": args.compare_duration,
                     "compare_warmup": args.compare_warmup, "server_cpu": server_cpu,
                     "baseline_src": str(args.baseline_src) if args.baseline_src else None,
                     "client_cpu": client_cpu, "max_batch_size": MAX_BATCH_SIZE,
                     "intra_op_threads": 1},
        "servers": {}, "skipped": skipped}
    labels: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="tradeoff-peers-") as tmp, \
            contextlib.ExitStack() as stack:
        scratch = Path(tmp)
        servers = start_servers(stack, args, versions, skipped, server_cpu, scratch, console)
        configs = [c for c in CONFIGS if c.key in servers]
        watch = CoreWatch(server_cpu, [s.process.pid for s in servers.values() if s.process])
        for config in configs:
            doc["servers"][config.key], labels[config.key] = describe(
                config, servers[config.key].url, versions.get(config.peer or "", {}))
        runs = measure_perf_analyzer(servers, configs, loads, args, client_cpu, scratch,
                                     watch, console)
        doc["perf_analyzer"] = {"runs": runs,
                                "medians": {k: {n: median_point(p) for n, p in v.items()}
                                            for k, v in runs.items()}}
        doc["compare"] = measure_compare(servers, configs, loads, args, client_cpu, scratch,
                                         watch, console)
    doc["load_average"] = {"before": load_before, "after": os.getloadavg()}
    doc["others_on_server_core"] = contention(doc)
    doc["ratios"] = ratios(doc, [load_name(m, c) for m, c in loads])
    print_tables(console, doc, [load_name(m, c) for m, c in loads], labels)
    console.print(f"other processes took {doc['others_on_server_core']['median']:.0%} of "
                  f"core {server_cpu} (median of the measurements; at most "
                  f"{doc['others_on_server_core']['max']:.0%}): above a few percent the "
                  "figures are of a shared core, not of the servers alone")
    for key, reason in skipped.items():
        console.print(f"[yellow]{PEERS[key].title} left out: {reason}[/]")
    write_results(args.json, doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
