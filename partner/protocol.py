"""The partner seam: what activities and recovery ask of a destination's server, whatever its kind.

A :class:`Partner` delivers one attempt's file, observes a final name, sets an attempt's temporary file
aside and removes temporaries; the values it exchanges (:class:`FileToDeliver`, :class:`OriginalFile`,
:class:`DeliveryReport`, :class:`Observation`, :class:`SetAside`, :class:`DeliveryHooks`) live here and in
:mod:`domain.evidence`, free of any transport library. Every method blocks: run it on a thread. The
worker picks a destination's partner with :func:`partner.kinds.partner_for` and injects it, so
activities/ and rules/ never import a kind's module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from domain.destination import Destination
from domain.evidence import DeliveryReport, FileToDeliver, Observation, OriginalFile, SetAside

__all__ = [
    "DeliveryHooks",
    "DeliveryReport",
    "FileToDeliver",
    "Observation",
    "OriginalFile",
    "Partner",
    "PartnerFor",
    "SetAside",
]


@dataclass
class DeliveryHooks:
    """Named seams for tests; each runs in the delivering thread at its point, and may be ``None``."""

    after_listing: Callable[[], None] | None = None
    during_upload: Callable[[int], None] | None = None  # bytes sent so far, after each write
    before_rename: Callable[[], None] | None = None
    after_rename: Callable[[], None] | None = None
    # The rename fence: asked right before the rename request; the rename is sent only when it answers
    # True. False, or an exception, means this attempt may no longer publish: nothing is renamed.
    authorize_rename: Callable[[], bool] | None = None


class Partner(Protocol):
    """One kind of partner server (today SFTP): the four things an attempt and recovery ask of it."""

    def deliver(
        self,
        destination: Destination,
        file: FileToDeliver,
        attempt_id: UUID,
        *,
        original: OriginalFile | None,
        overwrite_agreed: bool,
        on_evidence: Callable[[dict[str, Any]], None],
        hooks: DeliveryHooks | None = None,
    ) -> DeliveryReport:
        """Upload ``file`` for ``attempt_id`` and classify what happened; never raises for a delivery
        problem. Each observation goes to ``on_evidence`` as it is made."""
        ...

    def observe_final_name(self, destination: Destination, final_name: str) -> Observation:
        """What the server shows under ``final_name`` now, as the contract allows; raises when it cannot
        be asked."""
        ...

    def set_aside_for_recovery(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> tuple[SetAside, Observation]:
        """Move ``attempt_id``'s temporary file aside, then observe the final name; raises when the server
        cannot be asked."""
        ...

    def remove_temporary_files(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> list[dict[str, Any]]:
        """Remove ``attempt_id``'s temporary and set-aside files; one evidence dict per name, never raises."""
        ...


PartnerFor = Callable[[Destination], Partner]
"""Picks the partner of a destination (by its ``kind``): what the worker injects into the activities."""
