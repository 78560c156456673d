"""How the export list's counts are decided (issue 26, item 5), with no I/O: which counts are worth taking
exactly, what a capped count or an estimate may claim, and what their sum may claim.

A count is taken exactly only where the planner expects at most ``limit`` rows: reading that many index
entries stays well inside the list's time bound. When it expects at most ten times that many for every status
together, one pass over the filter's matches counts them all, from the filter's index alone. Beyond it the planner's estimate is shown, labelled as one;
a count that stopped at its cap says "more than", never the cap as if it were the number.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from domain.listing import Count, CountKind
from domain.models import JobStatus


def within_prefix(estimate: int, prefix: str | None) -> int:
    """An estimate of the exports whose ID starts with ``prefix`` among ``estimate`` exports: export IDs are
    random (UUIDv4), so each hex digit of the prefix keeps a sixteenth of them. (The planner cannot say: it
    has no arithmetic on UUIDs and takes any range inside one histogram bucket for half a bucket.)"""
    if not prefix:
        return estimate
    digits = len(prefix.replace("-", ""))
    return math.ceil(estimate / (1 << (4 * digits)))  # 16 ** digits


def worth_counting(estimates: Mapping[JobStatus, int], limit: int) -> list[JobStatus]:
    """The statuses whose estimate is small enough to count exactly (at most ``limit``), the cheapest first:
    counted one after another within one budget, as many as it allows are exact."""
    return sorted((s for s, estimate in estimates.items() if estimate <= limit), key=lambda s: estimates[s])


# One pass over a filter's matches counts every status from its index alone (the destination's and the list's
# carry the status), where a status's own count walks them again for each status: it may read this many times
# the limit of one status's count.
ONE_PASS_FACTOR = 10


def one_pass_cap(limit: int) -> int:
    """The most matches one pass over a filter counts (``ONE_PASS_FACTOR`` times one status's limit)."""
    return ONE_PASS_FACTOR * limit


def scope_is_small(estimates: Mapping[JobStatus, int], limit: int) -> bool:
    """Whether the planner expects every status together to come to at most :func:`one_pass_cap`: then one
    pass over the filter's matches counts them all, instead of one walk per status."""
    return sum(estimates.values()) <= one_pass_cap(limit)


@dataclass(frozen=True)
class CountPlan:
    """How the counts are taken: ``one_pass`` over the filter's matches for every status, else the statuses
    ``one_by_one``, the cheapest first (a pass that stops at its cap falls back to them too)."""

    one_pass: bool
    one_by_one: list[JobStatus]


def plan_counts(estimates: Mapping[JobStatus, int], limit: int) -> CountPlan:
    """The counts' plan from the planner's estimates per status (none: nothing to count)."""
    return CountPlan(bool(estimates) and scope_is_small(estimates, limit), worth_counting(estimates, limit))


def status_count(estimate: int | None, counted: int | None, limit: int) -> Count:
    """One status's count from its estimate (``None``: not estimated in time) and its capped count
    (``None``: not counted; ``limit + 1``: more than ``limit``)."""
    if counted is not None and counted <= limit:
        return Count(CountKind.EXACT, counted)
    if counted is not None:
        # The estimate said few, the count found more than the limit: the estimate is wrong, the bound is not.
        if estimate is not None and estimate > limit:
            return Count(CountKind.ESTIMATE, estimate)
        return Count(CountKind.MORE_THAN, limit)
    if estimate is not None:
        return Count(CountKind.ESTIMATE, estimate)
    return Count(CountKind.UNKNOWN)


def total(counts: Iterable[Count]) -> Count:
    """The sum of counts, claiming no more than its parts: exact only if every part is; an estimate if any
    part is; "more than" when the parts are exact or lower bounds; unknown if any part is."""
    parts = list(counts)
    if any(c.kind == CountKind.UNKNOWN for c in parts):
        return Count(CountKind.UNKNOWN)
    value = sum(c.value or 0 for c in parts)
    if all(c.kind == CountKind.EXACT for c in parts):
        return Count(CountKind.EXACT, value)
    if any(c.kind == CountKind.ESTIMATE for c in parts):
        return Count(CountKind.ESTIMATE, value)
    return Count(CountKind.MORE_THAN, value)
