"""The response cache's specification: what ``--cache`` asks for (a local LRU or Redis,
its sizes, each API key's share, the scope of entries, the shared secret and Redis's
password), parsed and validated, and described for the banner.

    spec = CacheSpec.parse("local,size=256MB,tenant_size=16MB")
    spec.describe()     # 'local LRU of 256 MB, answers up to 1,048,576 bytes, ...'
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from tradeoff.errors import InvalidValue

__all__ = [
    "MIN_SECRET_BYTES",
    "SCOPES",
    "SECRET_ENV",
    "CacheSpec",
    "parse_size",
    "redacted",
]

SECRET_ENV = "TRADEOFF_CACHE_SECRET"
MIN_SECRET_BYTES = 16
SCOPES = ("key", "global")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?i?b?)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1e3, "kb": 1e3, "kib": 1 << 10, "m": 1e6, "mb": 1e6,
          "mib": 1 << 20, "g": 1e9, "gb": 1e9, "gib": 1 << 30, "t": 1e12, "tb": 1e12,
          "tib": 1 << 40}


def parse_size(text: str, what: str) -> int:
    """``256MB``, ``1GiB``, ``4096`` as bytes; ValueError naming ``what`` otherwise."""
    match = _SIZE.match(text)
    if not match or (match.group(2) or "").lower() not in _UNITS:
        raise InvalidValue(f"{what}={text!r}: give bytes such as 256MB, 1GiB or 65536")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "").lower()])


def redacted(url: str) -> str:
    """A Redis URL without its password, for logs and banners."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = f"{parts.username}:***@" if parts.username else ":***@"
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=user + host))


def _tenant_size(values: dict[str, str], default: str) -> int:
    """``tenant_size`` of a --cache spec in bytes (at least 1)."""
    share = parse_size(values.get("tenant_size", default), "tenant_size")
    if share < 1:
        raise InvalidValue("--cache tenant_size must be at least 1 byte")
    return share


def _read_secret_file(path: str, what: str) -> bytes:
    try:
        return Path(path).expanduser().read_bytes().strip()
    except OSError as exc:
        raise InvalidValue(f"--cache {what}={path}: cannot read it ({exc.strerror})") from None


@dataclass(frozen=True)
class CacheSpec:
    """What ``--cache`` asked for: ``local[,size=256MB]`` or
    ``redis://HOST:PORT/DB[,ttl=3600]`` (a secret shared by the servers is required:
    ``secret_file=PATH`` or ``$TRADEOFF_CACHE_SECRET``; ``password_file=PATH`` for Redis's
    password), both with ``max_item=1MB`` (larger answers are not kept),
    ``scope=key|global`` (who may be answered with an entry: the API key that asked it,
    or anyone) and ``tenant_size=SIZE`` (the most one API key's answers may take)."""

    kind: str  # "local" | "redis"
    size_bytes: int = 256 * 10**6
    url: str = ""
    ttl_s: int | None = 3600
    max_item_bytes: int = 1 << 20
    scope: str = "key"
    tenant_bytes: int = 64 << 20
    secret: bytes = b""   # as given; empty: a local cache makes its own
    password: str | None = None

    @classmethod
    def parse(cls, text: str, env: Mapping[str, str] | None = None) -> CacheSpec:
        env = os.environ if env is None else env
        head, *options = [part.strip() for part in text.split(",")]
        values: dict[str, str] = {}
        for option in options:
            name, sep, value = option.partition("=")
            if not sep or not value:
                raise InvalidValue(f"--cache option {option!r}: write NAME=VALUE, e.g. "
                                   "size=256MB")
            values[name.strip()] = value.strip()
        common = {"max_item", "scope", "tenant_size", "secret_file"}
        if head == "local":
            allowed = common | {"size"}
        elif head.startswith(("redis://", "rediss://", "unix://")):
            allowed = common | {"ttl", "password_file"}
        else:
            raise InvalidValue(f"--cache {text!r}: use local[,size=256MB] or "
                               "redis://HOST:PORT/DB[,ttl=3600]")
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise InvalidValue(f"--cache {head}: unknown option {unknown[0]!r}; it takes "
                               f"{', '.join(sorted(allowed))}")
        max_item = parse_size(values.get("max_item", "1MiB"), "max_item")
        scope = values.get("scope", "key")
        if scope not in SCOPES:
            raise InvalidValue(f"--cache scope={scope!r}: use scope=key (each API key sees "
                               "only its own answers) or scope=global (shared by everyone)")
        secret = _read_secret_file(values["secret_file"], "secret_file") \
            if "secret_file" in values else env.get(SECRET_ENV, "").strip().encode()
        if secret and len(secret) < MIN_SECRET_BYTES:
            raise InvalidValue(f"the cache secret must be at least {MIN_SECRET_BYTES} bytes "
                               "(e.g. the output of: openssl rand -hex 32)")
        if head == "local":
            size = parse_size(values.get("size", "256MB"), "size")
            if size < 1:
                raise InvalidValue("--cache local: size must be at least 1 byte")
            return cls("local", size_bytes=size, max_item_bytes=max_item, scope=scope,
                       tenant_bytes=_tenant_size(values, str(max(size // 4, 1))),
                       secret=secret)
        if importlib.util.find_spec("redis") is None:
            raise InvalidValue("--cache redis:// needs the redis package: pip install "
                               "'tradeoff[cache]'")
        if not secret:
            raise InvalidValue(f"--cache {redacted(head)}: the servers that share it need one "
                               f"secret: secret_file=PATH or ${SECRET_ENV} (at least "
                               f"{MIN_SECRET_BYTES} bytes, e.g. openssl rand -hex 32)")
        ttl_text = values.get("ttl", "3600")
        if not (ttl_text.isascii() and ttl_text.isdigit()):
            raise InvalidValue(f"--cache ttl={ttl_text!r}: give whole seconds (0: no expiry)")
        ttl = int(ttl_text)
        password = _read_secret_file(values["password_file"], "password_file").decode() \
            if "password_file" in values else None
        return cls("redis", url=head, ttl_s=ttl or None, max_item_bytes=max_item,
                   scope=scope, tenant_bytes=_tenant_size(values, "256MB"),
                   secret=secret, password=password)

    def describe(self) -> str:
        shared = "shared by every API key" if self.scope == "global" else \
            "entries per API key"
        share = f"at most {self.tenant_bytes / 1e6:,.0f} MB per API key"
        if self.kind == "local":
            return (f"local LRU of {self.size_bytes / 1e6:,.0f} MB, answers up to "
                    f"{self.max_item_bytes:,} bytes, {shared}, {share}")
        ttl = f"ttl {self.ttl_s} s" if self.ttl_s else "no expiry"
        return (f"Redis at {redacted(self.url)} ({ttl}), answers up to "
                f"{self.max_item_bytes:,} bytes, {shared}, {share}")
