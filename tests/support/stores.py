"""The store of each database role, for tests that open a pool as a role chosen at run time."""

from __future__ import annotations

from typing import Any

from db.pool import Role
from db.stores.api import ApiStore
from db.stores.base import StoreBase
from db.stores.outbox import DispatcherStore
from db.stores.platform import PlatformStore
from db.stores.protocol import WorkerStore
from db.stores.reconciler import ReconcilerStore
from db.stores.recovery import RecoveryStore

STORE_OF_ROLE: dict[str, type[StoreBase]] = {
    "exports_api": ApiStore,
    "exports_worker": WorkerStore,
    "exports_recovery": RecoveryStore,
    "exports_dispatcher": DispatcherStore,
    "exports_reconciler": ReconcilerStore,
    "exports_platform": PlatformStore,
}


def store_for(role: Role, pool: Any, **store_kw: Any) -> Any:
    """The store a process acting as ``role`` uses, over ``pool`` (whose connections act as ``role``)."""
    return STORE_OF_ROLE[role](pool, **store_kw)
