"""What a gateway sent where: prompt prefixes, as chained hashes of fixed-size blocks of
their text, each mapped to the replicas it went to. A replica that was sent a prefix is
likely to hold it in its prefix cache; the longest match is where a prompt is cheapest.

    index = PrefixIndex(block_bytes=64, capacity=1 << 18)
    blocks = index.blocks(prompt_bytes)
    matched = index.matches(blocks)        # replica -> leading blocks it was sent
    index.record(blocks, replica=2)

Only whole blocks count (a 100-byte prompt is one block). The index holds at most
``capacity`` blocks; the least recently used go first, as a replica's cache evicts.
"""

from __future__ import annotations

from collections import OrderedDict

__all__ = ["PrefixIndex"]


class PrefixIndex:
    """Chained block hashes of the prompts sent, each with the replicas that got it."""

    def __init__(self, block_bytes: int = 64, capacity: int = 1 << 18) -> None:
        self.block_bytes = block_bytes
        self.capacity = capacity
        self._owners: OrderedDict[int, set[int]] = OrderedDict()
        self._held: dict[int, int] = {}  # replica -> blocks it holds here

    def blocks(self, text: bytes) -> list[int]:
        """The chained hash of each whole block of ``text``: a block's hash says the
        same for everything before it."""
        size = self.block_bytes
        hashes = []
        chained = 0
        for start in range(0, len(text) - size + 1, size):
            chained = hash((chained, text[start:start + size]))
            hashes.append(chained)
        return hashes

    def matches(self, blocks: list[int]) -> dict[int, int]:
        """For each replica that was sent the first block: how many leading blocks of
        ``blocks`` it was sent."""
        matched: dict[int, int] = {}
        alive: set[int] | None = None
        for count, block in enumerate(blocks, 1):
            owners = self._owners.get(block)
            if not owners:
                break
            alive = set(owners) if alive is None else alive & owners
            if not alive:
                break
            for replica in alive:
                matched[replica] = count
        return matched

    def record(self, blocks: list[int], replica: int) -> None:
        """``replica`` was sent these blocks."""
        owners = self._owners
        counts = self._held
        for block in blocks:
            held = owners.get(block)
            if held is None:
                owners[block] = {replica}
            elif replica not in held:
                held.add(replica)
            else:
                owners.move_to_end(block)
                continue
            counts[replica] = counts.get(replica, 0) + 1
            owners.move_to_end(block)
        while len(owners) > self.capacity:
            _, gone = owners.popitem(last=False)
            for owner in gone:
                counts[owner] -= 1

    def held(self, replica: int) -> int:
        """How many blocks ``replica`` is known to hold."""
        return self._held.get(replica, 0)

    def renumbered(self, numbers: dict[int, int]) -> PrefixIndex:
        """A copy whose replicas are renumbered by ``numbers`` (old -> new), those not
        in it left out: the same pool after a reload added or removed replicas."""
        index = PrefixIndex(self.block_bytes, self.capacity)
        for block, held in self._owners.items():
            kept = {numbers[r] for r in held if r in numbers}
            if kept:
                index._owners[block] = kept
                for replica in kept:
                    index._held[replica] = index._held.get(replica, 0) + 1
        return index

    def forget(self, replica: int) -> None:
        """``replica`` lost what it held (it restarted, or left the pool)."""
        for block in [b for b, held in self._owners.items() if replica in held]:
            held = self._owners[block]
            held.discard(replica)
            if not held:
                del self._owners[block]
        self._held.pop(replica, None)
