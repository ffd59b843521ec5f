"""One real ``tradeoff serve`` for the whole session, on free 127.0.0.1 ports.

The repository is written to a temporary directory at session start (see
``model_repo.py``); tests talk to the server with the official ``tritonclient.http`` or,
where they need status codes and headers, with ``http.client``.

A test that asks for ``server_mode`` gets how its server runs (``tests/conftest.py``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.http as triton

from tradeoff.server.process import ServerProcess

from .helpers import References, running_server
from .model_repo import build_test_repository


@pytest.fixture(scope="session")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_test_repository(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def server(repository: Path, server_mode: str) -> Iterator[ServerProcess]:
    yield from running_server(repository, mode=server_mode)


@pytest.fixture(scope="session")
def client(server: ServerProcess) -> Iterator[triton.InferenceServerClient]:
    connection = triton.InferenceServerClient(server.url.removeprefix("http://"),
                                              network_timeout=60.0)
    try:
        yield connection
    finally:
        connection.close()


@pytest.fixture(scope="session")
def references(repository: Path) -> References:
    """ONNX Runtime in this process, on the same model files the server loads."""
    return References(repository)
