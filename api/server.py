"""Serving the API: ``serve`` for ``python starter.py serve``, and an in-process server for the demo and
the browser tests."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI

from api.app import create_app
from service.exports import open_exports
from settings import Settings


class BackgroundServer(uvicorn.Server):
    """uvicorn on the current event loop, started and stopped by its owner (who handles Ctrl-C)."""

    def __init__(self, app: FastAPI, host: str = "127.0.0.1", port: int = 0) -> None:
        super().__init__(uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off"))
        self._task: asyncio.Task[None] | None = None

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the owner decides what Ctrl-C does

    @property
    def url(self) -> str:
        """The base URL it listens on (the real port when 0 was asked for)."""
        sock = self.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    async def start(self) -> str:
        """Start serving and return the base URL once it accepts connections."""
        self._task = asyncio.create_task(self.serve())
        while not self.started:
            if self._task.done():
                self._task.result()  # raises why it could not start
                raise RuntimeError("the API server stopped before it started")
            await asyncio.sleep(0.02)
        return self.url

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, and wait for the server to end."""
        self.should_exit = True
        if self._task is not None:
            await self._task


async def serve(settings: Settings, host: str | None = None, port: int | None = None) -> None:
    """Run the API and console until interrupted, over pools opened from ``settings.database_url``."""
    async with open_exports(settings) as exports:
        app = create_app(settings, exports=exports)
        config = uvicorn.Config(
            app, host=host or settings.api_host, port=port or settings.api_port, lifespan="off"
        )
        await uvicorn.Server(config).serve()
