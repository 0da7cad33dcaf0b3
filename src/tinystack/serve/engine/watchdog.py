"""The watchdog: a task on the server's event loop that restarts a dead engine loop.

Every `interval_s` it asks the adapter `is_alive()`; when the loop is dead (it
crashed, or was killed) it calls `restart()` and logs it. Requests that were on the
dead loop have already failed (EngineDead -> degraded / 503 and a breaker failure);
new ones run on the fresh loop. A stalled loop (alive, but no progress for
`stall_timeout_s`) shows up in /health as "stalled"; its requests fail by their own
stall timeout.
"""
from __future__ import annotations

import asyncio
import logging

from tinystack.serve.engine.adapter import EngineAdapter

logger = logging.getLogger("tinystack.serve")


async def watchdog(adapter: EngineAdapter, interval_s: float) -> None:
    """Run until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        if not adapter.is_alive():
            logger.warning("engine loop is dead; restarting it (restart #%d)", adapter.restarts + 1)
            try:
                adapter.restart()
            except Exception:  # try again next round; /health keeps saying "dead"
                logger.exception("engine restart failed")
