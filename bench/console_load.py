"""A console's history at scale, for ``python -m bench console`` and ``tests/db/test_console_plans.py``.

Tenants with several destinations each, a skewed mix of lists, every status in production-like shares, and
one tenant much larger than the others (the one an operator of a big customer scrolls), loaded into
``export_jobs`` as the superuser with ``generate_series`` in chunks, the triggers off for the load
(``session_replication_role = replica``, as ``bench/scale.py`` loads: the guard admits only new Queued
jobs, and this loads a history), then ``VACUUM ANALYZE`` as autovacuum would. Loaded: ``export_jobs``
and each attempt's events (its claim and how it ended, and recovery's listings of each OutcomeUnknown, which the
reconciler's queue reads); not the deliveries, the outbox or cancellation requests, which no page measured
reads (the audit ledger's page loads its own rows in its own step: :func:`load_operator_actions`). Nothing here is contact data.

The mix, by job number ``g`` (1 is the oldest; one second apart, the newest now):

- tenant: ``big_share`` percent of the jobs are the first tenant's, the rest spread over the others;
- destination: the ``k``-th of a tenant's destinations takes half of what the ``k-1``-th takes (50 %, 25 %,
  ... the last about 1 % with 8), so there are busy partners and rare ones;
- list: 50 lists ``list-01`` .. ``list-50``, the first takes about 27 %, the last under 1 %; and a rare
  ``escalations`` list, one job in 200,003;
- status: the newest ``live`` jobs are live (2 % Running, 1 % Delivering, the rest Queued); the history is
  90 % Completed, 5 % Failed (three reasons), 3 % Canceled, 1 % Stopped, 1 % Rejected; one job in 5,003
  is OutcomeUnknown (about 1,700 in the large tenant's reconciler queue at ten million: past its exact
  count), each with what the queue reads of it: its attempt's ``Finished`` event and two of recovery's
  listings of its final name.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import LiteralString
from uuid import UUID

import psycopg

from db.admin import add_destination, seed_tenant

DESTINATION = {
    "host": "127.0.0.1",
    "port": 22,
    "username": "partner",
    "host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPlaceholder",
    "credential_ref": "/nonexistent/key",
    "remote_dir": "/upload",
}
LISTS = 50
RARE_LIST = "escalations"
UNKNOWN_EVERY = 5_003

# Each attempt's events, as the protocol writes them (its claim, and how it ended), and what the reconciler's
# queue reads of each OutcomeUnknown export (outcome_unknown_summaries): the write that recorded it and
# recovery's listings of its final name since. The events table then has a history's size, as the queue's
# per-export lookups by ix_attempt_events_job meet it in production.
_EVENTS: list[LiteralString] = [
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, version, worker_id, recorded_at)
    SELECT id, attempt_id, 'Claimed', 1, claimed_by, created_at + interval '1 s'
    FROM export_jobs WHERE attempt_id IS NOT NULL
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id,
           CASE WHEN status = 'Stopped' THEN 'Stopped' WHEN failure_reason = 'BuildFailed' THEN 'Failed'
                WHEN failure_reason = 'AttemptsExhausted' THEN 'AttemptsExhausted' ELSE 'Finished' END,
           claimed_by,
           CASE WHEN status = 'OutcomeUnknown' THEN 'OutcomeUnknown: renamed, read-back failed (TimeoutError)'
                ELSE status || coalesce(' ' || failure_reason, '') END,
           coalesce(outcome_unknown_at, created_at + interval '30 s')
    FROM export_jobs
    WHERE attempt_id IS NOT NULL AND status IN ('Completed', 'Failed', 'Stopped', 'OutcomeUnknown')
    """,
    """
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
    SELECT id, attempt_id, 'DeliveryEvidence', 'recovery:bench/run',
           '{"observation": "recovery_listing", "final_name_present": false}',
           outcome_unknown_at + n * interval '10 min'
    FROM export_jobs CROSS JOIN generate_series(1, 2) n WHERE status = 'OutcomeUnknown'
    """,
]


@dataclass(frozen=True)
class ConsoleScope:
    """A tenant and its destinations (the first is the busiest)."""

    tenant_id: UUID
    destination_ids: tuple[UUID, ...]


async def seed_console_tenants(admin_url: str, tenants: int, destinations: int) -> list[ConsoleScope]:
    """``tenants`` tenants with ``destinations`` enabled destinations each, no contacts."""
    scopes = []
    for i in range(tenants):
        seeded = await seed_tenant(
            admin_url,
            tenant_name=f"console-{i}",
            destination_name="partner-1",
            destination=DESTINATION,
            contacts=0,
        )
        more = [
            await add_destination(
                admin_url, tenant_id=seeded.tenant_id, name=f"partner-{k}", destination=DESTINATION
            )
            for k in range(2, destinations + 1)
        ]
        scopes.append(ConsoleScope(seeded.tenant_id, (seeded.destination_id, *more)))
    return scopes


