"""What an attempt's own writes mean for the attempt: the mapping from the store's answers to
``AttemptOutcome``, in one place for the activities and the workflow."""

from __future__ import annotations

from domain.models import AttemptOutcome, AuthorizationResult, DeliveryOutcome, FinishResult

_DELIVERED = {
    DeliveryOutcome.COMPLETED: AttemptOutcome.COMPLETED,
    DeliveryOutcome.FAILED: AttemptOutcome.FAILED,
    DeliveryOutcome.OUTCOME_UNKNOWN: AttemptOutcome.OUTCOME_UNKNOWN,
}


def unwritten(finished: FinishResult | None) -> AttemptOutcome:
    """An attempt that wrote nothing: NotOwner when the row is another's, else LeftToRecovery (unanswered)."""
    return AttemptOutcome.NOT_OWNER if finished == FinishResult.NOT_OWNER else AttemptOutcome.LEFT_TO_RECOVERY


def after_terminal_write(finished: FinishResult, written: AttemptOutcome) -> AttemptOutcome:
    """``written`` when this attempt's terminal write matched; otherwise what its failure to write means."""
    return written if finished == FinishResult.WRITTEN else unwritten(finished)


def after_delivery(
    delivery: DeliveryOutcome | None, finished: FinishResult | None, *, retried: bool = False
) -> AttemptOutcome:
    """The attempt's outcome after ``deliver``: the classified delivery if its terminal write matched, or
    RetryScheduled when that write put the job back in the queue to be tried again (issue #25.4).

    ``delivery`` is ``None`` when the upload never started (the attempt could not confirm ownership).
    """
    if delivery is None or finished != FinishResult.WRITTEN:
        return unwritten(finished)
    if retried:
        return AttemptOutcome.RETRY_SCHEDULED
    return _DELIVERED[delivery]


def after_refused_cutoff(answer: AuthorizationResult) -> AttemptOutcome:
    """Cutoff 2 refused and nothing was written: NotOwner if the row is another's, else recovery reads it."""
    if answer == AuthorizationResult.NOT_OWNER:
        return AttemptOutcome.NOT_OWNER
    return AttemptOutcome.LEFT_TO_RECOVERY
