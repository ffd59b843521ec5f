"""How the suite is marked and shared out over pytest-xdist's workers.

* Every test under ``integration/`` and ``compat/`` starts real servers on 127.0.0.1, so
  each is marked ``integration`` here rather than file by file (``make test-fast`` runs
  ``tests/unit`` alone, without its ``slow`` tests).
* ``make test`` runs the suite on several workers (``-n``): a file's tests stay together
  on one worker (they share module fixtures: a server, a repository), except in SPREAD
  files, whose tests share nothing and are long, so they go test by test to whichever
  worker is free; the files of one of GROUPS never run beside each other. Files holding a
  ``slow`` test are handed out first, so no long test starts last.
* ``timing`` tests assert bounds that move with the machine's load: ``make test`` runs them
  alone, after the parallel run.
* ``gpu`` tests need a CUDA device and are skipped without one.
* Modules marked ``both_modes`` run each test that asks for ``server_mode`` twice:
  against a server in one process and one split into front-end and executor processes
  (``serve --workers 2``); a file's split tests are a work unit of their own.
* Tests that share their node id with another (schemathesis' tests, one per API
  operation, under pytest 9) are marked ``serial``: pytest-xdist hands out tests by node
  id and would run one of them; ``make test`` runs them after the parallel run.
"""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import pytest

SERVER_FOLDERS = ("integration", "compat")
SPREAD = {"test_plan.py", "test_docs_examples.py", "test_plan_pools.py"}
# two local Ray clusters at once would share 127.0.0.2's ports and Ray's session folder
GROUPS = {"test_ray.py": "ray", "test_ray_autoscale.py": "ray"}
SPLIT = re.compile(r"\[(.+-)?split(-.+)?\]$")


def work_unit(nodeid: str) -> str:
    """What one worker runs together: the test's file, its group, or (SPREAD) the test;
    a file's tests against a split server (``server_mode``) apart from the others."""
    path = nodeid.split("::", 1)[0]
    name = path.rsplit("/", 1)[-1]
    if name in SPREAD:
        return nodeid
    unit = GROUPS.get(name, path)
    return f"{unit}[split]" if SPLIT.search(nodeid) else unit


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Hand out work units in collection order (pytest-xdist's ``loadgroup`` names its
    groups by rewriting node ids, which pytest 9 no longer allows)."""
    from xdist.scheduler import LoadScopeScheduling

    class ByWorkUnit(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return work_unit(nodeid)

    config.option.loadscopereorder = False  # keep the slow-first order given below
    return ByWorkUnit(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    slow_files = set()
    ids = Counter(item.nodeid for item in items)
    for item in items:
        if ids[item.nodeid] > 1:
            item.add_marker(pytest.mark.serial)
        if item.path.parent.name in SERVER_FOLDERS:
            item.add_marker(pytest.mark.integration)
        if item.get_closest_marker("slow"):
            slow_files.add(item.path)
        if item.get_closest_marker("gpu") and not _cuda():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
    items.sort(key=lambda item: item.path not in slow_files)  # stable: order kept within


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that asks for ``server_mode`` runs its server in one process, or, in a
    module marked ``both_modes``, once in each of ``SERVER_MODES`` (the same test against
    a server split into front-end and executor processes)."""
    if "server_mode" in metafunc.fixturenames:
        from tests.integration.helpers import SERVER_MODES

        both = metafunc.definition.get_closest_marker("both_modes") is not None
        # session-wide: a server shared by several modules is started once per mode
        metafunc.parametrize("server_mode", list(SERVER_MODES) if both else ["in-process"],
                             scope="session")


def _cuda() -> bool:
    """Whether torch sees a CUDA device (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())
