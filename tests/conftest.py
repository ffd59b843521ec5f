"""How the suite is marked and shared out over pytest-xdist's workers.

* Every test under ``integration/`` and ``compat/`` starts real servers on 127.0.0.1, so
  each is marked ``integration`` here rather than file by file (``make test-fast`` leaves
  them out, with the unit tests marked ``slow``).
* ``make test`` runs the suite on several workers with ``--dist loadgroup``: a file's tests
  stay together on one worker (they share module fixtures: a server, a repository), except
  in SPREAD files, whose tests share nothing and are long, so they go test by test to
  whichever worker is free; files in one of GROUPS never run beside each other. Files
  holding a ``slow`` test are handed out first, so no long test starts last.
* ``timing`` tests assert bounds that move with the machine's load: ``make test`` runs them
  alone, after the parallel run.
* ``gpu`` tests need a CUDA device and are skipped without one.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent
SERVER_FOLDERS = tuple(HERE / name for name in ("integration", "compat"))
SPREAD = {"test_plan.py", "test_docs_examples.py", "test_plan_pools.py"}
# two local Ray clusters at once would share 127.0.0.2's ports and Ray's session folder
GROUPS = {"test_ray.py": "ray", "test_ray_autoscale.py": "ray"}


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = set()
    for item in items:
        if any(folder in item.path.parents for folder in SERVER_FOLDERS):
            item.add_marker(pytest.mark.integration)
        if item.path.name not in SPREAD:
            group = GROUPS.get(item.path.name, str(item.path.relative_to(HERE)))
            item.add_marker(pytest.mark.xdist_group(group))
        if item.get_closest_marker("slow"):
            slow_files.add(item.path)
        if item.get_closest_marker("gpu") and not _cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within


def _cuda() -> bool:
    """Whether torch sees a CUDA device (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
