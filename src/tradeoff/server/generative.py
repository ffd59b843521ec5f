"""Generative models of the repository: each runs a :class:`GenerationEngine` on a
thread of its own; requests reach it through an inbox and hear back token by token on
the event loop.

A generative model is a repository directory with a ``generate.yaml``::

    format: hf                  # hf: a Hugging Face directory; gguf: one .gguf file
    path: "1"                   # relative to the model directory (or absolute)
    max_num_seqs: 16            # sequences decoded together
    max_num_batched_tokens: 512 # tokens per step (prefill chunks + decodes)
    max_num_queued_requests: 256
    num_blocks: 512             # KV cache blocks ...
    block_size: 16              # ... of this many tokens
    scheduling: fcfs            # fcfs | priority
    batching: continuous        # continuous | static (the baseline)
    device: auto                # auto (cuda when torch sees a GPU) | cpu | cuda | cuda:N
    prefix_caching: true        # share the KV blocks of prompt prefixes seen before
"""

from __future__ import annotations

import asyncio
import bisect
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tradeoff.errors import ConfigError, ModelLoadError, NotFound, TradeoffError, Unavailable
from tradeoff.repository.repository import GENERATIVE_FILE, ModelRepository

log = logging.getLogger("tradeoff.server")


@dataclass(frozen=True)
class GenerativeConfig:
    """``generate.yaml``: where the weights are and how the engine batches."""

    format: str = "hf"
    path: str = "1"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_num_queued_requests: int = 256
    num_blocks: int = 512
    block_size: int = 16
    scheduling: str = "fcfs"
    batching: str = "continuous"
    device: str = "auto"
    prefix_caching: bool = True

    @classmethod
    def read(cls, path: Path) -> GenerativeConfig:
        source = str(path)
        try:
            doc = yaml.safe_load(path.read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise ConfigError(source, "", f"not readable YAML: {exc}") from None
        if not isinstance(doc, dict):
            raise ConfigError(source, "", "must be a mapping of settings")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in doc.items():
            if key not in known:
                raise ConfigError(source, str(key), f"unknown setting; known: {sorted(known)}")
            kind = known[key].type
            if kind == "bool":
                if not isinstance(value, bool):
                    raise ConfigError(source, key, f"expected true or false, got {value!r}")
                values[key] = value
                continue
            want = int if kind == "int" else str
            try:
                values[key] = want(value)
            except (TypeError, ValueError):
                raise ConfigError(source, key, f"expected {want.__name__}, got {value!r}") \
                    from None
        config = cls(**values)
        checks = {"format": config.format in ("hf", "gguf"),
                  "scheduling": config.scheduling in ("fcfs", "priority"),
                  "batching": config.batching in ("continuous", "static"),
                  "device": config.device in ("auto", "cpu", "cuda")
                  or config.device.startswith("cuda:")}
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(source, key, f"unsupported value {getattr(config, key)!r}")
        for key in ("max_num_seqs", "max_num_batched_tokens", "num_blocks", "block_size",
                    "max_num_queued_requests"):
            if getattr(config, key) < 1:
                raise ConfigError(source, key, "must be >= 1")
        return config


def resolve_device(device: str) -> str:
    """``auto`` -> ``cuda`` when torch sees a GPU, else ``cpu``; a CUDA device that is not
    there is a load error."""
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {device!r}: torch sees no CUDA GPU "
                             f"(torch {torch.__version__}); use device: cpu or auto")
    return device


def load_generative(directory: Path) -> tuple[GenerativeConfig, Any, Any]:
    """Read a generative model directory: its ``generate.yaml``, decoder and tokenizer."""
    config = GenerativeConfig.read(directory / GENERATIVE_FILE)
    try:
        from tradeoff.backends.llama import load_hf_directory
        from tradeoff.backends.text import Tokenizer
    except ImportError as exc:
        raise ModelLoadError(f"generative models need torch: pip install "
                             f"'tradeoff[llm]' ({exc})") from None
    path = Path(config.path) if Path(config.path).is_absolute() else directory / config.path
    device = resolve_device(config.device)
    if config.format == "gguf":
        from tradeoff.backends.gguf_file import load_gguf

        decoder, tokenizer = load_gguf(path, device=device)
    else:
        decoder = load_hf_directory(path, device=device)
        tokenizer = Tokenizer.from_directory(path)
    return config, decoder, tokenizer


