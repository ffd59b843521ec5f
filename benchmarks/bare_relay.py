"""The least a Python hop can cost: an HTTP relay on uvloop and httptools that passes each
request to one upstream server on kept connections and its answer back, and does nothing
else (no checks, limits, routing, statistics or health). benchmarks/gateway.py
(--scenario floor) measures it beside the gateway, as the floor a gateway in Python can
reach; it is not a server to use.

    python benchmarks/bare_relay.py UPSTREAM_HOST UPSTREAM_PORT PORT

Prints ``READY`` once it listens on 127.0.0.1:PORT.
"""

from __future__ import annotations

import asyncio
import sys

import httptools
import uvloop

from tradeoff.protocol.http_client import Connection, Response, build_request

PASSED_ON = (b"content-type", b"inference-header-content-length")


class Relay(asyncio.Protocol):
    """One client connection: each request whole, then sent on."""

    def __init__(self, upstream: tuple[str, int], idle: list[Connection]) -> None:
        self.upstream = upstream
        self.idle = idle
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport | None = None
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body: list[bytes] = []
        self.tasks: set[asyncio.Task[None]] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_url(self, url: bytes) -> None:
        self.url = url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() in PASSED_ON:
            self.headers[name.decode()] = value.decode()

    def on_body(self, body: bytes) -> None:
        self.body.append(body)

    def on_message_complete(self) -> None:
        host, port = self.upstream
        raw = build_request(self.parser.get_method().decode(), f"{host}:{port}",
                            self.url.decode(), b"".join(self.body), self.headers)
        self.headers, self.body = {}, []
        task = asyncio.ensure_future(self.forward(raw))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def forward(self, raw: bytes) -> None:
        connection = self.idle.pop() if self.idle else Connection(*self.upstream)
        try:
            response = await connection.request(raw)
        except (OSError, TimeoutError):
            connection.close()
            response = Response(502, {}, b"")
        else:
            self.idle.append(connection)
        head = [b"HTTP/1.1 %d X\r\n" % response.status]
        for name in PASSED_ON:
            if name in response.headers:
                head += (name, b": ", response.headers[name], b"\r\n")
        head += (b"content-length: %d\r\n\r\n" % len(response.body), response.body)
        assert self.transport is not None
        self.transport.write(b"".join(head))


async def serve(upstream: tuple[str, int], port: int) -> None:
    idle: list[Connection] = []
    server = await asyncio.get_running_loop().create_server(
        lambda: Relay(upstream, idle), "127.0.0.1", port)
    print("READY", flush=True)
    await server.serve_forever()


if __name__ == "__main__":
    uvloop.run(serve((sys.argv[1], int(sys.argv[2])), int(sys.argv[3])))
