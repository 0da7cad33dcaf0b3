"""The request routers of this process's handles to the engine deployment, for the gateway to read.

A module of its own because Ray Serve ships the router class *by value* (cloudpickle, router.py's
whole module): state kept there would be a copy. Functions here are pickled by reference, so every
copy of the router registers in this one place.
"""
from __future__ import annotations

import threading
import weakref
from typing import Any

_routers: weakref.WeakSet[Any] = weakref.WeakSet()
_lock = threading.Lock()  # routers register on Serve's event-loop thread; the gateway reads on its own


def register(router: Any) -> None:
    with _lock:
        _routers.add(router)


def live_routers() -> list[Any]:
    """The routers alive in this process (usually one per deployment handle)."""
    with _lock:
        return list(_routers)
