"""Access rules: which key opens which call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tradeoff.errors import Forbidden, NotFound, Unauthorized
from tradeoff.server.access import Access, read_keys

API, ADMIN = "api-key-123456", "admin-key-123456"


def test_no_keys_means_open() -> None:
    access = Access()
    assert not access.enabled
    access.check(None, admin=False)
    access.check(None, admin=True)


def test_inference_keys_guard_inference_and_lock_the_repository() -> None:
    access = Access([API])
    access.check(f"Bearer {API}", admin=False)
    access.check(f"bearer   {API}  ", admin=False)
    for bad in (None, "", f"Basic {API}", "Bearer", "Bearer wrong-key-000", API):
        with pytest.raises(Unauthorized):
            access.check(bad, admin=False)
    with pytest.raises(Forbidden):
        access.check(f"Bearer {API}", admin=True)  # no admin key: nobody may load
    with pytest.raises(Unauthorized):
        access.check(None, admin=True)


def test_admin_keys_alone_guard_only_the_repository() -> None:
    access = Access(admin_keys=[ADMIN])
    access.check(None, admin=False)
    access.check(f"Bearer {ADMIN}", admin=True)
    with pytest.raises(Unauthorized):
        access.check(None, admin=True)


def test_the_admin_key_opens_everything_and_inference_keys_are_refused_on_admin_calls() -> None:
    access = Access([API], [ADMIN])
    access.check(f"Bearer {ADMIN}", admin=False)
    access.check(f"Bearer {ADMIN}", admin=True)
    with pytest.raises(Forbidden, match="admin key"):
        access.check(f"Bearer {API}", admin=True)
    with pytest.raises(Unauthorized) as refused:
        access.check("Bearer not-a-key-999", admin=True)
    assert "not-a-key-999" not in str(refused.value)


def test_keys_from_flags_files_and_the_environment(tmp_path: Path) -> None:
    path = tmp_path / "keys"
    path.write_text("# comment\nfile-key-00001\n\n  file-key-00002  \n")
    assert read_keys(["flag-key-0001"], [path], "env-key-0001, env-key-0002") == [
        "flag-key-0001", "file-key-00001", "file-key-00002", "env-key-0001", "env-key-0002"]
    with pytest.raises(ValueError, match="at least 8"):
        read_keys(["short"], [], None)
    with pytest.raises(ValueError, match="cannot read key file"):
        read_keys([], [tmp_path / "missing"], None)


def test_only_exact_health_routes_are_open() -> None:
    from tradeoff.server.routes import ADMIN, INFERENCE, OPEN, Router

    router = Router()
    for method, path in (("GET", "/v2/health/live"), ("GET", "/v2/health/ready"),
                         ("GET", "/v2/models/m/ready"), ("GET", "/v2/models/m/versions/1/ready")):
        assert router.match(method, path)[0].access == OPEN, path
    for method, path in (("GET", "/v2"), ("GET", "/v2/models/m/versions/1"),
                         ("POST", "/v2/models/m/infer"), ("GET", "/v2/models/ready"),
                         ("GET", "/v2/models/stats"), ("POST", "/v2/repository/index"),
                         ("GET", "/v1/models"), ("POST", "/v1/completions"),
                         ("POST", "/v1/chat/completions")):
        assert router.match(method, path)[0].access == INFERENCE, path
    # /v2/models/m/versions/ready is the metadata of a version named "ready": not open
    assert router.match("GET", "/v2/models/m/versions/ready")[0].access == INFERENCE
    for path in ("/v2/health", "/v2/health/other", "/v2/x/y/ready",
                 "/v2/models/m/config/ready", "/v2/repository/models/ready"):
        with pytest.raises(NotFound):
            router.match("GET", path)
    assert router.match("POST", "/v2/repository/models/m/load")[0].access == ADMIN
    assert router.match("POST", "/v2/repository/models/m/unload")[0].access == ADMIN


def test_a_call_says_which_key_made_it() -> None:
    access = Access([API, "another-key-0123"], [ADMIN])
    mine = access.check(f"Bearer {API}", admin=False)
    assert len(mine) == 32 and mine == access.check(f"bearer  {API} ", admin=False)
    assert access.check("Bearer another-key-0123", admin=False) not in (mine, b"")
    assert access.check(f"Bearer {ADMIN}", admin=True) not in (mine, b"")
    assert Access().check(None, admin=False) == b""  # open: nobody in particular
