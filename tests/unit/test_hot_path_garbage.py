"""The infer request path leaves no reference cycles behind: at thousands of requests a
second, cyclic garbage makes the collector run often and walk what each run promotes,
which cost a request of `tiny` about as much CPU as the rest of its path together. The
server's own protocol, app and data plane serve `tiny` through a transport that stands
in for the socket, with the collector off; what it then finds is what the path left."""

from __future__ import annotations

import asyncio
import gc
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pytest

from tradeoff.models import build_repository


class Socket(asyncio.Transport):
    """Takes the place of a client's socket: keeps the statuses of whole responses."""

    def __init__(self) -> None:
        super().__init__()
        self.buffer = b""
        self.statuses: list[bytes] = []
        self.answered: asyncio.Future[None] | None = None
        self.wanted = 0

    def write(self, data: bytes) -> None:  # type: ignore[override]
        self.buffer += data
        while b"\r\n\r\n" in self.buffer:
            head, _, rest = self.buffer.partition(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
            if len(rest) < length:
                return
            self.buffer = rest[length:]
            self.statuses.append(head.split(b" ")[1])
            if len(self.statuses) == self.wanted and self.answered is not None:
                self.answered.set_result(None)

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 40000)}.get(
            name, default)

    def is_closing(self) -> bool:
        return False

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None: ...

    def write_eof(self) -> None: ...

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


def request_bytes(body: bytes, header_length: int) -> bytes:
    return (b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
            b"Inference-Header-Content-Length: %d\r\nContent-Length: %d\r\n\r\n"
            % (header_length, len(body))) + body


@pytest.mark.parametrize("binary", [True, False])
def test_served_infer_requests_leave_no_cyclic_garbage(tmp_path: Path, binary: bool) -> None:
    import uvicorn
    from uvicorn.server import ServerState

    from tradeoff.server import transport
    from tradeoff.server.options import ServeOptions
    from tradeoff.server.runner import make_app, make_dataplane

    build_repository(tmp_path, ("tiny",))
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    if binary:
        header = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                           "shape": [1, 16],
                                           "parameters": {"binary_data_size": x.nbytes}}],
                               "parameters": {"binary_data_output": True}})
        raw = request_bytes(header + x.tobytes(), len(header))
    else:
        body = orjson.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32",
                                         "shape": [1, 16], "data": x.ravel().tolist()}]})
        raw = request_bytes(body, len(body))
    found: list[int] = []

    async def scenario() -> Socket:
        options = ServeOptions(model_repository=tmp_path, metrics_port=None, grpc_port=None)
        dataplane = make_dataplane(options)

        async def nothing() -> None: ...

        app = make_app(options, dataplane, options.transport, None, nothing, nothing)
        await dataplane.manager.load_all()
        dataplane.started = True
        config = uvicorn.Config(app, loop="none", lifespan="off", log_config=None,
                                access_log=False, server_header=False, date_header=False)
        config.load()
        protocol = transport.guarded_protocol(options.transport, app)(
            config=config, server_state=ServerState(), app_state={},
            _loop=asyncio.get_running_loop())
        socket = Socket()
        protocol.connection_made(socket)

        async def serve(count: int) -> None:
            socket.wanted += count
            socket.answered = asyncio.get_running_loop().create_future()
            for _ in range(count):
                protocol.data_received(raw)
            await socket.answered

        await serve(50)  # warm: first-use caches and the loop's own state
        gc.collect()
        gc.disable()
        try:
            await serve(300)
            found.append(gc.collect())
        finally:
            gc.enable()
        protocol.connection_lost(None)
        await dataplane.close()
        return socket

    socket = asyncio.run(scenario())
    assert socket.statuses == [b"200"] * 350
    assert found == [0], f"{found[0]} objects in reference cycles after 300 requests"
