-- The project's statements outside the row protocol: API tokens, display names, destinations, the
-- builder's COPY, the migration runner's bookkeeping, administrators' seeding, readiness and the
-- scrape-time gauges. None of them writes
-- export_jobs; every status change is a statement of queries.sql.

-- name: find_api_token
-- The tenant, principal and role a token's SHA-256 is bound to, while its principal is not revoked and
-- still holds the token's role: revoking a principal disables every token it has at once.
SELECT t.tenant_id, t.principal, t.role
FROM api_tokens t
JOIN principals p ON p.tenant_id = t.tenant_id AND p.name = t.principal
WHERE t.token_sha256 = %(token_sha256)s AND p.revoked_at IS NULL AND p.role = t.role;

-- name: insert_api_token
-- Records a new token by its SHA-256 only (an administrator's connection: no application role may insert).
-- A name that is not yet a principal of the tenant becomes one, with the token's role; a token is never
-- minted for a revoked principal or for a role the principal does not hold (nothing is inserted).
WITH principal AS (
    INSERT INTO principals (tenant_id, name, role)
    VALUES (%(tenant_id)s, %(principal)s, %(role)s)
    ON CONFLICT (tenant_id, name) DO NOTHING)
INSERT INTO api_tokens (token_sha256, tenant_id, principal, role)
SELECT %(token_sha256)s, %(tenant_id)s, %(principal)s, %(role)s
WHERE NOT EXISTS (
    SELECT 1 FROM principals p
    WHERE p.tenant_id = %(tenant_id)s AND p.name = %(principal)s
      AND (p.role <> %(role)s OR p.revoked_at IS NOT NULL))
RETURNING tenant_id;

-- name: upsert_principal
-- Makes a name a principal of the tenant with a role and, optionally, the only lists it may export
-- (administrator's connection); an existing principal gets the role and lists given, and is reinstated.
INSERT INTO principals (tenant_id, name, role, export_lists)
VALUES (%(tenant_id)s, %(name)s, %(role)s, %(export_lists)s::text[])
ON CONFLICT (tenant_id, name) DO UPDATE
SET role = EXCLUDED.role, export_lists = EXCLUDED.export_lists, revoked_at = NULL, revoked_by = NULL
RETURNING name;

-- name: revoke_principal
-- Revokes a principal (administrator's connection): its tokens stop working and the policy check rejects
-- the exports it created that are still queued. Revoked once; a second revocation changes nothing.
UPDATE principals SET revoked_at = clock_timestamp(), revoked_by = %(revoked_by)s
WHERE tenant_id = %(tenant_id)s AND name = %(name)s AND revoked_at IS NULL
RETURNING name;

-- name: retire_destination
-- Retires a destination, as its next version, with its record (who, the role, why, the row before and after)
-- in the same statement: an admin's request (API) or an administrator's connection. Cutoff 2 reads this row
-- FOR SHARE, so an attempt building for it is stopped before delivery, and the policy check rejects what is
-- still queued. A retirement is final; retiring again changes nothing. Answers whether it matched, with the
-- version the row is at and when it was retired.
WITH current AS (
    SELECT d.* FROM destinations d
    WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s
    FOR UPDATE),
retired AS (
    UPDATE destinations d
    SET retired_at = clock_timestamp(), retired_by = %(retired_by)s, version = d.version + 1
    FROM current c
    WHERE d.tenant_id = c.tenant_id AND d.id = c.id AND c.retired_at IS NULL
    RETURNING d.*),
recorded AS (
    INSERT INTO destination_versions (tenant_id, destination_id, version, change, changed_by, changed_role,
                                      reason, before, after, changed_fields, delivery_changed)
    SELECT r.tenant_id, r.id, r.version, 'retired', %(retired_by)s, %(changed_role)s, %(reason)s,
           to_jsonb(c), to_jsonb(r), ARRAY['retired_at', 'retired_by'], r.delivery_version = r.version
    FROM retired r, current c
    RETURNING version)
SELECT true AS matched, r.version, r.retired_at, r.retired_by FROM retired r
UNION ALL
SELECT false, c.version, c.retired_at, c.retired_by FROM current c WHERE NOT EXISTS (SELECT 1 FROM retired);

-- name: create_destination
-- An admin creates a destination of the tenant (API) with its record as version 1, in one statement. An
-- Idempotency-Key this tenant already used creates nothing: the answer names that earlier creation and its
-- request's fingerprint, which the service compares. A new destination starts paused, as every one does (it
-- has no switch row: fail-closed), until an operator resumes it.
WITH earlier AS (
    SELECT destination_id, request_fingerprint FROM destination_versions
    WHERE tenant_id = %(tenant_id)s AND request_key = %(request_key)s),
created AS (
    INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, host_keys, credential_ref,
                              remote_dir, name_and_size_identify, hash_evidence, ack_suffix, max_write_request,
                              temporary_files, contract_starts_on, contract_ends_on, max_sessions,
                              intake_time_zone, intake_hours, blackout_dates, manifest, csv_header,
                              csv_delimiter, csv_columns, compression, pgp_recipient_keys, pgp_signing_key_ref)
    SELECT %(id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(host_key)s,
           %(host_keys)s::text[], %(credential_ref)s,
           %(remote_dir)s, %(name_and_size_identify)s, %(hash_evidence)s, %(ack_suffix)s::text,
           %(max_write_request)s, %(temporary_files)s,
           coalesce(%(contract_starts_on)s::date, (clock_timestamp() AT TIME ZONE 'UTC')::date),
           %(contract_ends_on)s::date, %(max_sessions)s::int,
           -- the delivery window (0035): none unless given
           coalesce(%(intake_time_zone)s::text, 'UTC'), %(intake_hours)s::text[],
           coalesce(%(blackout_dates)s::date[], ARRAY[]::date[]),
           -- the manifest published beside each file (0037): none unless asked for
           coalesce(%(manifest)s::text, 'none'),
           -- what the partner receives (0020): the file's shape and its OpenPGP layer, 0020's defaults unless given
           coalesce(%(csv_header)s::boolean, true), coalesce(%(csv_delimiter)s::text, ','),
           coalesce(%(csv_columns)s::text[], ARRAY['email', 'first_name', 'last_name']),
           coalesce(%(compression)s::text, 'none'),
           coalesce(%(pgp_recipient_keys)s::text[], ARRAY[]::text[]), %(pgp_signing_key_ref)s::text
    WHERE NOT EXISTS (SELECT 1 FROM earlier)
    RETURNING *),
recorded AS (
    INSERT INTO destination_versions (tenant_id, destination_id, version, change, changed_by, changed_role,
                                      reason, before, after, changed_fields, delivery_changed, request_key,
                                      request_fingerprint)
    SELECT c.tenant_id, c.id, c.version, 'created', %(changed_by)s, %(changed_role)s, %(reason)s, NULL,
           to_jsonb(c), ARRAY[]::text[], true, %(request_key)s, %(request_fingerprint)s
    FROM created c
    RETURNING destination_id)
SELECT id AS destination_id, false AS replayed, %(request_fingerprint)s::text AS fingerprint FROM created
UNION ALL
SELECT destination_id, true, request_fingerprint FROM earlier;

-- name: edit_destination_if_version
-- Changes a destination as its next version, only from the version the editor read (none given: whatever it
-- is now, an administrator's connection) and only while it is not retired, with its record (who, the role,
-- why, the row before and after, the fields that changed) in the same statement. ``changes`` is a JSON
-- object of the columns to set (a key absent keeps its value; null clears a nullable one). The trigger sets
-- delivery_version when a delivery term changed, which makes cutoff 2 refuse what was built before. Pinning
-- or removing a host key is such an edit of host_keys (0029: host_key follows as their first). Answers
-- whether it matched, with the version the row is at.
WITH current AS (
    SELECT d.* FROM destinations d
    WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s
    FOR UPDATE),
edited AS (
    UPDATE destinations d
    SET (name, host, port, username, host_key, host_keys, credential_ref, remote_dir, name_and_size_identify,
         hash_evidence, ack_suffix, max_write_request, temporary_files, contract_starts_on, contract_ends_on,
         max_sessions, manifest)
        = (SELECT r.name, r.host, r.port, r.username, r.host_key, r.host_keys, r.credential_ref, r.remote_dir,
                  r.name_and_size_identify, r.hash_evidence, r.ack_suffix, r.max_write_request, r.temporary_files,
                  r.contract_starts_on, r.contract_ends_on, r.max_sessions, r.manifest
           FROM jsonb_populate_record(d, %(changes)s::jsonb) AS r),
        -- what the partner receives (0020, an admin's since 0038): delivery terms, so a change rebuilds the file
        (csv_header, csv_delimiter, csv_columns, compression, pgp_recipient_keys, pgp_signing_key_ref)
        = (SELECT r.csv_header, r.csv_delimiter, r.csv_columns, r.compression, r.pgp_recipient_keys,
                  r.pgp_signing_key_ref
           FROM jsonb_populate_record(d, %(changes)s::jsonb) AS r),
        -- the delivery window (0035): not a delivery term, so no rebuild; cutoff 2 and the rename re-read it
        (intake_time_zone, intake_hours, blackout_dates)
        = (SELECT r.intake_time_zone, r.intake_hours, r.blackout_dates
           FROM jsonb_populate_record(d, %(changes)s::jsonb) AS r),
        version = d.version + 1
    FROM current c
    WHERE d.tenant_id = c.tenant_id AND d.id = c.id AND c.retired_at IS NULL
      AND (%(expected_version)s::int IS NULL OR c.version = %(expected_version)s::int)
    RETURNING d.*),
recorded AS (
    INSERT INTO destination_versions (tenant_id, destination_id, version, change, changed_by, changed_role,
                                      reason, before, after, changed_fields, delivery_changed)
    SELECT e.tenant_id, e.id, e.version, 'edited', %(changed_by)s, %(changed_role)s, %(reason)s,
           to_jsonb(c), to_jsonb(e),
           ARRAY(SELECT f.key FROM jsonb_each(to_jsonb(e)) AS f
                 WHERE f.key NOT IN ('version', 'delivery_version', 'intake_week')
                   AND f.value IS DISTINCT FROM to_jsonb(c) -> f.key
                 ORDER BY f.key),
           e.delivery_version = e.version
    FROM edited e, current c
    RETURNING version, changed_fields, delivery_changed)
SELECT true AS matched, r.version, r.changed_fields, r.delivery_changed, NULL::timestamptz AS retired_at
FROM recorded r
UNION ALL
SELECT false, c.version, ARRAY[]::text[], false, c.retired_at FROM current c WHERE NOT EXISTS (SELECT 1 FROM edited);

-- name: record_destination_seeded
-- The record of a destination seeding inserted (administrator's connection), as its version 1.
INSERT INTO destination_versions (tenant_id, destination_id, version, change, changed_by, changed_role, reason,
                                  before, after, changed_fields, delivery_changed)
SELECT d.tenant_id, d.id, d.version, 'created', %(changed_by)s, 'owner', %(reason)s, NULL, to_jsonb(d), ARRAY[]::text[], true
FROM destinations d
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s
RETURNING version;

-- name: get_tenant_destination
-- One destination of the tenant as it is now, every column as JSON (the service shows a reference as set or
-- unset, never its value), with whether its delivery switch is on and no pause of its own holds it (no switch
-- row: never enabled, so paused), what holds it when something does (the latest pause's reason, a worker's
-- "host key changed: presented SHA256:..." too, so a Queued export to it says why it waits), how many of its
-- session slots are held now (0029), and when its delivery window opens next (now, when it is open; 0035).
SELECT d.id, d.version, to_jsonb(d) - 'intake_week' AS settings,
       (SELECT s.enabled FROM delivery_switches s
        WHERE s.scope = 'destination' AND s.tenant_id = d.tenant_id AND s.destination_id = d.id)
       AND h.hold IS NULL AS enabled,
       h.hold AS paused_because,
       (SELECT count(*) FROM destination_session_slots s
        WHERE s.destination_id = d.id AND session_slot_held(s))::int AS sessions_in_use,
       w.at AS window_checked_at, next_window_opening(d, w.at) AS window_opens_at
FROM destinations d
CROSS JOIN (SELECT clock_timestamp() AS at) w
CROSS JOIN LATERAL (SELECT delivery_scope_hold('destination', d.tenant_id, d.id) AS hold) h
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s;

-- name: principal_role
-- The role a principal of the tenant holds, while it is not revoked (the command line acts as a named
-- principal, and a destination's change is an admin's).
SELECT role FROM principals
WHERE tenant_id = %(tenant_id)s AND name = %(name)s AND revoked_at IS NULL;

-- name: destination_versions_of
-- A destination's recorded versions, newest first (only if it is the tenant's): who changed what, when and
-- why, with the rows before and after.
SELECT version, change, changed_by, changed_role, reason, changed_at, before, after, changed_fields,
       delivery_changed
FROM destination_versions
WHERE tenant_id = %(tenant_id)s AND destination_id = %(destination_id)s
ORDER BY version DESC
LIMIT %(limit)s;

-- name: tenant_name
-- A tenant's display name.
SELECT name FROM tenants WHERE id = %(tenant_id)s;

-- name: lock_delivery_switch
-- The first statement of a pause or a resume: locks the scope's row, if it has one, and reads whether the
-- scope is open now (its row on and no active pause of its own). Taking the row lock waits for every claim and
-- cutoff 2 that read it FOR SHARE, and they wait for this transaction: a pause committed here is seen by every
-- later claim and cutoff 2 (they read the pauses after that lock, lock_delivery_scope).
SELECT s.enabled AND NOT coalesce(s.held_until > clock_timestamp(), false) AS enabled
FROM delivery_switches s
WHERE s.scope = %(scope)s AND s.tenant_id IS NOT DISTINCT FROM %(tenant_id)s::uuid
  AND s.destination_id IS NOT DISTINCT FROM %(destination_id)s::uuid
FOR UPDATE OF s;

-- name: set_delivery_switch
-- Pauses or resumes one scope (global; a tenant; one of its destinations) with who and why, after
-- lock_delivery_switch in the same transaction. A pause (enabled false) adds the changer's pause of the scope,
-- of its kind, with its reason and optional expiry (the same owner and reason again re-arms that pause). A
-- resume opens the scope's switch row (creating it: a scope never enabled opens) and releases the pauses it
-- names: pause_ids, or none given, the changer's own manual ones; one someone else set, or a host-key trip,
-- only with an approval the changer decided (the guard refuses the rest; here they match nothing). The change
-- is appended to the history in the same statement, with whether the scope is open after it and what it was
-- before (read under the lock).
WITH active AS (
    SELECT p.id, p.owner, p.kind, p.expires_at FROM delivery_pauses p
    WHERE p.scope = %(scope)s AND p.tenant_id IS NOT DISTINCT FROM %(tenant_id)s::uuid
      AND p.destination_id IS NOT DISTINCT FROM %(destination_id)s::uuid AND p.released_at IS NULL),
paused AS (
    INSERT INTO delivery_pauses (scope, tenant_id, destination_id, kind, owner, reason, expires_at)
    SELECT %(scope)s, %(tenant_id)s::uuid, %(destination_id)s::uuid, %(kind)s, %(changed_by)s, %(reason)s,
           %(expires_at)s::timestamptz
    WHERE NOT %(enabled)s
    ON CONFLICT (scope, tenant_id, destination_id, owner, reason) WHERE released_at IS NULL
    DO UPDATE SET expires_at = EXCLUDED.expires_at
    RETURNING id),
released AS (
    UPDATE delivery_pauses p
    SET released_at = clock_timestamp(), released_by = %(changed_by)s, release_reason = %(reason)s
    FROM active a
    WHERE %(enabled)s AND p.id = a.id
      AND CASE WHEN %(pause_ids)s::uuid[] IS NULL THEN a.owner = %(changed_by)s AND a.kind = 'manual'
               ELSE a.id = ANY (%(pause_ids)s::uuid[]) END
      -- a pause of someone else's, or a host-key trip: only with the changer's approval (two people, 0032)
      AND (%(scope)s = 'global' OR (a.owner = %(changed_by)s AND a.kind = 'manual')
           OR approved_action(%(tenant_id)s::uuid, ARRAY['resume_pause'], a.id::text, %(changed_by)s, jsonb_build_object()))
    RETURNING p.id),
switched AS (
    INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)
    VALUES (%(scope)s, %(tenant_id)s::uuid, %(destination_id)s::uuid, %(enabled)s, %(reason)s, %(changed_by)s)
    ON CONFLICT ON CONSTRAINT uq_delivery_switches_scope DO UPDATE
    SET enabled = delivery_switches.enabled OR EXCLUDED.enabled, reason = EXCLUDED.reason,
        changed_by = EXCLUDED.changed_by, changed_at = clock_timestamp()
    RETURNING scope, tenant_id, destination_id, enabled, reason, changed_by, changed_at)
INSERT INTO delivery_switch_changes (scope, tenant_id, destination_id, enabled, was_enabled, reason, changed_by,
                                     changed_at, pause_ids)
SELECT s.scope, s.tenant_id, s.destination_id,
       -- open after this change: its row on, not paused now, and none of its active pauses left
       s.enabled AND %(enabled)s AND NOT EXISTS (
           SELECT 1 FROM active a
           WHERE a.id NOT IN (SELECT id FROM released)
             AND (a.expires_at IS NULL OR a.expires_at > clock_timestamp())),
       %(was_enabled)s::boolean, s.reason, s.changed_by, s.changed_at,
       ARRAY(SELECT id FROM paused UNION ALL SELECT id FROM released)
FROM switched s
RETURNING id, scope, tenant_id, destination_id, enabled, was_enabled, reason, changed_by, changed_at, pause_ids;

-- name: tenant_switches
-- The switches an operator of a tenant sees: the global one, the tenant's, and one per destination of the
-- tenant, including destinations that have no row (never enabled: paused), retired ones marked. A scope held
-- by an active pause is paused, shown with its latest pause's owner, reason and start.
SELECT 'global' AS scope, NULL::uuid AS tenant_id, NULL::uuid AS destination_id, NULL::text AS destination_name,
       false AS destination_retired, s.enabled AND p.id IS NULL AS enabled, coalesce(p.reason, s.reason) AS reason,
       coalesce(p.owner, s.changed_by) AS changed_by, coalesce(p.paused_at, s.changed_at) AS changed_at
FROM (SELECT 1) AS one
LEFT JOIN delivery_switches s ON s.scope = 'global'
LEFT JOIN LATERAL (
    SELECT a.id, a.owner, a.reason, a.paused_at FROM delivery_pauses a
    WHERE a.scope = 'global' AND a.tenant_id IS NULL AND a.destination_id IS NULL AND a.released_at IS NULL
      AND (a.expires_at IS NULL OR a.expires_at > clock_timestamp())
    ORDER BY a.paused_at DESC LIMIT 1) p ON true
UNION ALL
SELECT 'tenant', %(tenant_id)s::uuid, NULL::uuid, NULL::text, false, s.enabled AND p.id IS NULL,
       coalesce(p.reason, s.reason), coalesce(p.owner, s.changed_by), coalesce(p.paused_at, s.changed_at)
FROM (SELECT 1) AS one
LEFT JOIN delivery_switches s ON s.scope = 'tenant' AND s.tenant_id = %(tenant_id)s::uuid
LEFT JOIN LATERAL (
    SELECT a.id, a.owner, a.reason, a.paused_at FROM delivery_pauses a
    WHERE a.scope = 'tenant' AND a.tenant_id = %(tenant_id)s::uuid AND a.destination_id IS NULL
      AND a.released_at IS NULL AND (a.expires_at IS NULL OR a.expires_at > clock_timestamp())
    ORDER BY a.paused_at DESC LIMIT 1) p ON true
WHERE %(tenant_id)s::uuid IS NOT NULL
UNION ALL
SELECT 'destination', d.tenant_id, d.id, d.name, d.retired_at IS NOT NULL, s.enabled AND p.id IS NULL,
       coalesce(p.reason, s.reason), coalesce(p.owner, s.changed_by), coalesce(p.paused_at, s.changed_at)
FROM destinations d
LEFT JOIN delivery_switches s ON s.scope = 'destination' AND s.tenant_id = d.tenant_id AND s.destination_id = d.id
LEFT JOIN LATERAL (
    SELECT a.id, a.owner, a.reason, a.paused_at FROM delivery_pauses a
    WHERE a.scope = 'destination' AND a.tenant_id = d.tenant_id AND a.destination_id = d.id
      AND a.released_at IS NULL AND (a.expires_at IS NULL OR a.expires_at > clock_timestamp())
    ORDER BY a.paused_at DESC LIMIT 1) p ON true
WHERE d.tenant_id = %(tenant_id)s::uuid;

-- name: tenant_pauses
-- The active pauses a tenant's operators see (the global scope's and their own tenant's and destinations'),
-- oldest first: who set each, why, since when, until when, and its kind.
SELECT id, scope, tenant_id, destination_id, kind, owner, reason, paused_at, expires_at
FROM delivery_pauses
WHERE released_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp())
  AND (scope = 'global' OR tenant_id = %(tenant_id)s::uuid)
