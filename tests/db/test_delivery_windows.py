"""Delivery windows per destination (issue #25, item 2; migration 0035) on the real server.

- The rule is stated once in SQL (``delivery_window_open``, ``next_window_opening``): held here to an
  independent reading of the same words (Python's ``zoneinfo``, a minute-by-minute scan) over hundreds of
  instants, across DST changes (a skipped hour, a repeated one, Lord Howe's half hour), overnight hours, a
  Sunday range that runs into Monday and blackout dates; and to named instants a person can check.
- The claim outside the window makes no attempt: the job stays Queued, waits for the next opening
  (``available_at``) and gets a wake-up deferred as long. The guard lets a Queued job's wait only grow, and
  only to its window's opening.
- Cutoff 2 refuses when the window closed during the build (WindowClosed), and the give-back is uncounted and
  waits for the next opening. A window edit and cutoff 2 serialize on the destination row (both orders).
- The rename fence is refused outside the window, and when the window closes within its look-ahead.
- A window is not a delivery term: changing it forces no rebuild.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from domain.models import (
    AuthorizationResult,
    ClaimResult,
    EventKind,
    FenceResult,
    JobStatus,
    ReleaseCause,
    ReleaseResult,
)
from service.destinations import INTAKE_HOURS_PATTERN
from tests.db.race import authorize, authorize_params, matched, still_waiting

DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


# -- an independent reading of the rule, for the tests alone --------------------------------------------


def _ranges(entry: str) -> list[tuple[int, int]]:
    """An entry's ranges in minutes of the week (the words of migration 0035, read again in Python)."""
    days, hours = entry.split(" ")
    opens, closes = hours.split("-")
    o = int(opens[:2]) * 60 + int(opens[3:])
    c = int(closes[:2]) * 60 + int(closes[3:])
    if c <= o:
        c += 1440
    out = []
    for part in days.split(","):
        first, _, last = part.partition("-")
        d, e = DAYS.index(first), DAYS.index(last or first)
        while True:
            out.append((d * 1440 + o, d * 1440 + c))
            if d == e:
                break
            d = (d + 1) % 7
    return out


def oracle_open(hours: list[str] | None, tz: str, blackouts: set[date], at: datetime) -> bool:
    if hours is None and not blackouts:
        return True
    wall = at.astimezone(ZoneInfo(tz))
    if wall.date() in blackouts:
        return False
    if hours is None:
        return True
    minute = wall.weekday() * 1440 + wall.hour * 60 + wall.minute
    return any(o <= m < c for e in hours for o, c in _ranges(e) for m in (minute, minute + 10080))


def oracle_next(hours: list[str] | None, tz: str, blackouts: set[date], at: datetime) -> datetime | None:
    """The first instant at or after ``at`` when it is open: every boundary is on a whole minute."""
    if oracle_open(hours, tz, blackouts, at):
        return at
    t = at.replace(second=0, microsecond=0) + timedelta(minutes=1)
    for _ in range(60 * 24 * 9):
        if oracle_open(hours, tz, blackouts, t):
            return t
        t += timedelta(minutes=1)
    return None


async def window_destination(factory, hours: list[str] | None, tz: str, blackouts: list[date]) -> uuid.UUID:
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    await factory.change_destination(
        tenant_id, destination_id, intake_hours=hours, intake_time_zone=tz, blackout_dates=blackouts
    )
    return destination_id


async def sql_window(factory, destination_id: uuid.UUID, at: datetime) -> tuple[bool, datetime | None]:
    [found] = await factory.admin(
        "SELECT delivery_window_open(d, %(at)s) AS open, next_window_opening(d, %(at)s) AS opens_at"
        " FROM destinations d WHERE d.id = %(d)s",
        {"at": at, "d": destination_id},
    )
    return found["open"], found["opens_at"]


# -- the rule --------------------------------------------------------------------------------------------

