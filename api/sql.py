"""Loads the API's named statements from ``api/queries.sql`` and runs them with bound parameters only."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources
from typing import Any, LiteralString, cast

from psycopg import AsyncConnection
from psycopg.rows import dict_row

_HEADER = re.compile(r"^-- name: (\w+)\n(?:-- .*\n)*", re.MULTILINE)


@cache
def api_queries() -> dict[str, LiteralString]:
    """Every named statement in ``api/queries.sql``, by name."""
    text = (resources.files("api") / "queries.sql").read_text(encoding="utf-8")
    matches = list(_HEADER.finditer(text))
    found: dict[str, LiteralString] = {}
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        found[m.group(1)] = cast(LiteralString, text[m.end() : end].strip().rstrip(";"))
    return found


async def run(conn: AsyncConnection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the named statement on ``conn`` and return its rows as dicts."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(api_queries()[name], params)
        return await cur.fetchall() if cur.description else []
