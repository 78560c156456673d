"""The soak's HTTP client: every request it makes is journaled with its route, time and answer, and a
status board follows every export by reading the list route, as an operator's screen would.

A client-side failure (connection refused while the API restarts, a timeout) is recorded as an error,
never as a server answer: only a status the server sent counts as a 5xx.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from typing import Any

import httpx

MAX_PAGE = 500  # the list route's own limit
TERMINAL = frozenset({"Canceled", "Rejected", "Stopped", "Failed", "Completed", "OutcomeUnknown"})


@dataclass
class HttpRecord:
    """One request and what came back: a ``status`` from the server, or a client-side ``error``."""

    t: float
    method: str
    route: str
    job_id: str | None
    status: int | None
    error: str | None
    elapsed: float
    outcome: str | None = None
    retry_after: str | None = None
    detail: str | None = None


class ApiClient:
    """httpx over the API with a bearer token; ``journal`` holds every request made."""

    def __init__(self, base_url: str, token: str) -> None:
        self.http = httpx.AsyncClient(
            base_url=base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(30.0, connect=5.0),
            limits=httpx.Limits(max_connections=64, max_keepalive_connections=32),
        )
        self.journal: list[HttpRecord] = []

    async def aclose(self) -> None:
        await self.http.aclose()

    async def request(
        self,
        method: str,
        route: str,
        path: str,
        *,
        job_id: Any = None,
        json: Any = None,
        headers: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
    ) -> tuple[httpx.Response | None, HttpRecord]:
        """Send one request and journal it; the response is None when no answer came (the record says why)."""
        started = time.monotonic()
        t = time.time()
        try:
            response = await self.http.request(method, path, json=json, headers=headers, params=params)
        except httpx.HTTPError as exc:
            record = HttpRecord(
                t, method, route, _str(job_id), None, type(exc).__name__, time.monotonic() - started
            )
            self.journal.append(record)
            return None, record
        body: dict[str, Any] = {}
        with contextlib.suppress(ValueError):
            parsed = response.json()
            if isinstance(parsed, dict):
                body = parsed
        detail = body.get("detail") if response.status_code >= 400 else None
        record = HttpRecord(
            t,
            method,
            route,
            _str(job_id),
            response.status_code,
            None,
            time.monotonic() - started,
            outcome=body.get("outcome"),
            retry_after=response.headers.get("retry-after"),
            detail=str(detail)[:300] if detail is not None else None,
        )
        self.journal.append(record)
        return response, record


def _str(value: Any) -> str | None:
    return None if value is None else str(value)


class StatusBoard:
    """Follows the tenant's exports through ``GET /exports`` every ``every`` seconds; tasks wait on it
    for a job to reach a status. Jobs that fall off the list's page are read one by one."""

    def __init__(self, api: ApiClient, every: float = 0.25, page: int = 100, singles: int = 5) -> None:
        self.api = api
        self.every = every
        self.page = page
        self.singles = singles
        self._turn = 0
        self._pass = 0
        self.jobs: dict[str, dict[str, Any]] = {}
        self.watched: set[str] = set()
        self.history: dict[str, list[str]] = {}  # statuses each job was seen in, in order
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="status-board")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def status(self, job_id: str) -> str | None:
        job = self.jobs.get(job_id)
        return job["status"] if job else None

    def watch(self, job_id: str) -> None:
        self.watched.add(job_id)

    async def _update(self, rows: list[dict[str, Any]]) -> None:
        async with self._changed:
            for row in rows:
                job_id = row["id"]
                self.jobs[job_id] = row
                seen = self.history.setdefault(job_id, [])
                if not seen or seen[-1] != row["status"]:
                    seen.append(row["status"])
            self._changed.notify_all()

    async def _run(self) -> None:
        while True:
            started = time.monotonic()
            # One page deep enough for the open jobs (newest first), so few are left to read one by one.
            open_jobs = sum(1 for j in self.watched if self.status(j) not in TERMINAL)
            limit = max(self.page, min(MAX_PAGE, open_jobs + 50))
            response, _ = await self.api.request("GET", "GET /exports", "/exports", params={"limit": limit})
            listed: set[str] = set()
            if response is not None and response.status_code == 200:
                rows = response.json().get("exports", [])
                listed = {row["id"] for row in rows}
                await self._update(rows)
            # Watched jobs beyond the page (older ones still open) are read one by one, a few per pass.
            missing = sorted(j for j in self.watched if j not in listed and self.status(j) not in TERMINAL)
            self._pass += 1
            if self._pass % 4:
                missing = []  # a few single reads once a second, not every pass: the API is busy enough
            if missing:
                start = self._turn % len(missing)
                missing = (missing[start:] + missing[:start])[: self.singles]
                self._turn += self.singles
            for job_id in missing:
                single, _ = await self.api.request(
                    "GET", "GET /exports/{id}", f"/exports/{job_id}", job_id=job_id
                )
                if single is not None and single.status_code == 200:
                    await self._update([single.json()["export"]])
            await asyncio.sleep(max(0.0, self.every - (time.monotonic() - started)))

    async def wait_for(self, job_id: str, statuses: frozenset[str] | set[str], deadline: float) -> str | None:
        """Wait until the job is seen in one of ``statuses`` (or any terminal status); returns the status
        seen, or None at ``deadline`` (a monotonic time)."""
        self.watch(job_id)
        wanted = set(statuses) | TERMINAL
        async with self._changed:
            while True:
                status = self.status(job_id)
                if status in wanted:
                    return status
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 5.0))