# One chunk of the history: jobs lo..hi of total. u_* are independent uniform draws in [0, 1) per job (one
# seed each: hashint8 of a small number equals hashint4 of it, so those two would draw the same).
_CHUNK: LiteralString = """
INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, attempt_id, attempt_count, claimed_by,
    lease_expires_at, stop_request_id, expected_file_name, expected_file_bytes, expected_file_sha256,
    expected_file_rows, delivery_authorized_at, woken_at, failure_reason, delivery_key, created_by, list_name,
    rejection_code, rejection_reason, workflow_id, fence_expected, upload_fenced_at, rename_fenced_at, created_at,
    outcome_unknown_at)
SELECT md5('job' || g)::uuid, (%(tenants)s::uuid[])[k.t], s.status, 1,
    (%(destinations)s::uuid[])[(k.t - 1) * %(per_tenant)s + k.d],
    CASE WHEN s.attempted THEN md5('att' || g)::uuid END,
    CASE WHEN s.attempted THEN 1 ELSE 0 END,
    CASE WHEN s.attempted THEN 'bench-worker.1' END,
    CASE WHEN s.status IN ('Running', 'Delivering') THEN now() + interval '1 minute' END,
    CASE WHEN s.status = 'Stopped' THEN md5('stop' || g)::uuid END,
    CASE WHEN s.authorized THEN 'contacts-k' || g || '.csv' END,
    CASE WHEN s.authorized THEN 40000 + mod(g, 1000) END,
    CASE WHEN s.authorized THEN sha256(('file' || g)::bytea) END,
    CASE WHEN s.authorized THEN 400 END,
    CASE WHEN s.authorized THEN c.created_at + interval '20 s' END,
    CASE WHEN s.status = 'Queued' THEN now() - mod(g, 120) * interval '1 min' ELSE c.created_at END,
    s.failure, 'k' || g, 'bench', k.list,
    CASE WHEN s.status = 'Rejected' THEN 'contract_ended' END,
    CASE WHEN s.status = 'Rejected' THEN 'the partner contract ended' END,
    CASE WHEN s.attempted THEN 'export-' || md5('job' || g)::uuid || '-' || md5('msg' || g)::uuid END,
    s.authorized,
    CASE WHEN s.authorized THEN c.created_at + interval '21 s' END,
    CASE WHEN s.status = 'Completed' THEN c.created_at + interval '25 s' END,
    c.created_at,
    -- what 0033's trigger would have set (the guard is off for the load; its CHECK is not)
    CASE WHEN s.status = 'OutcomeUnknown' THEN c.created_at + interval '30 s' END
FROM generate_series(%(lo)s::int, %(hi)s::int) g
CROSS JOIN LATERAL (SELECT now() - (%(total)s - g) * interval '1 s' AS created_at,
                           (hashint4extended(g, 1) & 1048575) / 1048576.0 AS u_tenant,
                           (hashint4extended(g, 2) & 1048575) / 1048576.0 AS u_destination,
                           (hashint4extended(g, 3) & 1048575) / 1048576.0 AS u_list,
                           (hashint4extended(g, 4) & 1048575) / 1048576.0 AS u_status) c
CROSS JOIN LATERAL (SELECT
    CASE WHEN %(t)s = 1 OR c.u_tenant * 100 < %(big_share)s THEN 1
         ELSE 2 + floor((c.u_tenant * 100 - %(big_share)s) / (100 - %(big_share)s) * (%(t)s - 1))::int END AS t,
    1 + least(%(per_tenant)s - 1, floor(-log(2, 1 - c.u_destination))::int) AS d,
    CASE WHEN mod(g, 200003) = 0 THEN %(rare_list)s
         ELSE 'list-' || lpad((1 + floor(%(lists)s * power(c.u_list, 3)))::int::text, 2, '0') END AS list) k
CROSS JOIN LATERAL (SELECT
    CASE WHEN g > %(total)s - %(live)s THEN
              CASE WHEN mod(g, 100) < 2 THEN 'Running' WHEN mod(g, 100) = 2 THEN 'Delivering' ELSE 'Queued' END
         WHEN mod(g, %(unknown_every)s) = 17 THEN 'OutcomeUnknown'
         WHEN c.u_status < 0.90 THEN 'Completed' WHEN c.u_status < 0.95 THEN 'Failed'
         WHEN c.u_status < 0.98 THEN 'Canceled' WHEN c.u_status < 0.99 THEN 'Stopped' ELSE 'Rejected' END AS status,
    CASE WHEN g > %(total)s - %(live)s OR c.u_status >= 0.95 THEN NULL WHEN c.u_status < 0.90 THEN NULL
         WHEN c.u_status < 0.93 THEN 'NotDelivered' WHEN c.u_status < 0.94 THEN 'BuildFailed'
         ELSE 'AttemptsExhausted' END AS failure_raw) s0
CROSS JOIN LATERAL (SELECT s0.status,
    CASE WHEN s0.status = 'Failed' THEN s0.failure_raw END AS failure,
    s0.status NOT IN ('Queued', 'Rejected', 'Canceled') AS attempted,  -- a cancel wins only while Queued
    s0.status IN ('Delivering', 'Completed', 'OutcomeUnknown')
        OR (s0.status = 'Failed' AND s0.failure_raw = 'NotDelivered') AS authorized) s
"""


