"""What the export list is asked and what its counts say (issue 26, item 5): the filter, the ID prefix as the
range of IDs it names, and a count that says whether it is exact, an estimate, or only a lower bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from uuid import UUID

from domain.models import JobStatus

# Where a UUID's canonical text (8-4-4-4-12 lowercase hex) has its hyphens.
_HYPHENS = frozenset({8, 13, 18, 23})


@dataclass(frozen=True)
class ExportFilter:
    """The list's filters; an empty ``statuses`` means every status, ``None`` means "any"."""

    statuses: tuple[JobStatus, ...] = ()
    destination_id: UUID | None = None
    list_name: str | None = None
    id_prefix: str | None = None

    def without_statuses(self) -> ExportFilter:
        """The same filter over every status (what the per-status counts of the console's chips use)."""
        return ExportFilter((), self.destination_id, self.list_name, self.id_prefix)


def id_range(prefix: str) -> tuple[UUID, UUID] | None:
    """The IDs whose canonical text starts with ``prefix``, as an inclusive range of UUIDs (UUIDs order as
    their bytes, that is as their hex digits), so the primary key answers a prefix search; ``None`` when no
    canonical ID starts with it (a hyphen out of place, a character that is not hex, more than 36)."""
    text = prefix.lower()
    if len(text) > 36:
        return None
    for position, char in enumerate(text):
        if (position in _HYPHENS) != (char == "-") or (char != "-" and char not in "0123456789abcdef"):
            return None
    digits = text.replace("-", "")
    return UUID(hex=digits.ljust(32, "0")), UUID(hex=digits.ljust(32, "f"))


class CountKind(StrEnum):
    """How far a count can be trusted."""

    EXACT = "exact"  # counted: this many match
    ESTIMATE = "estimate"  # the planner's estimate from the table's statistics: about this many
    MORE_THAN = "more_than"  # counting stopped at its limit: more than this many
    UNKNOWN = "unknown"  # neither counted nor estimated within the bound


@dataclass(frozen=True)
class Count:
    """One count and how far it can be trusted (never a silent cap: a stopped count is ``MORE_THAN``)."""

    kind: CountKind
    value: int | None = None

    @property
    def exact(self) -> bool:
        return self.kind == CountKind.EXACT


@dataclass(frozen=True)
class Counts:
    """How many exports match a filter, in total and per status under the filter's other conditions (the
    console's chips), what the exact counts were capped at, and whether counting ran past its bound (the
    counts it could not finish are then estimates)."""

    total: Count
    by_status: dict[JobStatus, Count] = field(default_factory=dict)
    exact_up_to: int = 0
    timed_out: bool = False
