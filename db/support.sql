-- The project's statements outside the row protocol: API tokens, display names, destinations, the
-- builder's COPY, the migration runner's bookkeeping, administrators' seeding, readiness and the
-- scrape-time gauges. None of them writes
-- export_jobs; every status change is a statement of queries.sql.

-- name: find_api_token
-- The tenant, principal and role a token's SHA-256 is bound to.
SELECT tenant_id, principal, role FROM api_tokens WHERE token_sha256 = %(token_sha256)s;

-- name: insert_api_token
-- Records a new token by its SHA-256 only (an administrator's connection: no application role may insert).
INSERT INTO api_tokens (token_sha256, tenant_id, principal, role)
VALUES (%(token_sha256)s, %(tenant_id)s, %(principal)s, %(role)s)
RETURNING tenant_id;

-- name: tenant_name
-- A tenant's display name.
SELECT name FROM tenants WHERE id = %(tenant_id)s;

-- name: tenant_destinations
-- A tenant's destinations for display: names and where they point, never the credential reference.
SELECT id, name, host, port, remote_dir FROM destinations WHERE tenant_id = %(tenant_id)s ORDER BY name, id;

-- name: load_destination
-- One tenant's destination with its partner contract, for the worker and recovery.
SELECT id, tenant_id, name, host, port, username, host_key, credential_ref, remote_dir,
       name_and_size_identify, hash_evidence, ack_suffix, max_write_request
FROM destinations WHERE tenant_id = %(tenant_id)s AND id = %(destination_id)s;

-- name: set_build_scope
-- The builder's scope as transaction-local settings bound with named parameters: COPY takes no server-side
-- parameters, and no value is ever merged into SQL text.
SELECT set_config('fenced_exports.tenant_id', %(tenant_id)s, true),
       set_config('fenced_exports.list_name', %(list_name)s, true);

-- name: copy_contacts
-- The tenant's contacts in the list, in a stable order, as CSV with a header (scope from set_build_scope).
COPY (SELECT email, first_name, last_name FROM contacts
      WHERE tenant_id = current_setting('fenced_exports.tenant_id')::uuid
        AND list_name = current_setting('fenced_exports.list_name')
      ORDER BY id) TO STDOUT (FORMAT csv, HEADER true);

-- name: lock_migrations
-- Serializes migrating processes (any constant works; every process uses the same one).
SELECT pg_advisory_lock(%(key)s);

-- name: unlock_migrations
-- Releases the migration lock.
SELECT pg_advisory_unlock(%(key)s);

-- name: create_migrations_table
-- The record of applied migrations.
CREATE TABLE IF NOT EXISTS schema_migrations (
    name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT clock_timestamp());

-- name: applied_migrations
-- The names of the migrations applied so far.
SELECT name FROM schema_migrations ORDER BY name;

-- name: record_migration
-- Records one migration, in the transaction that applied it.
INSERT INTO schema_migrations (name) VALUES (%(name)s);

-- name: role_exists
-- Whether a role of that name exists (roles are cluster-wide).
SELECT 1 AS found FROM pg_roles WHERE rolname = %(role)s;

-- name: insert_tenant
-- Seeds a tenant (administrator's connection).
INSERT INTO tenants (id, name) VALUES (%(id)s, %(name)s) RETURNING id;

-- name: insert_destination
-- Seeds a partner destination (administrator's connection).
INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref, remote_dir,
                          name_and_size_identify, hash_evidence, ack_suffix, max_write_request)
VALUES (%(id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(host_key)s, %(credential_ref)s,
        %(remote_dir)s, %(name_and_size_identify)s, %(hash_evidence)s, %(ack_suffix)s, %(max_write_request)s)
RETURNING id;

-- name: insert_generated_contacts
-- Seeds a list of synthetic contacts in one statement (administrator's connection).
INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)
SELECT %(tenant_id)s, %(list_name)s, 'contact' || n || '@example.test', 'First' || n, 'Last' || n
FROM generate_series(1, %(count)s) AS n;

-- name: become_dispatcher
-- The dispatcher's LISTEN connection acts as its role.
SET ROLE exports_dispatcher;

-- name: listen_outbox
-- Wake-ups: the outbox's insert trigger sends a NOTIFY on this channel after each committed insert.
LISTEN outbox;

-- name: ping_database
-- Readiness (/readyz): the database answers on a connection of the process's own pool.
SELECT 1 AS ok;

-- name: configure_gauges_session
-- The gauges' own connection acts as its role (set_config('role') is SET ROLE) with a statement_timeout,
-- both bound as parameters.
SELECT set_config('role', %(role)s, false), set_config('statement_timeout', %(statement_timeout)s, false);

-- name: read_database_gauges
-- The scrape-time gauges (observability/db_gauges.py) in one statement. Each part reads a partial index
-- whose size is the work in flight (0004_observability.sql), never the history: counts stop at %(cap)s
-- rows each, minimums are one index probe, and the OutcomeUnknown wait looks up the outcome event of at
-- most %(unknown_probe)s jobs (those whose delivery began first). Ages are on the database clock, like
-- every lease, and are 0 when nothing is waiting.
WITH unknown_since AS (
    SELECT min(e.recorded_at) AS since
    FROM (SELECT id, attempt_id FROM export_jobs
          WHERE status = 'OutcomeUnknown'
          ORDER BY delivery_authorized_at
          LIMIT %(unknown_probe)s) u
    CROSS JOIN LATERAL (
        SELECT recorded_at FROM export_attempt_events e
        WHERE e.job_id = u.id AND e.attempt_id = u.attempt_id
          AND e.kind IN ('Finished', 'ResolvedByRecovery') AND e.kind <> 'DeliveryEvidence') e
)
SELECT
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Queued' LIMIT %(cap)s) c) AS queued,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Running' LIMIT %(cap)s) c) AS running,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Delivering' LIMIT %(cap)s) c) AS delivering,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'OutcomeUnknown' LIMIT %(cap)s) c)
        AS outcome_unknown,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Running' AND lease_expires_at < statement_timestamp()
                           LIMIT %(cap)s) c) AS running_expired,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp()
                           LIMIT %(cap)s) c) AS delivering_expired,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Running' AND lease_expires_at < statement_timestamp())
        AS running_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp())
        AS delivering_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(created_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(woken_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_wake_up_age,
    (SELECT coalesce(max(sweep_count), 0) FROM export_jobs WHERE status = 'Queued') AS queued_max_sweep_count,
    (SELECT count(*) FROM (SELECT FROM outbox WHERE published_at IS NULL LIMIT %(cap)s) c) AS outbox_unpublished,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(created_at)), 0)::float8
     FROM outbox WHERE published_at IS NULL) AS outbox_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - since), 0)::float8 FROM unknown_since)
        AS outcome_unknown_oldest_age;
