"""Give-backs: which ones count, how long the next claim waits, and when they end the job (issue 23.1).

An attempt gives its job back to the queue before cutoff 2 when it must not go on (``ReleaseCause``). A
drain, a pause, a policy refusal or a destination an admin changed during the build (issue #24.2: the file was
built for a version cutoff 2 no longer authorizes) is nobody's failure: the job is handed on at once and
nothing counts it.
A failure the attempt could not get past (the build interrupted by the database, a fact cutoff 2 could not
read, a workflow nobody could confirm) counts: the next claim waits ``min(cap, base * 2^n)`` scaled by a
jitter between 0.5 and 1 (n: the job's earlier counted give-backs), and past ``max_releases`` of them the
give-back ends the job Failed (``AttemptsExhausted``) instead (002 "Backoff", "poison input cannot create
infinite retries"). The wait is computed and written by ``release_attempt_if_running`` on the database
clock; :func:`delay_seconds` states the same formula for the tests and the docs.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from domain.models import ReleaseCause

COUNTED_CAUSES = frozenset({ReleaseCause.WORKFLOW, ReleaseCause.TRANSIENT})


@dataclass(frozen=True)
class ReleasePolicy:
    """The backoff and the bound of give-backs for failures (``EXPORTS_RELEASE_BACKOFF_*``,
    ``EXPORTS_MAX_TRANSIENT_RELEASES``). ``rng`` draws the jitter; tests inject a seeded one."""

    base_seconds: float = 5.0
    cap_seconds: float = 300.0
    max_releases: int = 6
    rng: random.Random | None = None

    def counts(self, cause: ReleaseCause) -> bool:
        """Whether a give-back for ``cause`` counts towards the bound and makes the next claim wait."""
        return cause in COUNTED_CAUSES

    def jitter(self) -> float:
        """A draw in [0, 1): the wait is scaled by ``0.5 + 0.5 * jitter``, so give-backs of many jobs at
        once (a database restart) do not all come back at the same moment."""
        return (self.rng or random).random()


def delay_seconds(policy: ReleasePolicy, earlier: int, jitter: float) -> float:
    """The wait after a counted give-back when the job had ``earlier`` counted give-backs before it: the
    formula ``release_attempt_if_running`` applies in SQL."""
    backoff: float = min(policy.cap_seconds, policy.base_seconds * 2.0**earlier)
    return backoff * (0.5 + 0.5 * jitter)
