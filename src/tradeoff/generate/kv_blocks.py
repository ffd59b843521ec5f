"""The KV cache's block accounting: fixed-size blocks, a free list, each sequence's block
table, and (optionally) a prefix cache. Pure bookkeeping; the tensors live with the
decoder.

    blocks = BlockAllocator(num_blocks=256, block_size=16)
    table = blocks.allocate(blocks.needed(prompt_len))
    blocks.free(table)

With ``prefix_caching``, a full block whose keys and values are computed is registered
under its content: the tokens it holds and the key of the block before it. A later
sequence whose prompt starts with the same blocks shares them (reference counted)
instead of computing them again. A cached block nobody uses stays cached until its
memory is needed: free blocks are handed out first, then the least recently released
cached ones.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict, deque

import numpy as np

from tradeoff.errors import InvalidValue

__all__ = ["BlockAllocator", "BlockKey", "BlockTable", "block_key"]

# (digest of every token before the block, the block's tokens): a cache hit compares the
# block's own tokens exactly and its whole prefix by a cryptographic digest, so no two
# different prompts can share a block (Python's hash() can be made to collide)
BlockKey = tuple[bytes, tuple[int, ...]]


def block_key(previous: BlockKey | None, tokens: list[int]) -> BlockKey:
    """The cache key of a full block: its tokens and everything before them."""
    if previous is None:
        return (b"", tuple(tokens))
    digest = hashlib.blake2b(previous[0], digest_size=16)
    digest.update(array("q", previous[1]).tobytes())
    return (digest.digest(), tuple(tokens))


class BlockAllocator:
    """Hands out KV cache blocks; ``usage`` is the fraction held by sequences."""

    def __init__(self, num_blocks: int, block_size: int, prefix_caching: bool = False) -> None:
        if num_blocks < 1 or block_size < 1:
            raise InvalidValue("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self._free: deque[int] = deque(range(num_blocks))
        self._refs = [0] * num_blocks
        self._key_of: dict[int, BlockKey] = {}
        self._cached: dict[BlockKey, int] = {}
        self._unused: OrderedDict[int, None] = OrderedDict()  # cached, no user; LRU first
        self.hit_tokens = 0    # prompt tokens found in the prefix cache
        self.query_tokens = 0  # prompt tokens looked up

    @property
    def free_blocks(self) -> int:
        return len(self._free) + len(self._unused)

    @property
    def usage(self) -> float:
        return 1 - self.free_blocks / self.num_blocks

    def needed(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def can_allocate(self, count: int) -> bool:
        return count <= self.free_blocks

    def allocate(self, count: int) -> list[int]:
        if count > self.free_blocks:
            raise MemoryError(f"{count} KV blocks asked, {self.free_blocks} free")
        out = []
        for _ in range(count):
            if self._free:
                block = self._free.popleft()
            else:  # reuse the least recently released cached block
                block, _ = self._unused.popitem(last=False)
                del self._cached[self._key_of.pop(block)]
            self._refs[block] = 1
            out.append(block)
        return out

    def free(self, blocks: list[int]) -> None:
        for block in blocks:
            self._refs[block] -= 1
            if self._refs[block] == 0:
                if block in self._key_of:
                    self._unused[block] = None
                else:
                    self._free.append(block)

    def match(self, tokens: list[int], limit: int) -> tuple[list[int], list[BlockKey]]:
        """The cached blocks holding the longest cached prefix of ``tokens`` (at most
        ``limit`` tokens), now shared with the caller, and their keys."""
        if not self.prefix_caching:
            return [], []
        size = self.block_size
        blocks: list[int] = []
        keys: list[BlockKey] = []
        for start in range(0, limit - size + 1, size):
            key = block_key(keys[-1] if keys else None, tokens[start:start + size])
            block = self._cached.get(key)
            if block is None:
                break
            if self._refs[block] == 0:
                del self._unused[block]
            self._refs[block] += 1
            blocks.append(block)
            keys.append(key)
        self.query_tokens += limit
        self.hit_tokens += len(blocks) * size
        return blocks, keys

    def register(self, block: int, key: BlockKey) -> None:
        """Cache a full, computed block under ``key`` (unless that content is cached)."""
        if self.prefix_caching and key not in self._cached and block not in self._key_of:
            self._cached[key] = block
            self._key_of[block] = key


class BlockTable:
    """The block table of every running sequence as one int32 array, a row each, kept up
    to date by appending the blocks a sequence gained since the last step (never rebuilt
    per step). Unused places hold ``scratch``, a block no sequence owns, so a padded row
    of a fixed-size batch reads and writes only that block.

        table = BlockTable(rows=16, width=64, scratch=num_blocks)
        row = table.sync(seq_id, seq.blocks)  # its row, with any new blocks written
        table.release(seq_id)                 # it finished or was preempted
    """

    def __init__(self, rows: int, width: int, scratch: int) -> None:
        self.scratch = scratch
        self.width = width
        self.table = np.full((rows, width), scratch, dtype=np.int32)
        self._row: dict[int, int] = {}
        self._filled: dict[int, int] = {}  # row -> blocks written
        self._free_rows = list(range(rows - 1, -1, -1))

    def sync(self, owner: int, blocks: list[int]) -> int:
        """The row of ``owner`` (a sequence id), its new blocks written."""
        row = self._row.get(owner)
        if row is None:
            row = self._row[owner] = self._free_rows.pop()
            self._filled[row] = 0
        have = self._filled[row]
        if len(blocks) > self.width:
            raise InvalidValue(f"a sequence holds {len(blocks)} blocks; the table has "
                               f"{self.width} places")
        if len(blocks) > have:
            self.table[row, have:len(blocks)] = blocks[have:]
            self._filled[row] = len(blocks)
        return row

    def release(self, owner: int) -> None:
        """The sequence holds no blocks now: its row goes back, cleared."""
        row = self._row.pop(owner, None)
        if row is not None:
            self.table[row, :self._filled.pop(row)] = self.scratch
            self._free_rows.append(row)

    def blocks_of(self, owner: int) -> int:
        """How many blocks the owner's row holds (0 without a row)."""
        row = self._row.get(owner)
        return 0 if row is None else self._filled[row]
