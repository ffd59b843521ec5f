"""A streamed answer passed on to a client that reads slowly: the gateway holds at most
about STREAM_BUFFER_BYTES of it and stops reading the replica's connection meanwhile,
then passes every byte on in order. The replica is a real socket server here that writes
its stream as fast as the connection takes it."""

from __future__ import annotations

import asyncio
import time

import pytest

from tradeoff.errors import BadGateway
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


async def serve_big_error(reader: asyncio.StreamReader,
                          writer: asyncio.StreamWriter) -> None:
    """A 500 whose message is several times the bound, in pieces."""
    await reader.readuntil(b"\r\n\r\n")
    writer.write(b"HTTP/1.1 500 Internal Server Error\r\ncontent-type: text/plain\r\n"
                 b"transfer-encoding: chunked\r\n\r\n")
    for _ in range(4 * STREAM_BUFFER_BYTES // PIECE):
        writer.write(b"%x\r\n%s\r\n" % (PIECE, b"e" * PIECE))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


def ready_pool(port: int, timeout_s: float = 60.0) -> ReplicaPool:
    doc = {"pools": {"p": {"protocol": "openai", "model": "m", "policy": "round_robin",
                           "replicas": [f"http://127.0.0.1:{port}/v1"],
                           "timeout_s": timeout_s}},
           "routes": [{"to": "p"}]}
    pool = ReplicaPool(RouterConfig.from_mapping(doc, "r.yaml", "r").pools["p"])
    for replica in pool.replicas:
        replica.ready = replica.checked = True
    return pool


async def slow_client() -> tuple[int, int, bytes]:
    server = await asyncio.start_server(serve_stream, "127.0.0.1", 0)
    pool = ready_pool(server.sockets[0].getsockname()[1])
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


def test_an_error_answer_past_the_bound_is_read_whole_not_held_back() -> None:
    """Only an answer being passed on is held back: a replica's long error is read whole
    and answered with at once, not left waiting for the pool's timeout."""
    async def scenario() -> float:
        server = await asyncio.start_server(serve_big_error, "127.0.0.1", 0)
        pool = ready_pool(server.sockets[0].getsockname()[1], timeout_s=20.0)
        started = time.monotonic()
        try:
            with pytest.raises(BadGateway, match=r"failed the request \(500\)"):
                await open_generation(pool, {"prompt": "hi", "stream": True},
                                      "/completions", {}, stream=True, prompt=b"hi",
                                      session=None)
        finally:
            server.close()
            await server.wait_closed()
            await pool.stop(1)
        return time.monotonic() - started

    assert asyncio.run(scenario()) < 20.0  # answered, not timed out
