"""A partner's session slots (issue #25.3, migration 0029; roles ``exports_worker`` and ``exports_recovery``):
a session with a destination's partner is opened only under a slot its holder took, so the partner never
sees more sessions than its limit, whichever worker opens them.

An attempt takes one after its build and before it connects (it is then held while the attempt holds its
job Running or Delivering: the row's own change ends it, in the terminal write's statement). Any other
holder (recovery's listing of an OutcomeUnknown, a cleanup, a connection test) takes one for a bounded time
and releases it once its session is closed.
"""

from __future__ import annotations

from uuid import UUID

from db.rows import SlotAnswer, SlotRow
from db.stores.base import StoreBase

ATTEMPT = "attempt"
RECOVERY = "recovery"
CLEANUP = "cleanup"
CONNECTION_TEST = "connection_test"


class SlotStatements(StoreBase):
    """Take and release a destination's session slots."""

    async def take_session_slot(
        self,
        tenant_id: UUID,
        destination_id: UUID,
        holder: UUID,
        *,
        job_id: UUID | None = None,
        purpose: str = ATTEMPT,
        hold_seconds: float | None = None,
        adopt: UUID | None = None,
    ) -> SlotAnswer:
        """Take a free slot of the destination for ``holder`` (one statement, conditional): for an attempt
        (``job_id`` its job) only while it holds that job Running with a current lease; for anyone else for
        ``hold_seconds`` unless released sooner. ``adopt`` names a holder whose slot this one may take over. A
        holder that already holds one finds it again, so a retry after a lost answer takes no second slot. The
        ``adopt`` holder's slot is taken only when no slot is free (its attempt may be alive still)."""
        if (job_id is None) == (hold_seconds is None):
            raise ValueError("an attempt's slot names its job; any other holder's names how long it holds it")
        answer = await self._row(
            "take_session_slot",
            {
                "tenant_id": tenant_id,
                "destination_id": destination_id,
                "holder": holder,
                "job_id": job_id,
                "purpose": purpose if job_id is None else ATTEMPT,
                "hold_seconds": hold_seconds,
                "adopt": adopt,
            },
            SlotAnswer,
        )
        assert answer is not None  # the statement always answers one row
        return answer

    async def release_session_slot(
        self, holder: UUID, *, return_to: UUID | None = None, return_job_id: UUID | None = None
    ) -> bool:
        """Release ``holder``'s slot once its session is closed, or give it back to the attempt it was adopted
        from (``return_to``, with its job); False when it held none (it expired and was taken meanwhile)."""
        if (return_to is None) != (return_job_id is None):
            raise ValueError("a slot given back to an attempt names the attempt's job")
        rows = await self._rows(
            "release_session_slot",
            {"holder": holder, "return_to": return_to, "return_job_id": return_job_id},
            SlotRow,
        )
        return bool(rows)

    async def release_taken_over_slot(self, attempt_id: UUID) -> bool:
        """Give back the slot recovery left held for ``attempt_id`` after taking its job over (0041), once this
        attempt's session is closed; False when there was none (no slot, or already taken by someone else)."""
        rows = await self._rows("release_taken_over_slot", {"holder": attempt_id}, SlotRow)
        return bool(rows)