WINDOWS = [
    pytest.param(["Mon-Fri 08:00-18:00"], "Europe/Berlin", [], id="office-hours-berlin"),
    pytest.param(["Mon-Fri 22:00-06:00"], "Europe/Berlin", [date(2026, 3, 30)], id="overnight-with-blackout"),
    pytest.param(["Sun 02:30-04:00", "Sun 01:00-02:15"], "Europe/Berlin", [], id="berlin-skipped-hour"),
    pytest.param(["Sat,Sun 02:00-02:30"], "Europe/Berlin", [], id="berlin-repeated-hour"),
    pytest.param(["Sun 22:00-02:00"], "America/New_York", [], id="sunday-into-monday"),
    pytest.param(None, "Australia/Lord_Howe", [date(2026, 4, 5), date(2026, 4, 6)], id="blackouts-only"),
    pytest.param(["Mon-Sun 02:15-02:45"], "Australia/Lord_Howe", [], id="half-hour-dst"),
    pytest.param(["Fri-Mon 00:00-24:00"], "Asia/Tokyo", [date(2026, 3, 28)], id="wrapping-days"),
]

# Around both DST changes of 2026 in Europe and North America, and Lord Howe's (5 April, 4 October).
AROUND = [
    datetime(2026, 3, 7, tzinfo=UTC),
    datetime(2026, 3, 27, tzinfo=UTC),
    datetime(2026, 4, 3, tzinfo=UTC),
    datetime(2026, 10, 2, tzinfo=UTC),
    datetime(2026, 10, 23, tzinfo=UTC),
    datetime(2026, 10, 30, tzinfo=UTC),
]


@pytest.mark.parametrize(("hours", "tz", "blackouts"), WINDOWS)
async def test_the_window_and_its_next_opening_agree_with_the_wall_clock_at_every_instant(
    factory, hours, tz, blackouts
):
    destination_id = await window_destination(factory, hours, tz, blackouts)
    rng = random.Random(f"{hours}{tz}")
    checked = 0
    for start in AROUND:
        for _ in range(8):
            at = start + timedelta(seconds=rng.randrange(0, 4 * 86400), microseconds=rng.randrange(10**6))
            expected = (
                oracle_open(hours, tz, set(blackouts), at),
                oracle_next(hours, tz, set(blackouts), at),
            )
            assert await sql_window(factory, destination_id, at) == expected, at
            checked += 1
    assert checked == 48


BERLIN = ZoneInfo("Europe/Berlin")


@pytest.mark.parametrize(
    ("hours", "at", "expected"),
    [
        # the clock jumps from 02:00 to 03:00 on 29 March 2026: hours 02:30-04:00 open at 03:00 local
        (
            ["Sun 02:30-04:00"],
            datetime(2026, 3, 29, 0, 0, tzinfo=UTC),
            datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        ),
        # it falls back from 03:00 to 02:00 on 25 October: hours 02:00-02:30 open twice that night
        (
            ["Sun 02:00-02:30"],
            datetime(2026, 10, 24, 23, 0, tzinfo=UTC),
            datetime(2026, 10, 25, 0, 0, tzinfo=UTC),
        ),
        (
            ["Sun 02:00-02:30"],
            datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
            datetime(2026, 10, 25, 1, 0, tzinfo=UTC),
        ),
        # hours 01:30-02:30 close at 02:30 summer time and open again when 03:00 becomes 02:00 winter time
        (
            ["Sun 01:30-02:30"],
            datetime(2026, 10, 25, 0, 45, tzinfo=UTC),
            datetime(2026, 10, 25, 1, 0, tzinfo=UTC),
        ),
        # office hours: Friday evening waits for Monday 08:00
        (
            ["Mon-Fri 08:00-18:00"],
            datetime(2026, 11, 27, 18, 0, tzinfo=BERLIN),
            datetime(2026, 11, 30, 8, 0, tzinfo=BERLIN),
        ),
        # overnight: Tuesday 05:59 is still Monday night's window
        (
            ["Mon 22:00-06:00"],
            datetime(2026, 12, 1, 5, 59, tzinfo=BERLIN),
            datetime(2026, 12, 1, 5, 59, tzinfo=BERLIN),
        ),
    ],
)
async def test_named_instants_across_dst_and_overnight(factory, hours, at, expected):
    destination_id = await window_destination(factory, hours, "Europe/Berlin", [])
    assert (await sql_window(factory, destination_id, at))[1] == expected


async def test_a_blackout_date_closes_the_whole_local_day_and_the_window_opens_after_it(factory):
    # 24 December 2026 is a Thursday: closed all day in Berlin, open again on Friday at 08:00
    destination_id = await window_destination(
        factory, ["Mon-Fri 08:00-18:00"], "Europe/Berlin", [date(2026, 12, 24)]
    )
    noon = datetime(2026, 12, 24, 12, 0, tzinfo=BERLIN)
    assert await sql_window(factory, destination_id, noon) == (
        False,
        datetime(2026, 12, 25, 8, 0, tzinfo=BERLIN),
    )