ORDER BY paused_at, id;

-- name: find_delivery_pause
-- One active pause of the tenant (or the global one), or no row: another tenant's looks missing.
SELECT id, scope, tenant_id, destination_id, kind, owner, reason, paused_at, expires_at
FROM delivery_pauses
WHERE id = %(pause_id)s AND released_at IS NULL AND (expires_at IS NULL OR expires_at > clock_timestamp())
  AND (scope = 'global' OR tenant_id = %(tenant_id)s::uuid);

-- name: switch_history
-- The latest changes a tenant's operators may see (the global switch's and their own tenant's), newest
-- first; with no tenant, the global switch's alone.
SELECT id, scope, tenant_id, destination_id, enabled, was_enabled, reason, changed_by, changed_at, pause_ids
FROM delivery_switch_changes
WHERE scope = 'global' OR tenant_id = %(tenant_id)s::uuid
ORDER BY id DESC
LIMIT %(limit)s;

-- name: tenant_destinations
-- A tenant's destinations for display: names, where they point, their version and retirement, never the
-- credential reference.
SELECT id, name, host, port, remote_dir, version, retired_at
FROM destinations WHERE tenant_id = %(tenant_id)s ORDER BY name, id;

-- name: load_destination
-- One tenant's destination with its partner contract and the format of the file it receives (0020), for the
-- worker and recovery: as it is now, or, given a
-- version, as that version recorded it (a delivery uses the version cutoff 2 authorized, whatever the row
-- says since: that version's record, or the row before the change that followed it; a column added since
-- keeps the row's value). No row when that version was never recorded. Its kind picks the partner code
-- (partner/kinds.py); SFTP is the one kind and no column stores it yet. A version recorded before host_keys
-- existed (0029) trusted its one host_key, whatever the row pins now. max_sessions is the row's as it is now
-- (a limit, not a term of the version).
SELECT r.id, r.tenant_id, r.name, r.host, r.port, r.username, r.host_key,
       CASE WHEN %(version)s::int IS NULL OR d.version = %(version)s::int
                 OR coalesce(v.after, n.before) ? 'host_keys' THEN r.host_keys
            ELSE ARRAY[r.host_key] END AS host_keys,
       r.credential_ref, r.remote_dir,
       r.name_and_size_identify, r.hash_evidence, r.ack_suffix, r.max_write_request, r.temporary_files,
       r.version, 'sftp'::text AS kind,
       r.csv_header, r.csv_delimiter, r.csv_columns, r.compression, r.pgp_recipient_keys, r.pgp_signing_key_ref,
       d.max_sessions, r.manifest
FROM destinations d
LEFT JOIN destination_versions v
       ON v.tenant_id = d.tenant_id AND v.destination_id = d.id AND v.version = %(version)s::int
LEFT JOIN destination_versions n
       ON n.tenant_id = d.tenant_id AND n.destination_id = d.id AND n.version = %(version)s::int + 1
CROSS JOIN LATERAL jsonb_populate_record(
    d, CASE WHEN %(version)s::int IS NULL OR d.version = %(version)s::int THEN jsonb_build_object()
            ELSE coalesce(v.after, n.before) END) AS r
WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s
  -- jsonb_populate_record of a NULL is the row as it is now: a version nothing recorded is no row at all
  AND (%(version)s::int IS NULL OR d.version = %(version)s::int OR v.after IS NOT NULL OR n.before IS NOT NULL);

-- name: read_delivery_scope
-- Whether every delivery switch of a destination's scope (global, its tenant, itself) is enabled now: what
-- recovery asks before it opens a session with that partner (a paused scope waits for the resume, 23.5).
SELECT delivery_scope_open(%(tenant_id)s, %(destination_id)s) AS open;

-- name: set_build_scope
-- The builder's scope as transaction-local settings bound with named parameters: COPY takes no server-side
-- parameters, and no value is ever merged into SQL text.
SELECT set_config('fenced_exports.tenant_id', %(tenant_id)s, true),
       set_config('fenced_exports.list_name', %(list_name)s, true);

-- name: copy_contacts
-- The tenant's contacts in the list, in a stable order, as CSV (scope from set_build_scope), in the
-- destination's format: db/builder.py composes it with psycopg.sql from a checked FileFormat, {columns} as
-- identifiers of contacts' columns and {header}, {delimiter} as literals (COPY takes no parameters).
COPY (SELECT {columns} FROM contacts
      WHERE tenant_id = current_setting('fenced_exports.tenant_id')::uuid
        AND list_name = current_setting('fenced_exports.list_name')
      ORDER BY id) TO STDOUT (FORMAT csv, HEADER {header}, DELIMITER {delimiter});

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
-- Seeds a partner destination (administrator's connection). It starts paused, as every new destination
-- does, until a switch row enables it (seed_switch, or an operator's resume).
INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, host_keys, credential_ref,
                          remote_dir, name_and_size_identify, hash_evidence, ack_suffix, max_write_request,
                          temporary_files, csv_header, csv_delimiter, csv_columns, compression, pgp_recipient_keys,
                          pgp_signing_key_ref, max_sessions, manifest)
VALUES (%(id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(host_key)s, %(host_keys)s::text[],
        %(credential_ref)s, %(remote_dir)s, %(name_and_size_identify)s, %(hash_evidence)s, %(ack_suffix)s,
        %(max_write_request)s, %(temporary_files)s, %(csv_header)s, %(csv_delimiter)s, %(csv_columns)s,
        %(compression)s, %(pgp_recipient_keys)s, %(pgp_signing_key_ref)s, %(max_sessions)s::int, %(manifest)s)
RETURNING id;

-- name: seed_switch
-- Creates a tenant's or destination's switch at seeding time, enabled or not, with its history entry
-- (administrator's connection: a tenant or destination "created enabled").
WITH switched AS (
    INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)
    VALUES (%(scope)s, %(tenant_id)s::uuid, %(destination_id)s::uuid, %(enabled)s, %(reason)s, %(changed_by)s)
    RETURNING scope, tenant_id, destination_id, enabled, reason, changed_by, changed_at)
INSERT INTO delivery_switch_changes (scope, tenant_id, destination_id, enabled, reason, changed_by, changed_at)
SELECT scope, tenant_id, destination_id, enabled, reason, changed_by, changed_at FROM switched
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

-- name: record_cancellation_preview
-- What a bulk cancel with this filter would cover now (the confirmation the operator reads): each live export
-- of the tenant with its status, and that exact set kept under a new preview token bound to the tenant and
-- the principal who saw it, in one statement, so the set kept is the set counted. No token when nothing
-- matches. Expired previews are removed on the way.
WITH expired AS (
    DELETE FROM cancellation_previews WHERE expires_at < clock_timestamp()),
live AS (
    SELECT id, status, created_at FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND destination_id = %(destination_id)s
      AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
      AND status IN ('Queued', 'Running', 'Delivering')),
kept AS (
    INSERT INTO cancellation_previews (tenant_id, previewed_by, destination_id, list_name, job_ids, expires_at)
    SELECT %(tenant_id)s, %(previewed_by)s, %(destination_id)s, %(list_name)s::text, array_agg(id ORDER BY id),
           clock_timestamp() + make_interval(secs => %(ttl_seconds)s)
    FROM live
    HAVING count(*) > 0
    RETURNING id, expires_at)
SELECT (SELECT id FROM kept) AS preview_id, (SELECT expires_at FROM kept) AS expires_at,
       l.id AS job_id, l.status
FROM live l
ORDER BY l.created_at, l.id;

-- name: record_cancellation_batch
-- Records a bulk cancel (who, the filter, why) and the exports of the tenant it covers, fixed now, in one
-- statement; nothing when the batch ID is already recorded in this tenant (the caller reads it), or when the
-- preview it confirms is not this principal's unexpired preview of this filter in this tenant. With a
-- preview it covers exactly the set the preview counted, whatever their status now; without one, the
-- exports live now. Each covered export then gets its own request through cancel_and_record.
WITH preview AS (
    SELECT job_ids FROM cancellation_previews
    WHERE tenant_id = %(tenant_id)s AND id = %(preview_id)s::uuid AND previewed_by = %(requested_by)s
      AND destination_id = %(destination_id)s AND list_name IS NOT DISTINCT FROM %(list_name)s::text
      AND expires_at > clock_timestamp()),
covers AS (
    -- the previewed set: an export of it that ended meanwhile is covered too, and the ledger gives it its
    -- honest outcome (AlreadyEnded, TooLate, ...); one that became live after the preview is not in it
    SELECT j.id FROM preview p JOIN export_jobs j ON j.id = ANY (p.job_ids)
    WHERE j.tenant_id = %(tenant_id)s
    UNION ALL
    SELECT id FROM export_jobs
    WHERE %(preview_id)s::uuid IS NULL
      AND tenant_id = %(tenant_id)s AND destination_id = %(destination_id)s
      AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
      AND status IN ('Queued', 'Running', 'Delivering')),
batch AS (
    INSERT INTO cancellation_batches (tenant_id, id, requested_by, reason, destination_id, list_name, matched,
                                      preview_id)
    SELECT %(tenant_id)s, %(batch_id)s, %(requested_by)s, %(reason)s, %(destination_id)s, %(list_name)s::text,
           (SELECT count(*) FROM covers), %(preview_id)s::uuid
    WHERE %(preview_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM preview)
    ON CONFLICT ON CONSTRAINT pk_cancellation_batches DO NOTHING
    RETURNING *),
covered AS (
    INSERT INTO cancellation_batch_jobs (tenant_id, batch_id, job_id)
    SELECT b.tenant_id, b.id, c.id FROM batch b, covers c)
SELECT * FROM batch;

-- name: find_cancellation_batch
-- A recorded bulk cancel of this tenant.
SELECT * FROM cancellation_batches WHERE tenant_id = %(tenant_id)s AND id = %(batch_id)s;

-- name: batch_jobs_without_request
-- The exports a bulk cancel covers that have no request of that batch recorded yet: the ones that were
-- Busy, or never reached. A retry of the batch decides these and only these.
SELECT m.job_id FROM cancellation_batch_jobs m
JOIN export_jobs j ON j.tenant_id = m.tenant_id AND j.id = m.job_id
WHERE m.tenant_id = %(tenant_id)s AND m.batch_id = %(batch_id)s
  AND NOT EXISTS (SELECT 1 FROM cancellation_requests r
                  WHERE r.tenant_id = m.tenant_id AND r.batch_id = m.batch_id AND r.job_id = m.job_id)
ORDER BY j.created_at, j.id;

-- name: batch_live_exports_not_covered
-- The exports live now under a bulk cancel's filter that it does not cover: they became live after its
-- preview (or after it was recorded). The batch never touches them; its answer names them.
SELECT j.id AS job_id FROM cancellation_batches b
JOIN export_jobs j ON j.tenant_id = b.tenant_id AND j.destination_id = b.destination_id
WHERE b.tenant_id = %(tenant_id)s AND b.id = %(batch_id)s
  AND (b.list_name IS NULL OR j.list_name = b.list_name)
  AND j.status IN ('Queued', 'Running', 'Delivering')
  AND NOT EXISTS (SELECT 1 FROM cancellation_batch_jobs m
                  WHERE m.tenant_id = b.tenant_id AND m.batch_id = b.id AND m.job_id = j.id)
ORDER BY j.created_at, j.id;

-- name: batch_requests_of_jobs
-- The requests a bulk cancel recorded for these exports: the re-read after a lane lost its connection, whose
-- segment's transactions may have committed before the answer was lost (the row, not the exception, says).
SELECT * FROM cancellation_requests
WHERE tenant_id = %(tenant_id)s AND batch_id = %(batch_id)s AND job_id = ANY (%(job_ids)s::uuid[]);

-- name: batch_outcomes
-- How many requests of a bulk cancel were recorded with each outcome.
SELECT outcome, count(*)::int AS n FROM cancellation_requests
WHERE tenant_id = %(tenant_id)s AND batch_id = %(batch_id)s
GROUP BY outcome;

-- name: batch_stops_to_signal
-- A bulk cancel's StopRequested requests that no submission of the batch has signalled yet and whose attempt
-- still runs under them: what every submission signals, a replay included, so a stop request committed by a
-- lane whose answer was lost is signalled too. The signal only speeds the stop; cutoff 2 enforces it.
SELECT r.id AS request_id, r.job_id, j.workflow_id
FROM cancellation_requests r
JOIN export_jobs j ON j.tenant_id = r.tenant_id AND j.id = r.job_id
WHERE r.tenant_id = %(tenant_id)s AND r.batch_id = %(batch_id)s AND r.outcome = 'StopRequested'
  AND j.status = 'Running' AND j.stop_request_id = r.id AND j.workflow_id IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM cancellation_stop_signals s
                  WHERE s.tenant_id = r.tenant_id AND s.request_id = r.id)
ORDER BY r.recorded_at, r.id;

-- name: record_stop_signals
-- The stop signals Temporal took for a bulk cancel's requests, so no later submission sends them again.
INSERT INTO cancellation_stop_signals (tenant_id, request_id, workflow_id)
SELECT %(tenant_id)s, s.request_id, s.workflow_id
FROM unnest(%(request_ids)s::uuid[], %(workflow_ids)s::text[]) AS s (request_id, workflow_id)
ON CONFLICT ON CONSTRAINT pk_cancellation_stop_signals DO NOTHING;

-- name: open_console_session
-- Opens a console session for a known token: stores the session ID's hash and its expiry, never the ID.
-- Expired sessions are removed on the way, so the table does not grow with abandoned sign-ins.
WITH expired AS (
    DELETE FROM console_sessions WHERE expires_at < clock_timestamp())
INSERT INTO console_sessions (session_sha256, token_sha256, expires_at)
VALUES (%(session_sha256)s, %(token_sha256)s, clock_timestamp() + make_interval(secs => %(ttl_seconds)s))
RETURNING expires_at;

-- name: find_console_session
-- The tenant, principal and role a live (unexpired) console session is bound to, through its token, on
-- the same terms as find_api_token: a revoked principal's sessions end with its tokens.
SELECT t.tenant_id, t.principal, t.role
FROM console_sessions s
JOIN api_tokens t ON t.token_sha256 = s.token_sha256
JOIN principals p ON p.tenant_id = t.tenant_id AND p.name = t.principal
WHERE s.session_sha256 = %(session_sha256)s AND s.expires_at > clock_timestamp()
  AND p.revoked_at IS NULL AND p.role = t.role;

-- name: close_console_session
-- Sign-out: the session is deleted, so its cookie no longer authenticates anything.
DELETE FROM console_sessions WHERE session_sha256 = %(session_sha256)s
RETURNING session_sha256;

-- name: bound_this_read
-- The console's and the list API's reads run in a short transaction whose first statement bounds it: a
-- statement_timeout (past it the read is canceled, SQLSTATE 57014, and the page says so) and custom plans
-- (their filters are optional, and which index answers depends on which are given: a generic plan cannot know).
SELECT set_config('statement_timeout', %(timeout)s, true) AS timeout,
       set_config('plan_cache_mode', 'force_custom_plan', true) AS plans;

-- name: page_tenant_jobs
-- One page of a tenant's exports, newest first, after a keyset bound (created_at, id): the row comparison
-- seeks instead of counting past an offset. Optional filters: a destination, a list, and an ID range (the
-- console's ID prefix, as the range of IDs that start with it); the store takes page_tenant_jobs_by_status
-- for a destination or a list, whose indexes hold each status apart (0027). Unfiltered it reads
-- ix_export_jobs_tenant_created_id; the ID range reads the primary key. Run bounded (bound_this_read).
SELECT * FROM export_jobs
WHERE tenant_id = %(tenant_id)s
  AND (created_at, id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid)
  AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)
  AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
  AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: page_tenant_jobs_by_status
-- page_tenant_jobs for the statuses asked for (every one, for a destination or a list): one page per status,
-- each read in order from ix_export_jobs_tenant_status_created, or the destination's or the list's index with
-- the status in its key (0027), then merged. A single index scan over status = ANY(...) returns its rows
-- ordered by status first, and so would have to read and sort every match.
SELECT j.* FROM (SELECT DISTINCT unnest(%(statuses)s::text[])) AS wanted(status)
CROSS JOIN LATERAL (
    SELECT * FROM export_jobs
    WHERE tenant_id = %(tenant_id)s
      AND status = wanted.status
      AND (created_at, id) < (%(before_created_at)s::timestamptz, %(before_id)s::uuid)
      AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)
      AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
      AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid)
    ORDER BY created_at DESC, id DESC
    LIMIT %(limit)s) j
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s;