def load_console_history(
    admin_url: str,
    scopes: Sequence[ConsoleScope],
    *,
    total: int,
    live: int,
    big_share: int = 85,
    chunk: int = 1_000_000,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Load ``total`` exports (the newest ``live`` of them live) as described above, then VACUUM ANALYZE;
    returns the seconds it took."""
    per_tenant = len(scopes[0].destination_ids)
    if any(len(s.destination_ids) != per_tenant for s in scopes):
        raise ValueError("every tenant needs the same number of destinations")
    started = time.perf_counter()
    base = {
        "tenants": [s.tenant_id for s in scopes],
        "destinations": [d for s in scopes for d in s.destination_ids],
        "t": len(scopes),
        "per_tenant": per_tenant,
        "big_share": big_share,
        "lists": LISTS,
        "rare_list": RARE_LIST,
        "total": total,
        "live": live,
        "unknown_every": UNKNOWN_EVERY,
    }
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        for lo in range(1, total + 1, chunk):
            hi = min(total, lo + chunk - 1)
            conn.execute(_CHUNK, {**base, "lo": lo, "hi": hi})
            if progress is not None:
                progress(f"loaded {hi:,} of {total:,} exports ({time.perf_counter() - started:.0f} s)")
        for statement in _EVENTS:
            conn.execute(statement)
        if progress is not None:
            progress(f"loaded the attempts' events ({time.perf_counter() - started:.0f} s)")
        conn.execute("SET session_replication_role = origin")
        conn.execute("VACUUM ANALYZE export_jobs")
        conn.execute("VACUUM ANALYZE export_attempt_events")
        found = conn.execute("SELECT count(*) FROM export_jobs").fetchone()
    if found is None or found[0] < total:
        raise SystemExit(f"loaded {found}, expected at least {total}")
    return time.perf_counter() - started


# -- the ledger of operator actions (0031), for the audit page ----------------------------------------------

# Who acts in each tenant: operators (the first busiest, as with lists: ``OPERATORS`` of them, the k-th taking a
# cube-root share), a few reconcilers and admins, and a break-glass admin who acts once in ``RARE_EVERY`` rows.
OPERATORS = 24
RARE_PRINCIPAL = "breakglass.admin"
RARE_EVERY = 100_003
PLATFORM_EVERY = 10_007  # the platform's own global pauses and resumes (tenant NULL)

# The actions, by cumulative share: (action, subject kind, the role that takes it, the share up to here). An
# operator's cancels dominate; the rest is what a year of a console's control plane looks like.
LEDGER_MIX: tuple[tuple[str, str, str, float], ...] = (
    ("cancel", "export", "operator", 0.62),
    ("bulk_cancel", "cancellation_batch", "operator", 0.64),
    ("pause", "delivery_scope", "operator", 0.70),
    ("resume", "delivery_scope", "operator", 0.755),
    ("replace", "export", "operator", 0.785),
    ("reconcile", "export", "reconciler", 0.80),
    ("correct", "export", "reconciler", 0.805),
    ("listing.request", "export", "reconciler", 0.825),
    ("approval.approve", "approval", "operator", 0.845),
    ("approval.decline", "approval", "operator", 0.85),
    ("destination.edit", "destination", "admin", 0.87),
    ("destination.pin_key", "destination", "admin", 0.875),
    ("recurring.edit", "recurring_export", "admin", 0.925),
    ("recurring.pause", "recurring_export", "admin", 0.935),
    ("recurring.resume", "recurring_export", "admin", 0.945),
    ("webhook.redeliver", "webhook_endpoint", "admin", 0.975),
    ("token.mint", "token", "admin", 0.99),
    ("token.revoke", "token", "admin", 0.995),
    ("principal.grant", "principal", "admin", 1.0),
)

# One chunk of the ledger: rows lo..hi of total, row n about job g (one export in every total_jobs/total; one row
# in ten is a second action about the previous row's export, a lost cancel's replacement, say), in that job's
# tenant (the same draw as _CHUNK's), at that job's time plus a few minutes. Inserted as the
# superuser with the append-only trigger and every check in force (an INSERT is all the ledger takes).
_LEDGER_CHUNK: LiteralString = """
INSERT INTO operator_actions (tenant_id, at, principal, role, action, subject_kind, subject_id, request_id, reason,
                              outcome, detail, approval_id, requested_by, before, after)
SELECT CASE WHEN mod(n, %(platform_every)s) = 0 THEN NULL ELSE (%(tenants)s::uuid[])[k.t] END,
    now() - (%(total_jobs)s - j.g) * interval '1 s' + (1 + mod(n, 600)) * interval '1 s',
    p.principal,
    CASE WHEN mod(n, %(platform_every)s) = 0 THEN 'platform' WHEN p.principal = %(rare_principal)s THEN 'admin'
         ELSE a.role END,
    CASE WHEN mod(n, %(platform_every)s) = 0 THEN CASE WHEN mod(n, 2) = 0 THEN 'pause' ELSE 'resume' END
         ELSE a.action END,
    CASE WHEN mod(n, %(platform_every)s) = 0 THEN 'delivery_scope' ELSE a.kind END,
    CASE WHEN mod(n, %(platform_every)s) = 0 THEN 'global'
         WHEN a.kind = 'export' THEN md5('job' || j.g)::uuid::text
         WHEN a.kind = 'cancellation_batch' THEN md5('batch' || n)::uuid::text
         WHEN a.kind = 'delivery_scope' AND mod(n, 3) = 0 THEN ((%(tenants)s::uuid[])[k.t])::text
         WHEN a.kind IN ('delivery_scope', 'destination')
              THEN ((%(destinations)s::uuid[])[(k.t - 1) * %(per_tenant)s + k.d])::text
         WHEN a.kind = 'recurring_export' THEN md5('recurring' || k.t || '-' || mod(n, 40))::uuid::text
         WHEN a.kind = 'webhook_endpoint' THEN md5('hook' || k.t || '-' || mod(n, 3))::uuid::text
         WHEN a.kind = 'approval' THEN md5('approval' || n)::uuid::text
         WHEN a.kind = 'token' THEN md5('token' || n)::uuid::text
         ELSE 'operator-' || lpad((1 + mod(n, %(operators)s))::text, 2, '0') END,
    'req-' || md5('req' || n)::uuid,
    CASE a.action WHEN 'cancel' THEN 'the customer asked to stop this export'
                  WHEN 'pause' THEN 'incident INC-' || mod(n, 9000) || ': partner SFTP answering slowly'
                  WHEN 'resume' THEN 'incident INC-' || mod(n, 9000) || ' resolved'
                  WHEN 'reconcile' THEN 'the partner confirmed receipt (ticket ' || mod(n, 50000) || ')'
                  WHEN 'correct' THEN 'the partner never received it'
                  WHEN 'replace' THEN 'resend with the corrected list'
                  WHEN 'bulk_cancel' THEN 'contract ended: cancel what is queued' END,
    CASE WHEN a.action = 'cancel' AND o.u < 0.15 THEN 'refused' WHEN o.u < 0.02 THEN 'forbidden'
         WHEN o.u < 0.03 THEN 'not_found' WHEN a.action = 'bulk_cancel' THEN 'partial'
         WHEN a.action = 'approval.approve' THEN 'done' WHEN a.action = 'token.mint' THEN 'created'
         ELSE 'done' END,
    CASE WHEN a.action = 'cancel' AND o.u < 0.15 THEN 'delivery had been authorized: the cancel lost' END,
    CASE WHEN a.kind = 'approval' THEN md5('approval' || n)::uuid END,
    CASE WHEN a.action = 'approval.approve'
         THEN 'operator-' || lpad((1 + mod(p.k, %(operators)s))::text, 2, '0') END,
    CASE WHEN a.kind = 'export' THEN jsonb_build_object('status', 'Queued', 'version', 1)
         WHEN a.kind = 'destination' THEN jsonb_build_object('port', 22, 'credential_ref', 'set') END,
    CASE WHEN a.kind = 'export' AND o.u >= 0.15 THEN jsonb_build_object('status', 'Canceled', 'version', 2)
         WHEN a.kind = 'destination' THEN jsonb_build_object('port', 2222, 'credential_ref', 'set') END
FROM generate_series(%(lo)s::int, %(hi)s::int) n
CROSS JOIN LATERAL (SELECT CASE WHEN mod(n, 10) = 1 AND n > 1 THEN n - 1 ELSE n END AS m) r
CROSS JOIN LATERAL (SELECT greatest(1, least(%(total_jobs)s,
    (r.m::bigint * %(total_jobs)s / %(total)s)::int - mod(r.m, 7)))::int AS g) j
CROSS JOIN LATERAL (SELECT (hashint4extended(j.g, 1) & 1048575) / 1048576.0 AS u_tenant,
                           (hashint4extended(j.g, 2) & 1048575) / 1048576.0 AS u_destination,
                           (hashint4extended(n, 5) & 1048575) / 1048576.0 AS u_action,
                           (hashint4extended(n, 6) & 1048575) / 1048576.0 AS u_principal,
                           (hashint4extended(n, 7) & 1048575) / 1048576.0 AS u) o
CROSS JOIN LATERAL (SELECT
    CASE WHEN %(t)s = 1 OR o.u_tenant * 100 < %(big_share)s THEN 1
         ELSE 2 + floor((o.u_tenant * 100 - %(big_share)s) / (100 - %(big_share)s) * (%(t)s - 1))::int END AS t,
    1 + least(%(per_tenant)s - 1, floor(-log(2, 1 - o.u_destination))::int) AS d) k
CROSS JOIN LATERAL (SELECT m.action, m.kind, m.role FROM unnest(%(mix_actions)s::text[], %(mix_kinds)s::text[],
    %(mix_roles)s::text[], %(mix_upto)s::float8[]) m(action, kind, role, upto)
    WHERE m.upto > o.u_action ORDER BY m.upto LIMIT 1) a
CROSS JOIN LATERAL (SELECT 1 + floor(%(operators)s * power(o.u_principal, 3))::int AS k) pk
CROSS JOIN LATERAL (SELECT pk.k,
    CASE WHEN mod(n, %(rare_every)s) = 0 THEN %(rare_principal)s
         WHEN a.role = 'operator' THEN 'operator-' || lpad(pk.k::text, 2, '0')
         WHEN a.role = 'reconciler' THEN 'reconciler-' || (1 + mod(pk.k, 4))
         ELSE 'admin-' || (1 + mod(pk.k, 3)) END AS principal) p
"""


def load_operator_actions(
    admin_url: str,
    scopes: Sequence[ConsoleScope],
    *,
    total: int,
    total_jobs: int,
    big_share: int = 85,
    chunk: int = 500_000,
    progress: Callable[[str], None] | None = None,
) -> float:
    """Append ``total`` rows to the ledger over the history of ``total_jobs`` exports (one operator action in
    every ``total_jobs / total`` exports, in that export's tenant, the first tenant holding ``big_share``
    percent), with the trigger and checks of 0031 in force, then VACUUM ANALYZE; returns the seconds it took."""
    started = time.perf_counter()
    base = {
        "tenants": [s.tenant_id for s in scopes],
        "destinations": [d for s in scopes for d in s.destination_ids],
        "t": len(scopes),
        "per_tenant": len(scopes[0].destination_ids),
        "big_share": big_share,
        "total": total,
        "total_jobs": total_jobs,
        "operators": OPERATORS,
        "rare_principal": RARE_PRINCIPAL,
        "rare_every": RARE_EVERY,
        "platform_every": PLATFORM_EVERY,
        "mix_actions": [m[0] for m in LEDGER_MIX],
        "mix_kinds": [m[1] for m in LEDGER_MIX],
        "mix_roles": [m[2] for m in LEDGER_MIX],
        "mix_upto": [m[3] for m in LEDGER_MIX],
    }
    with psycopg.connect(admin_url, autocommit=True) as conn:
        for lo in range(1, total + 1, chunk):
            hi = min(total, lo + chunk - 1)
            conn.execute(_LEDGER_CHUNK, {**base, "lo": lo, "hi": hi})
            if progress is not None:
                progress(
                    f"ledger: {hi:,} of {total:,} operator actions ({time.perf_counter() - started:.0f} s)"
                )
        conn.execute("VACUUM ANALYZE operator_actions")
        found = conn.execute("SELECT count(*) FROM operator_actions").fetchone()
    if found is None or found[0] < total:
        raise SystemExit(f"ledger: {found} rows, expected at least {total}")
    return time.perf_counter() - started
