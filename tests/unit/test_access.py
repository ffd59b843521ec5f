"""Access rules: which key opens which call."""

from __future__ import annotations

from pathlib import Path

import pytest

from tradeoff.errors import Forbidden, InvalidValue, NotFound, Unauthorized
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


def test_a_generation_s_priority_is_held_to_what_its_key_allows() -> None:
    """By default a caller may only make itself less urgent (priority 0 or above); a
    key given KEY=N may ask down to N, an admin key anything; --priority-floor moves
    the default, and never takes from a key allowed more."""
    trusted = "trusted-key-0123="  # a key may end in '=': the last one splits
    access = Access([API], [ADMIN], priority_keys={trusted: -10})
    ordinary = access.check(f"Bearer {API}", admin=False)
    allowed = access.check(f"Bearer {trusted}", admin=False)  # an inference key too
    admin = access.check(f"Bearer {ADMIN}", admin=False)
    assert access.priority(ordinary, -(2**31)) == 0
    assert access.priority(ordinary, 3) == 3  # less urgent: as asked
    assert access.priority(allowed, -(2**31)) == -10 and access.priority(allowed, -4) == -4
    assert access.priority(admin, -(2**31)) == -(2**31)
    assert Access().priority(b"", -1) == 0  # open: the same floor for everyone
    assert Access(priority_floor=-(2**31)).priority(b"", -(2**31)) == -(2**31)
    lower = Access([API], priority_keys={trusted: -10}, priority_floor=-20)
    assert lower.priority(lower.check(f"Bearer {trusted}", admin=False), -50) == -20
    with pytest.raises(InvalidValue, match="priority floor"):
        Access(priority_floor=2**31)


def test_priority_keys_are_read_as_key_equals_n_without_showing_the_key(tmp_path: Path
                                                                         ) -> None:
    from tradeoff.server.access import read_priority_keys

    keys = tmp_path / "priority.txt"
    keys.write_text("# key=most urgent priority\nfile-key-0123456=-3\n\n")
    assert read_priority_keys(["cli-key-0123==-5", " spaced-key-0123 = 2 "], [keys]) == {
        "cli-key-0123=": -5, "spaced-key-0123": 2, "file-key-0123456": -3}
    for bad in ("secret-key-0123", "secret-key-0123=high", "secret-key-0123=2147483648",
                "=5", "secret-key-0123=1.5"):
        with pytest.raises(InvalidValue, match="KEY=N") as refused:
            read_priority_keys([bad], [])
        assert "secret" not in str(refused.value)
    keys.write_text("secret-key-0123 -3\n")
    with pytest.raises(InvalidValue, match="line 1"):
        read_priority_keys([], [keys])
    with pytest.raises(InvalidValue, match="at least 8"):
        read_priority_keys(["short=1"], [])