-- name: count_tenant_jobs_of_status
-- How many of a tenant's exports of one status match the optional filters, counted only up to %(cap)s + 1 rows:
-- an answer of cap + 1 means "more than cap", never a number. One statement per status, so each is planned for
-- its own status: the status's index, or the destination's or the list's, where the status is a key (0027),
-- so a count reads that status's entries alone, from the index. The ORDER BY keeps the planner to an index in
-- the list's order, which it can stop reading at the cap. Run bounded (bound_this_read), the statuses one
-- after another within one budget.
SELECT %(status)s::text AS status, count(*) AS counted FROM (
    SELECT 1 FROM export_jobs
    WHERE tenant_id = %(tenant_id)s
      AND status = %(status)s::text
      AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)
      AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
      AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid)
    ORDER BY created_at DESC, id DESC
    LIMIT %(cap)s + 1) capped;

-- name: count_tenant_jobs_in_scope
-- How many of a tenant's exports match the optional filters, per status, in one pass over at most %(cap)s + 1
-- of them: when they add up to cap + 1 the pass stopped and no status's count is known. The counts take this
-- when the planner expects the filters to match few in all: one walk of the filter's index (which carries
-- the status, and the list's the destination: 0027), read alone, instead of one per status. ORDER BY status
-- is that index's own order, so the walk can stop at the cap and a sequential scan has nothing to offer.
-- Run bounded (bound_this_read).
SELECT status, count(*) AS counted FROM (
    SELECT status FROM export_jobs
    WHERE tenant_id = %(tenant_id)s
      AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)
      AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
      AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid)
    ORDER BY status
    LIMIT %(cap)s + 1) capped
