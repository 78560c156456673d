"""The database side of the scrape-time gauges: one connection of their own and one named statement
(``read_database_gauges`` in ``support.sql``), blocking, because the metrics exposition runs in a thread.

The collector (``observability.db_gauges``) owns the caching and the Prometheus families; this module owns
the SQL, the role the query runs as and its ``statement_timeout``, and translates driver errors at the
one boundary (:func:`db.errors.translate`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import psycopg

from db.errors import translate
from db.queries import fetch_sync

# A job given back for failures this many times is "released again and again" (the alert's gauge).
RELEASED_OFTEN = 3


@dataclass(frozen=True)
class GaugeValues:
    """One answer of ``read_database_gauges``; counts stop at the reader's ``count_cap``."""

    queued: int
    running: int
    delivering: int
    outcome_unknown: int
    running_expired: int
    delivering_expired: int
    delivering_waiting_for_resume: int  # expired, settled only by its partner, whose deliveries are paused
    running_expired_oldest_age: float
    delivering_expired_oldest_age: float
    queued_oldest_age: float
    queued_oldest_wake_up_age: float
    queued_max_sweep_count: int
    outbox_unpublished: int
    outbox_oldest_age: float
    outcome_unknown_oldest_age: float
    released_repeatedly: int  # jobs in flight given back for failures at least ``released_often`` times

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> GaugeValues:
        return cls(**{f.name: row[f.name] for f in fields(cls)})


class GaugesReader:
    """Runs the gauges query on a connection of its own, opened on first use, as ``role``.

    ``read`` raises a :class:`db.errors.StoreError` (``TransientStoreError`` when the database does not
    answer) and closes the connection, so the next read opens a new one. Not thread-safe: its caller
    serializes reads.
    """

    def __init__(
        self,
        url: str,
        *,
        role: str = "exports_worker",
        count_cap: int = 100_000,
        unknown_probe: int = 100,
        released_often: int = RELEASED_OFTEN,
        statement_timeout_ms: int = 2_000,
        connect_timeout_seconds: int = 3,
    ) -> None:
        self.url = url
        self.role = role
        self.params = {"cap": count_cap, "unknown_probe": unknown_probe, "released_often": released_often}
        self.statement_timeout_ms = statement_timeout_ms
        self.connect_timeout_seconds = connect_timeout_seconds
        self._conn: psycopg.Connection[Any] | None = None

    def _connect(self) -> psycopg.Connection[Any]:
        conn = psycopg.connect(
            self.url,
            autocommit=True,
            connect_timeout=self.connect_timeout_seconds,
            application_name="fenced-exports:metrics",
        )
        fetch_sync(
            conn,
            "configure_gauges_session",
            {"role": self.role, "statement_timeout": f"{int(self.statement_timeout_ms)}ms"},
        )
        return conn

    def read(self) -> GaugeValues:
        """One answer of the gauges query."""
        try:
            if self._conn is None or self._conn.closed:
                self._conn = self._connect()
            rows = fetch_sync(self._conn, "read_database_gauges", self.params)
        except psycopg.Error as exc:
            self.close()
            raise translate(exc) from exc
        return GaugeValues.from_row(rows[0])

    def close(self) -> None:
        """Close the connection (at shutdown, or after an error); a later read opens a new one."""
        if self._conn is not None:
            try:
                self._conn.close()
            except psycopg.Error:
                pass
            self._conn = None