def new_engine(config: GenerativeConfig, decoder: Any, tokenizer: Any) -> Any:
    """A :class:`GenerationEngine` with the settings of ``config``."""
    from tradeoff.scheduling.engine import GenerationEngine

    return GenerationEngine(
        decoder, num_blocks=config.num_blocks, block_size=config.block_size,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_queued=config.max_num_queued_requests, policy=config.scheduling,
        mode=config.batching, prefix_caching=config.prefix_caching,
        detokenize=tokenizer.decode)


@dataclass
class Handle:
    """One request's link to the engine: events arrive on ``events`` in order:
    ("token", id, time), then ("done", finish_reason) or ("error", exception)."""

    prompt: list[int]
    params: Any
    priority: int = 0
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    seq: Any = None
    aborted: bool = False


class GenerativeModel:
    """One generative model: decoder, tokenizer, engine, and the thread that steps it."""

    def __init__(self, name: str, config: GenerativeConfig, decoder: Any, tokenizer: Any,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.name = name
        self.config = config
        self.decoder = decoder
        self.tokenizer = tokenizer
        self.loop = loop
        self.created = int(time.time())
        self.engine = new_engine(config, decoder, tokenizer)
        self.inbox: queue.SimpleQueue[tuple[str, Handle]] = queue.SimpleQueue()
        self.pending = 0  # submitted, not yet taken by the engine thread
        self.handles: dict[int, Handle] = {}
        self.stats = GenerationStats()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=f"generate-{name}",
                                        daemon=True)
        self._thread.start()

    # ------------------------------------------------------------- event loop side

    def submit(self, prompt: list[int], params: Any, priority: int = 0) -> Handle:
        """Queue a request; Unavailable (503) at once when the queue is full."""
        waiting = len(self.engine.scheduler.waiting) + self.pending
        if waiting >= self.config.max_num_queued_requests:
            raise Unavailable(f"model {self.name!r}: {waiting} requests already wait "
                              f"(max_num_queued_requests {self.config.max_num_queued_requests});"
                              " retry later")
        handle = Handle(prompt, params, priority)
        self.pending += 1
        self.inbox.put(("add", handle))
        self._wake.set()
        return handle

    def abort(self, handle: Handle) -> None:
        handle.aborted = True
        self.inbox.put(("abort", handle))
        self._wake.set()

    def close(self) -> None:
        self._stop = True
        self._wake.set()
        self._thread.join(30)

    # ---------------------------------------------------------------- engine thread

    def _emit(self, handle: Handle, *event: Any) -> None:
        self.loop.call_soon_threadsafe(handle.events.put_nowait, event)

    def _take_inbox(self) -> None:
        while True:
            try:
                kind, handle = self.inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "add":
                self.loop.call_soon_threadsafe(self._taken)
                if handle.aborted:
                    continue
                try:
                    handle.seq = self.engine.add(handle.prompt, handle.params, handle.priority)
                except TradeoffError as exc:
                    self._emit(handle, "error", exc)
                    continue
                self.handles[handle.seq.seq_id] = handle
                self.stats.arrived(handle.seq.seq_id, len(handle.prompt))
            elif handle.seq is not None and handle.seq.seq_id in self.handles:
                self.engine.abort(handle.seq)
                self.handles.pop(handle.seq.seq_id, None)
                self.stats.forget(handle.seq.seq_id)

    def _taken(self) -> None:
        self.pending -= 1

    def _run(self) -> None:
        while not self._stop:
            self._take_inbox()
            if not self.engine.has_work():
                self._wake.wait(0.5)
                self._wake.clear()
                continue
            try:
                report = self.engine.step()
            except Exception as exc:  # the model failed: every running request hears it
                log.exception("model %s: generation step failed", self.name)
                for handle in list(self.handles.values()):
                    if handle.seq is not None:
                        self.engine.abort(handle.seq)
                    self._emit(handle, "error", exc)
                self.handles.clear()
                continue
            now = time.perf_counter()
            self.stats.step(report, now, self.engine.blocks.usage)
            for seq in report.decoded:
                if seq.seq_id in self.handles:
                    self._emit(self.handles[seq.seq_id], "token", seq.output[-1], now)
            for seq in report.finished:
                if seq.seq_id in self.handles:
                    self._emit(self.handles.pop(seq.seq_id), "done", seq.finish_reason)
        for handle in self.handles.values():
            self._emit(handle, "error", Unavailable("the server is shutting down"))


