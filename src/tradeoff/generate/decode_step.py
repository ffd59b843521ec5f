"""The decode step over fixed buffers: the sequences that add one token each, run as one
batch padded to a bucket size, with sampling, and (on a GPU) replayed as a CUDA graph.

Each step the host writes one row per sequence into a pinned staging array: its token,
position, sampling settings and its row of the block table. One non-blocking copy moves
the rows the batch uses to the device; the decoder's ``forward_decode`` (attention reads
the cache through the block table) and :func:`~tradeoff.generate.sampling.sample_tokens`
run on those fixed buffers; one copy brings the chosen token ids back. Rows past the
batch's sequences are padding: their table points at the scratch block, so they write
and read nothing a sequence owns, and their tokens are ignored.

On CUDA each (batch bucket, context bucket, sampling kind) is captured once as a CUDA
graph, so a step is a copy in, one graph launch and a copy out, whatever the model's
depth. On the CPU the same code runs eagerly, at the batch's exact size.

    step = DecodeStep(decoder, cache, max_seqs=64, max_blocks=128, scratch_block=512)
    tokens = step.run(rows, floats, tables, greedy_only=True, truncating=False)

``run`` is ``launch`` then ``read``: the engine's worker launches the next step before it
reads this one's tokens back where it can (see :mod:`tradeoff.generate.step_worker`).
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch

from tradeoff.generate.sampling import SamplingBatch, sample_tokens

__all__ = ["COLUMNS", "DecodeStep", "batch_buckets", "context_bucket"]

log = logging.getLogger("tradeoff.server")

# the staging row: token, position, seed, tokens produced, top_k, greedy, then
# temperature and top_p as float64 bit patterns, then the block table
TOKEN, POSITION, SEED, PRODUCED, TOP_K, GREEDY, TEMPERATURE, TOP_P = range(8)
COLUMNS = 8


def batch_buckets(max_seqs: int) -> list[int]:
    """The padded batch sizes graphs are captured for: 1, 2, 4, 8, then steps of 8 to
    32, then of 16 (as a step pads a batch by at most a few rows), up to ``max_seqs``."""
    sizes = {1, 2, 4, 8, *range(16, 33, 8), *range(48, max_seqs + 16, 16)}
    return sorted({min(s, max_seqs) for s in sizes})


def context_bucket(blocks: int, max_blocks: int) -> int:
    """The padded table width for a batch whose longest sequence holds ``blocks``
    blocks: the next power of two (a graph per width), at most ``max_blocks``."""
    return min(1 << max(blocks - 1, 0).bit_length(), max_blocks)


class DecodeStep:
    """Runs pure-decode batches of ``decoder`` over ``cache``; CUDA graphs when
    ``graphs`` (default: on a CUDA device). ``pad``: pad batches and tables to the bucket
    sizes (default: with graphs, which need them; the CPU tests pad without graphs)."""

    def __init__(self, decoder: Any, cache: Any, *, max_seqs: int, max_blocks: int,
                 scratch_block: int, graphs: bool | None = None,
                 pad: bool | None = None) -> None:
        self.decoder = decoder
        self.cache = cache
        self.device = torch.device(decoder.device)
        self.graphs = self.device.type == "cuda" if graphs is None else graphs
        self.pad = self.graphs if pad is None else pad or self.graphs
        self.max_blocks = max_blocks
        self.scratch_block = scratch_block
        self.buckets = batch_buckets(max_seqs) if self.pad else []
        rows = self.buckets[-1] if self.buckets else max_seqs
        # flat: a step's rows, only as wide as its table, lie at the front (one copy)
        size = rows * (COLUMNS + max_blocks)
        pinned = self.device.type == "cuda"
        self.staging = torch.zeros(size, dtype=torch.int64, pin_memory=pinned)
        self.inputs = torch.zeros(size, dtype=torch.int64, device=self.device)
        self.outputs = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self._captured: dict[tuple[int, int, bool, bool], Any] = {}
        self._pool: Any = None
        self.capture_seconds = 0.0

    def run(self, rows: np.ndarray, floats: np.ndarray, tables: np.ndarray,
            greedy_only: bool, truncating: bool) -> list[int]:
        """The next token of each sequence: ``rows`` int64 ``[b, 6]`` (token, position,
        seed, produced, top_k, greedy), ``floats`` float64 ``[b, 2]`` (temperature,
        top_p), ``tables`` int32 ``[b, blocks]`` (its block table rows)."""
        return self.read(self.launch(rows, floats, tables, greedy_only, truncating))

    def launch(self, rows: np.ndarray, floats: np.ndarray, tables: np.ndarray,
               greedy_only: bool, truncating: bool) -> int:
        """Start :meth:`run`'s step on the device; returns its row count for
        :meth:`read`."""
        count = len(rows)
        size = self.buckets[bisect.bisect_left(self.buckets, count)] if self.pad else count
        blocks = context_bucket(tables.shape[1], self.max_blocks) if self.pad \
            else tables.shape[1]
        width = COLUMNS + blocks
        staged = self.staging[:size * width].numpy().reshape(size, width)
        staged[:count, :TEMPERATURE] = rows
        staged[:count, TEMPERATURE:COLUMNS] = floats.view(np.int64)
        staged[:count, COLUMNS:COLUMNS + tables.shape[1]] = tables
        staged[:count, COLUMNS + tables.shape[1]:COLUMNS + blocks] = self.scratch_block
        if size > count:  # padding rows: token 0 at position 0 of the scratch block, greedy
            staged[count:size, :COLUMNS] = 0
            staged[count:size, GREEDY] = 1
            staged[count:size, TEMPERATURE:COLUMNS] = np.array([1.0, 1.0]).view(np.int64)
            staged[count:size, COLUMNS:COLUMNS + blocks] = self.scratch_block
        self.inputs[:size * width].copy_(self.staging[:size * width],
                                         non_blocking=True)  # one copy in
        key = (size, blocks, greedy_only, truncating)
        if self.graphs:
            graph = self._captured.get(key)
            if graph is None:
                graph = self._captured[key] = self._capture(key)
            graph.replay()
        else:
            self._forward(*key)
        return count

    def read(self, count: int) -> list[int]:
        """The tokens of the step :meth:`launch` started, once the device has run it."""
        self.decoder.synchronize()
        tokens: list[int] = self.outputs[:count].tolist()  # one copy out
        return tokens

    @torch.inference_mode()
    def _forward(self, size: int, blocks: int, greedy_only: bool, truncating: bool) -> None:
        """The step on the fixed buffers, as a graph captures it."""
        columns = self.inputs[:size * (COLUMNS + blocks)].view(size, COLUMNS + blocks)
        floats = columns[:, TEMPERATURE:COLUMNS].view(torch.float64).float()
        logits = self.decoder.forward_decode(columns[:, TOKEN], columns[:, POSITION],
                                             columns[:, COLUMNS:COLUMNS + blocks], self.cache)
        batch = SamplingBatch(temperature=floats[:, 0], top_p=floats[:, 1],
                              top_k=columns[:, TOP_K], seed=columns[:, SEED],
                              produced=columns[:, PRODUCED], greedy=columns[:, GREEDY] != 0,
                              greedy_only=greedy_only, truncating=truncating)
        self.outputs[:size] = sample_tokens(logits, batch)

    def _capture(self, key: tuple[int, int, bool, bool]) -> Any:
        """A CUDA graph of one step shape (warmed up on a side stream first)."""
        started = time.perf_counter()
        run: Callable[[], None] = lambda: self._forward(*key)  # noqa: E731
        with _pinned_attention():
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                run()  # the step's kernels choose their plans outside the capture
            torch.cuda.current_stream(self.device).wait_stream(stream)
            if self._pool is None:
                self._pool = torch.cuda.graph_pool_handle()
            graph = torch.cuda.CUDAGraph()
            # thread_local: another model's thread may call CUDA (a load) meanwhile
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                run()
        spent = time.perf_counter() - started
        self.capture_seconds += spent
        log.info("captured the decode step for batch %d, %d blocks, %s sampling in %.0f ms",
                 key[0], key[1], "greedy" if key[2] else "full" if key[3] else "plain",
                 spent * 1e3)
        return graph


@contextlib.contextmanager
def _pinned_attention() -> Iterator[None]:
    """Attention on the memory-efficient kernel (the math one as the fallback): the
    cuDNN kernel plans again for every new key length, which costs tens of ms."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]):
        yield
