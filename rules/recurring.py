"""Recurring exports: what a definition may say, and what one firing does. Pure decisions, no I/O.

A definition names a cron expression (five fields, or a macro such as ``@daily``) or an interval (a minute to
366 days), an IANA timezone, and an optional start and end; :func:`definition_problems` says, field by field,
what is wrong with one, so the API answers 422 and stores nothing.

A firing (the Temporal Schedule's action, for one nominal fire time) reads its facts under a lock on its
recurring export's row and asks :func:`decide_firing`: create the export through the same idempotent create
as ``POST /exports``, or skip it and record why. The policy part is the claim's own (:func:`rules.policy
.evaluate_policy`); the claim still decides for the export itself, since a contract or a switch can change
after the firing.
"""

from __future__ import annotations

import re
import zoneinfo
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from functools import cache
from uuid import UUID

from domain.controls import PolicyFacts
from domain.recurring import SkipReason
from rules.policy import evaluate_policy

MIN_INTERVAL_SECONDS = 60
MAX_INTERVAL_SECONDS = 366 * 86400
MAX_CRON = 200

MACROS = frozenset({"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"})
_MONTHS = {m: i + 1 for i, m in enumerate("jan feb mar apr may jun jul aug sep oct nov dec".split())}
_DAYS = {d: i for i, d in enumerate("sun mon tue wed thu fri sat".split())}
# (name, lowest, highest, names) of the five fields, in order
_FIELDS: tuple[tuple[str, int, int, dict[str, int]], ...] = (
    ("minute", 0, 59, {}),
    ("hour", 0, 23, {}),
    ("day of month", 1, 31, {}),
    ("month", 1, 12, _MONTHS),
    ("day of week", 0, 6, _DAYS),
)
_ATOM = re.compile(r"^(\*|[0-9a-z]+(?:-[0-9a-z]+)?)(?:/([0-9]+))?$")


def _value(text: str, low: int, high: int, names: dict[str, int], field: str) -> int:
    if text.isdigit():
        number = int(text)
    elif text in names:
        number = names[text]
    else:
        raise ValueError(f"{field}: {text!r} is not a number" + (" or a name" if names else ""))
    if not low <= number <= high:
        raise ValueError(f"{field}: {number} is outside {low}-{high}")
    return number


def cron_problem(expression: str) -> str | None:
    """Why ``expression`` is not a cron expression a recurring export may use, or ``None`` when it is.

    Five fields (minute, hour, day of month, month, day of week) of ``*``, numbers, names (``jan``,
    ``mon``), ranges ``a-b``, steps ``/n`` and lists ``a,b``; or one of the macros (``@daily``, ...). The
    timezone is a field of its own, so ``CRON_TZ=`` is refused; seconds and years are not offered.
    """
    text = expression.strip().lower()
    if not text:
        return "give a cron expression, e.g. '0 2 * * *' (every day at 02:00)"
    if len(expression) > MAX_CRON:
        return f"at most {MAX_CRON} characters"
    if text.startswith(("cron_tz=", "tz=")):
        return "give the timezone in time_zone, not in the expression"
    if text.startswith("@"):
        return None if text in MACROS else f"{text!r} is not one of {', '.join(sorted(MACROS))}"
    fields = text.split()
    if len(fields) != len(_FIELDS):
        return (
            f"{len(fields)} fields; a cron expression has five: minute hour day-of-month month day-of-week "
            "(e.g. '0 2 * * *')"
        )
    try:
        for part, (field, low, high, names) in zip(fields, _FIELDS, strict=True):
            for item in part.split(","):
                atom = _ATOM.match(item)
                if atom is None:
                    raise ValueError(f"{field}: {item!r} is not a value, a range or a step")
                span, step = atom.groups()
                if step is not None and int(step) == 0:
                    raise ValueError(f"{field}: a step of 0")
                if span != "*":
                    first, _, last = span.partition("-")
                    start = _value(first, low, high, names, field)
                    if last and _value(last, low, high, names, field) < start:
                        raise ValueError(f"{field}: the range {span} runs backwards")
    except ValueError as exc:
        return str(exc)
    return None


@cache
def _zones() -> frozenset[str]:
    return frozenset(zoneinfo.available_timezones())


def time_zone_problem(name: str) -> str | None:
    """Why ``name`` is not an IANA timezone name (``Europe/Berlin``, ``UTC``), or ``None`` when it is."""
    if name in _zones():
        return None
    return f"{name!r} is not an IANA timezone name, e.g. 'Europe/Berlin' or 'UTC'"


def interval_problem(seconds: int) -> str | None:
    """Why an interval of ``seconds`` is refused (a minute to 366 days), or ``None``."""
    if MIN_INTERVAL_SECONDS <= seconds <= MAX_INTERVAL_SECONDS:
        return None
    return f"between {MIN_INTERVAL_SECONDS} seconds and {MAX_INTERVAL_SECONDS} seconds (366 days)"


