"""The heads real clients send all take the transport's direct path: optional whitespace
in a header value (libcurl, and so perf_analyzer, sends ``Content-Length: 1208 ``), any
header case, ``Expect: 100-continue`` (answered at once), HTTP/1.0. The protocol is fed
their exact bytes; a stand-in app records what reached its direct route."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import uvicorn
from uvicorn.server import ServerState

from tradeoff.server.options import TransportLimits
from tradeoff.server.transport import guarded_protocol

BODY = b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}'
N = len(BODY)
PATH = b"/v2/models/mlp/infer"

HEADS = {
    "perf_analyzer (libcurl)": b"POST %s HTTP/1.1\r\nHost: localhost:8000\r\nAccept: */*\r\n"
                               b"Content-Type: application/json\r\nContent-Length: %d \r\n\r\n",
    "tritonclient (geventhttpclient)": b"POST %s HTTP/1.1\r\nUser-Agent: python/gevent-http-"
                                       b"client-2.3.1\r\nContent-Length: %d\r\n"
                                       b"Host: 127.0.0.1:8000\r\n\r\n",
    "curl, with Expect": b"POST %s HTTP/1.1\r\nHost: 127.0.0.1:8000\r\nUser-Agent: curl/8.5.0"
                         b"\r\nAccept: */*\r\nContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n",
    "tradeoff bench": b"POST %s HTTP/1.1\r\nhost: 127.0.0.1:8000\r\n"
                      b"content-type: application/json\r\ncontent-length: %d\r\n\r\n",
    "upper case, tab": b"POST %s HTTP/1.1\r\nHOST: 127.0.0.1\r\nCONTENT-LENGTH:\t%d\t\r\n\r\n",
    "HTTP/1.0": b"POST %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n\r\n",
}


class DirectApp:
    """Answers every infer route directly and records what it was given."""

    direct_headers = frozenset((b"content-length", b"host"))

    def __init__(self) -> None:
        self.calls: list[tuple[dict[bytes, bytes], bytes]] = []

    def direct_route(self, scope: Any, headers: dict[bytes, bytes]) -> dict[str, str] | None:
        declared = headers.get(b"content-length", b"")
        return {"model": "mlp"} if declared.isdigit() else None

    def infer_direct(self, scope: Any, target: Any, headers: dict[bytes, bytes],
                     body: bytes, respond: Any) -> Any:
        self.calls.append((dict(headers), bytes(body)))
        respond(200, b"{}", [])
        return lambda: None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        raise AssertionError(f"took the ASGI path: {scope['headers']}")


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 50000), "sockname": ("127.0.0.1", 8000)}.get(
            name, default)

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.written += data

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


@pytest.mark.parametrize("client", list(HEADS))
def test_each_clients_head_takes_the_direct_path(client: str) -> None:
    async def feed() -> tuple[DirectApp, bytes]:
        app = DirectApp()
        config = uvicorn.Config(app, http=guarded_protocol(TransportLimits(), app),
                                ws="none", lifespan="off", log_config=None)
        config.load()
        protocol = config.http_protocol_class(config=config, server_state=ServerState(),
                                              app_state={}, _loop=asyncio.get_running_loop())
        transport = Transport()
        protocol.connection_made(transport)
        head = HEADS[client] % (PATH, N)
        protocol.data_received(head)
        if client.endswith("Expect"):  # answered before the body is sent
            assert bytes(transport.written) == b"HTTP/1.1 100 Continue\r\n\r\n"
        protocol.data_received(BODY)
        await asyncio.sleep(0)
        protocol.connection_lost(None)
        return app, bytes(transport.written)

    app, written = asyncio.run(feed())
    [(headers, body)] = app.calls
    assert body == BODY and headers[b"content-length"] == str(N).encode()
    assert written.endswith(b"\r\n\r\n{}") and b"HTTP/1.1 200 OK" in written, written