GROUP BY status;

-- name: estimate_tenant_jobs
-- The planner's estimate of how many of a tenant's exports of one status match the optional filters (its plan
-- as JSON, whose top node's "Plan Rows" is the estimate): what a count too large to take exactly shows,
-- labelled "about". Nothing is read but the statistics (0027 adds the extended ones it relies on).
EXPLAIN (FORMAT JSON)
SELECT 1 FROM export_jobs
WHERE tenant_id = %(tenant_id)s
  AND status = %(status)s::text
  AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid)
  AND (%(list_name)s::text IS NULL OR list_name = %(list_name)s::text)
  AND (%(id_from)s::uuid IS NULL OR id BETWEEN %(id_from)s::uuid AND %(id_to)s::uuid);

-- name: tenant_list_names
-- The list names a tenant's exports use (at most 200), for the console's filter: a skip scan over
-- ix_export_jobs_tenant_list_status, one index probe per name, instead of reading every export of the tenant.
WITH RECURSIVE names(name) AS (
    (SELECT list_name FROM export_jobs WHERE tenant_id = %(tenant_id)s ORDER BY list_name LIMIT 1)
    UNION ALL
    SELECT (SELECT list_name FROM export_jobs
            WHERE tenant_id = %(tenant_id)s AND list_name > names.name ORDER BY list_name LIMIT 1)
    FROM names WHERE names.name IS NOT NULL
)
SELECT name FROM names WHERE name IS NOT NULL LIMIT 200;

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
    -- an expired delivery that only its partner can settle waits while that partner is paused (recovery
    -- opens no session to it): counted apart, not as a lease recovery failed to take over
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp()
                             AND ((fence_expected AND rename_fenced_at IS NULL)
                                  OR delivery_scope_open(tenant_id, destination_id))
                           LIMIT %(cap)s) c) AS delivering_expired,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp()
                             AND NOT (fence_expected AND rename_fenced_at IS NULL)
                             AND NOT delivery_scope_open(tenant_id, destination_id)
                           LIMIT %(cap)s) c) AS delivering_waiting_for_resume,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Running' AND lease_expires_at < statement_timestamp())
        AS running_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp()
       AND ((fence_expected AND rename_fenced_at IS NULL) OR delivery_scope_open(tenant_id, destination_id)))
        AS delivering_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(created_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(woken_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_wake_up_age,
    (SELECT coalesce(max(sweep_count), 0) FROM export_jobs WHERE status = 'Queued') AS queued_max_sweep_count,
    (SELECT count(*) FROM (SELECT FROM outbox WHERE published_at IS NULL LIMIT %(cap)s) c) AS outbox_unpublished,
    -- a wake-up that waits for a give-back's available_at is not late until then
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(coalesce(available_at, created_at))), 0)::float8
     FROM outbox WHERE published_at IS NULL
       AND (available_at IS NULL OR available_at <= statement_timestamp())) AS outbox_oldest_age,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status IN ('Queued', 'Running') AND transient_releases >= %(released_often)s
                           LIMIT %(cap)s) c) AS released_repeatedly,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - since), 0)::float8 FROM unknown_since)
        AS outcome_unknown_oldest_age;

