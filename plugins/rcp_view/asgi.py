"""An ASGI app that imports and builds the real one on its first request.

The API server mounts whatever ASGI callable a plugin hands it; handing it this one keeps
FastAPI and Airflow's API modules out of every other process that loads the plugin.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class LazyApp:
    """``LazyApp("package.module:factory")``: the factory is imported and called once."""

    def __init__(self, factory: str) -> None:
        self.factory = factory
        self._app: ASGIApp | None = None
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # what Airflow's plugin listing shows for the app
        return f"LazyApp({self.factory!r})"

    def load(self) -> ASGIApp:
        with self._lock:
            if self._app is None:
                module, _, name = self.factory.partition(":")
                self._app = getattr(importlib.import_module(module), name)()
            return self._app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.load()(scope, receive, send)
