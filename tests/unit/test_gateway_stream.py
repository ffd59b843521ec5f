"""A streamed answer passed on to a client that reads slowly: the gateway holds at most
about STREAM_BUFFER_BYTES of it and stops reading the replica's connection meanwhile,
then passes every byte on in order. The replica is a real socket server here that writes
its stream as fast as the connection takes it."""

from __future__ import annotations

import asyncio

from tradeoff.repository.router import RouterConfig
from tradeoff.server.gateway import STREAM_BUFFER_BYTES, open_generation
from tradeoff.server.replica_pool import ReplicaPool

PIECE = 16 << 10
PIECES = 512  # 8 MiB: eight times the bound


def event(index: int) -> bytes:
    """One server-sent event of PIECE bytes, numbered."""
    head = b"data: %08d " % index
    return head + b"x" * (PIECE - len(head) - 2) + b"\n\n"


async def serve_stream(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    length = 0
    writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    for index in range(PIECES):
        data = event(index)
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        length += len(data)
        await writer.drain()  # held here while the gateway reads no more
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


async def slow_client() -> tuple[int, int, bytes]:
    server = await asyncio.start_server(serve_stream, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    doc = {"pools": {"p": {"protocol": "openai", "model": "m", "policy": "round_robin",
                           "replicas": [f"http://127.0.0.1:{port}/v1"]}},
           "routes": [{"to": "p"}]}
    pool = ReplicaPool(RouterConfig.from_mapping(doc, "r.yaml", "r").pools["p"])
    for replica in pool.replicas:
        replica.ready = replica.checked = True
    stream = await open_generation(pool, {"prompt": "hi", "stream": True}, "/completions",
                                   {}, stream=True, prompt=b"hi", session=None)
    received = bytearray()
    most = 0
    async for chunk in stream.chunks():
        received += chunk
        if len(received) < 2 * STREAM_BUFFER_BYTES:
            await asyncio.sleep(0.01)  # a client reading slowly: the replica runs ahead
        most = max(most, stream.buffered)
    server.close()
    await server.wait_closed()
    await pool.stop(1)
    return most, pool.replicas[0].stats.answered, bytes(received)


def test_a_slow_reader_holds_a_bounded_part_of_a_stream_and_gets_all_of_it() -> None:
    most, answered, received = asyncio.run(slow_client())
    assert received == b"".join(event(i) for i in range(PIECES))
    # the bound, and what one read of the socket may add past it
    assert STREAM_BUFFER_BYTES // 2 < most <= STREAM_BUFFER_BYTES + (256 << 10)
    assert answered == 1
