"""The API's store (role ``exports_api``): the rooms its grants allow, composed."""

from __future__ import annotations

from db.stores.audit import ApprovalStatements, AuditReads
from db.stores.destinations import DestinationStatements
from db.stores.endpoints import EndpointStatements
from db.stores.ledger import LedgerStatements
from db.stores.listing import ListingStatements
from db.stores.reconciliation import ReconciliationStatements
from db.stores.recurring import RecurringStatements
from db.stores.requests import RequestStatements
from db.stores.sessions import SessionStatements
from db.stores.switches import SwitchStatements


class ApiStore(
    RequestStatements,
    LedgerStatements,
    SwitchStatements,
    SessionStatements,
    RecurringStatements,
    DestinationStatements,
    EndpointStatements,
    ReconciliationStatements,
    ListingStatements,
    AuditReads,
    ApprovalStatements,
):
    """The API's store: creation, edits, the cancellation ledger, switches, sessions, recurring exports and
    their firings, destinations, webhook endpoints, the reconciler's queue and listing requests, the bounded
    export list and its counts, the ledger of operator actions, approvals of two-person actions, and the
    reads."""
