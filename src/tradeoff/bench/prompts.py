"""Prompts for LLM benchmarks: synthetic ones with given input/output lengths, or a JSONL.

    items = synthetic_prompts(200, input_tokens=(64, 512), output_tokens=(16, 256), seed=0)
    items = read_prompts(Path("prompts.jsonl"), output_tokens=(128, 128), seed=0)

Synthetic prompts are common English words, one per asked input token: most BPE tokenizers
give about one token per such word, and the server's own count (``usage.prompt_tokens``)
is what the result reports. Output lengths are asked with ``max_tokens`` (and
``ignore_eos`` where the server allows it, so that generation does not stop early).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from tradeoff.errors import DatasetError

__all__ = [
    "WORDS",
    "PromptItem",
    "fingerprint",
    "parse_length",
    "read_prompts",
    "synthetic_prompts",
]

WORDS = tuple("""the of and to in is was for on that with as by at from it his an were are
which this be or has had one first their its new after who they two her she been other
when time all during into would there more over city some can only most also between
made these under while about year them many world then where well since state through
both part known such three later school years may each high team people any before game
life film war against work each house music water name family small long days own place
area home group early great way around make found light river north south east west end
""".split())


@dataclass(frozen=True)
class PromptItem:
    """One request of a dataset: a completion ``prompt`` or chat ``messages``, and the
    output length to ask for."""

    prompt: str | None
    messages: tuple[dict[str, str], ...] | None
    max_tokens: int
    input_words: int | None = None  # synthetic: the input length asked for


def parse_length(text: str, option: str) -> tuple[int, int]:
    """``N`` (fixed) or ``LO:HI`` (uniform, both included), each >= 1."""
    low, sep, high = text.partition(":")
    try:
        bounds = (int(low), int(high) if sep else int(low))
    except ValueError:
        raise DatasetError(f"{option} {text!r}: use N or LO:HI, e.g. 128 or 64:512") from None
    if bounds[0] < 1 or bounds[1] < bounds[0]:
        raise DatasetError(f"{option} {text!r}: need 1 <= LO <= HI")
    return bounds


def _lengths(bounds: tuple[int, int], count: int, rng: np.random.Generator) -> np.ndarray:
    return rng.integers(bounds[0], bounds[1] + 1, count)


def synthetic_prompts(count: int, input_tokens: tuple[int, int],
                      output_tokens: tuple[int, int], seed: int = 0,
                      chat: bool = False) -> list[PromptItem]:
    """``count`` prompts of random words; the same seed gives the same prompts."""
    rng = np.random.default_rng(seed)
    inputs = _lengths(input_tokens, count, rng)
    outputs = _lengths(output_tokens, count, rng)
    words = np.asarray(WORDS)
    items = []
    for n_in, n_out in zip(inputs.tolist(), outputs.tolist(), strict=True):
        text = " ".join(words[rng.integers(0, len(words), n_in)].tolist())
        messages = ({"role": "user", "content": text},) if chat else None
        items.append(PromptItem(None if chat else text, messages, n_out, n_in))
    return items


def read_prompts(path: Path, output_tokens: tuple[int, int], seed: int = 0,
                 chat: bool = False) -> list[PromptItem]:
    """A JSONL file, one request per line: ``{"prompt": ...}`` or ``{"messages": [...]}``,
    with an optional ``max_tokens`` (else drawn from ``output_tokens``). A prompt line
    sent to a chat endpoint becomes one user message."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise DatasetError(f"--prompts {path}: {exc.strerror}") from None
    rng = np.random.default_rng(seed)
    items = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            doc: Any = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"--prompts {path}:{number}: not JSON ({exc.msg})") from None
        if not isinstance(doc, dict):
            raise DatasetError(f"--prompts {path}:{number}: expected a JSON object")
        max_tokens = doc.get("max_tokens", int(_lengths(output_tokens, 1, rng)[0]))
        if not isinstance(max_tokens, int) or max_tokens < 1:
            raise DatasetError(f"--prompts {path}:{number}: max_tokens must be an integer >= 1")
        messages = doc.get("messages")
        if messages is not None:
            if not isinstance(messages, list) or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages):
                raise DatasetError(f"--prompts {path}:{number}: messages must be a list of "
                                   "{role, content} objects")
            if not chat:
                raise DatasetError(f"--prompts {path}:{number}: chat messages need --chat")
            items.append(PromptItem(None, tuple(messages), max_tokens))
        elif isinstance(doc.get("prompt"), str):
            prompt = doc["prompt"]
            items.append(PromptItem(None, ({"role": "user", "content": prompt},), max_tokens)
                         if chat else PromptItem(prompt, None, max_tokens))
        else:
            raise DatasetError(f"--prompts {path}:{number}: needs \"prompt\" (a string) "
                               "or \"messages\"")
    if not items:
        raise DatasetError(f"--prompts {path}: no prompts in the file")
    return items


def fingerprint(items: list[PromptItem]) -> str:
    """SHA-256 of the dataset, the same whichever endpoint it is sent to."""
    digest = hashlib.sha256()
    for item in items:
        digest.update(json.dumps([item.prompt, item.messages, item.max_tokens]).encode())
    return digest.hexdigest()
