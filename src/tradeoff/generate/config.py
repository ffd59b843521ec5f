"""``generate.yaml``: the file that makes a repository directory a generative model.

    format: hf                  # hf: a Hugging Face directory; gguf: one .gguf file
    path: "1"                   # relative to the model directory (or absolute)
    max_num_seqs: 16            # sequences decoded together
    max_num_batched_tokens: 512 # tokens per step (prefill chunks + decodes)
    max_num_queued_requests: 256
    num_blocks: 512             # KV cache blocks ...
    block_size: 16              # ... of this many tokens
    scheduling: fcfs            # fcfs | priority
    priority_aging_steps: 200   # priority: a request this many steps old goes first
    batching: continuous        # continuous | static (the baseline)
    device: auto                # auto (cuda when torch sees a GPU) | cpu | cuda | cuda:N
    prefix_caching: true        # share the KV blocks of prompt prefixes seen before
    precision: fp32             # fp32 | bf16 | int8 (per-channel INT8 weights, CPU)
    response_cache: false       # with serve --cache: whole greedy/seeded answers kept
    cuda_graphs: true           # on a GPU, decode steps replay captured CUDA graphs
    prefill_stretch: 2.0        # a step that prefills takes at most this many decode steps
    threads: 0                  # CPU threads of this engine's steps (0: the server's cores)
    process: false              # true: the engine in a process of its own
    overlap: true               # schedule step N+1 while step N runs (false: one by one)

Validated like ``config.pbtxt``: an error names the file, the field and what is wrong,
with "did you mean" for a misspelt field or value. The sizes have upper bounds
(``SIZE_LIMITS``: max_num_seqs 4,096, max_num_batched_tokens and num_blocks 2^20,
max_num_queued_requests and priority_aging_steps 1,000,000, block_size 1,024).
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tradeoff.backends.registry import default_registry
from tradeoff.errors import ConfigError, shown
from tradeoff.generate.iteration import AGING_STEPS
from tradeoff.repository.repository import GENERATIVE_FILE
from tradeoff.repository.safe_yaml import read_yaml

__all__ = ["SIZE_LIMITS", "GenerativeConfig"]

_CHOICES = {"scheduling": ("fcfs", "priority"), "batching": ("continuous", "static"),
            "precision": ("fp32", "bf16", "int8")}
# the sizes and their upper bounds (each is at least 1)
SIZE_LIMITS = {"max_num_seqs": 4096, "max_num_batched_tokens": 1 << 20,
               "max_num_queued_requests": 1_000_000, "num_blocks": 1 << 20,
               "block_size": 1024, "priority_aging_steps": 1_000_000}
MAX_THREADS = 1024


def _hint(value: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(value, list(choices), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


@dataclass(frozen=True)
class GenerativeConfig:
    """Where the weights are and how the engine batches."""

    format: str = "hf"
    path: str = "1"
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    max_num_queued_requests: int = 256
    num_blocks: int = 512
    block_size: int = 16
    scheduling: str = "fcfs"
    priority_aging_steps: int = AGING_STEPS  # see generate/iteration.py
    batching: str = "continuous"
    device: str = "auto"
    prefix_caching: bool = True
    precision: str = "fp32"
    response_cache: bool = False
    cuda_graphs: bool = True
    prefill_stretch: float = 2.0
    threads: int = 0  # the CPU threads of the engine's steps; 0: torch's default
    process: bool = False  # the engine core in a process of its own (server/engine_process)
    # step N+1 scheduled while step N runs (engine_core.py); False: one by one, a new
    # request's first token a step sooner, the host work between steps
    overlap: bool = True
    fault_nan_on_token: int = -1  # tests only, with --allow-fault-injection (backends/faults)

    @classmethod
    def of_model(cls, directory: Path, formats: Sequence[str] | None = None
                 ) -> GenerativeConfig:
        """The ``generate.yaml`` of a model directory."""
        return cls.read(directory / GENERATIVE_FILE, formats)

    @classmethod
    def read(cls, path: Path, formats: Sequence[str] | None = None) -> GenerativeConfig:
        """Read and validate a ``generate.yaml``; ConfigError names file and field.
        ``formats``: those the generative backends read (default: the registry's)."""
        doc = read_yaml(path)
        if formats is None:
            formats = default_registry().generative_formats()
        return cls.from_mapping({} if doc is None else doc, str(path), formats)

    @classmethod
    def from_mapping(cls, doc: Any, source: str, formats: Sequence[str] = ()
                     ) -> GenerativeConfig:
        """Validate the settings; ``format`` against ``formats`` unless it is empty (no
        generative backend imports: loading says why)."""
        if not isinstance(doc, dict):
            raise ConfigError(source, "", f"must be a mapping of settings, got "
                                          f"{type(doc).__name__}")
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {}
        for key, value in doc.items():
            if key not in known:
                raise ConfigError(source, str(key), f"unknown setting"
                                  f"{_hint(str(key), sorted(known))} (known: "
                                  f"{', '.join(sorted(known))})")
            values[key] = _typed(source, key, known[key].type, value)
        config = cls(**values)
        if formats and config.format not in formats:
            raise ConfigError(source, "format", f"no backend reads {shown(config.format)}"
                              f"{_hint(config.format, formats)} (formats: "
                              f"{', '.join(formats)})")
        for key, choices in _CHOICES.items():
            value = getattr(config, key)
            if value not in choices:
                raise ConfigError(source, key, f"unsupported value {shown(value)}"
                                  f"{_hint(value, choices)} (one of {', '.join(choices)})")
        device = config.device
        if device not in ("auto", "cpu", "cuda") and not (
                device.startswith("cuda:") and device[5:].isascii() and device[5:].isdigit()):
            raise ConfigError(source, "device", f"unsupported value {shown(device)}"
                              f"{_hint(device, ('auto', 'cpu', 'cuda'))} "
                              "(auto, cpu, cuda or cuda:N)")
        for key, limit in SIZE_LIMITS.items():
            size = getattr(config, key)
            if size < 1:
                raise ConfigError(source, key, f"must be >= 1, got {size}")
            if size > limit:
                raise ConfigError(source, key, f"must be at most {limit:,}, got {shown(size)}")
        if not 0 <= config.threads <= MAX_THREADS:
            raise ConfigError(source, "threads", f"must be 0 (the server's cores) to "
                              f"{MAX_THREADS}, got {shown(config.threads)}")
        if config.prefill_stretch and not 1 < config.prefill_stretch <= 100:
            raise ConfigError(source, "prefill_stretch", "must be 0 (no limit) or above 1 "
                              f"(at most 100), got {config.prefill_stretch}")
        return config


def _typed(source: str, key: str, kind: Any, value: Any) -> Any:
    """``value`` as the field's type; YAML gives ints, bools and strings already."""
    if kind == "bool":
        if not isinstance(value, bool):
            raise ConfigError(source, key, f"expected true or false, got {shown(value)}")
        return value
    if kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(source, key, f"expected int, got {shown(value)}")
        return value
    if kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(source, key, f"expected a number, got {shown(value)}")
        return float(value)
    if isinstance(value, (dict, list)) or value is None:
        raise ConfigError(source, key, f"expected a string, got {shown(value)}")
    return str(value)
