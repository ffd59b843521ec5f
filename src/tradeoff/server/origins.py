"""Requests a browser makes on a web page's behalf: DNS rebinding and cross-site writes.

A page on any web site can make its visitor's browser POST to ``http://127.0.0.1:8000``
(a ``text/plain`` form needs no CORS preflight), and a host name the page's site
controls can be re-pointed to 127.0.0.1 so the browser treats the server as that site
(DNS rebinding). Without API keys either would load and unload models. Two checks, both
before any route runs:

- **Host**: on a server bound to a loopback address, a request whose ``Host`` is a
  name other than ``localhost`` (or one given with ``--allowed-host``) is refused with
  403; an IP address is always served (rebinding needs a name). A server bound to
  another address accepts any Host unless ``--allowed-host`` names them (addresses and
  ``localhost`` stay served, for health checks and probes).
- **Origin**: a request that may change state (any method but GET, HEAD and OPTIONS)
  carrying an ``Origin`` header is refused with 403 unless that origin is this server
  itself (its authority equals the ``Host`` header) or one given with
  ``--allowed-origin``. Clients that are not browsers send no Origin and are not
  affected.

    policy = OriginPolicy.for_bind("127.0.0.1", hosts=(), origins=())
    policy.check("POST", scope["headers"])   # raises Forbidden
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from tradeoff.errors import Forbidden

__all__ = ["ANY", "OriginPolicy", "is_address", "is_loopback"]

ANY = "*"
_READS = frozenset(("GET", "HEAD", "OPTIONS"))


def _hostname(authority: str) -> str:
    """The host of ``host[:port]`` or ``[v6]:port``, lower case, without the port."""
    authority = authority.strip().lower()
    if authority.startswith("["):
        return authority[1:].partition("]")[0]
    return authority.rpartition(":")[0] if authority.count(":") == 1 else authority


def is_address(host: str) -> bool:
    """Whether ``host`` (no port) is an IP address rather than a name: DNS rebinding needs
    a name, so a Host that is an address is served whatever it is."""
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or address, no port) is this machine's loopback."""
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class OriginPolicy:
    """Which ``Host`` and ``Origin`` headers the HTTP port accepts."""

    hosts: frozenset[str] | None  # names served besides addresses and localhost; None: any
    origins: frozenset[str]  # "scheme://host[:port]", lower case; "*": any
    _seen: dict[bytes, bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_bind(cls, bind_host: str, hosts: Sequence[str] = (),
                 origins: Sequence[str] = ()) -> OriginPolicy:
        """The policy of a server bound to ``bind_host`` with the allow-lists of
        ``--allowed-host`` and ``--allowed-origin``."""
        names = frozenset(_hostname(h) if h != ANY else ANY for h in hosts)
        if ANY in names or (not names and not is_loopback(_hostname(bind_host))):
            allowed = None
        else:
            allowed = names
        return cls(allowed, frozenset(o.strip().rstrip("/").lower() for o in origins))

    def _host_allowed(self, host: bytes) -> bool:
        """The Host rule for one header value, remembered (clients send a handful)."""
        allowed = self._seen.get(host)
        if allowed is None:
            hostname = _hostname(host.decode("latin-1"))
            allowed = hostname in (self.hosts or ()) or is_loopback(hostname) or \
                is_address(hostname)
            if len(self._seen) >= 1024:  # many distinct Hosts: forget, stay bounded
                self._seen.clear()
            self._seen[host] = allowed
        return allowed

    def check(self, method: str, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Raise Forbidden (403) for a request from a foreign Host or cross-site Origin."""
        host = origin = None
        for name, value in headers:
            if name == b"host":
                host = value
            elif name == b"origin":
                origin = value
        self.check_values(method, host, origin)

    def check_values(self, method: str, host: bytes | None, origin: bytes | None) -> None:
        """:meth:`check` given the values of the ``Host`` and ``Origin`` headers."""
        if host is not None and self.hosts is not None and not self._host_allowed(host):
            raise Forbidden(f"Host {host.decode('latin-1')!r} is not served here: this server "
                            "answers addresses and localhost; allow other names with "
                            "--allowed-host")
        if origin is None or method in _READS or ANY in self.origins:
            return
        site = origin.decode("latin-1").strip().rstrip("/").lower()
        if site in self.origins:
            return
        if host is not None and \
                site.partition("://")[2] == host.decode("latin-1").strip().lower():
            return  # the server's own pages
        raise Forbidden(f"cross-site request from Origin {site!r} refused: a browser "
                        "page of another site may not change this server; allow it with "
                        "--allowed-origin")
