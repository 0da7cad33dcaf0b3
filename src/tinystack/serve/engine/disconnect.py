"""Cancel the work of a non-streaming request when its client goes away.

A streaming response notices a disconnect by itself (Starlette cancels the
response, and closing the generator aborts the sequences). A plain request would
keep generating for nobody, holding its KV memory; `unless_disconnected` runs the
work as a task next to one that waits for the ASGI `http.disconnect` message, and
cancels the work (which aborts its sequences) when that comes first.
"""
from __future__ import annotations

import asyncio
from typing import Awaitable, TypeVar

from starlette.requests import Request

T = TypeVar("T")


class ClientDisconnected(Exception):
    """The client closed the connection before the answer was ready."""


async def _wait_for_disconnect(request: Request) -> None:
    while True:
        message = await request.receive()  # the body was already read: only a disconnect can come
        if message["type"] == "http.disconnect":
            return


async def unless_disconnected(request: Request, work: Awaitable[T]) -> T:
    task = asyncio.ensure_future(work)
    watcher = asyncio.ensure_future(_wait_for_disconnect(request))
    try:
        await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        task.cancel()
        raise
    finally:
        watcher.cancel()
    if not task.done():
        task.cancel()
        try:
            await task
        except (asyncio.CancelledError, Exception):
            pass
        raise ClientDisconnected()
    return task.result()
