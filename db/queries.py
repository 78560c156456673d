"""Loads the named statements of ``queries.sql``; each is run by the store function of the same name."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any, LiteralString, cast

from psycopg import AsyncConnection
from psycopg.rows import dict_row

_HEADER = re.compile(r"^-- name: (\w+)\n((?:-- .*\n)*)", re.MULTILINE)


@dataclass(frozen=True)
class Query:
    name: str
    description: str
    sql: LiteralString


@cache
def all_queries() -> dict[str, Query]:
    """Every named statement in ``queries.sql``, by name."""
    text = (resources.files("db") / "queries.sql").read_text(encoding="utf-8")
    found: dict[str, Query] = {}
    matches = list(_HEADER.finditer(text))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        description = " ".join(line[3:].strip() for line in m.group(2).splitlines())
        if m.group(1) in found:
            raise ValueError(f"statement {m.group(1)} is defined twice")
        found[m.group(1)] = Query(m.group(1), description, cast(LiteralString, body.rstrip(";")))
    return found


def q(name: str) -> LiteralString:
    """The SQL text of the statement ``name``."""
    return all_queries()[name].sql


async def fetch_all(conn: AsyncConnection, name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """Run the named statement with bound parameters and return its rows as dicts."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(q(name), params)
        return await cur.fetchall() if cur.description else []


async def fetch_one(conn: AsyncConnection, name: str, params: dict[str, Any]) -> dict[str, Any] | None:
    """Run the named statement and return its first row, or ``None``."""
    rows = await fetch_all(conn, name, params)
    return rows[0] if rows else None
