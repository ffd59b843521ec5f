"""The Host and Origin checks of the HTTP port (server/origins.py)."""

from __future__ import annotations

import pytest

from tradeoff.errors import Forbidden
from tradeoff.server.origins import OriginPolicy, is_loopback


def headers(host: str | None = None, origin: str | None = None) -> list[tuple[bytes, bytes]]:
    pairs = [(b"content-type", b"text/plain")]
    if host is not None:
        pairs.append((b"host", host.encode()))
    if origin is not None:
        pairs.append((b"origin", origin.encode()))
    return pairs


@pytest.mark.parametrize("host", ["localhost", "127.0.0.1", "127.0.0.2", "::1",
                                  "app.localhost"])
def test_loopback_names(host: str) -> None:
    assert is_loopback(host)


@pytest.mark.parametrize("host", ["example.com", "10.0.0.1", "0.0.0.0", "localhost.evil.com",
                                  "127.0.0.1.nip.io"])
def test_names_that_are_not_loopback(host: str) -> None:
    assert not is_loopback(host)


@pytest.mark.parametrize("host", ["127.0.0.1:8000", "localhost:8000", "[::1]:8000",
                                  "localhost", "127.0.0.3:1"])
def test_a_loopback_server_serves_loopback_hosts(host: str) -> None:
    OriginPolicy.for_bind("127.0.0.1").check("GET", headers(host))


@pytest.mark.parametrize("host", ["evil.example.com", "evil.example.com:8000",
                                  "127.0.0.1.nip.io:8000", "localhost.:8000"])
def test_a_loopback_server_refuses_other_host_names(host: str) -> None:
    with pytest.raises(Forbidden, match="--allowed-host"):
        OriginPolicy.for_bind("127.0.0.1").check("GET", headers(host))


def test_allowed_hosts_add_to_loopback_and_star_allows_any() -> None:
    policy = OriginPolicy.for_bind("::1", hosts=("models.internal",))
    policy.check("GET", headers("models.internal:8000"))
    policy.check("GET", headers("localhost:8000"))
    with pytest.raises(Forbidden):
        policy.check("GET", headers("other.internal"))
    OriginPolicy.for_bind("127.0.0.1", hosts=("*",)).check("GET", headers("anything"))


@pytest.mark.parametrize("host", ["192.168.1.5:8000", "10.0.0.7", "[2001:db8::1]:8000"])
def test_addresses_are_served_rebinding_needs_a_name(host: str) -> None:
    OriginPolicy.for_bind("127.0.0.1").check("GET", headers(host))


def test_a_server_bound_elsewhere_serves_any_host_unless_told() -> None:
    OriginPolicy.for_bind("0.0.0.0").check("GET", headers("gpu-box-7:8000"))
    limited = OriginPolicy.for_bind("0.0.0.0", hosts=("infer.example.com",))
    limited.check("GET", headers("infer.example.com"))
    for probe in ("localhost:8000", "127.0.0.1:8000", "10.1.2.3:8000"):  # health checks
        limited.check("GET", headers(probe))
    with pytest.raises(Forbidden):
        limited.check("GET", headers("gpu-box-7:8000"))


def test_a_request_without_host_or_origin_passes() -> None:
    OriginPolicy.for_bind("127.0.0.1").check("POST", headers())


@pytest.mark.parametrize("origin", ["https://evil.example.com", "null",
                                    "http://localhost:3000", "http://127.0.0.1:9999"])
def test_cross_site_writes_are_refused(origin: str) -> None:
    policy = OriginPolicy.for_bind("127.0.0.1")
    with pytest.raises(Forbidden, match="--allowed-origin"):
        policy.check("POST", headers("127.0.0.1:8000", origin))
    policy.check("GET", headers("127.0.0.1:8000", origin))  # reads are not writes


def test_same_origin_and_allowed_origins_may_write() -> None:
    policy = OriginPolicy.for_bind("127.0.0.1", origins=("https://Dash.Example.com/",))
    policy.check("POST", headers("127.0.0.1:8000", "http://127.0.0.1:8000"))
    policy.check("DELETE", headers("127.0.0.1:8000", "https://dash.example.com"))
    OriginPolicy.for_bind("127.0.0.1", origins=("*",)).check(
        "POST", headers("127.0.0.1:8000", "https://anyone.example"))