-- -- recurring exports (issue 25, item 1; 0023) ---------------------------------------------------------

-- name: insert_recurring_export
-- Defines a recurring export of a tenant (the API's admin): the row is the source of truth, its Temporal
-- Schedule is created from it after this commits. Another tenant's destination is a foreign-key refusal.
INSERT INTO recurring_exports (tenant_id, id, destination_id, list_name, cron, interval_seconds, time_zone,
                               starts_at, ends_at, paused, paused_reason, created_by, updated_by)
VALUES (%(tenant_id)s, %(id)s, %(destination_id)s, %(list_name)s, %(cron)s, %(interval_seconds)s,
        %(time_zone)s, %(starts_at)s, %(ends_at)s, %(paused)s, %(paused_reason)s, %(created_by)s,
        %(created_by)s)
RETURNING *;

-- name: get_recurring_export
-- One recurring export of the tenant (deleted ones too: their firings stay readable); another tenant's
-- reads as missing.
SELECT * FROM recurring_exports WHERE tenant_id = %(tenant_id)s AND id = %(id)s;

-- name: page_recurring_exports
-- A tenant's recurring exports, newest first; deleted ones only when asked.
SELECT * FROM recurring_exports
WHERE tenant_id = %(tenant_id)s AND (%(include_deleted)s OR deleted_at IS NULL)
ORDER BY created_at DESC, id DESC
LIMIT %(limit)s;

-- name: edit_recurring_export_if_version
-- Changes a recurring export's terms and timing for the version the editor read (If-Match); a deleted one
-- never changes. The Schedule is brought to the new row after this commits.
UPDATE recurring_exports
SET destination_id = %(destination_id)s, list_name = %(list_name)s, cron = %(cron)s,
    interval_seconds = %(interval_seconds)s, time_zone = %(time_zone)s, starts_at = %(starts_at)s,
    ends_at = %(ends_at)s, updated_by = %(updated_by)s, updated_at = clock_timestamp(), version = version + 1
WHERE tenant_id = %(tenant_id)s AND id = %(id)s AND version = %(expected_version)s AND deleted_at IS NULL
RETURNING *;

-- name: set_recurring_export_paused
-- Pauses or resumes a recurring export that is not deleted and not already in that state, with who and
-- why; matches nothing otherwise (the caller re-reads to say which). Touches no export it created.
UPDATE recurring_exports
SET paused = %(paused)s, paused_reason = CASE WHEN %(paused)s THEN %(reason)s::text END,
    updated_by = %(updated_by)s, updated_at = clock_timestamp(), version = version + 1
WHERE tenant_id = %(tenant_id)s AND id = %(id)s AND deleted_at IS NULL AND paused <> %(paused)s
RETURNING *;

-- name: delete_recurring_export
-- Records the deletion of a recurring export that is not deleted yet (the row stays, with its firings);
-- its Schedule is deleted after this commits. Touches no export it created.
UPDATE recurring_exports
SET deleted_at = clock_timestamp(), deleted_by = %(deleted_by)s, updated_by = %(deleted_by)s,
    updated_at = clock_timestamp(), version = version + 1
WHERE tenant_id = %(tenant_id)s AND id = %(id)s AND deleted_at IS NULL
RETURNING *;

-- name: recurring_export_exports_by_status
-- How many exports a recurring export's firings created, by their status now (what a pause or a deletion
-- leaves untouched).
SELECT j.status, count(*)::int AS n
FROM recurring_export_firings f
JOIN export_jobs j ON j.tenant_id = f.tenant_id AND j.id = f.job_id
WHERE f.tenant_id = %(tenant_id)s AND f.recurring_export_id = %(id)s AND f.outcome = 'created'
GROUP BY j.status;

