"""``tradeoff optimize`` for a generative model: its decoder in another precision.

A generative model has no version directories, so each precision becomes a sibling model
``<name>-<precision>`` in the same repository: its ``generate.yaml`` is the original's
with ``precision`` set and ``path`` made absolute (the weights are shared, not copied).
The server serves it under that name next to the original, and ``tradeoff compare`` can
A/B the two through ``/v1``.

Every precision is then measured in process: the time of one decode step at batch 1,
tokens per second at each batch of sequences decoded together, the time of a step that
prefills a prompt chunk of 16, 64 and 256 tokens, and, on the sentences
shipped with tradeoff, the perplexity and how often the next-token choice (greedy, with
the text as context) agrees with the original's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml

from tradeoff import data
from tradeoff.errors import OptimizeError, local_resource
from tradeoff.generate.config import GenerativeConfig
from tradeoff.generate.loader import load_generative
from tradeoff.repository.repository import GENERATIVE_FILE
from tradeoff.repository.safe_yaml import read_yaml
from tradeoff.results import OutputAccuracy, VersionReport
from tradeoff.stats.distribution import distribution

__all__ = [
    "GENERATIVE",
    "PROMPT_TOKENS",
    "TEXT_SENTENCES",
    "optimize_generative",
    "scored_text",
    "sibling_name",
    "write_sibling",
]

GENERATIVE = "generative"
PROMPT_TOKENS = 16  # context of each sequence before the timed decode steps
TEXT_SENTENCES = 40  # the scored text: this many of tradeoff's sentences


def sibling_name(name: str, precision: str) -> str:
    return f"{name}-{precision}"


def write_sibling(model_dir: Path, precision: str) -> Path:
    """The sibling model of ``model_dir`` in ``precision``; returns its directory."""
    doc = read_yaml(model_dir / GENERATIVE_FILE) or {}
    path = Path(str(doc.get("path", GenerativeConfig.path)))
    doc["path"] = str(path if path.is_absolute() else (model_dir / path).resolve())
    doc["precision"] = precision
    target = model_dir.parent / sibling_name(model_dir.name, precision)
    with local_resource(f"cannot write the sibling model {target}"):
        target.mkdir(exist_ok=True)
        (target / GENERATIVE_FILE).write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def scored_text() -> str:
    """The text perplexity and agreement are measured on."""
    return " ".join(data.sentences()[:TEXT_SENTENCES])


def _score(decoder: Any, tokenizer: Any) -> tuple[np.ndarray, float]:
    """The greedy next token at every position of the scored text, and its perplexity."""
    from tradeoff.backends.decoding import SequenceStep

    ids = torch.tensor(tokenizer.encode(scored_text()), dtype=torch.long)
    ids = ids[:decoder.config.max_position]
    cache = decoder.new_cache(math.ceil(len(ids) / 16), 16)
    (logits,) = decoder.step([SequenceStep(ids, 0, torch.arange(len(ids)))], cache,
                             all_logits=True)
    nll = torch.nn.functional.cross_entropy(logits[:-1].float(), ids[1:])
    return logits.argmax(-1).numpy(), float(nll.exp())


def _decode_speed(decoder: Any, max_batch: int, seconds: float
                  ) -> tuple[dict[str, float], dict[int, float]]:
    """Step time (ms) of one sequence decoding, and tokens per second with 1, 2, 4 ...
    ``max_batch`` sequences decoding together, each for a share of ``seconds``."""
    from tradeoff.backends.decoding import SequenceStep

    sizes = [1]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    steps_most = 512
    length = PROMPT_TOKENS + steps_most
    cache = decoder.new_cache(max(sizes) * math.ceil(length / 16), 16)
    prompt = torch.arange(1, PROMPT_TOKENS + 1, dtype=torch.long)

    def run(batch: int, budget: float) -> list[float]:
        slots = [torch.arange(i * length, (i + 1) * length) for i in range(batch)]
        decoder.step([SequenceStep(prompt, 0, s) for s in slots], cache)
        decoder.synchronize()
        times: list[float] = []
        deadline = time.perf_counter() + budget
        while len(times) < 3 or (time.perf_counter() < deadline and len(times) < steps_most):
            position = PROMPT_TOKENS + len(times)
            start = time.perf_counter()
            decoder.step([SequenceStep(torch.tensor([7]), position, s) for s in slots], cache)
            decoder.synchronize()  # the step's device work, not only its launch
            times.append(time.perf_counter() - start)
        return times

    single = run(1, seconds / 2)
    latency = distribution(np.array(single) * 1e3)
    assert latency is not None
    throughput = {}
    for batch in sizes:
        times = run(batch, seconds / 2 / len(sizes))
        throughput[batch] = batch * len(times) / sum(times)
    return latency, throughput


PREFILL_CHUNKS = (16, 64, 256)  # prompt tokens of the timed prefill steps


def _prefill_speed(decoder: Any, seconds: float) -> dict[int, float]:
    """The median time (ms) of one step prefilling a prompt chunk of each of
    PREFILL_CHUNKS tokens (what a prompt adds to a step), each for a share of
    ``seconds``."""
    from tradeoff.backends.decoding import SequenceStep

    top = min(max(PREFILL_CHUNKS), int(getattr(decoder.config, "max_position", 1 << 30)))
    chunks = [c for c in PREFILL_CHUNKS if c <= top] or [top]
    cache = decoder.new_cache(math.ceil(max(chunks) / 16), 16)
    out = {}
    for size in chunks:
        prompt = torch.arange(1, size + 1, dtype=torch.long) % 200 + 1
        slots = torch.arange(size)
        times: list[float] = []
        deadline = time.perf_counter() + seconds / len(chunks)
        while len(times) < 3 or (time.perf_counter() < deadline and len(times) < 50):
            start = time.perf_counter()
            decoder.step([SequenceStep(prompt, 0, slots)], cache)
            decoder.synchronize()
            times.append(time.perf_counter() - start)
        out[size] = 1e3 * float(np.median(times))
    return out


def optimize_generative(model_dir: Path, precisions: tuple[str, ...], seconds: float,
                        say: Callable[[str], None], max_sequences: int | None = None
                        ) -> tuple[list[VersionReport], str]:
    """Write the sibling of each precision and measure it with the original; returns the
    reports (the original first, labelled 1, 2, 3 ...) and the original's precision.
    ``max_sequences``: the largest decode batch timed (default: the config's
    max_num_seqs, at most 16)."""
    original = GenerativeConfig.of_model(model_dir)
    wanted = [p for p in precisions if p != original.precision]
    if precisions and not wanted:  # none asked for: the original is measured alone
        raise OptimizeError(f"{model_dir.name} is already {original.precision}")
    directories = [model_dir] + [write_sibling(model_dir, p) for p in wanted]
    reports: list[VersionReport] = []
    reference: np.ndarray | None = None
    for label, directory in enumerate(directories, start=1):
        say(f"measuring {directory.name}")
        config, decoder, tokenizer = load_generative(directory)
        latency, throughput = _decode_speed(
            decoder, max_sequences or min(config.max_num_seqs, 16), seconds)
        prefill = _prefill_speed(decoder, seconds / 4)
        accuracy = []
        # graded against the original; measured alone, the original is not scored
        if len(directories) > 1 and reference is None:
            reference, reference_perplexity = _score(decoder, tokenizer)
        elif reference is not None:
            greedy, perplexity = _score(decoder, tokenizer)
            agreement = float(np.mean(greedy == reference))
            metrics = {"perplexity": perplexity, "greedy_agreement": agreement,
                       "perplexity_original": reference_perplexity}
            accuracy = [OutputAccuracy("next token", GENERATIVE, len(greedy), metrics,
                                       1.0 - agreement)]
        method = "original" if directory == model_dir else \
            f"generate.yaml precision: {config.precision}; from {model_dir.name}"
        reports.append(VersionReport(label, config.precision, method, decoder.weight_bytes,
                                     latency, throughput, accuracy,
                                     created=directory != model_dir, model=directory.name,
                                     prefill_ms=prefill))
        del decoder
    return reports, original.precision
