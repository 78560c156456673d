"""Console sessions and API tokens (role ``exports_api``): open, find and close a session; find a token."""

from __future__ import annotations

import logging

from db.rows import (
    ExpiryRow,
    TokenRow,
)
from db.stores.base import StoreBase

log = logging.getLogger(__name__)


class SessionStatements(StoreBase):
    """Console sessions and API tokens."""

    async def open_console_session(
        self, session_sha256: bytes, token_sha256: bytes, ttl_seconds: float
    ) -> None:
        """Store a console session's hash, bound to a token's hash, until ``ttl_seconds`` from now."""
        await self._rows(
            "open_console_session",
            {"session_sha256": session_sha256, "token_sha256": token_sha256, "ttl_seconds": ttl_seconds},
            ExpiryRow,
        )

    async def find_console_session(self, session_sha256: bytes) -> TokenRow | None:
        """The tenant, principal and role a live console session is bound to, or ``None``."""
        return await self._row("find_console_session", {"session_sha256": session_sha256}, TokenRow)

    async def close_console_session(self, session_sha256: bytes) -> bool:
        """Delete a console session (sign-out); whether there was one."""
        return await self._matched("close_console_session", session_sha256=session_sha256)

    async def find_token(self, token_sha256: bytes) -> TokenRow | None:
        """The tenant, principal and role a token's hash is bound to, or ``None``."""
        return await self._row("find_api_token", {"token_sha256": token_sha256}, TokenRow)
