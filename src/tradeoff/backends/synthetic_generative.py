"""A generative model whose step cost is set, not computed: the serving path at GPU token
rates on a CPU (tests, and :mod:`benchmarks.llm_load_generator`).

A model directory holds ``generate.yaml`` with ``format: synthetic`` and ``path:
model.json``; the file sets what one engine step costs and what the model answers:

    {"step_ms": 3.0,          # wall time of every step ...
     "per_token_ms": 0.0,     # ... plus this per token the step computes (prompt + decode)
     "vocab_size": 261,       # logits per row (at least 261: 256 bytes + 5 special tokens)
     "max_position": 4096,    # positions of a sequence (prompt + answer)
     "eos_at_position": null} # null: never stops by itself; N: EOS from position N on

A step takes ``step_ms + per_token_ms * tokens`` of the stand-in device's time, its own
work included. It runs from its launch, or from the end of the step before it when that
is later, as a GPU stream runs queued work; the host waits for it in ``synchronize``
(``time.sleep``, the GIL free) just before it reads the step's tokens back, so sampling
counts in the step as it does on a GPU. With ``max_num_seqs: 64`` and ``step_ms: 3``
the engine can stream at most 64 / 3 ms = 21,333 tokens/s, whatever the machine.

The answer is deterministic and cheap to check: the "KV cache" holds the token id at each
slot, and the token after position ``p`` is a letter or a space chosen by the token at
``p`` and the one at ``p - 1``, the latter read back from the cache through the step's
slots (so a wrong slot or a bad prefix-cache hit changes the answer); :func:`continuation`
is the same rule over a plain list. The tokenizer is byte-level (token id = byte value for
ids 0-255, then ``<|pad|>``, ``<|bos|>``, ``<|eos|>``, ``<|im_start|>``, ``<|im_end|>``)
with a ChatML-style chat template, built in memory (no files, no download) and served by
:class:`tradeoff.backends.text.Tokenizer`, so answers are real text, one character a token.

    decoder, tokenizer = load_synthetic(Path("model.json"), "synthetic", "cpu", "fp32")
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from tradeoff.backends.decoding import SequenceStep
from tradeoff.backends.llama import PagedKVCache
from tradeoff.backends.registry import GenerativeBackendType
from tradeoff.backends.text import Tokenizer
from tradeoff.errors import InvalidValue, ModelLoadError

__all__ = [
    "ANSWER_ALPHABET",
    "BACKEND",
    "CHAT_TEMPLATE",
    "MAX_COST_MS",
    "MIN_VOCAB",
    "NO_TOKEN",
    "SPECIAL_TOKENS",
    "SyntheticDecoder",
    "SyntheticLLMConfig",
    "build_tokenizer",
    "continuation",
    "load_synthetic",
    "write_model_file",
]

SPECIAL_TOKENS = ("<|pad|>", "<|bos|>", "<|eos|>", "<|im_start|>", "<|im_end|>")
BOS_ID, EOS_ID = 257, 258
MIN_VOCAB = 256 + len(SPECIAL_TOKENS)
# a step cost above this would outlast a server's shutdown drain: a mistake, not a model
MAX_COST_MS = 10_000.0
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
                 "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant"
                 "\n{% endif %}")
ANSWER_ALPHABET = b"abcdefghijklmnopqrstuvwxyz "  # what the model says, one byte a token
NO_TOKEN = 0  # the token "before" position 0
# the rule's multipliers: odd and coprime to the alphabet's 27 letters, so every letter
# follows every pair of tokens at some position
_LAST, _BEFORE, _POSITION = 7, 13, 5
_UNCHOSEN = -1.0e4  # finite: a row is never "no finite logit"; exp(-1e4 / 2) is 0
_PR_SET_TIMERSLACK = 29  # prctl(2)
_thread_state = threading.local()


@dataclass(frozen=True)
class SyntheticLLMConfig:
    """What ``model.json`` sets; ``eos_token_id``, ``bos_token_id`` as a Llama config
    names them, for the engine and the server."""

    step_ms: float = 3.0
    per_token_ms: float = 0.0
    vocab_size: int = MIN_VOCAB
    max_position: int = 4096
    eos_at_position: int | None = None
    bos_token_id: int = BOS_ID
    eos_token_id: int = EOS_ID

    def __post_init__(self) -> None:
        for name in ("step_ms", "per_token_ms"):
            value = getattr(self, name)
            if not value >= 0:  # NaN too
                raise ModelLoadError(f"synthetic model: {name} must be >= 0 ms, got {value}")
            if value > MAX_COST_MS:  # infinity too
                raise ModelLoadError(f"synthetic model: {name} must be at most "
                                     f"{MAX_COST_MS:,.0f} ms, got {value}")
        if self.vocab_size < MIN_VOCAB:
            raise ModelLoadError(f"synthetic model: vocab_size must be >= {MIN_VOCAB} (256 "
                                 f"bytes + {len(SPECIAL_TOKENS)} special tokens), got "
                                 f"{self.vocab_size}")
        if self.max_position < 2:
            raise ModelLoadError(f"synthetic model: max_position must be >= 2, got "
                                 f"{self.max_position}")
        if self.eos_at_position is not None and self.eos_at_position < 1:
            raise ModelLoadError(f"synthetic model: eos_at_position must be >= 1 or null, "
                                 f"got {self.eos_at_position}")

    def step_seconds(self, tokens: int) -> float:
        """Wall time of a step that computes ``tokens`` tokens."""
        return (self.step_ms + self.per_token_ms * tokens) / 1e3

    def to_json(self) -> dict[str, Any]:
        """The ``model.json`` document (the token ids are fixed by the tokenizer)."""
        return {"step_ms": self.step_ms, "per_token_ms": self.per_token_ms,
                "vocab_size": self.vocab_size, "max_position": self.max_position,
                "eos_at_position": self.eos_at_position}

    @classmethod
    def read(cls, path: Path) -> SyntheticLLMConfig:
        """Read and check ``model.json``; ModelLoadError names the file and the field."""
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            raise ModelLoadError(f"{path}: not a readable synthetic model: {exc}") from None
        if not isinstance(doc, dict):
            raise ModelLoadError(f"{path}: must be a JSON object of settings")
        known = {f.name: f.type for f in dataclasses.fields(cls)
                 if f.name not in ("bos_token_id", "eos_token_id")}
        unknown = sorted(set(doc) - set(known))
        if unknown:
            raise ModelLoadError(f"{path}: unknown setting(s) {', '.join(unknown)} (known: "
                                 f"{', '.join(sorted(known))})")
        values: dict[str, Any] = {}
        for key, value in doc.items():
            wants_int = known[key] != "float"
            if value is None and key == "eos_at_position":
                values[key] = None
            elif isinstance(value, bool) or not isinstance(value, int if wants_int
                                                           else (int, float)):
                kind = "an integer" if wants_int else "a number"
                raise ModelLoadError(f"{path}: {key} must be {kind}, got {value!r}")
            else:
                values[key] = value if wants_int else float(value)
        try:
            return cls(**values)
        except ModelLoadError as exc:
            raise ModelLoadError(f"{path}: {exc}") from None


def write_model_file(path: Path, config: SyntheticLLMConfig) -> Path:
    """Write ``config`` as ``model.json`` at ``path``; returns it."""
    path.write_text(json.dumps(config.to_json(), indent=2) + "\n")
    return path


def _byte_symbols() -> list[str]:
    """The printable character byte-level BPE stands each byte for, in byte order: the
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in turn."""
    kept = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    spare = iter(range(256, 512))
    return [chr(b) if b in kept else chr(next(spare)) for b in range(256)]


def build_tokenizer() -> Tokenizer:
    """The byte-level tokenizer and chat template, made in memory."""
    from tokenizers import Tokenizer as HfTokenizer
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {symbol: byte for byte, symbol in enumerate(_byte_symbols())}
    backend = HfTokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    return Tokenizer(backend, {"bos_token": SPECIAL_TOKENS[1], "eos_token": SPECIAL_TOKENS[2],
                               "add_bos_token": True, "chat_template": CHAT_TEMPLATE})


def _next_tokens(last: torch.Tensor, before: torch.Tensor, position: torch.Tensor,
                 alphabet: torch.Tensor) -> torch.Tensor:
    """The rule, on tensors: the token at ``position`` after ``last`` (at position - 1)
    and ``before`` (at position - 2)."""
    mixed = last * _LAST + before * _BEFORE + position * _POSITION
    return alphabet[mixed % alphabet.numel()]


def continuation(tokens: Sequence[int], count: int,
                 eos_at_position: int | None = None) -> list[int]:
    """The ``count`` tokens the model answers after ``tokens`` (greedy or not): the
    reference an answer is checked against. Stops after EOS as the engine would unless
    the caller ignores EOS, in which case pass ``eos_at_position=None``."""
    alphabet = list(ANSWER_ALPHABET)
    seq = list(tokens)
    out: list[int] = []
    while len(out) < count:
        position = len(seq)
        if eos_at_position is not None and position >= eos_at_position:
            token = EOS_ID
        else:
            last = seq[-1] if seq else NO_TOKEN
            before = seq[-2] if len(seq) > 1 else NO_TOKEN
            token = alphabet[(last * _LAST + before * _BEFORE + position * _POSITION)
                             % len(alphabet)]
        seq.append(token)
        out.append(token)
    return out


class SyntheticDecoder:
    """The decoder interface of :class:`tradeoff.backends.llama.LlamaDecoder`: ``config``,
    ``device``, ``dtype``, ``new_cache`` and ``step``, at the cost ``config`` sets."""

    def __init__(self, config: SyntheticLLMConfig) -> None:
        self.config = config
        self.device = torch.device("cpu")
        self.dtype = torch.float32
        self.weight_bytes = 0
        self.alphabet = torch.tensor(list(ANSWER_ALPHABET), dtype=torch.int64,
                                     device=self.device)
        self.steps = 0  # steps run, and the tokens they computed (for tests)
        self.tokens_computed = 0
        self._due = 0.0

    def new_cache(self, num_blocks: int, block_size: int) -> PagedKVCache:
        """The token id at every slot (``keys``; ``values`` is empty), in the shape of a
        paged cache of one layer and one head of width 1."""
        slots = num_blocks * block_size
        return PagedKVCache(torch.full((1, slots, 1, 1), NO_TOKEN, dtype=torch.int64,
                                       device=self.device),
                            torch.empty((1, slots, 0, 0), device=self.device), block_size)

    @torch.inference_mode()
    def step(self, steps: Sequence[SequenceStep], cache: PagedKVCache,
             all_logits: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """Write the new tokens' ids at their slots and choose the token after each:
        ``[len(steps), vocab]`` float32 logits, 0 for the chosen token and -1e4 for the
        others (or, with ``all_logits``, per sequence ``[n, vocab]`` for every new token).
        Returns when the step's set time has passed."""
        started = time.perf_counter()
        counts = torch.tensor([s.tokens.numel() for s in steps], dtype=torch.int64)
        lengths = torch.tensor([s.slots.numel() for s in steps], dtype=torch.int64)
        tokens = torch.cat([s.tokens for s in steps]).to(self.device)
        slots = torch.cat([s.slots for s in steps]).to(self.device)
        new = int(counts.sum())
        # where each sequence's slots start in ``slots``, and each new token's position
        slots_from = torch.cumsum(lengths, 0) - lengths
        position = (torch.repeat_interleave(lengths - counts, counts)
                    + torch.arange(new) - torch.repeat_interleave(torch.cumsum(counts, 0)
                                                                  - counts, counts))
        if bool((position < 0).any()) or bool((counts < 1).any()):
            raise InvalidValue("a sequence step has no new tokens or more tokens than slots")
        first = torch.repeat_interleave(slots_from, counts).to(self.device)
        position = position.to(self.device)
        table = cache.keys.view(-1)
        table[slots[first + position]] = tokens
        # the token before each new one, read back from the cache (written this step or
        # an earlier one, or shared by a prefix-cache hit)
        before = torch.where(position > 0, table[slots[first + (position - 1).clamp(min=0)]],
                             NO_TOKEN)
        chosen = _next_tokens(tokens, before, position + 1, self.alphabet)
        if self.config.eos_at_position is not None:
            chosen = torch.where(position + 1 >= self.config.eos_at_position,
                                 self.config.eos_token_id, chosen)
        ends = torch.cumsum(counts, 0) - 1
        logits = self._logits(chosen if all_logits else chosen[ends.to(self.device)])
        self._spend(started, new)
        if all_logits:
            return list(logits.split(counts.tolist()))
        return logits

    @torch.inference_mode()
    def forward_decode(self, tokens: torch.Tensor, positions: torch.Tensor,
                       table: torch.Tensor, cache: PagedKVCache) -> torch.Tensor:
        """One decode token per row through a block table, as
        :meth:`LlamaDecoder.forward_decode`: ``tokens`` and ``positions`` ``[rows]``,
        ``table`` ``[rows, blocks]``; float32 logits ``[rows, vocab]``. A row whose block
        is past the cache (the scratch block of a padded batch) writes nothing and reads
        no token back. Costs a step of ``rows`` tokens."""
        started = time.perf_counter()
        size = cache.block_size
        held = cache.keys.shape[1] // size
        table = table.to(self.device, torch.int64)
        tokens, positions = tokens.to(self.device), positions.to(self.device)

        def slots_of(at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            block = table.gather(1, (at // size)[:, None])[:, 0]
            return block.clamp(max=held - 1) * size + at % size, block < held

        slots, inside = slots_of(positions)
        cached = cache.keys.view(-1)
        cached[slots[inside]] = tokens[inside]
        earlier, readable = slots_of((positions - 1).clamp(min=0))
        before = torch.where((positions > 0) & readable, cached[earlier], NO_TOKEN)
        chosen = _next_tokens(tokens, before, positions + 1, self.alphabet)
        if self.config.eos_at_position is not None:
            chosen = torch.where(positions + 1 >= self.config.eos_at_position,
                                 self.config.eos_token_id, chosen)
        logits = self._logits(chosen)
        self._spend(started, int(tokens.numel()))
        return logits

    def _logits(self, chosen: torch.Tensor) -> torch.Tensor:
        """0 for each row's chosen token, -1e4 for the others."""
        logits = torch.full((chosen.numel(), self.config.vocab_size), _UNCHOSEN,
                            dtype=torch.float32, device=self.device)
        return logits.scatter_(1, chosen[:, None], 0.0)

    def _spend(self, started: float, tokens: int) -> None:
        """Count the step and queue its time on the stand-in device: it runs from
        ``started`` or from the end of the step before it, whichever is later."""
        self.steps += 1
        self.tokens_computed += tokens
        self._due = max(started, self._due) + self.config.step_seconds(tokens)

    def synchronize(self) -> None:
        """Sleep (the GIL free) until the steps launched so far have run."""
        if not getattr(_thread_state, "fine_timer", False):
            _fine_timer()
            _thread_state.fine_timer = True
        left = self._due - time.perf_counter()
        if left > 0:
            time.sleep(left)


def _fine_timer() -> None:
    """Wake this thread's sleeps within 1 µs of their end, not Linux's default 50 µs
    timer slack: a host waiting on a GPU's stream sees the step end at once."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(_PR_SET_TIMERSLACK, 1000, 0, 0, 0)


def load_synthetic(path: Path, fmt: str, device: str, precision: str = "fp32"
                   ) -> tuple[SyntheticDecoder, Tokenizer]:
    """Decoder and tokenizer of a ``model.json``: on the CPU (``device`` auto or cpu; a
    CUDA graph could not capture its sleep), in fp32 (it has no weights)."""
    if precision != "fp32":
        raise ModelLoadError(f"synthetic model {path}: precision {precision!r}: it has no "
                             "weights; use precision: fp32")
    if device not in ("auto", "cpu"):
        raise ModelLoadError(f"synthetic model {path}: device {device!r}: it runs on the "
                             "host whatever the machine (its step stands for a GPU's); use "
                             "device: cpu or auto")
    return SyntheticDecoder(SyntheticLLMConfig.read(path)), build_tokenizer()


BACKEND = GenerativeBackendType(name="synthetic", formats=("synthetic",), load=load_synthetic)
