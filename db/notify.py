"""The outbox's NOTIFY channel: the dispatcher's wake-up, on a dedicated connection."""

from __future__ import annotations

from collections.abc import AsyncIterator

import psycopg

from db.errors import translated
from db.queries import execute


async def outbox_wakeups(url: str) -> AsyncIterator[None]:
    """Yield once when LISTEN is in place, then once per NOTIFY on the outbox channel.

    Raises the store's typed errors (``TransientStoreError`` when the connection is lost); the caller
    reconnects, and polling covers the gap.
    """
    async with translated(), await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await execute(conn, "become_dispatcher", {})
        await execute(conn, "listen_outbox", {})
        yield
        async for _ in conn.notifies():
            yield