def definition_problems(
    *,
    cron: str | None,
    interval_seconds: int | None,
    time_zone: str,
    starts_at: datetime | None,
    ends_at: datetime | None,
) -> dict[str, str]:
    """Every problem of a definition, by field; empty when it may be stored."""
    problems: dict[str, str] = {}
    if (cron is None) == (interval_seconds is None):
        problems["cron"] = "give either cron or interval_seconds, not both and not neither"
    elif cron is not None and (why := cron_problem(cron)) is not None:
        problems["cron"] = why
    elif interval_seconds is not None and (why := interval_problem(interval_seconds)) is not None:
        problems["interval_seconds"] = why
    if (why := time_zone_problem(time_zone)) is not None:
        problems["time_zone"] = why
    for name, value in (("starts_at", starts_at), ("ends_at", ends_at)):
        if value is not None and value.tzinfo is None:
            problems[name] = "give a time with its UTC offset, e.g. 2026-01-01T02:00:00+01:00"
    if "starts_at" not in problems and "ends_at" not in problems and starts_at and ends_at:
        if ends_at <= starts_at:
            problems["ends_at"] = "must be after starts_at"
    return problems


# -- one firing -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FiringFacts:
    """What a firing decides from, read under the lock on its recurring export's row (db: ``lock_recurring_
    export_for_firing``): the definition as it is now, the policy's facts for its terms, whether its scope's
    switches are open, its previous export if still live, and how late this firing is."""

    recurring_export_id: UUID
    paused: bool
    paused_reason: str | None
    deleted_at: datetime | None
    starts_at: datetime | None
    ends_at: datetime | None
    policy: PolicyFacts
    paused_scope: str | None  # 'global', 'tenant' or 'destination': the first paused switch, for the message
    paused_scope_reason: str | None
    live_job_id: UUID | None  # the latest export this recurring export created, if Queued/Running/Delivering
    live_job_status: str | None
    late: bool  # recorded later than the lateness bound after its nominal time (a missed firing)
    late_runs: int  # late firings that created an export since the latest firing on time


@dataclass(frozen=True)
class FiringDecision:
    """Create the export, or skip with a reason and the message people read (``job_id``: the live export
    an overlap waited for)."""

    create: bool
    reason: SkipReason | None = None
    message: str = ""
    job_id: UUID | None = None


def _skip(reason: SkipReason, message: str, job_id: UUID | None = None) -> FiringDecision:
    return FiringDecision(False, reason, f"Skipped: {message}; nothing was queued.", job_id)


def _day(value: date | datetime) -> str:
    return (value.date() if isinstance(value, datetime) else value).isoformat()


def _where(scope: str, destination: str) -> str:
    return {"global": "for every tenant", "tenant": "for this tenant"}.get(scope, f"to {destination}")


def decide_firing(facts: FiringFacts, nominal_time: datetime, *, catchup_firings: int) -> FiringDecision:
    """What one firing of ``nominal_time`` does. In this order, the first that applies wins: the recurring
    export was deleted or is paused; the nominal time is outside its start and end (a backfill); the claim's
    policy refuses its terms (destination retired, contract not started or ended, creator revoked or not
    permitted; the list's contacts are the claim's to check, the API role may not read them); a delivery
    switch of its scope is paused; its previous export is still live (overlap); it is a missed firing beyond
    the ``catchup_firings`` run after an outage. Otherwise: create."""
    if facts.deleted_at is not None:
        return _skip(
            SkipReason.RECURRING_DELETED, f"this recurring export was deleted on {_day(facts.deleted_at)}"
        )
    if facts.paused:
        why = f" ({facts.paused_reason})" if facts.paused_reason else ""
        return _skip(SkipReason.RECURRING_PAUSED, f"this recurring export is paused{why}")
    if facts.starts_at is not None and nominal_time < facts.starts_at:
        return _skip(SkipReason.OUTSIDE_WINDOW, f"{nominal_time.isoformat()} is before its start")
    if facts.ends_at is not None and nominal_time > facts.ends_at:
        return _skip(SkipReason.OUTSIDE_WINDOW, f"{nominal_time.isoformat()} is after its end")
    # The list's contacts are the claim's to check: the firing runs as exports_api, which may not read them.
    policy = evaluate_policy(facts.policy.model_copy(update={"list_exists": True}))
    if not policy.allowed:
        assert policy.code is not None
        return _skip(SkipReason(policy.code.value), policy.message.removeprefix("Rejected: "))
    if not facts.policy.deliveries_open:  # delivery_scope_open, the claim's gate: a missing switch is paused
        destination = facts.policy.destination_name or str(facts.policy.destination_id)
        why = f" ({facts.paused_scope_reason})" if facts.paused_scope_reason else ""
        return _skip(
            SkipReason.DELIVERIES_PAUSED,
            f"deliveries {_where(facts.paused_scope or 'destination', destination)} are paused{why}",
        )
    if facts.live_job_id is not None:
        return _skip(
            SkipReason.OVERLAP,
            f"its previous export {facts.live_job_id} is still {facts.live_job_status}",
            facts.live_job_id,
        )
    if facts.late and facts.late_runs >= catchup_firings:
        return _skip(
            SkipReason.CATCH_UP,
            f"a firing missed during an outage; at most {catchup_firings} missed firing(s) run after one "
            f"(EXPORTS_RECURRING_CATCHUP_FIRINGS), and {facts.late_runs} did",
        )
    return FiringDecision(True)


def created_message(job_id: UUID, late: bool) -> str:
    """The firing record's message for an export it created."""
    return f"Created export {job_id}" + (" (a missed firing, caught up)." if late else ".")


def is_late(nominal_time: datetime, recorded_at: datetime, late_after: timedelta) -> bool:
    """Whether a firing recorded at ``recorded_at`` missed its nominal time by more than ``late_after``."""
    return recorded_at - nominal_time > late_after