TOKEN_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


class GenerationStats:
    """Counters and latency samples for ``/metrics`` (updated on the engine thread,
    read at scrape time)."""

    def __init__(self) -> None:
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.requests_finished = 0
        self.preemptions = 0
        self.kv_usage = 0.0
        self.running = 0
        self.waiting = 0
        # per histogram: observations per bucket (the last one past every bound) and sum
        self.histograms = {kind: ([0] * (len(TOKEN_BUCKETS_S) + 1), [0.0])
                           for kind in ("ttft", "itl", "e2e")}
        self._arrival: dict[int, float] = {}
        self._last: dict[int, float] = {}

    def observe(self, kind: str, seconds: float) -> None:
        counts, total = self.histograms[kind]
        counts[bisect.bisect_left(TOKEN_BUCKETS_S, seconds)] += 1
        total[0] += seconds

    def arrived(self, seq_id: int, prompt_tokens: int) -> None:
        self._arrival[seq_id] = time.perf_counter()
        self.prompt_tokens += prompt_tokens

    def forget(self, seq_id: int) -> None:
        self._arrival.pop(seq_id, None)
        self._last.pop(seq_id, None)

    def step(self, report: Any, now: float, kv_usage: float) -> None:
        self.preemptions += report.preempted
        self.kv_usage = kv_usage
        for seq in report.decoded:
            self.generation_tokens += 1
            last = self._last.get(seq.seq_id)
            if last is None:
                self.observe("ttft", now - self._arrival.get(seq.seq_id, now))
            else:
                self.observe("itl", now - last)
            self._last[seq.seq_id] = now
        for seq in report.finished:
            self.requests_finished += 1
            self.observe("e2e", now - self._arrival.get(seq.seq_id, now))
            self.forget(seq.seq_id)


class GenerativeModels:
    """Every generative model of the repository, by name."""

    def __init__(self, repository: ModelRepository) -> None:
        self.repository = repository
        self.models: dict[str, GenerativeModel] = {}
        self.failures: dict[str, str] = {}

    async def load_all(self) -> None:
        loop = asyncio.get_running_loop()
        for name in self.repository.generative_names():
            try:
                self.models[name] = await asyncio.to_thread(self._load, name, loop)
                log.info("generative model %s: %s", name, self.models[name].config)
            except (TradeoffError, ImportError, OSError) as exc:
                self.failures[name] = str(exc)
                log.error("generative model %s: load failed: %s", name, exc)

    def _load(self, name: str, loop: asyncio.AbstractEventLoop) -> GenerativeModel:
        config, decoder, tokenizer = load_generative(self.repository.root / name)
        return GenerativeModel(name, config, decoder, tokenizer, loop)

    def get(self, name: str) -> GenerativeModel:
        model = self.models.get(name)
        if model is None:
            if name in self.failures:
                raise Unavailable(f"model {name!r} is not ready: {self.failures[name]}")
            raise NotFound(f"unknown model {name!r}; GET /v1/models lists them")
        return model

    def close(self) -> None:
        for model in self.models.values():
            model.close()
