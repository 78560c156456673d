"""Delivery windows over the API (issue #25, item 2): an admin sets a destination's window (a recorded version,
not a delivery term), bad input is refused with a clear answer and changes nothing, and an export that waits
for the window says why and until when, in the partner's time zone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from domain.models import ClaimResult
from service.views import DeliveryWindowState


async def window_edit(client, acme, body: dict, version: int | None = None):
    current = (await client.get(f"/destinations/{acme.destination_id}", headers=acme.admin)).json()
    tag = version if version is not None else current["destination"]["version"]
    return await client.patch(
        f"/destinations/{acme.destination_id}",
        json={"reason": "the partner's intake hours", **body},
        headers={**acme.admin, "If-Match": f'"{tag}"'},
    )


async def test_an_admin_sets_a_window_as_a_recorded_version_that_forces_no_rebuild(client, acme):
    r = await window_edit(
        client,
        acme,
        {
            "intake_time_zone": "Europe/Berlin",
            "intake_hours": ["Mon-Fri 08:00-18:00"],
            "blackout_dates": ["2026-12-24", "2026-12-31"],
        },
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["delivery_changed"] is False
    assert body["changed_fields"] == ["blackout_dates", "intake_hours", "intake_time_zone"]
    assert "The delivery window applies from now on" in body["message"]
    shown = body["destination"]
    assert (shown["intake_time_zone"], shown["intake_hours"], shown["blackout_dates"]) == (
        "Europe/Berlin",
        ["Mon-Fri 08:00-18:00"],
        ["2026-12-24", "2026-12-31"],
    )
    assert "intake_week" not in shown  # the database's own reading of the hours is not shown

    r = await window_edit(client, acme, {"intake_hours": None})  # null: deliveries at any hour again
    assert r.status_code == 200 and r.json()["destination"]["intake_hours"] is None


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"intake_hours": ["Mon-Fri 8:00-18:00"]}, "intake_hours"),
        ({"intake_hours": []}, "intake_hours"),
        ({"intake_hours": ["Mon 08:00-08:00"]}, "opening and closing at different times"),
        ({"intake_time_zone": "Europe/Nowhere"}, "IANA time zone"),
        ({"intake_time_zone": "+02:00"}, "intake_time_zone"),
        ({"blackout_dates": ["24.12.2026"]}, "blackout_dates"),
    ],
)
async def test_a_bad_window_is_refused_with_a_clear_answer_and_changes_nothing(client, acme, body, says):
    before = (await client.get(f"/destinations/{acme.destination_id}", headers=acme.admin)).json()
    r = await window_edit(client, acme, body)
    assert r.status_code == 422, r.text
    assert says in r.text
    after = (await client.get(f"/destinations/{acme.destination_id}", headers=acme.admin)).json()
    assert after["destination"]["version"] == before["destination"]["version"]


async def test_a_waiting_export_says_why_and_when_the_window_opens(client, factory, worker_store, acme):
    job = await factory.queued(acme.id, acme.destination_id)
    await factory.close_window(acme.id, acme.destination_id)
    assert (
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "w")
        == ClaimResult.OUTSIDE_WINDOW
    )

    view = (await client.get(f"/exports/{job.id}", headers=acme.viewer)).json()

    [row] = await factory.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d")
    assert view["status_line"].startswith("Queued (v1): ")
    assert f"takes no deliveries today ({row['d']}, a blackout date in UTC)" in view["status_line"]
    assert "; next opening " in view["status_line"] and view["status_line"].endswith(" 00:00.")


def test_the_console_names_the_intake_hours_and_the_next_opening_in_the_partners_time_zone():
    friday_evening = datetime(2026, 11, 27, 17, 30, tzinfo=UTC)  # 18:30 in Berlin
    window = DeliveryWindowState(
        destination_name="partner-new",
        time_zone="Europe/Berlin",
        intake_hours=("Mon-Fri 08:00-18:00",),
        blackout_dates=(),
        checked_at=friday_evening,
        opens_at=datetime(2026, 11, 30, 7, 0, tzinfo=UTC),  # Monday 08:00 in Berlin
    )
    assert window.closed
    assert window.why_waiting() == (
        "outside partner-new's intake hours (Mon-Fri 08:00-18:00 Europe/Berlin); next opening Mon 08:00"
    )
    open_now = DeliveryWindowState("partner-new", "UTC", None, (), friday_evening, friday_evening)
    assert not open_now.closed
