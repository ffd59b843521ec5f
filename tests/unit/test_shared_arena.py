"""The shared memory that tensors cross to an executor process: blocks carved first fit
and merged when freed, never grown, readable from another mapping, private to the user,
and the segments of dead servers removed."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tradeoff.server.shared_arena import ALIGNMENT, SharedArena, remove_stale_segments


def test_blocks_are_aligned_reused_and_merged_and_a_full_arena_says_so() -> None:
    arena = SharedArena.create("unit", 4 * ALIGNMENT)
    try:
        a, b, c = (arena.allocate(10) for _ in range(3))
        assert (a, b, c) == (0, ALIGNMENT, 2 * ALIGNMENT)
        assert arena.allocate(2 * ALIGNMENT) is None  # one block left: full, not grown
        arena.free(b)
        assert arena.allocate(ALIGNMENT + 1) is None  # the free space is in two pieces
        arena.free(a)  # merged with b's block: two blocks' room at the start
        assert arena.allocate(2 * ALIGNMENT) == 0
        arena.free(0)
        arena.free(c)
        assert arena.used_bytes == 0
        assert arena.allocate(4 * ALIGNMENT) == 0  # all merged back into one
    finally:
        arena.close()


def test_an_array_put_in_is_read_from_another_mapping_without_a_copy() -> None:
    arena = SharedArena.create("unit", 1 << 16)
    peer = SharedArena.attach(arena.name)
    try:
        data = np.arange(24, dtype=np.float32).reshape(4, 6)
        start = arena.put(data)
        assert start is not None
        view = peer.view(start, data.dtype, data.shape)
        np.testing.assert_array_equal(view, data)
        view[0, 0] = 99.0  # one memory: the owner sees the change
        assert arena.view(start, data.dtype, data.shape)[0, 0] == 99.0
        del view
        assert arena.put(np.zeros(1 << 15, np.float32)) is None  # 128 KiB: never fits
    finally:
        peer.close()
        arena.close()
    assert not (Path("/dev/shm") / arena.name).exists()


def test_segments_are_the_users_alone() -> None:
    arena = SharedArena.create("unit", 4096)
    try:
        mode = stat.S_IMODE((Path("/dev/shm") / arena.name).stat().st_mode)
        assert mode == 0o600
        assert arena.name.startswith(f"tradeoff-{os.getuid()}-{os.getpid()}-")
    finally:
        arena.close()


def test_segments_of_a_dead_server_are_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    dead = int(gone.stdout)
    uid = os.getuid()
    for name in (f"tradeoff-{uid}-{dead}-0-in", f"tradeoff-{uid}-{os.getpid()}-0-in",
                 f"tradeoff-{uid + 1}-{dead}-0-in", "other-file"):
        (tmp_path / name).write_bytes(b"")
    assert remove_stale_segments(tmp_path) == [f"tradeoff-{uid}-{dead}-0-in"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
        f"tradeoff-{uid}-{os.getpid()}-0-in", f"tradeoff-{uid + 1}-{dead}-0-in", "other-file"])


def test_a_request_whose_tensors_do_not_all_fit_holds_nothing() -> None:
    from tradeoff.server.executor_messages import read_tensor, write_tensors

    arena = SharedArena.create("unit", 4096)
    try:
        small, big = np.ones(16, np.float32), np.ones(2048, np.float32)  # 64 B, 8 KiB
        words = np.array([b"a", "b"], dtype=object)  # BYTES go inline, not in the arena
        assert write_tensors(arena, {"a": small, "w": words, "b": big}) is None
        assert arena.used_bytes == 0  # the first one's block was given back
        refs = write_tensors(arena, {"a": small, "w": words})
        assert refs is not None and arena.used_bytes == 64
        np.testing.assert_array_equal(read_tensor(arena, refs[0], copy=True), small)
        assert read_tensor(arena, refs[1], copy=True).tolist() == [b"a", "b"]
    finally:
        arena.close()


def test_arenas_larger_than_the_shared_memory_are_refused_before_the_server_starts(
        tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tradeoff.cli import main
    from tradeoff.errors import InvalidValue
    from tradeoff.server.shared_arena import check_room

    check_room(64 << 20)  # the default fits
    with pytest.raises(InvalidValue, match="give a smaller --executor-memory-mb"):
        check_room(1 << 60)
    run = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path),
                                    "--executors", "process",
                                    "--executor-memory-mb", str(1 << 40)])
    assert run.exit_code == 2 and "give a smaller --executor-memory-mb" in run.output


def test_workers_take_two_arenas_each_and_do_not_go_with_ray(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from tradeoff.cli import main

    total = shutil.disk_usage("/dev/shm").total >> 20
    each = total // 6 + 1  # two front ends' four arenas fit, eight do not
    run = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path),
                                    "--workers", "4", "--executor-memory-mb", str(each)])
    assert run.exit_code == 2 and "8 shared memory arenas" in run.output, run.output
    run = CliRunner().invoke(main, ["serve", "--model-repository", str(tmp_path),
                                    "--workers", "2", "--ray", "local"])
    assert run.exit_code == 2 and "give one or the other" in run.output, run.output
