"""Shared memory between the server and its executor processes: one named segment per
direction, of a fixed size, carved into blocks by its one writer.

    arena = SharedArena.create(tag="in", size=64 << 20)   # the owner: mode 0600
    offset = arena.put(array)            # None when full: answer 503, never grow
    peer = SharedArena.attach(arena.name)
    view = peer.view(offset, array.dtype, array.shape)    # no copy
    arena.free(offset)

Blocks are allocated first fit over a free list and coalesced when freed. An arena is
used from one thread on each side (the event loop's), so it takes no lock.

A segment's name carries the user id and the server's pid
(``tradeoff-<uid>-<pid>-<n>-<tag>``): :func:`remove_stale_segments`, run when a server
starts, unlinks those of servers no longer alive (one killed with SIGKILL never
unlinked its own).
"""

from __future__ import annotations

import bisect
import itertools
import os
import shutil
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

from tradeoff.errors import InvalidValue

__all__ = ["ALIGNMENT", "SharedArena", "check_room", "remove_stale_segments"]

ALIGNMENT = 64  # bytes: every block starts on a cache line
SHM_FOLDER = Path("/dev/shm")
_PREFIX = "tradeoff-"
_numbers = itertools.count()


def _aligned(size: int) -> int:
    return max(ALIGNMENT, -(-size // ALIGNMENT) * ALIGNMENT)


class SharedArena:
    """A shared memory segment and, on its writer's side, the blocks in use."""

    def __init__(self, segment: shared_memory.SharedMemory, owner: bool) -> None:
        self._segment = segment
        self.owner = owner
        self.name = segment.name
        self.size = segment.size
        self.buf = segment.buf
        self._starts = [0]  # free blocks, sorted by start, with their sizes
        self._sizes = [self.size]
        self._used: dict[int, int] = {}  # block start -> size
        self.used_bytes = 0

    @classmethod
    def create(cls, tag: str, size: int) -> SharedArena:
        """A new segment of ``size`` bytes that only this user can open (0600)."""
        name = f"{_PREFIX}{os.getuid()}-{os.getpid()}-{next(_numbers)}-{tag}"
        return cls(shared_memory.SharedMemory(name, create=True, size=_aligned(size)), True)

    @classmethod
    def attach(cls, name: str) -> SharedArena:
        """A segment another process created; its creator unlinks it. Attaching
        registers it with the resource tracker again, a no-op for a process the creator
        spawned: spawned children share their parent's tracker, which holds one entry
        per name (unregistering here would drop the creator's)."""
        return cls(shared_memory.SharedMemory(name), False)

    def allocate(self, size: int) -> int | None:
        """The start of a free block of at least ``size`` bytes; None if none is left."""
        need = _aligned(size)
        for i, free in enumerate(self._sizes):
            if free >= need:
                start = self._starts[i]
                if free == need:
                    del self._starts[i], self._sizes[i]
                else:
                    self._starts[i] += need
                    self._sizes[i] -= need
                self._used[start] = need
                self.used_bytes += need
                return start
        return None

    def free(self, start: int) -> None:
        """Give a block back (merged with the free blocks beside it)."""
        size = self._used.pop(start)
        self.used_bytes -= size
        i = bisect.bisect_left(self._starts, start)
        if i < len(self._starts) and start + size == self._starts[i]:  # the next is free
            size += self._sizes[i]
            del self._starts[i], self._sizes[i]
        if i and self._starts[i - 1] + self._sizes[i - 1] == start:  # the previous too
            self._sizes[i - 1] += size
        else:
            self._starts.insert(i, start)
            self._sizes.insert(i, size)

    def free_all(self) -> None:
        """Every block free again (the process on the other side is gone)."""
        self._starts, self._sizes, self._used = [0], [self.size], {}
        self.used_bytes = 0

    def put(self, array: np.ndarray) -> int | None:
        """Copy ``array`` into a new block: its start, or None when the arena is full."""
        start = self.allocate(array.nbytes)
        if start is not None:
            self.view(start, array.dtype, array.shape)[...] = array
        return start

    def view(self, start: int, dtype: np.dtype | str, shape: tuple[int, ...]) -> np.ndarray:
        """The array stored at ``start`` (a view of the segment: no copy)."""
        return np.ndarray(shape, dtype=dtype, buffer=self.buf, offset=start)

    def close(self) -> None:
        """Detach; the owner also unlinks the segment."""
        self.buf = None
        try:
            self._segment.close()
        except BufferError:  # a view still held somewhere: the mapping goes with it
            pass
        if self.owner:
            try:
                self._segment.unlink()
            except FileNotFoundError:
                pass


def check_room(size: int, count: int = 2, folder: Path = SHM_FOLDER) -> None:
    """InvalidValue unless ``count`` arenas of ``size`` bytes fit the shared memory
    filesystem (each front end takes two: one each way)."""
    total = shutil.disk_usage(folder).total if folder.is_dir() else 0
    if count * _aligned(size) > total:
        raise InvalidValue(f"the executor processes take {count} shared memory arenas of "
                           f"{size >> 20} MiB (two per front end), and {folder} holds "
                           f"{total >> 20} MiB in all: give a smaller --executor-memory-mb")


def remove_stale_segments(folder: Path = SHM_FOLDER) -> list[str]:
    """Unlink this user's segments whose server is no longer running; their names."""
    removed = []
    mine = f"{_PREFIX}{os.getuid()}-"
    for path in folder.glob(f"{mine}*"):
        pid = path.name[len(mine):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        try:
            path.unlink()
            removed.append(path.name)
        except FileNotFoundError:
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