async def test_a_destination_without_a_window_is_always_open(factory):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    at = datetime(2026, 12, 24, 3, 0, tzinfo=UTC)
    assert await sql_window(factory, destination_id, at) == (True, at)


ENTRIES = [
    ("Mon-Fri 08:00-18:00", True),
    ("Sat,Sun 10:00-12:00", True),
    ("Mon-Fri 22:00-06:00", True),
    ("Sun 00:00-24:00", True),
    ("Fri-Mon 09:30-10:45", True),
    ("Mon,Wed-Fri 23:59-00:01", True),
    ("Mon-Fri 8:00-18:00", False),
    ("mon-fri 08:00-18:00", False),
    ("Mon-Fri 08:00-24:01", False),
    ("Mon-Fri 24:00-08:00", False),
    ("Mon-Fri 08:00 - 18:00", False),
    ("Monday 08:00-18:00", False),
    ("Mon-Fri", False),
    ("Mon,,Tue 08:00-09:00", False),
    ("", False),
]


@pytest.mark.parametrize(("entry", "well_formed"), ENTRIES)
async def test_the_api_pattern_and_the_database_read_intake_hours_alike(factory, entry, well_formed):
    # The API's pattern (a clear 422 before anything is written) and the column's check agree on each entry.
    assert bool(re.fullmatch(INTAKE_HOURS_PATTERN, entry)) is well_formed
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    if well_formed:
        await factory.change_destination(tenant_id, destination_id, intake_hours=[entry])
    else:
        with pytest.raises(Exception) as refused:
            await factory.change_destination(tenant_id, destination_id, intake_hours=[entry])
        assert getattr(refused.value, "constraint", None) == "ck_destinations_intake_hours"


async def test_an_entry_that_opens_and_closes_at_the_same_minute_is_refused_by_the_database(factory):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    with pytest.raises(Exception) as refused:
        await factory.change_destination(tenant_id, destination_id, intake_hours=["Mon 08:00-08:00"])
    assert getattr(refused.value, "constraint", None) == "ck_destinations_intake_hours"


@pytest.mark.parametrize("tz", ["+02", "UTC+3", "Europe/Nowhere", "europe berlin"])
async def test_only_an_iana_time_zone_is_taken(factory, tz):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    with pytest.raises(Exception) as refused:
        await factory.change_destination(tenant_id, destination_id, intake_time_zone=tz)
    assert getattr(refused.value, "constraint", None) == "ck_destinations_intake_time_zone"


async def test_a_window_is_not_a_delivery_term_and_forces_no_rebuild(factory):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    await factory.change_destination(
        tenant_id,
        destination_id,
        intake_hours=["Mon-Fri 08:00-18:00"],
        intake_time_zone="Europe/Berlin",
        blackout_dates=["2026-12-24"],
    )
    [found] = await factory.admin(
        "SELECT d.version, d.delivery_version, v.changed_fields, v.delivery_changed FROM destinations d"
        " JOIN destination_versions v ON v.destination_id = d.id AND v.version = d.version WHERE d.id = %(d)s",
        {"d": destination_id},
    )
    assert (found["version"], found["delivery_version"], found["delivery_changed"]) == (2, 1, False)
    assert found["changed_fields"] == ["blackout_dates", "intake_hours", "intake_time_zone"]


# -- the claim -------------------------------------------------------------------------------------------


async def test_a_claim_outside_the_window_makes_no_attempt_and_the_job_waits_for_the_next_opening(
    factory, worker_store
):
    job = await factory.queued()
    opens_at = await factory.close_window(job.tenant_id, job.destination_id)
    outbox_before = await factory.outbox_count(job.id)

    answer = await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")

    assert answer == ClaimResult.OUTSIDE_WINDOW
    row = await factory.job(job.id)
    assert (row.status, row.attempt_id, row.attempt_count, row.available_at) == (
        JobStatus.QUEUED,
        None,
        0,
        opens_at,
    )
    assert await worker_store.job_events(job.id) == []  # no attempt, no event
    [deferred] = await factory.admin(
        "SELECT available_at, published_at FROM outbox WHERE job_id = %(j)s AND available_at IS NOT NULL",
        {"j": job.id},
    )
    assert deferred == {"available_at": opens_at, "published_at": None}  # woken at the opening
    assert await factory.outbox_count(job.id) == outbox_before + 1

    # Another wake-up meanwhile finds it waiting: nothing is claimed, and nothing new is deferred.
    assert (
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "worker-3")
        == ClaimResult.NOT_YET
    )
    assert await factory.outbox_count(job.id) == outbox_before + 1
    facts = await worker_store.read_policy_facts(job.id)
    assert facts is not None and facts.available is False


