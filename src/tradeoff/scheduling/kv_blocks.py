"""The KV cache's block accounting: fixed-size blocks, a free list, and each sequence's
block table. Pure bookkeeping; the tensors live with the decoder.

    blocks = BlockAllocator(num_blocks=256, block_size=16)
    table = blocks.allocate(blocks.needed(prompt_len))
    blocks.free(table)
"""

from __future__ import annotations

from collections import deque


class BlockAllocator:
    """Hands out KV cache blocks; ``usage`` is the fraction in use."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("the KV cache needs at least one block of at least one token")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        return 1 - len(self._free) / self.num_blocks

    def needed(self, tokens: int) -> int:
        """Blocks that hold ``tokens`` tokens."""
        return -(-tokens // self.block_size)

    def can_allocate(self, count: int) -> bool:
        return count <= len(self._free)

    def allocate(self, count: int) -> list[int]:
        if count > len(self._free):
            raise MemoryError(f"{count} KV blocks asked, {len(self._free)} free")
        return [self._free.popleft() for _ in range(count)]

    def free(self, blocks: list[int]) -> None:
        self._free.extend(blocks)
