"""Who may call what: optional API keys, sent as ``Authorization: Bearer KEY``.

With inference keys set, inference and metadata need one (an admin key also works);
with admin keys set, repository load and unload need an admin key and refuse inference
keys with 403. Health checks stay open; ``/metrics`` (on its own port) is open unless
metrics keys are set, then it takes a metrics or an admin key. Keys are compared in
constant time, never logged, and a refusal says only what to send, never what was wrong
with the key sent.

A generation's own ``priority`` (lower is served first) is honoured only as far as its
key allows: down to ``priority_floor`` (0: a request may only make itself less urgent)
for any caller, down to N for a key given as ``KEY=N`` (``--api-key-priority``), and
without bound for an admin key. A more urgent priority is served at the allowance.

    access = Access.from_sources(["k1"], [key_file], env=os.environ)
    tenant = access.check(authorization_header, admin=False)  # or Unauthorized / Forbidden
    priority = access.priority(tenant, asked)                 # held to the key's allowance
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from tradeoff.errors import Forbidden, InvalidValue, Unauthorized
from tradeoff.scheduling.priority import (
    GENERATION_PRIORITY_MAX,
    GENERATION_PRIORITY_MIN,
    GenerationPriority,
)

__all__ = ["ADMIN_KEY_ENV", "API_KEY_ENV", "METRICS_KEY_ENV", "TENANT",
           "Access", "read_keys", "read_priority_keys"]

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


def _priority_pair(item: str, where: str) -> tuple[str, int]:
    """``KEY=N`` as (key, N); the error names where it was, never the key."""
    key, sep, value = item.strip().rpartition("=")  # a key may end in '=' (base64)
    try:
        priority = int(value.strip()) if sep and key.strip() else None
    except ValueError:
        priority = None
    if priority is None or not GENERATION_PRIORITY_MIN <= priority <= GENERATION_PRIORITY_MAX:
        raise InvalidValue(f"{where}: expected KEY=N, N an integer from -2**31 to "
                           "2**31 - 1 (the most urgent priority the key may ask for)")
    return key.strip(), priority


def read_priority_keys(values: Iterable[str], files: Iterable[Path]) -> dict[str, int]:
    """Keys allowed a priority: ``KEY=N`` pairs given on the command line and one per
    line in files (``#`` comments); each key may ask for priorities down to N."""
    pairs = [_priority_pair(v, f"--api-key-priority #{i + 1}") for i, v in enumerate(values)]
    for path in files:
        try:
            text = path.read_text()
        except OSError as exc:
            raise InvalidValue(f"cannot read key file {path}: {exc.strerror}") from None
        pairs += [_priority_pair(line, f"{path} line {number}")
                  for number, line in enumerate(text.splitlines(), 1)
                  if line.strip() and not line.lstrip().startswith("#")]
    read_keys([key for key, _ in pairs], (), None)  # the same rules as other keys
    return dict(pairs)


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
                 metrics_keys: Sequence[str] = (), *,
                 priority_keys: Mapping[str, int] | None = None,
                 priority_floor: int = 0) -> None:
        """``priority_keys``: inference keys, each with the most urgent priority it may
        ask for (a lower ``priority_floor`` applies to them too); ``priority_floor``:
        the most urgent any other caller may ask for."""
        if not GENERATION_PRIORITY_MIN <= priority_floor <= GENERATION_PRIORITY_MAX:
            raise InvalidValue(f"the priority floor must be an integer from -2**31 to "
                               f"2**31 - 1, got {priority_floor}")
        priority_keys = priority_keys or {}
        self.api_keys = [_digest(k.encode()) for k in [*api_keys, *priority_keys]]
        self.admin_keys = [_digest(k.encode()) for k in admin_keys]
        self.metrics_keys = [_digest(k.encode()) for k in metrics_keys]
        self.priority_floor = GenerationPriority(priority_floor)
        # who made a call (check's answer) -> the most urgent priority it may ask for
        self._floors = {_digest(k.encode()): GenerationPriority(min(n, priority_floor))
                        for k, n in priority_keys.items()}
        self._floors.update((key, GenerationPriority(GENERATION_PRIORITY_MIN))
                            for key in self.admin_keys)

    @classmethod
    def from_sources(cls, api_keys: Sequence[str], api_key_files: Sequence[Path],
                     admin_keys: Sequence[str], admin_key_files: Sequence[Path],
                     env: Mapping[str, str], metrics_keys: Sequence[str] = (), *,
                     priority_keys: Sequence[str] = (),
                     priority_key_files: Sequence[Path] = (),
                     priority_floor: int = 0) -> Access:
        """Keys from the command line, files and the environment (``priority_keys``:
        ``KEY=N`` pairs, see :func:`read_priority_keys`)."""
        return cls(read_keys(api_keys, api_key_files, env.get(API_KEY_ENV)),
                   read_keys(admin_keys, admin_key_files, env.get(ADMIN_KEY_ENV)),
                   read_keys(metrics_keys, (), env.get(METRICS_KEY_ENV)),
                   priority_keys=read_priority_keys(priority_keys, priority_key_files),
                   priority_floor=priority_floor)

    def priority(self, tenant: bytes, asked: GenerationPriority) -> GenerationPriority:
        """The priority a generation is queued at: ``asked``, but no more urgent (no
        lower) than the allowance of the key that sent it (``tenant``: :meth:`check`'s
        answer; b"", an open call, gets ``priority_floor``)."""
        return max(asked, self._floors.get(tenant, self.priority_floor))

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
        floors = (f"; a generation may ask for priority {self.priority_floor} or above "
                  "unless its key allows more")
        return (f"{len(self.api_keys)} inference key(s), {len(self.admin_keys)} admin key(s)"
                if self.enabled else "open (no API keys)") + floors

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