async def test_once_the_window_is_open_the_claim_at_its_opening_claims(factory, worker_store):
    job = await factory.queued()
    await factory.close_window(job.tenant_id, job.destination_id)
    assert (
        await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "w")
        == ClaimResult.OUTSIDE_WINDOW
    )
    # The partner takes deliveries again, and the opening's time has come (a clock on the row, as a test may).
    await factory.change_destination(job.tenant_id, job.destination_id, blackout_dates=[])
    await factory.end_wait(job.id)
    assert await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "w") == ClaimResult.CLAIMED


async def test_a_paused_scope_answers_paused_before_the_window_and_defers_nothing(factory, worker_store):
    job = await factory.queued()
    await factory.close_window(job.tenant_id, job.destination_id)
    await factory.switch(job.tenant_id, job.destination_id, enabled=False)
    assert await worker_store.claim_if_queued(job.id, job.version, uuid.uuid4(), "w") == ClaimResult.PAUSED
    assert (await factory.job(job.id)).available_at is None  # the resume wakes it, and its claim defers it


async def test_the_guard_lets_a_queued_job_wait_only_for_its_window_and_never_less(factory):
    job = await factory.queued()
    by_hand = "UPDATE export_jobs SET available_at = %(at)s WHERE id = %(j)s"
    later = datetime.now(UTC) + timedelta(days=3)
    # The window is open: no writer makes a Queued job wait, a superuser's repair included (0016's rule).
    with pytest.raises(psycopg.errors.CheckViolation, match="give-back"):
        await factory.admin(by_hand, {"at": later, "j": job.id})
    opens_at = await factory.close_window(job.tenant_id, job.destination_id)
    # Closed: only to an instant when it is open (the blackout's days are not), and never sooner than a wait.
    with pytest.raises(psycopg.errors.CheckViolation, match="give-back"):
        await factory.admin(by_hand, {"at": opens_at - timedelta(hours=1), "j": job.id})
    await factory.admin(by_hand, {"at": opens_at, "j": job.id})
    with pytest.raises(psycopg.errors.CheckViolation, match="give-back"):
        await factory.admin("UPDATE export_jobs SET available_at = NULL WHERE id = %(j)s", {"j": job.id})
    assert (await factory.job(job.id)).available_at == opens_at


# -- cutoff 2 --------------------------------------------------------------------------------------------


async def test_cutoff_2_refuses_when_the_window_closed_during_the_build_and_the_give_back_waits_uncounted(
    factory, worker_store
):
    job, attempt = await factory.running()
    opens_at = await factory.close_window(job.tenant_id, job.destination_id)

    assert await authorize(worker_store, job, attempt) == AuthorizationResult.WINDOW_CLOSED
    assert await factory.status(job.id) == JobStatus.RUNNING

    released = await worker_store.release_attempt_if_running(
        job.id, attempt, "worker-3", "cutoff 2: the delivery window closed", ReleaseCause.WINDOW_CLOSED
    )
    assert released == ReleaseResult.RELEASED
    row = await factory.job(job.id)
    assert (row.status, row.attempts_released, row.transient_releases, row.available_at) == (
        JobStatus.QUEUED,
        1,
        0,  # not counted: nobody's failure
        opens_at,  # but it waits for the next opening
    )
    [event] = [e for e in await worker_store.job_events(job.id) if e.kind == EventKind.RELEASED]
    assert event.detail is not None and event.detail.startswith("window_closed: cutoff 2:")
    assert "the next claim waits until 00:00:00.000 UTC" in event.detail
    [deferred] = await factory.admin(
        "SELECT available_at FROM outbox WHERE job_id = %(j)s AND available_at IS NOT NULL", {"j": job.id}
    )
    assert deferred["available_at"] == opens_at


