"""One store per database role, each exposing only the statements that role may run.

Every store is built on :class:`db.stores.base.StoreBase` (one pool, typed rows, the one error boundary,
the lost-response re-read) from the rooms of this package, one room per concern, one method per named
statement of ``db/queries.sql``. The pool's role decides what the database allows; the store's type decides
what the code can even ask, so a process reaches only the statements its grants permit:

| store (module) | role | rooms |
|---|---|---|
| `WorkerStore` (protocol.py) | ``exports_worker`` | protocol (claim, cutoff 2, renewal, fences, terminal writes, sweep), evidence, reads |
| `RecoveryStore` (recovery.py) | ``exports_recovery`` | recovery (takeovers, set-aside proofs, re-checks), evidence, reads |
| `DispatcherStore` (outbox.py) | ``exports_dispatcher`` | outbox |
| `ApiStore` (api.py) | ``exports_api`` | requests (create, replace, edit), the cancellation ledger, switches, sessions, destinations (an admin's: create, edit, retire, their versions), reads |
| `ReconcilerStore` (reconciler.py) | ``exports_reconciler`` | reconciliation and corrections, reads |
| `PlatformStore` (platform.py) | ``exports_platform`` | the global delivery switch (the switch change of switching.py, which the API's switches room shares) |

Import a store from its module: this package imports nothing, so importing one store does not import
the others (the import contracts in pyproject.toml keep each process to its role's rooms).
"""