-- name: lock_recurring_export
-- The firing transaction's locking read, its own statement: under READ COMMITTED a statement that waited for
-- this lock would still read the other rows (a firing recorded by the transaction it waited for) as they were
-- before the wait, so the facts are read by the next statement, whose snapshot is taken after it (as the
-- cancellation transaction's lock_job_for_cancel does).
SELECT id FROM recurring_exports WHERE tenant_id = %(tenant_id)s AND id = %(id)s FOR UPDATE;

-- name: lock_recurring_export_for_firing
-- A firing's facts, read under a lock on its recurring export's row (FOR UPDATE: the firings of one
-- recurring export, and its pause, edit and deletion, serialize on it): the definition now, the claim's
-- policy facts for its terms (destination, contract, creator; exports_api may not read contacts),
-- whether every switch of its scope is open (delivery_scope_open, the claim's gate) and the first scope held
-- and why (a switch off or an active pause, delivery_scope_hold), a firing already recorded for this nominal time, the latest export it created if still live
-- (overlap), and how late this firing is on the database clock with the late firings that created an
-- export since the latest firing on time (catch-up). No row: no such recurring export in the tenant.
WITH r AS (
    SELECT * FROM recurring_exports
    WHERE tenant_id = %(tenant_id)s AND id = %(id)s
    FOR UPDATE),
last_created AS (
    SELECT f.job_id FROM recurring_export_firings f, r
    WHERE f.tenant_id = r.tenant_id AND f.recurring_export_id = r.id AND f.outcome = 'created'
    ORDER BY f.id DESC
    LIMIT 1),
last_on_time AS (
    SELECT coalesce(max(f.id), 0) AS id FROM recurring_export_firings f, r
    WHERE f.tenant_id = r.tenant_id AND f.recurring_export_id = r.id AND NOT f.late)
SELECT r.id, r.tenant_id, r.version, r.destination_id, r.list_name, r.created_by, r.paused, r.paused_reason,
       r.deleted_at, r.starts_at, r.ends_at,
       d.id IS NOT NULL AS destination_found, d.name AS destination_name,
       d.retired_at AS destination_retired_at, d.contract_starts_on, d.contract_ends_on,
       p.name IS NOT NULL AS principal_found, p.role AS principal_role, p.revoked_at AS principal_revoked_at,
       p.export_lists AS principal_lists,
       delivery_scope_open(r.tenant_id, r.destination_id) AS deliveries_open,
       CASE WHEN h.global_hold IS NOT NULL THEN 'global'
            WHEN h.tenant_hold IS NOT NULL THEN 'tenant'
            WHEN h.destination_hold IS NOT NULL THEN 'destination' END AS paused_scope,
       coalesce(h.global_hold, h.tenant_hold, h.destination_hold) AS paused_scope_reason,
       (SELECT f.outcome FROM recurring_export_firings f
        WHERE f.tenant_id = r.tenant_id AND f.recurring_export_id = r.id
          AND f.nominal_time = %(nominal_time)s) AS recorded_outcome,
       lj.id AS live_job_id, lj.status AS live_job_status,
       clock_timestamp() - %(nominal_time)s::timestamptz > make_interval(secs => %(late_after_seconds)s) AS late,
       (SELECT count(*)::int FROM recurring_export_firings f, last_on_time o
        WHERE f.tenant_id = r.tenant_id AND f.recurring_export_id = r.id AND f.outcome = 'created' AND f.late
          AND f.id > o.id) AS late_runs,
       (clock_timestamp() AT TIME ZONE 'UTC')::date AS today
FROM r
LEFT JOIN destinations d ON d.tenant_id = r.tenant_id AND d.id = r.destination_id
LEFT JOIN principals p ON p.tenant_id = r.tenant_id AND p.name = r.created_by
CROSS JOIN LATERAL (
    SELECT delivery_scope_hold('global', NULL, NULL) AS global_hold,
           delivery_scope_hold('tenant', r.tenant_id, NULL) AS tenant_hold,
           delivery_scope_hold('destination', r.tenant_id, r.destination_id) AS destination_hold) AS h
LEFT JOIN export_jobs lj ON lj.tenant_id = r.tenant_id AND lj.id = (SELECT job_id FROM last_created)
                        AND lj.status IN ('Queued', 'Running', 'Delivering');

-- name: record_recurring_firing
-- Appends one firing of a recurring export: created export job_id (in the same transaction as the export,
-- after create_original), or skipped with its reason and message. Its nominal time is its key: a second
-- record of the same time is refused (pk_recurring_export_firings).
INSERT INTO recurring_export_firings (tenant_id, recurring_export_id, nominal_time, outcome, reason, message,
                                      job_id, late, fired_by)
VALUES (%(tenant_id)s, %(id)s, %(nominal_time)s, %(outcome)s, %(reason)s, %(message)s, %(job_id)s, %(late)s,
        %(fired_by)s)
RETURNING tenant_id, recurring_export_id, nominal_time, id, outcome, reason, message, job_id, late, fired_by,
          recorded_at, NULL::text AS job_status;

-- name: recurring_export_firing_at
-- The firing recorded for one nominal time of a recurring export, with its export's status now.
SELECT f.tenant_id, f.recurring_export_id, f.nominal_time, f.id, f.outcome, f.reason, f.message, f.job_id,
       f.late, f.fired_by, f.recorded_at, j.status AS job_status
FROM recurring_export_firings f
LEFT JOIN export_jobs j ON j.tenant_id = f.tenant_id AND j.id = f.job_id
WHERE f.tenant_id = %(tenant_id)s AND f.recurring_export_id = %(id)s AND f.nominal_time = %(nominal_time)s;

-- name: recurring_export_firings
-- A recurring export's latest firings, newest recorded first, with each export's status now.
SELECT f.tenant_id, f.recurring_export_id, f.nominal_time, f.id, f.outcome, f.reason, f.message, f.job_id,
       f.late, f.fired_by, f.recorded_at, j.status AS job_status
FROM recurring_export_firings f
LEFT JOIN export_jobs j ON j.tenant_id = f.tenant_id AND j.id = f.job_id
WHERE f.tenant_id = %(tenant_id)s AND f.recurring_export_id = %(id)s
ORDER BY f.id DESC
LIMIT %(limit)s;

-- name: recurring_exports_for_schedules
-- Every recurring export after a keyset bound, for a worker that reconciles their Schedules at start
-- (deleted ones too: their Schedules must not exist).
SELECT * FROM recurring_exports
WHERE id > %(after)s
ORDER BY id
LIMIT %(limit)s;

-- name: find_principal
-- A principal of a tenant, its role and whether it is revoked (the command line acts as one).
SELECT name, role, revoked_at FROM principals WHERE tenant_id = %(tenant_id)s AND name = %(name)s;

-- name: record_operator_action
-- Appends one row to the ledger of operator actions (0031): in the transaction of the action it records where
-- that is a database write, on its own for a refusal. Before and after come without secrets (the service masks
-- them; ck_operator_actions_no_secrets refuses any left).
INSERT INTO operator_actions (tenant_id, principal, role, action, subject_kind, subject_id, request_id, reason,
                              outcome, detail, approval_id, requested_by, before, after)
VALUES (%(tenant_id)s, %(principal)s, %(role)s, %(action)s, %(subject_kind)s, %(subject_id)s, %(request_id)s,
        %(reason)s, %(outcome)s, %(detail)s, %(approval_id)s, %(requested_by)s, %(before)s::jsonb,
        %(after)s::jsonb)
RETURNING id;

-- name: page_operator_actions
-- One page of a tenant's ledger, newest first, after the keyset bound (the id of the previous page's last row),
-- filtered by principal, action, subject and time (each filter given or NULL). Custom plans fold the NULL
-- filters away and walk the index of the filter given (ix_operator_actions_*), backwards from the bound.
SELECT id, tenant_id, at, principal, role, action, subject_kind, subject_id, request_id, reason, outcome, detail,
       approval_id, requested_by, before, after
FROM operator_actions
WHERE tenant_id = %(tenant_id)s
  AND (%(before_id)s::bigint IS NULL OR id < %(before_id)s::bigint)
  AND (%(principal)s::text IS NULL OR principal = %(principal)s::text)
  AND (%(action)s::text IS NULL OR action = %(action)s::text)
  AND (%(subject_kind)s::text IS NULL OR subject_kind = %(subject_kind)s::text)
  AND (%(subject_id)s::text IS NULL OR subject_id = %(subject_id)s::text)
  AND (%(since)s::timestamptz IS NULL OR at >= %(since)s::timestamptz)
  AND (%(until)s::timestamptz IS NULL OR at < %(until)s::timestamptz)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: insert_approval
-- A two-person action asked for (0032): what, its parameters, why, by whom with which role, until when (the
-- database clock plus the time limit). The guard refuses a requester whose role may not do it.
INSERT INTO approvals (tenant_id, action, subject_kind, subject_id, parameters, reason, requested_by,
                       requested_role, expires_at)
VALUES (%(tenant_id)s, %(action)s, %(subject_kind)s, %(subject_id)s, %(parameters)s::jsonb, %(reason)s,
        %(requested_by)s, %(requested_role)s, clock_timestamp() + make_interval(secs => %(ttl_seconds)s))
RETURNING tenant_id, id, action, subject_kind, subject_id, parameters, reason, requested_by, requested_role,
          requested_at, expires_at, decision, decided_by, decided_role, decided_at, decision_reason, executed_at,
          outcome, false AS expired;

-- name: find_approval
-- One approval of the tenant (another tenant's looks missing), with whether it expired undecided.
SELECT tenant_id, id, action, subject_kind, subject_id, parameters, reason, requested_by, requested_role,
       requested_at, expires_at, decision, decided_by, decided_role, decided_at, decision_reason, executed_at,
       outcome, decision IS NULL AND expires_at < clock_timestamp() AS expired
FROM approvals
WHERE tenant_id = %(tenant_id)s AND id = %(approval_id)s;

-- name: page_approvals
-- A tenant's approvals, newest first (only those still waiting for a decision and unexpired, if asked).
SELECT tenant_id, id, action, subject_kind, subject_id, parameters, reason, requested_by, requested_role,
       requested_at, expires_at, decision, decided_by, decided_role, decided_at, decision_reason, executed_at,
       outcome, decision IS NULL AND expires_at < clock_timestamp() AS expired
FROM approvals
WHERE tenant_id = %(tenant_id)s
  AND (NOT %(pending_only)s OR (decision IS NULL AND expires_at >= clock_timestamp()))
ORDER BY requested_at DESC, id
LIMIT %(limit)s;

-- name: decide_approval
-- The second person's decision on a waiting approval (approved or declined), with their role and why; in the
-- transaction of the action it approves, which runs next. Matches nothing once decided; the guard refuses the
-- requester (ck_approvals_second_person), a decision past the expiry (ck_approvals_expired) and a role that may
-- not do the action (ck_approvals_role).
UPDATE approvals
SET decision = %(decision)s, decided_by = %(decided_by)s, decided_role = %(decided_role)s,
    decided_at = clock_timestamp(), decision_reason = %(decision_reason)s
WHERE tenant_id = %(tenant_id)s AND id = %(approval_id)s AND decision IS NULL
RETURNING id;

-- name: conclude_approval
-- An approved action ran: when, and what it answered. Once; in the action's transaction, so an approval is
-- used by one run only (the guards look for one not run yet).
UPDATE approvals SET executed_at = clock_timestamp(), outcome = %(outcome)s
WHERE tenant_id = %(tenant_id)s AND id = %(approval_id)s AND decision = 'approved' AND executed_at IS NULL
RETURNING id;

-- name: revoke_api_tokens
-- Revokes every token of a principal of the tenant (an administrator's connection): their console sessions go
-- with them (ON DELETE CASCADE); the principal stays, and may be given a new token. The tokens revoked, by count.
WITH revoked AS (
    DELETE FROM api_tokens WHERE tenant_id = %(tenant_id)s AND principal = %(principal)s
    RETURNING token_sha256)
SELECT count(*)::int AS n FROM revoked;

-- -- outcome notifications (0025): webhook endpoints, the events' fan-out and their deliveries -------------

-- name: create_webhook_endpoint
-- Registers a tenant's webhook endpoint (an admin's), enabled, at version 1, unless the tenant already has
-- max_endpoints. Returns the endpoint without its secret: exports_api may write the secret, never read it.
INSERT INTO webhook_endpoints (tenant_id, id, url, secret, events, description, enabled, created_by)
SELECT %(tenant_id)s, %(endpoint_id)s, %(url)s, %(secret)s, %(events)s::text[], %(description)s::text, true,
       %(created_by)s
WHERE (SELECT count(*) FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s) < %(max_endpoints)s
RETURNING tenant_id, id, url, events, description, enabled, version, created_by, created_at, updated_by,
          updated_at;

-- name: tenant_webhook_endpoints
-- A tenant's endpoints (never their secrets) with how their deliveries stand, oldest first; or the one named.
SELECT w.tenant_id, w.id, w.url, w.events, w.description, w.enabled, w.version, w.created_by, w.created_at,
       w.updated_by, w.updated_at,
       coalesce(c.pending, 0) AS pending, coalesce(c.failed, 0) AS failed, coalesce(c.delivered, 0) AS delivered,
       c.last_failure_at
FROM webhook_endpoints w
LEFT JOIN LATERAL (
    SELECT count(*) FILTER (WHERE d.state = 'pending')::int AS pending,
           count(*) FILTER (WHERE d.state = 'failed')::int AS failed,
           count(*) FILTER (WHERE d.state = 'delivered')::int AS delivered,
           max(d.last_attempt_at) FILTER (WHERE d.state <> 'delivered' AND d.last_error IS NOT NULL)
               AS last_failure_at
    FROM webhook_deliveries d WHERE d.endpoint_id = w.id) c ON true
WHERE w.tenant_id = %(tenant_id)s AND (%(endpoint_id)s::uuid IS NULL OR w.id = %(endpoint_id)s::uuid)
ORDER BY w.created_at, w.id;

-- name: update_webhook_endpoint
-- Changes an endpoint of the tenant for the version its editor read (If-Match): a field given NULL keeps its
-- value. Matches nothing for another version or another tenant's endpoint (the caller re-reads to tell
-- which). The secret is rotate_webhook_secret's: this role may not read it, so not even keep it by name.
UPDATE webhook_endpoints
SET url = coalesce(%(url)s::text, url), events = coalesce(%(events)s::text[], events),
    description = CASE WHEN %(clear_description)s THEN NULL ELSE coalesce(%(description)s::text, description) END,
    enabled = coalesce(%(enabled)s::boolean, enabled),
    version = version + 1, updated_by = %(updated_by)s, updated_at = clock_timestamp()
WHERE tenant_id = %(tenant_id)s AND id = %(endpoint_id)s AND version = %(expected_version)s
RETURNING tenant_id, id, url, events, description, enabled, version, created_by, created_at, updated_by,
          updated_at;

-- name: rotate_webhook_secret
-- A new signing secret for an endpoint, in update_webhook_endpoint's transaction, for the version that
-- statement just wrote; effective for the next attempt.
UPDATE webhook_endpoints SET secret = %(secret)s
WHERE tenant_id = %(tenant_id)s AND id = %(endpoint_id)s AND version = %(version)s
RETURNING id;

-- name: delete_webhook_endpoint
-- Removes an endpoint of the tenant and its deliveries (ON DELETE CASCADE); the events stay.
DELETE FROM webhook_endpoints WHERE tenant_id = %(tenant_id)s AND id = %(endpoint_id)s
RETURNING id;

-- name: endpoint_deliveries
-- An endpoint's deliveries, newest first, with their event's type and export; optionally only one state.
-- Nothing for another tenant's endpoint.
SELECT d.id, d.tenant_id, d.event_id, d.endpoint_id, e.kind, e.job_id, d.state, d.attempts, d.next_attempt_at,
       d.give_up_at, d.last_attempt_at, d.last_status_code, d.last_error, d.delivered_at, d.redeliveries,
       d.redelivered_by, d.redelivered_at, d.created_at, e.created_at AS event_created_at
FROM webhook_deliveries d
JOIN notification_events e ON e.id = d.event_id
WHERE d.tenant_id = %(tenant_id)s AND d.endpoint_id = %(endpoint_id)s
  AND (%(state)s::text IS NULL OR d.state = %(state)s::text)
ORDER BY d.created_at DESC, d.id DESC
LIMIT %(limit)s;

-- name: redeliver_webhook
-- A person's redelivery of one delivery of the tenant's endpoint, whatever its state: due now, with a fresh
-- retry window, the same event (the same webhook-id). An attempt in flight keeps its lease and records its
-- answer as usual.
UPDATE webhook_deliveries
SET state = 'pending', next_attempt_at = clock_timestamp(),
    give_up_at = clock_timestamp() + make_interval(secs => %(window_seconds)s),
    redeliveries = redeliveries + 1, redelivered_by = %(redelivered_by)s, redelivered_at = clock_timestamp()
WHERE tenant_id = %(tenant_id)s AND endpoint_id = %(endpoint_id)s AND id = %(delivery_id)s
RETURNING id;

-- name: fan_out_notification_events
-- The dispatcher's fan-out: a batch of events not yet fanned out, oldest first, each marked and given one
-- delivery per endpoint of its tenant that is enabled and subscribed to its type now, due at once, retried
-- until window_seconds from now. SKIP LOCKED: two dispatchers take different events; the unique
-- (event, endpoint) makes a repeat harmless.
WITH due AS (
    SELECT id FROM notification_events
    WHERE fanned_out_at IS NULL
    ORDER BY created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED),
marked AS (
    UPDATE notification_events e SET fanned_out_at = clock_timestamp()
    FROM due
    WHERE e.id = due.id AND e.fanned_out_at IS NULL
    RETURNING e.id, e.tenant_id, e.kind),
made AS (
    INSERT INTO webhook_deliveries (tenant_id, event_id, endpoint_id, next_attempt_at, give_up_at)
    SELECT m.tenant_id, m.id, w.id, clock_timestamp(),
           clock_timestamp() + make_interval(secs => %(window_seconds)s)
    FROM marked m
    JOIN webhook_endpoints w ON w.tenant_id = m.tenant_id AND w.enabled AND m.kind = ANY (w.events)
    ON CONFLICT ON CONSTRAINT uq_webhook_deliveries_event_endpoint DO NOTHING
    RETURNING id)
SELECT (SELECT count(*) FROM marked)::int AS events, (SELECT count(*) FROM made)::int AS deliveries;

-- name: take_due_webhook_deliveries
-- The dispatcher's batch of attempts, leased in one short committed statement (no lock is held across the
-- POST): pending deliveries due now, to enabled endpoints, that no other dispatcher holds a current lease
-- on, each leased until now + lease_seconds; with what it takes to send and sign them. The lease is the
-- token record_webhook_attempts must match; a lease that passed (its dispatcher died) lets any take it again.
WITH due AS (
    SELECT d.id FROM webhook_deliveries d
    JOIN webhook_endpoints w ON w.tenant_id = d.tenant_id AND w.id = d.endpoint_id
    WHERE d.state = 'pending' AND d.next_attempt_at <= clock_timestamp()
      AND (d.leased_until IS NULL OR d.leased_until < clock_timestamp())
      AND w.enabled
    ORDER BY d.next_attempt_at
    LIMIT %(batch)s
    FOR UPDATE OF d SKIP LOCKED),
