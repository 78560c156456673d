"""The one loader of SQL: every statement of the project lives in ``db/*.sql`` under a ``-- name:`` header.

``queries.sql`` holds the row protocol, one statement per transition; ``support.sql`` the rest (tokens,
display names, destinations, the builder's COPY, migrations' bookkeeping, administrators' seeding,
readiness, the scrape-time gauges). A name is defined once across both files. Statements run with named
parameters only, and rows come back typed through ``class_row``; ``fetch``, ``fetch_maybe`` and
``execute`` are where every statement of a running process goes, so they are where each one is traced
and timed (``observability.statements.observe_statement``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any, LiteralString, TypeVar

from psycopg import AsyncConnection, AsyncCursor, Connection
from psycopg.rows import class_row, dict_row

from observability.statements import observe_statement

_HEADER = re.compile(r"^-- name: (\w+)\n((?:-- .*\n)*)", re.MULTILINE)
SQL_FILES = ("queries.sql", "support.sql")
_WRITES = re.compile(r"\b(INSERT|UPDATE|DELETE|COPY|LOCK|BEGIN|COMMIT|SET|NOTIFY)\b", re.IGNORECASE)

Row = TypeVar("Row")


@dataclass(frozen=True)
class Query:
    """One named statement: its name, the description under its header, its text, and whether it changes
    anything (or locks rows to): only those get a span unless reads are traced."""

    name: str
    description: str
    sql: LiteralString
    file: str
    writes: bool = field(init=False)

    def __post_init__(self) -> None:
        # Read once, here: every statement a process runs asks, and the text is a few kilobytes of SQL.
        object.__setattr__(self, "writes", _WRITES.search(re.sub(r"--[^\n]*", "", self.sql)) is not None)


def _parse(file: str, text: str) -> list[Query]:
    matches = list(_HEADER.finditer(text))
    found = []
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(text)
        body = text[m.end() : end].strip()
        description = " ".join(line[3:].strip() for line in m.group(2).splitlines())
        sql: LiteralString = body.rstrip(";")  # a file of ours, never a value
        found.append(Query(m.group(1), description, sql, file))
    return found


@cache
def all_queries() -> dict[str, Query]:
    """Every named statement of every SQL file, by name; a name defined twice is an error."""
    found: dict[str, Query] = {}
    for file in SQL_FILES:
        for query in _parse(file, (resources.files("db") / file).read_text(encoding="utf-8")):
            if query.name in found:
                raise ValueError(f"statement {query.name} is defined twice")
            found[query.name] = query
    return found


def q(name: str) -> LiteralString:
    """The SQL text of the statement ``name``."""
    return all_queries()[name].sql


async def fetch(conn: AsyncConnection[Any], name: str, params: dict[str, Any], row: type[Row]) -> list[Row]:
    """Run the named statement with bound parameters; its rows as ``row`` instances (by column name).

    Observed: one span named after the statement (IDs, sizes and codes of its parameters only) and its
    latency in ``fenced_exports_statement_duration_seconds``, whether it answers or raises.
    """
    with observe_statement(name, params, writes=all_queries()[name].writes):
        async with conn.cursor(row_factory=class_row(row)) as cur:
            await cur.execute(q(name), params)
            # rownumber is None when the statement returned no rows to fetch; unlike description, it builds
            # no Column per field (the claim and the upload fence answer with the whole row)
            return await cur.fetchall() if cur.rownumber is not None else []


async def fetch_maybe(
    conn: AsyncConnection[Any], name: str, params: dict[str, Any], row: type[Row]
) -> Row | None:
    """Run the named statement; its first row as ``row``, or ``None``."""
    rows = await fetch(conn, name, params, row)
    return rows[0] if rows else None


async def execute(conn: AsyncConnection[Any], name: str, params: dict[str, Any]) -> int:
    """Run the named statement for its effect; the number of rows it returned or changed (observed as
    ``fetch``)."""
    with observe_statement(name, params, writes=all_queries()[name].writes):
        async with conn.cursor() as cur:
            await cur.execute(q(name), params)
            return cur.rowcount


async def send(
    conn: AsyncConnection[Any], name: str, params: dict[str, Any], row: type[Row] | None = None
) -> AsyncCursor[Any]:
    """Queue the named statement on a connection in pipeline mode and return its cursor: the statement
    goes out with the next ones, and its rows are read with ``fetchall()`` once the pipeline has synced."""
    cur = conn.cursor(row_factory=class_row(row)) if row is not None else conn.cursor()
    await cur.execute(q(name), params)
    return cur


def fetch_sync(conn: Connection[Any], name: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The blocking form, for administrators' scripts, migrations and the gauges' own connection: rows as
    dicts. Not observed: none of them runs the row protocol, and the gauges report their own duration."""
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(q(name), params)
        return cur.fetchall() if cur.rownumber is not None else []
