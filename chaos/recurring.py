"""The soak's recurring exports (issue 25, item 1): an admin defines a few recurring exports through the API
at the start of the load (every minute, the smallest interval), their Schedules fire on the workers while the
faults run, and duplicate firings are forced by backfilling one past nominal time of each twice through
Temporal. At the end of the load they are deleted through the API (which answers that the exports they made
are untouched), so the run can settle. The auditor then checks that no firing created two exports."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from temporalio.client import Client, ScheduleBackfill, ScheduleOverlapPolicy

from chaos.client import ApiClient
from domain.recurring import schedule_id_for

ADMIN = "chaos.admin"
EVERY_SECONDS = 60


@dataclass
class RecurringRecords:
    """What the soak asked for: the recurring exports defined, the backfills sent, the deletions' answers."""

    defined: list[str] = field(default_factory=list)
    backfills: list[tuple[str, str]] = field(default_factory=list)  # (recurring export, nominal time)
    deletions: dict[str, int | None] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


class RecurringLoad:
    """Defines ``count`` recurring exports of ``list_name``, fires duplicates, deletes them at the end."""

    def __init__(
        self, api: ApiClient, client: Client, destination_id: str, *, count: int, list_name: str
    ) -> None:
        self.api = api
        self.client = client
        self.destination_id = destination_id
        self.count = count
        self.list_name = list_name
        self.records = RecurringRecords()

    async def define(self) -> None:
        for _ in range(self.count):
            response, _ = await self.api.request(
                "POST",
                "/recurring-exports",
                "/recurring-exports",
                json={
                    "destination_id": self.destination_id,
                    "list_name": self.list_name,
                    "interval_seconds": EVERY_SECONDS,
                    "time_zone": "UTC",
                },
            )
            if response is not None and response.status_code == 201:
                self.records.defined.append(response.json()["recurring_export"]["id"])
            else:
                self.records.errors.append(
                    f"define answered {response.status_code if response else 'nothing'}"
                )

    async def duplicates(self, until: float) -> None:
        """Backfill one past nominal time of each recurring export twice, a few times during the load."""
        rounds = 0
        while time.monotonic() < until and rounds < 3:
            rounds += 1
            nominal = datetime.now(UTC).replace(second=0, microsecond=0) - timedelta(minutes=10 + rounds)
            for recurring_id in self.records.defined:
                handle = self.client.get_schedule_handle(schedule_id_for(uuid.UUID(recurring_id)))
                backfill = ScheduleBackfill(
                    start_at=nominal - timedelta(seconds=1),
                    end_at=nominal + timedelta(seconds=1),
                    overlap=ScheduleOverlapPolicy.ALLOW_ALL,
                )
                for _ in range(2):
                    try:
                        await handle.backfill(backfill)
                        self.records.backfills.append((recurring_id, nominal.isoformat()))
                    except Exception as exc:  # noqa: BLE001 - Temporal may be down under a fault: recorded
                        self.records.errors.append(f"backfill: {type(exc).__name__}")
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(min(20.0, max(0.0, until - time.monotonic())))

    async def delete_all(self) -> None:
        for recurring_id in self.records.defined:
            for _ in range(5):  # the API may be restarting under a fault
                response, _ = await self.api.request(
                    "DELETE", "/recurring-exports/{id}", f"/recurring-exports/{recurring_id}", headers=None
                )
                self.records.deletions[recurring_id] = response.status_code if response else None
                if response is not None and response.status_code == 200:
                    break
                await asyncio.sleep(2)

    def summary(self) -> dict[str, Any]:
        return {
            "defined": len(self.records.defined),
            "backfills": len(self.records.backfills),
            "deleted": sum(1 for s in self.records.deletions.values() if s == 200),
            "errors": self.records.errors[:20],
        }
