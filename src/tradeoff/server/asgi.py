"""The few ASGI pieces every HTTP handler shares: types, one-shot responses, and the
watch that notices a client leaving while its request is being worked on."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import TracebackType
from typing import Any

import orjson

__all__ = [
    "JSON_HEADERS",
    "OFF_LOOP_BYTES",
    "DisconnectWatch",
    "Headers",
    "Receive",
    "Scope",
    "Send",
    "off_loop_if_large",
    "send_body",
    "send_json",
]

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

JSON_HEADERS: Headers = [(b"content-type", b"application/json")]

# work on a body larger than this (decompressing, parsing, decoding tensors) runs in a
# worker thread: tens of milliseconds on the event loop would stall every client
OFF_LOOP_BYTES = 1 << 20


async def off_loop_if_large(size: int, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)``, in a worker thread when it works on more than
    ``OFF_LOOP_BYTES`` (a thread hop costs more than a small body's work)."""
    if size <= OFF_LOOP_BYTES:
        return function(*args)
    return await asyncio.to_thread(function, *args)


async def send_body(send: Send, status: int, body: bytes, headers: Headers | None = None
                    ) -> None:
    """A whole response: JSON content type by default when there is a body."""
    headers = list(headers if headers is not None else JSON_HEADERS if body else [])
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_json(send: Send, status: int, doc: Any, headers: Headers | None = None) -> None:
    await send_body(send, status, orjson.dumps(doc), JSON_HEADERS + (headers or []))


class DisconnectWatch:
    """While open, calls ``on_gone`` once if the client disconnects (``http.disconnect``);
    ``gone`` says whether it did.

        with DisconnectWatch(receive, task.cancel) as watch:
            ...
    """

    def __init__(self, receive: Receive, on_gone: Callable[[], object]) -> None:
        self.receive = receive
        self.on_gone = on_gone
        self.gone = False
        self._open = False
        self._task: asyncio.Future[dict[str, Any]] | None = None

    def _on_message(self, message: asyncio.Future[dict[str, Any]]) -> None:
        if self._open and not message.cancelled() and message.exception() is None and \
                message.result()["type"] == "http.disconnect":
            self.gone = True
            self.on_gone()

    def __enter__(self) -> DisconnectWatch:
        self._open = True
        self._task = asyncio.ensure_future(self.receive())
        self._task.add_done_callback(self._on_message)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self._open = False  # a disconnect noticed from now on changes nothing
        if self._task is not None:
            self._task.remove_done_callback(self._on_message)
            self._task.cancel()
