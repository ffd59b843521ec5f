"""Official clients against `tradeoff serve`: tritonclient (HTTP and gRPC, sync and
asyncio) and perf_analyzer, on the integration tests' hand-written model repository."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.helpers import References, running_server
from tests.integration.model_repo import build_test_repository
from tradeoff.server.process import ServerProcess

PERF_ANALYZER = Path(__file__).resolve().parents[2] / ".tools" / "bin" / "perf_analyzer"


@pytest.fixture(scope="session")
def compat_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("compat-models"))


@pytest.fixture(scope="session")
def compat_server(compat_repository: Path, server_mode: str) -> Iterator[ServerProcess]:
    yield from running_server(compat_repository, mode=server_mode)


@pytest.fixture(scope="session")
def compat_references(compat_repository: Path) -> References:
    return References(compat_repository)


@pytest.fixture(scope="session")
def perf_analyzer() -> Path:
    if not PERF_ANALYZER.exists() or not shutil.which("taskset"):
        pytest.skip("perf_analyzer is not installed: run scripts/get_perf_analyzer.sh "
                    "(make test does)")
    return PERF_ANALYZER
