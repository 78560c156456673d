"""The store's typed errors. psycopg errors are translated once, here, at the database boundary:
every statement the store runs is inside ``translated()``, so no driver error escapes a store call."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import psycopg
from psycopg import errors as pg_errors


class StoreError(Exception):
    """Base class of everything the store raises on purpose."""


class TransientStoreError(StoreError):
    """The database did not answer (connection lost, timeout): the write may or may not have committed."""


class QueryTimedOut(TransientStoreError):
    """A statement ran past the ``statement_timeout`` its transaction was bounded by (SQLSTATE 57014 with
    PostgreSQL's "canceling statement due to statement timeout"): canceled, it read and changed nothing. The
    console's and the list API's reads are bounded so (``bound_this_read``) and say so instead of hanging.
    A kind of :class:`TransientStoreError`, so any caller that re-reads after an uncertain answer still does."""


class ConstraintRefused(StoreError):
    """The database refused the write on a named constraint; ``constraint`` says which."""

    def __init__(self, constraint: str | None, message: str) -> None:
        super().__init__(message)
        self.constraint = constraint


class NotPermitted(StoreError):
    """The role this process runs as may not do that (SQLSTATE 42501)."""


class IdempotencyConflict(StoreError):
    """The idempotency key was used before with a different request (a 409)."""

    def __init__(self, job_id: object) -> None:
        super().__init__("this idempotency key was used for a different request")
        self.job_id = job_id


class UnknownReference(ConstraintRefused):
    """A referenced row (destination, original job) does not exist in this tenant."""


class LockTimeout(StoreError):
    """A lock wait outlasted ``lock_timeout`` (SQLSTATE 55P03): the transaction decided nothing; Busy."""


class DestinationNotFound(StoreError):
    """No destination with that ID in that tenant."""


class InvariantViolation(StoreError):
    """Something changed under a row lock; the outcome computed under it is not true, so nothing is recorded."""


# The one table from a refused constraint to the domain error it means, whichever statement hit it. A
# constraint whose refusal needs the statement's context (an idempotency key's or a request ID's replay)
# stays a ConstraintRefused for that statement to read.
_NO_DESTINATION = "no such destination in this tenant"
CONSTRAINT_MEANINGS: dict[str, tuple[type[ConstraintRefused], str]] = {
    "fk_export_jobs_destination": (UnknownReference, _NO_DESTINATION),
    "export_jobs_tenant_id_fkey": (UnknownReference, _NO_DESTINATION),
    "fk_delivery_switches_destination": (UnknownReference, _NO_DESTINATION),
    "fk_delivery_pauses_destination": (UnknownReference, _NO_DESTINATION),
    "delivery_pauses_tenant_id_fkey": (UnknownReference, _NO_DESTINATION),
    "delivery_switches_tenant_id_fkey": (UnknownReference, _NO_DESTINATION),
    "fk_cancellation_batches_destination": (UnknownReference, _NO_DESTINATION),
    "fk_cancellation_previews_destination": (UnknownReference, _NO_DESTINATION),
    "fk_recurring_exports_destination": (UnknownReference, _NO_DESTINATION),
    "fk_recurring_exports_creator": (UnknownReference, "the creator is not a principal of this tenant"),
}


def refused(constraint: str | None, message: str) -> ConstraintRefused:
    """The typed refusal of ``constraint``: what :data:`CONSTRAINT_MEANINGS` says it means, else itself."""
    meaning = CONSTRAINT_MEANINGS.get(constraint or "")
    if meaning is None:
        return ConstraintRefused(constraint, message)
    kind, text = meaning
    return kind(constraint, text)


def is_transient(exc: BaseException) -> bool:
    """Connection failures and timeouts: the only errors that leave a write's fate unknown.

    Constraint violations and other database errors are real answers, not uncertainty.
    """
    if isinstance(exc, TransientStoreError | TimeoutError | ConnectionError | OSError):
        return True
    if isinstance(exc, pg_errors.QueryCanceled | pg_errors.AdminShutdown | pg_errors.CannotConnectNow):
        return True
    if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
        # OperationalError with a SQLSTATE of a real refusal is not transient (e.g. lock_not_available).
        sqlstate = getattr(exc, "sqlstate", None)
        return sqlstate is None or sqlstate.startswith(("08", "57"))
    return False


@contextlib.asynccontextmanager
async def translated() -> AsyncIterator[None]:
    """The database boundary: any psycopg error raised inside becomes the typed error it means.

    A pool that cannot hand out a connection in time (``PoolTimeout``) is transient, like a lost one.
    """
    try:
        yield
    except psycopg.Error as exc:
        raise translate(exc) from exc


_STATEMENT_TIMEOUT = "canceling statement due to statement timeout"


def translate(exc: psycopg.Error) -> StoreError:
    """Map one psycopg error to the typed error it means."""
    diag_constraint = exc.diag.constraint_name if exc.diag else None
    if isinstance(exc, pg_errors.LockNotAvailable):
        return LockTimeout("the row lock was not granted within lock_timeout")
    if isinstance(exc, pg_errors.InsufficientPrivilege):
        return NotPermitted(str(exc.diag.message_primary or "permission denied"))
    if isinstance(exc, pg_errors.IntegrityError | pg_errors.CheckViolation):
        return refused(diag_constraint, str(exc.diag.message_primary or exc))
    if isinstance(exc, pg_errors.QueryCanceled) and _STATEMENT_TIMEOUT in str(exc.diag.message_primary or ""):
        # 57014 is also an administrator's pg_cancel_backend ("due to user request"): only the bound is a
        # timeout. (A server whose lc_messages is not English reports both as a plain transient error.)
        return QueryTimedOut("the statement ran past its statement_timeout")
    if is_transient(exc):
        return TransientStoreError(type(exc).__name__)
    return StoreError(f"{type(exc).__name__}: {exc.diag.message_primary if exc.diag else exc}")