async def test_a_window_edit_held_open_makes_cutoff_2_wait_then_refuse(factory, kit):
    job, attempt = await factory.running()
    [today] = await factory.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d")
    editing = await kit.hold("exports_api")
    [edited] = await editing.run(
        "edit_destination_if_version",
        {
            "tenant_id": job.tenant_id,
            "destination_id": job.destination_id,
            "expected_version": 1,
            "changes": json.dumps({"blackout_dates": [str(today["d"]), str(today["d"] + timedelta(days=1))]}),
            "changed_by": "ada.admin",
            "changed_role": "admin",
            "reason": "the partner closes for its audit",
        },
    )
    assert edited["matched"]

    worker = await kit.solo("exports_worker")
    authorizing = asyncio.create_task(authorize(worker.store, job, attempt))
    await kit.wait_until_blocked_by(worker.pid, editing.pid)
    await still_waiting(authorizing)

    await editing.commit()
    assert await authorizing == AuthorizationResult.WINDOW_CLOSED
    assert await factory.status(job.id) == JobStatus.RUNNING


async def test_cutoff_2_held_open_makes_a_window_edit_wait_and_authorizes_inside_the_window(factory, kit):
    job, attempt = await factory.running()
    cutoff = await kit.hold("exports_worker")
    assert matched(await cutoff.run("authorize_delivery_if_running", authorize_params(job, attempt)))

    editor = await kit.solo("exports_api")
    [today] = await factory.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d")
    editing = asyncio.create_task(
        editor.store.edit_destination_if_version(
            tenant_id=job.tenant_id,
            destination_id=job.destination_id,
            expected_version=1,
            changes={"blackout_dates": [str(today["d"])]},
            changed_by="ada.admin",
            changed_role="admin",
            reason="the partner closes for its audit",
        )
    )
    await kit.wait_until_blocked_by(editor.pid, cutoff.pid)
    await still_waiting(editing)

    await cutoff.commit()
    assert (await editing).matched
    # Authorized while it was open; the closed window now keeps its rename from being sent (the fence below).
    assert await factory.status(job.id) == JobStatus.DELIVERING


# -- the rename fence ------------------------------------------------------------------------------------


async def fenced_upload(factory, worker_store):
    job, attempt = await factory.delivering()
    assert await worker_store.fence_upload_if_delivering(job.id, attempt) == FenceResult.FENCED
    return job, attempt


async def test_the_rename_fence_is_refused_outside_the_window_so_no_rename_is_sent(factory, worker_store):
    job, attempt = await fenced_upload(factory, worker_store)
    await factory.close_window(job.tenant_id, job.destination_id)

    assert await worker_store.fence_rename_if_delivering(job.id, attempt) == FenceResult.OUTSIDE_WINDOW
    row = await factory.job(job.id)
    assert (row.status, row.rename_fenced_at) == (JobStatus.DELIVERING, None)
    kinds = [e.kind for e in await worker_store.job_events(job.id)]
    assert EventKind.RENAME_FENCED not in kinds

    # Open again: the same attempt's fence is written (its lease is still current).
    await factory.change_destination(job.tenant_id, job.destination_id, blackout_dates=[])
    assert await worker_store.fence_rename_if_delivering(job.id, attempt) == FenceResult.FENCED


async def test_the_rename_fence_looks_ahead_so_a_window_closing_before_the_rename_arrives_refuses_it(
    factory, worker_store, kit
):
    job, attempt = await fenced_upload(factory, worker_store)
    [today] = await factory.admin("SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date AS d")
    tomorrow = today["d"] + timedelta(days=1)
    day_after = today["d"] + timedelta(days=2)
    # Open now; closed tomorrow and the day after (UTC): a look-ahead of two days lands inside the blackout
    await factory.change_destination(job.tenant_id, job.destination_id, blackout_dates=[tomorrow, day_after])
    fence = await kit.hold("exports_worker")
    params: dict[str, Any] = {"job_id": job.id, "attempt_id": attempt, "window_margin_seconds": 2 * 86400.0}
    [refused] = await fence.run("fence_rename_if_delivering", params)
    assert (refused["matched"], refused["window_open"]) == (False, False)
    [fenced] = await fence.run("fence_rename_if_delivering", {**params, "window_margin_seconds": 5.0})
    assert fenced["matched"]
    await fence.rollback()
