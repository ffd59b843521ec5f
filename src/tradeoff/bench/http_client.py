"""A minimal keep-alive HTTP/1.1 client on asyncio streams, for load generation.

General clients (httpx, aiohttp) spend more CPU per request than a small model server
does, which would make the client the bottleneck. This one sends prebuilt request bytes
and parses only the status line, ``Content-Length`` and the headers asked for.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass


@dataclass(slots=True)
class Response:
    status: int
    headers: dict[bytes, bytes]
    body: bytes


def build_request(method: str, host: str, path: str, body: bytes = b"",
                  headers: dict[str, str] | None = None) -> bytes:
    """The bytes of one HTTP/1.1 request, reusable for every send."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Connection:
    """One keep-alive connection; one request at a time."""

    def __init__(self, host: str, port: int, timeout: float = 30.0) -> None:
        self.host = host
        self.port = port
        self.timeout = timeout
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def _connect(self) -> None:
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), self.timeout)

    async def request(self, raw: bytes) -> Response:
        if self._writer is None or self._writer.is_closing():
            await self._connect()
        assert self._reader is not None and self._writer is not None
        try:
            self._writer.write(raw)
            head = await asyncio.wait_for(self._reader.readuntil(b"\r\n\r\n"), self.timeout)
            lines = head.split(b"\r\n")
            status = int(lines[0].split(b" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    key, _, value = line.partition(b":")
                    headers[key.strip().lower()] = value.strip()
            length = int(headers.get(b"content-length", b"0"))
            body = await asyncio.wait_for(self._reader.readexactly(length), self.timeout) \
                if length else b""
            if headers.get(b"connection", b"").lower() == b"close":
                self.close()
            return Response(status, headers, body)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = self._reader = None
