"""Who may call what: optional API keys, sent as ``Authorization: Bearer KEY``.

With inference keys set, inference and metadata need one (an admin key also works);
with admin keys set, repository load and unload need an admin key and refuse inference
keys with 403. Health checks stay open; ``/metrics`` (on its own port) is open unless
metrics keys are set, then it takes a metrics or an admin key. Keys are compared in
constant time, never logged, and a refusal says only what to send, never what was wrong
with the key sent.

    access = Access.from_sources(["k1"], [key_file], env=os.environ)
    tenant = access.check(authorization_header, admin=False)  # or Unauthorized / Forbidden
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tradeoff.errors import Forbidden, InvalidValue, Unauthorized

__all__ = ["ADMIN_KEY_ENV", "API_KEY_ENV", "METRICS_KEY_ENV", "TENANT", "Access", "read_keys"]

API_KEY_ENV = "TRADEOFF_API_KEY"
ADMIN_KEY_ENV = "TRADEOFF_ADMIN_KEY"
METRICS_KEY_ENV = "TRADEOFF_METRICS_KEY"
TENANT = "tradeoff.tenant"  # the ASGI scope's entry for who made the call (check's answer)


def read_keys(values: Iterable[str], files: Iterable[Path], env_value: str | None
              ) -> list[str]:
    """Keys given on the command line, one per line in files (``#`` comments), and
    comma-separated in an environment variable."""
    keys = [v.strip() for v in values]
    for path in files:
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidValue(f"cannot read key file {path}: {exc.strerror}") from None
        keys += [line.strip() for line in text.splitlines()
                 if line.strip() and not line.lstrip().startswith("#")]
    if env_value:
        keys += [v.strip() for v in env_value.split(",")]
    keys = [k for k in keys if k]
    if any(len(k) < 8 for k in keys):
        raise InvalidValue("API keys must be at least 8 characters long")
    return keys


def _digest(key: bytes) -> bytes:
    return hashlib.sha256(key).digest()


def _matches(presented: bytes, keys: Sequence[bytes]) -> bool:
    """Digests of equal length compared with every key: the time says neither which key
    matched nor how long the keys are."""
    digest = _digest(presented)
    found = False
    for key in keys:
        found |= hmac.compare_digest(digest, key)
    return found


def _bearer(authorization: bytes | None) -> bytes:
    """The key of an ``Authorization: Bearer KEY`` header value (b"" for anything else)."""
    if not authorization:
        return b""
    scheme, _, token = authorization.strip().partition(b" ")
    return token.strip() if scheme.lower() == b"bearer" else b""


class Access:
    """The server's keys and the check every protected call goes through."""

    def __init__(self, api_keys: Sequence[str] = (), admin_keys: Sequence[str] = (),
                 metrics_keys: Sequence[str] = ()) -> None:
        self.api_keys = [_digest(k.encode()) for k in api_keys]
        self.admin_keys = [_digest(k.encode()) for k in admin_keys]
        self.metrics_keys = [_digest(k.encode()) for k in metrics_keys]

    @classmethod
    def from_sources(cls, api_keys: Sequence[str], api_key_files: Sequence[Path],
                     admin_keys: Sequence[str], admin_key_files: Sequence[Path],
                     env: Mapping[str, str], metrics_keys: Sequence[str] = ()) -> Access:
        return cls(read_keys(api_keys, api_key_files, env.get(API_KEY_ENV)),
                   read_keys(admin_keys, admin_key_files, env.get(ADMIN_KEY_ENV)),
                   read_keys(metrics_keys, (), env.get(METRICS_KEY_ENV)))

    def check_metrics(self, headers: Iterable[tuple[bytes, bytes]]) -> None:
        """Allow a scrape of /metrics: open unless metrics keys are set, then a metrics
        key or an admin key (Prometheus sends it with ``authorization: {credentials}``)."""
        if not self.metrics_keys:
            return
        presented = _bearer(next((v for k, v in headers if k == b"authorization"), None))
        if presented and (_matches(presented, self.metrics_keys)
                          or _matches(presented, self.admin_keys)):
            return
        raise Unauthorized("missing or invalid metrics key: send 'Authorization: Bearer KEY'")

    @property
    def enabled(self) -> bool:
        return bool(self.api_keys or self.admin_keys)

    def describe(self) -> str:
        return (f"{len(self.api_keys)} inference key(s), {len(self.admin_keys)} admin key(s)"
                if self.enabled else "open (no API keys)")

    def check(self, authorization: bytes | str | None, admin: bool) -> bytes:
        """Allow the call, and say who made it: the digest of the key it presented (b""
        when the call is open); or raise Unauthorized (401) / Forbidden (403)."""
        if isinstance(authorization, str):
            authorization = authorization.encode()
        needs = self.admin_keys if admin else self.api_keys
        if not needs and not (admin and self.api_keys):
            return b""  # no keys of the kind this call needs: it is open
        presented = _bearer(authorization)
        if presented and _matches(presented, self.admin_keys):
            return _digest(presented)  # an admin key may do everything
        if not admin:
            if presented and _matches(presented, self.api_keys):
                return _digest(presented)
            raise Unauthorized("missing or invalid API key: send 'Authorization: Bearer KEY'")
        if presented and _matches(presented, self.api_keys):
            raise Forbidden("this key may not load or unload models; use an admin key")
        raise Unauthorized("missing or invalid admin key: send 'Authorization: Bearer KEY'")