lease AS (   -- volatile, so evaluated once: one lease value for the whole batch
    SELECT clock_timestamp() AS taken_at, clock_timestamp() + make_interval(secs => %(lease_seconds)s) AS until),
leased AS (
    UPDATE webhook_deliveries d SET leased_until = lease.until
    FROM due, lease
    WHERE d.id = due.id AND d.state = 'pending'
      AND (d.leased_until IS NULL OR d.leased_until < lease.taken_at)
    RETURNING d.id, d.tenant_id, d.event_id, d.endpoint_id, d.attempts, d.leased_until)
SELECT l.id, l.tenant_id, l.event_id, l.endpoint_id, e.kind, e.created_at AS event_created_at, e.payload,
       w.url, w.secret, l.attempts, l.leased_until
FROM leased l
JOIN notification_events e ON e.id = l.event_id
JOIN webhook_endpoints w ON w.tenant_id = l.tenant_id AND w.id = l.endpoint_id;

-- name: record_webhook_attempts
-- How a batch of attempts ended, in one statement: a 2xx is delivered; any other answer or none waits
-- min(cap, base * 2^n) scaled by its jitter (0.5 to 1; n the delivery's earlier attempts) on the database
-- clock, and gives up (failed) when that would pass the delivery's give_up_at. Only while the delivery still
-- carries the lease its attempt was sent under (a later lease's attempt records its own answer).
WITH answer AS (
    SELECT * FROM unnest(%(delivery_ids)s::uuid[], %(leases)s::timestamptz[], %(status_codes)s::int[],
                         %(errors)s::text[], %(jitters)s::float8[])
        AS a (id, leased_until, status_code, error, jitter)),
waited AS (
    SELECT d.id, a.status_code, a.error, a.status_code BETWEEN 200 AND 299 AS delivered,
           clock_timestamp() + make_interval(
               secs => least(%(cap_seconds)s::float8, %(base_seconds)s::float8 * 2 ^ least(d.attempts, 30))
                       * (0.5 + 0.5 * a.jitter)) AS next_at,
           d.give_up_at, a.leased_until
    FROM answer a
    JOIN webhook_deliveries d ON d.id = a.id AND d.leased_until = a.leased_until AND d.state = 'pending')
UPDATE webhook_deliveries d
SET attempts = d.attempts + 1, leased_until = NULL, last_attempt_at = clock_timestamp(),
    last_status_code = w.status_code, last_error = left(w.error, 200),
    state = CASE WHEN w.delivered THEN 'delivered' WHEN w.next_at > w.give_up_at THEN 'failed' ELSE 'pending' END,
    delivered_at = CASE WHEN w.delivered THEN clock_timestamp() ELSE d.delivered_at END,
    next_attempt_at = CASE WHEN w.delivered OR w.next_at > w.give_up_at THEN d.next_attempt_at ELSE w.next_at END
FROM waited w
WHERE d.id = w.id AND d.state = 'pending' AND d.leased_until = w.leased_until
RETURNING d.id, d.state, d.attempts, d.next_attempt_at;

-- name: page_outcome_unknown_queue
-- The reconciler's queue (issue 26 item 4): one page of a tenant's OutcomeUnknown exports, oldest first by when
-- each became OutcomeUnknown, after a keyset bound (outcome_unknown_at, id): an ordered walk of
-- ix_export_jobs_tenant_outcome_unknown (0033), as many entries as the page shows, never a sort.
SELECT * FROM export_jobs
WHERE tenant_id = %(tenant_id)s AND status = 'OutcomeUnknown'
  AND (outcome_unknown_at, id) > (%(after_at)s::timestamptz, %(after_id)s::uuid)
ORDER BY outcome_unknown_at, id
LIMIT %(limit)s;

-- name: count_outcome_unknown_queue
-- How many of a tenant's exports wait for a reconciler, counted only up to %(cap)s + 1: an answer of cap + 1
-- means "more than cap", never a number. Reads one of the OutcomeUnknown partial indexes, the planner's pick:
-- the tenant's entries of the queue's (at most cap + 1), or, while every tenant's unknowns together are few,
-- all of ix_export_jobs_outcome_unknown; never the table.
SELECT count(*) AS counted FROM (
    SELECT 1 FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND status = 'OutcomeUnknown'
    LIMIT %(cap)s + 1) capped;

-- name: estimate_outcome_unknown_queue
-- The planner's estimate of a tenant's OutcomeUnknown exports (the plan as JSON; its top node's "Plan Rows"):
-- what the queue's count shows, labelled "about", past the cap it counts to. Reads only the statistics.
EXPLAIN (FORMAT JSON)
SELECT 1 FROM export_jobs WHERE tenant_id = %(tenant_id)s AND status = 'OutcomeUnknown';

-- name: outcome_unknown_summaries
-- For one page of the queue, each export's one line of why: the attempt's write that recorded OutcomeUnknown
-- (the worker's Finished or recovery's ResolvedByRecovery, with its summary of codes and sizes), how many
-- times recovery listed its final name since (observed_by starting with %(recovery_prefix)s) and when last,
-- and whether a reconciler's listing request waits for its answer (record_listing_request). Only the tenant's
-- exports; each read by ix_attempt_events_job.
SELECT j.id AS job_id, why.detail AS reason, why.recorded_by, why.recorded_at,
       coalesce(checks.listings, 0) AS recovery_listings, checks.last_at AS last_listed_at,
       EXISTS (
           SELECT 1 FROM listing_requests r
           WHERE r.job_id = j.id
             AND r.requested_at > clock_timestamp() - make_interval(secs => %(window_seconds)s)
             AND NOT EXISTS (
                 SELECT 1 FROM export_attempt_events e
                 WHERE e.job_id = r.job_id AND e.kind = 'DeliveryEvidence'
                   AND e.observed_by = %(observer_prefix)s || r.id::text)) AS listing_requested
FROM export_jobs j
LEFT JOIN LATERAL (
    SELECT e.detail, coalesce(e.worker_id, e.observed_by) AS recorded_by, e.recorded_at
    FROM export_attempt_events e
    WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind IN ('Finished', 'ResolvedByRecovery')
    ORDER BY e.id DESC
    LIMIT 1) why ON true
LEFT JOIN LATERAL (
    SELECT count(*) AS listings, max(e.recorded_at) AS last_at
    FROM export_attempt_events e
    WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id
      -- the JSON is read only once the row is recovery's evidence (an AND does not order its operands)
      AND CASE WHEN e.kind = 'DeliveryEvidence' AND starts_with(e.observed_by, %(recovery_prefix)s)
               THEN e.detail::jsonb ->> 'observation' = 'recovery_listing' ELSE false END) checks ON true
WHERE j.tenant_id = %(tenant_id)s AND j.id = ANY(%(job_ids)s::uuid[]);

-- name: record_listing_request
-- A reconciler asks for today's listing of an OutcomeUnknown export's final name (0033): recorded for the
-- export's attempt, only while it is OutcomeUnknown, its partner's deliveries are not paused (no session is
-- opened to a paused partner) and no earlier request of it still waits for its answer (an answer is the
-- attempt's DeliveryEvidence observed by %(observer_prefix)s || the request's ID; a request unanswered after
-- %(window_seconds)s no longer waits). Nothing is inserted otherwise; the service re-reads to say why.
INSERT INTO listing_requests (tenant_id, job_id, attempt_id, requested_by)
SELECT j.tenant_id, j.id, j.attempt_id, %(requested_by)s
FROM export_jobs j
WHERE j.tenant_id = %(tenant_id)s AND j.id = %(job_id)s AND j.status = 'OutcomeUnknown'
  AND delivery_scope_open(j.tenant_id, j.destination_id)
  AND NOT EXISTS (
      SELECT 1 FROM listing_requests r
      WHERE r.job_id = j.id
        AND r.requested_at > clock_timestamp() - make_interval(secs => %(window_seconds)s)
        AND NOT EXISTS (
            SELECT 1 FROM export_attempt_events e
            WHERE e.job_id = r.job_id AND e.kind = 'DeliveryEvidence'
              AND e.observed_by = %(observer_prefix)s || r.id::text))
RETURNING id, job_id, attempt_id, requested_by, requested_at;

-- name: listing_requests_of_job
-- Every listing request of one of the tenant's exports, oldest first, with whether it may still be answered
-- (made within %(window_seconds)s); its answer, if any, is among the export's events.
SELECT r.id, r.job_id, r.attempt_id, r.requested_by, r.requested_at,
       r.requested_at > clock_timestamp() - make_interval(secs => %(window_seconds)s) AS answerable
FROM listing_requests r
WHERE r.tenant_id = %(tenant_id)s AND r.job_id = %(job_id)s
ORDER BY r.requested_at, r.id;

-- name: find_listing_requests
-- Recovery's nomination of the reconcilers' listing requests to answer, oldest first: made within
-- %(window_seconds)s, for an attempt still OutcomeUnknown, not answered yet (no DeliveryEvidence observed by
-- %(observer_prefix)s || its ID). Answering re-reads the row and lists the name once.
SELECT r.id AS request_id, r.job_id, r.attempt_id
FROM listing_requests r
JOIN export_jobs j ON j.id = r.job_id AND j.attempt_id = r.attempt_id AND j.status = 'OutcomeUnknown'
WHERE r.requested_at > clock_timestamp() - make_interval(secs => %(window_seconds)s)
  AND NOT EXISTS (
      SELECT 1 FROM export_attempt_events e
      WHERE e.job_id = r.job_id AND e.kind = 'DeliveryEvidence'
        AND e.observed_by = %(observer_prefix)s || r.id::text)
ORDER BY r.requested_at
LIMIT %(limit)s;
