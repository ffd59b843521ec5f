"""An OpenAI-compatible streaming server whose token timing the tests control, on 127.0.0.1.

The base URL carries the behaviour as path segments before ``/v1``, e.g.
``{url}/first/200/every/40/v1``: the first token 200 ms after the request arrived, then one
every 40 ms (on a fixed schedule, so delays do not add up). More segments:
``cap/N`` sends at most N tokens whatever max_tokens asks (a server that does not honour
the length); ``fail/N`` sends an error event after N tokens; ``cut/N`` closes the
connection after N tokens without ``[DONE]``; ``nousage/1`` never sends ``usage``.
Every token is the text ``"tok "``. ``GET .../v1/models`` lists ``test-model``.
``authorization`` keeps every Authorization header it was sent.
"""

from __future__ import annotations

import asyncio
import json

from .control_server import ThreadedServer


class StreamingServer(ThreadedServer):
    def __init__(self) -> None:
        super().__init__()
        self.requests = 0
        self.authorization: set[str] = set()  # Authorization headers seen

    def url(self, **behaviour: int) -> str:
        path = "".join(f"/{key}/{value}" for key, value in behaviour.items())
        return f"http://127.0.0.1:{self.port}{path}/v1"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = self._loop.time()
                lines = head.decode().split("\r\n")
                method, target, _ = lines[0].split(" ")
                headers = {k.lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:] if line)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                if "authorization" in headers:
                    self.authorization.add(headers["authorization"])
                segments = target.split("/")[1:]
                where = segments.index("v1")
                behaviour = {segments[i]: int(segments[i + 1]) for i in range(0, where, 2)}
                route = "/".join(segments[where + 1:])
                if method == "GET" and route == "models":
                    doc = json.dumps({"object": "list", "data": [
                        {"id": "test-model", "object": "model", "owned_by": "test"}]}).encode()
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(doc), doc))
                    continue
                self.requests += 1
                if not await self._stream(writer, json.loads(body), behaviour, arrived,
                                          chat=route == "chat/completions"):
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:  # also when the server stops and cancels this handler
            writer.close()

    async def _stream(self, writer: asyncio.StreamWriter, request: dict, behaviour: dict,
                      arrived: float, chat: bool) -> bool:
        """Send one streamed answer; False when the connection is to be cut."""
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                     b"Transfer-Encoding: chunked\r\n\r\n")

        def event(doc: object) -> None:
            data = b"data: " + (doc if isinstance(doc, bytes) else json.dumps(doc).encode()) \
                + b"\n\n"
            writer.write(b"%x\r\n%s\r\n" % (len(data), data))

        tokens = min(request.get("max_tokens", 16), behaviour.get("cap", 10**9))
        first, every = behaviour.get("first", 0) / 1000, behaviour.get("every", 0) / 1000
        for i in range(tokens):
            delay = arrived + first + i * every - self._loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            if i == behaviour.get("fail", -1):
                event({"error": {"message": "the engine failed mid-stream",
                                 "type": "server_error"}})
                break
            if i == behaviour.get("cut", -1):
                await writer.drain()
                return False
            reason = "length" if i == tokens - 1 else None
            piece = {"delta": {"content": "tok "}} if chat else {"text": "tok "}
            event({"object": "text_completion", "choices": [
                {"index": 0, **piece, "finish_reason": reason}]})
            await writer.drain()
        if (request.get("stream_options") or {}).get("include_usage") and \
                not behaviour.get("nousage"):
            event({"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": tokens,
                                            "total_tokens": 7 + tokens}})
        event(b"[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True
