-- Every statement of the row protocol, one per transition, loaded by name (db/queries.py).
-- Each write repeats every condition it relies on, and a state change commits with its attempt event in
-- the same statement (000 "Claim and Authorization in One Statement Each"). Lease arithmetic is on the
-- database clock, clock_timestamp(), never a worker's.

-- name: create_original
-- Creates an original export: deliveries row, Queued job, first wake-up and (optional) idempotency key,
-- together or not at all.
WITH delivery AS (
    INSERT INTO deliveries (tenant_id, delivery_key, original_job_id)
    VALUES (%(tenant_id)s, %(delivery_key)s, %(job_id)s)),
idem AS (
    INSERT INTO idempotency_keys (tenant_id, operation, key, fingerprint, job_id)
    SELECT %(tenant_id)s, 'create_export', %(idempotency_key)s::text, %(fingerprint)s, %(job_id)s
    WHERE %(idempotency_key)s::text IS NOT NULL),
created AS (
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, created_by, woken_at,
                             list_name)
    VALUES (%(job_id)s, %(tenant_id)s, 'Queued', 1, %(destination_id)s, %(delivery_key)s, %(created_by)s,
            clock_timestamp(), %(list_name)s)
    RETURNING id),
woke AS (   -- not RETURNING: the outbox is insert-only for this role, not readable
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM created)
SELECT id AS job_id FROM created;

-- name: find_idempotency_key
-- The job an idempotency key already names, with the fingerprint it was bound to.
SELECT job_id, fingerprint FROM idempotency_keys
WHERE tenant_id = %(tenant_id)s AND operation = %(operation)s AND key = %(idempotency_key)s;

-- name: create_replacement
-- Creates a replacement for a named person. Inserts nothing unless the original may be replaced: an
-- original, same tenant, OutcomeUnknown or Failed for a reason that proves nothing was finalized; and, with an
-- overwrite agreement, under an approval of this replacement and agreement that its creator decided, asked by
-- another (two people, 0032; the insert guard refuses the rest).
WITH original AS (
    SELECT id, tenant_id, destination_id, delivery_key, list_name
    FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND id = %(original_job_id)s AND replaces_job_id IS NULL
      AND (status = 'OutcomeUnknown'
           OR (status = 'Failed' AND failure_reason IN ('BuildFailed', 'AttemptsExhausted', 'NotDelivered')))
      AND (%(overwrite_agreement_ref)s::text IS NULL
           OR approved_action(tenant_id, ARRAY['replace_with_overwrite'], id::text, %(created_by)s,
                              jsonb_build_object('overwrite_agreement_ref', %(overwrite_agreement_ref)s::text)))
    FOR UPDATE),   -- waits for a concurrent correction of the original, then re-checks its status
created AS (
    INSERT INTO export_jobs (id, tenant_id, status, version, destination_id, delivery_key, replaces_job_id,
                             created_by, replacement_reason, overwrite_agreement_ref, woken_at, list_name)
    SELECT %(job_id)s, tenant_id, 'Queued', 1, destination_id, delivery_key, id,
           %(created_by)s, %(replacement_reason)s, %(overwrite_agreement_ref)s, clock_timestamp(), list_name
    FROM original
    RETURNING id),
woke AS (   -- not RETURNING: the outbox is insert-only for this role, not readable
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM created)
SELECT id AS job_id FROM created;

-- name: edit_terms_if_queued
-- Changes a queued export's terms for the version the editor read: increments version (the claim's
-- version condition depends on it) and writes a new wake-up, so the edited job is never stranded. A
-- replacement's terms are its original's and never change (0015's trigger refuses it for every writer).
WITH edited AS (
    UPDATE export_jobs
    SET destination_id = %(destination_id)s, list_name = %(list_name)s, version = version + 1,
        woken_at = clock_timestamp()
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND status = 'Queued' AND version = %(expected_version)s
      AND replaces_job_id IS NULL
    RETURNING id, version),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM edited)
SELECT id AS job_id, version FROM edited;

-- name: read_policy_facts
-- The policy check's facts, in one read, for the version it evaluates: the job's terms, its destination
-- row (contract, retirement), the creator's principal row, whether the list has contacts, whether every
-- switch of its scope is enabled (the claim re-reads those under its own locks), and the database clock's
-- UTC day. Side-effect free; a missing destination or principal row reads as not found.
SELECT j.id AS job_id, j.tenant_id, j.status, j.version, j.attempt_id, j.destination_id, j.list_name,
       j.created_by,
       d.id IS NOT NULL AS destination_found, d.name AS destination_name,
       d.retired_at AS destination_retired_at, d.contract_starts_on, d.contract_ends_on,
       p.name IS NOT NULL AS principal_found, p.role AS principal_role, p.revoked_at AS principal_revoked_at,
       p.export_lists AS principal_lists,
       -- the list's first contact in its primary key's order: one index entry. (An EXISTS drops the ORDER BY
       -- and the LIMIT, and its plan may read contacts sequentially up to the list's rows, which sit together,
       -- often last: every tenant's contacts, twice an export.)
       (SELECT true FROM contacts c WHERE c.tenant_id = j.tenant_id AND c.list_name = j.list_name
        ORDER BY c.id LIMIT 1) IS NOT NULL AS list_exists,
       delivery_scope_open(j.tenant_id, j.destination_id) AS deliveries_open,
       coalesce(j.available_at <= clock_timestamp(), true) AS available,
       (clock_timestamp() AT TIME ZONE 'UTC')::date AS today
FROM export_jobs j
LEFT JOIN destinations d ON d.tenant_id = j.tenant_id AND d.id = j.destination_id
LEFT JOIN principals p ON p.tenant_id = j.tenant_id AND p.name = j.created_by
WHERE j.id = %(job_id)s;

-- name: reject_if_queued
-- Queued -> Rejected, for the evaluated version only: an edit since the evaluation makes this match nothing.
-- The code is one of the fixed reasons; the message is what the console and the API show.
UPDATE export_jobs
SET status = 'Rejected', rejection_code = %(code)s, rejection_reason = %(message)s
WHERE id = %(job_id)s AND status = 'Queued' AND version = %(checked_version)s
RETURNING id;

-- name: claim_if_queued
-- Cutoff 1: Queued -> Running for the checked version, with the lease and the Claimed event, only while
-- every delivery switch of the job's scope (global, its tenant, its destination) exists and is enabled: a
-- missing row is a paused scope (fail-closed), only once the job's available_at (a give-back's wait)
-- has passed, and only inside the destination's delivery window (0035). The switch rows are read FOR SHARE
-- here, so a pause or resume and this claim serialize: whichever commits first, the other sees it. A paused
-- or waiting claim matches nothing and the job stays Queued. Outside the window it matches nothing either,
-- and makes the job wait for the next opening instead (issue #25.2): available_at and a wake-up deferred as
-- long, in this statement, so no attempt is made and the job is woken when the partner takes deliveries.
-- It answers with the whole row whether or not it matched (lock, guarded update, return the row), so a refusal
-- is classified from this answer, and the attempt's build needs no read of its own; the locking reads return the
-- latest committed versions after any wait.
WITH job AS (
    SELECT e AS found, e.id, e.status, e.tenant_id, e.destination_id,
           coalesce(e.available_at <= clock_timestamp(), true) AS available
    FROM export_jobs e WHERE e.id = %(job_id)s FOR UPDATE),
gate AS (
    -- the three switches of the job's scope read FOR SHARE, while it is Queued (a missing row is paused)
    SELECT coalesce((SELECT lock_delivery_scope(job.tenant_id, job.destination_id) FROM job
                     WHERE job.status = 'Queued'), false) AS open),
win AS (
    -- the destination's delivery window now, read without a lock: cutoff 2 and the rename fence re-check it
    SELECT coalesce(w.opens_at <= w.at, false) AS open, w.opens_at
    FROM job, destinations d,
         LATERAL (SELECT t.at, next_window_opening(d, t.at) AS opens_at
                  FROM (SELECT clock_timestamp() AS at) t) w
    WHERE job.status = 'Queued' AND d.tenant_id = job.tenant_id AND d.id = job.destination_id),
claimed AS (
    UPDATE export_jobs j
    SET status = 'Running', attempt_id = %(attempt_id)s, attempt_count = j.attempt_count + 1,
        claimed_by = %(worker_id)s, lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        workflow_id = %(workflow_id)s
    FROM job, gate
    WHERE j.id = job.id AND j.status = 'Queued' AND j.version = %(checked_version)s
      AND gate.open
      -- a job given back after a failure waits until its available_at (002: "Persist available_at")
      AND (j.available_at IS NULL OR j.available_at <= clock_timestamp())
      -- the partner takes deliveries now (a missing destination is the policy's and cutoff 2's to refuse)
      AND coalesce((SELECT open FROM win), true)
    RETURNING j.*),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, version, worker_id, recorded_at)
    SELECT id, attempt_id, 'Claimed', version, claimed_by, clock_timestamp() FROM claimed),
deferred AS (
    -- outside the window: the job waits for the next opening (0035's guard lets a Queued job's wait only grow)
    UPDATE export_jobs j
    SET available_at = win.opens_at, woken_at = clock_timestamp()
    FROM job, gate, win
    WHERE j.id = job.id AND j.status = 'Queued' AND j.version = %(checked_version)s
      AND gate.open AND NOT win.open AND win.opens_at IS NOT NULL
      AND (j.available_at IS NULL OR j.available_at < win.opens_at)
    RETURNING j.id, j.available_at),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent, available_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text, available_at
    FROM deferred)
SELECT true AS matched, true AS deliveries_open, true AS available,
       true AS window_open, NULL::timestamptz AS window_opens_at, claimed.*
FROM claimed
UNION ALL
SELECT false AS matched, (SELECT open FROM gate) AS deliveries_open, job.available,
       coalesce((SELECT open FROM win), true) AS window_open, (SELECT opens_at FROM win) AS window_opens_at,
       (job.found).*
FROM job WHERE NOT EXISTS (SELECT 1 FROM claimed);

-- name: adopt_claim_if_running
-- After a lost claim answer Temporal may retry the claim on another host, which finds the claim its attempt
-- made (Running with this attempt): the attempt is that host's now (23.8), so the row names it, and every
-- event written from here on (fences, terminal writes) names the host that holds the attempt. Only this
-- attempt, only while Running; no status change. Ownership is the attempt's: no write is conditioned on
-- claimed_by.
UPDATE export_jobs SET claimed_by = %(worker_id)s
WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
  AND claimed_by IS DISTINCT FROM %(worker_id)s
RETURNING id AS job_id;

-- name: authorize_delivery_if_running
-- Cutoff 2: Running -> Delivering for this attempt, only with no stop request and a current lease; for a
-- replacement, only while its original is not Completed; only while the job's destination is active
-- and within its contract today (UTC) and every delivery switch of its scope exists and is enabled; and
-- only while the creator may still export the list and the list still has contacts (001: "facts that live
-- outside the claimed row"; the claim's policy check read them before the build). FOR SHARE on the
-- original conflicts with a correction's update of it, on the destination with its retirement and its
-- edits, on the switches with a pause, on the creator's principal row with its revocation: whichever
-- commits first makes the other wait, and this statement then re-checks. It authorizes only the destination
-- version the build read (issue #24.2): no change of what a delivery uses (delivery_version, set by the
-- destination's trigger) since then, and it records the version it authorized on the row and in the event.
-- It authorizes only inside the destination's delivery window (0035), read on the same locked row, so a
-- window edit and cutoff 2 serialize too: a window that closed during the build refuses (WindowClosed).
-- It answers with state and ownership whether or not it matched, so a refusal is classified from this
-- answer (StopRecorded, LeaseLapsed, NotOwner, OriginalCompleted, DestinationInactive, PolicyDenied, Paused,
-- DestinationChanged, WindowClosed).
WITH job AS (
    SELECT id, status, attempt_id, stop_request_id, tenant_id, destination_id, created_by, list_name,
           coalesce(lease_expires_at > clock_timestamp(), false) AS lease_current
    FROM export_jobs WHERE id = %(job_id)s FOR UPDATE),
original AS (
    SELECT status FROM export_jobs
    WHERE tenant_id = %(tenant_id)s AND id = %(replaces_job_id)s::uuid
    FOR SHARE),
destination AS (
    SELECT d.retired_at IS NULL
           AND d.contract_starts_on <= (clock_timestamp() AT TIME ZONE 'UTC')::date
           AND (d.contract_ends_on IS NULL
                OR (clock_timestamp() AT TIME ZONE 'UTC')::date <= d.contract_ends_on) AS usable,
           -- nothing a delivery uses changed since the version the build read (a caller that read none
           -- checks nothing: the worker always passes it)
           (%(destination_version)s::int IS NULL OR d.delivery_version <= %(destination_version)s::int)
               AS unchanged,
           -- the partner takes deliveries now (issue #25.2: intake hours and blackout dates)
           delivery_window_open(d, clock_timestamp()) AS window_open,
           d.version, d.manifest
    FROM destinations d, job
    WHERE job.status = 'Running' AND d.tenant_id = job.tenant_id AND d.id = job.destination_id
    FOR SHARE OF d),
creator AS (
    -- rules.policy.evaluate_policy's creator checks (a test holds the two to the same answers)
    SELECT p.revoked_at IS NULL AND p.role IN ('operator', 'reconciler', 'admin')
           AND (p.export_lists IS NULL OR job.list_name = ANY (p.export_lists)) AS may_export
    FROM principals p, job
    WHERE job.status = 'Running' AND p.tenant_id = job.tenant_id AND p.name = job.created_by
    FOR SHARE OF p),
gate AS (
    -- the switches of the job's scope read FOR SHARE while it is Running (a missing row is paused), a
    -- missing destination an unusable one, a missing principal one who may not export
    SELECT coalesce((SELECT lock_delivery_scope(job.tenant_id, job.destination_id) FROM job
                     WHERE job.status = 'Running'), false) AS open,
           coalesce((SELECT usable FROM destination), false) AS usable,
           coalesce((SELECT unchanged FROM destination), false) AS unchanged,
           coalesce((SELECT window_open FROM destination), false) AS window_open,
           coalesce((SELECT may_export FROM creator), false)
           -- the list still has a contact: its first in the primary key's order, as read_policy_facts reads it
           AND coalesce((SELECT (SELECT true FROM contacts c
                                 WHERE c.tenant_id = job.tenant_id AND c.list_name = job.list_name
                                 ORDER BY c.id LIMIT 1) FROM job), false) AS policy_allows),
authorized AS (
    UPDATE export_jobs j
    SET status = 'Delivering',
        expected_file_name = %(final_name)s, expected_file_bytes = %(length)s, expected_file_sha256 = %(sha256)s,
        expected_file_rows = %(rows)s::bigint,
        delivery_authorized_at = clock_timestamp(),
        -- the upload starts with a full lease, never with what was left of the build's
        lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s),
        fence_expected = true, upload_fenced_at = NULL, rename_fenced_at = NULL,
        destination_version = (SELECT version FROM destination),
        -- what the authorized version asks for beside the file (0037): its Completed needs it in place
        expected_manifest = (SELECT manifest FROM destination)
    FROM job, gate
    WHERE j.id = job.id AND j.attempt_id = %(attempt_id)s AND j.status = 'Running'
      AND j.stop_request_id IS NULL
      AND j.lease_expires_at > clock_timestamp()
      -- typed, so a null binds; the original must exist and not be Completed
      AND (%(replaces_job_id)s::uuid IS NULL OR EXISTS (SELECT 1 FROM original WHERE status <> 'Completed'))
      -- a retired or out-of-contract destination, a creator who may no longer export the list or a list
      -- that is gone, or a paused scope stops the attempt before delivery
      AND gate.usable AND gate.policy_allows AND gate.open
      -- an edit of the host, credentials, keys or format since the build read the destination: rebuild
      AND gate.unchanged
      -- outside the partner's intake hours, or on a blackout date: give back, wait for the next opening
      AND gate.window_open
    RETURNING j.id, j.status, j.attempt_id, j.stop_request_id, j.delivery_authorized_at, j.destination_version),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, detail, recorded_at, destination_version)
    -- the attempt's file evidence (JSON: file, bytes, SHA-256, rows, plaintext, format, fingerprints)
    SELECT id, attempt_id, 'DeliveryAuthorized', %(detail)s, delivery_authorized_at, destination_version
    FROM authorized)
SELECT true AS matched, status, attempt_id, stop_request_id, true AS lease_current,
       (SELECT status FROM original) AS original_status, true AS destination_usable, true AS deliveries_open,
       true AS policy_allows, true AS destination_unchanged, true AS window_open
FROM authorized
UNION ALL
SELECT false AS matched, status, attempt_id, stop_request_id, lease_current,
       (SELECT status FROM original) AS original_status,
       (SELECT usable FROM gate) AS destination_usable, (SELECT open FROM gate) AS deliveries_open,
       (SELECT policy_allows FROM gate) AS policy_allows, (SELECT unchanged FROM gate) AS destination_unchanged,
       (SELECT window_open FROM gate) AS window_open
FROM job WHERE NOT EXISTS (SELECT 1 FROM authorized);

-- name: read_ownership
-- The lost-response re-read: state and ownership together, with the lease judged on the database clock,
-- whether the upload fence is written and, for a replacement, its original's status.
SELECT j.status, j.attempt_id, j.stop_request_id,
       coalesce(j.lease_expires_at > clock_timestamp(), false) AS lease_current,
       o.status AS original_status,
       j.upload_fenced_at IS NOT NULL AS upload_fenced,
       j.rename_fenced_at IS NOT NULL AS rename_fenced
FROM export_jobs j
LEFT JOIN export_jobs o ON o.tenant_id = j.tenant_id AND o.id = j.replaces_job_id
WHERE j.id = %(job_id)s;

-- name: renew_lease
-- Renewal. It deliberately does not check expiry: ownership ends only when a takeover commits. It answers,
-- in the same round trip, whether a stop request is recorded.
UPDATE export_jobs
SET lease_expires_at = clock_timestamp() + make_interval(secs => %(lease_seconds)s)
WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status IN ('Running', 'Delivering')
RETURNING status, stop_request_id IS NOT NULL AS stop_requested;

-- name: finish_stopped
-- Running -> Stopped for this attempt, only when a stop request is recorded: a lease takeover can never be
-- written as an operator's stop. The event names the request it honored.
WITH stopped AS (
    UPDATE export_jobs
    SET status = 'Stopped', lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running' AND stop_request_id IS NOT NULL
    RETURNING id, attempt_id, stop_request_id, claimed_by),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id, 'Stopped', claimed_by,
           %(stop_point)s || ', for ' || stop_request_id::text || '; ' || %(note)s, clock_timestamp()
    FROM stopped
    RETURNING id)
-- With the stop's latency from the request to this write, both on the database clock (a metric).
SELECT event.id, extract(epoch FROM clock_timestamp() - r.recorded_at)::float8 AS stop_latency_seconds
FROM event CROSS JOIN stopped LEFT JOIN cancellation_requests r ON r.id = stopped.stop_request_id;

-- name: finish_failed
-- Running -> Failed for this attempt, with one failure code; the cause (an error type, never data) goes in
-- the event's detail.
WITH failed AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = %(code)s, lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
    RETURNING id, attempt_id, claimed_by)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
SELECT id, attempt_id, 'Failed', claimed_by, %(code)s || coalesce(': ' || %(cause)s::text, ''), clock_timestamp()
FROM failed
RETURNING id;

-- name: release_attempt_if_running
-- Running -> Queued by the attempt that holds the job (ownership is the attempt's, whichever host confirmed
-- its claim), before cutoff 2, with its event and a new wake-up; the attempt is not counted against the
-- attempt cap. A give-back for a failure (counted) makes the job wait: available_at = now + min(cap,
-- base * 2^n) scaled by the jitter (0.5 to 1), n its earlier counted give-backs, and the wake-up waits as
-- long (002 "Backoff": persisted, so a restart keeps the delay). Past max_releases counted give-backs the
-- job ends Failed (AttemptsExhausted) instead (002: "poison input cannot create infinite retries"). A drain
-- or a pause is not counted and does not wait. A give-back because the destination's delivery window closed
-- (until_window_opens, issue #25.2) is not counted but waits for the window's next opening; one for want of a
-- partner session slot (25.3) is not counted either but waits wait_seconds, so it does not come straight back
-- to a partner still at its limit. A recorded stop request is honored by finish_stopped instead, never released
-- into the queue again. The event names the host that gave the job back.
WITH released AS (
    UPDATE export_jobs
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        woken_at = clock_timestamp(), attempts_released = attempts_released + 1,
        transient_releases = transient_releases + CASE WHEN %(counted)s THEN 1 ELSE 0 END,
        available_at = CASE WHEN %(counted)s THEN clock_timestamp() + make_interval(
            secs => least(%(cap_seconds)s::float8, %(base_seconds)s::float8 * 2 ^ transient_releases)
                    * (0.5 + 0.5 * %(jitter)s::float8))
            WHEN %(until_window_opens)s THEN (
                SELECT next_window_opening(d, clock_timestamp()) FROM destinations d
                WHERE d.tenant_id = export_jobs.tenant_id AND d.id = export_jobs.destination_id)
            WHEN %(wait_seconds)s::float8 IS NOT NULL
            THEN clock_timestamp() + make_interval(secs => %(wait_seconds)s::float8) END
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NULL
      AND (NOT %(counted)s OR transient_releases < %(max_releases)s)
    RETURNING id, available_at, transient_releases),
exhausted AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'AttemptsExhausted', lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Running'
      AND stop_request_id IS NULL
      AND %(counted)s AND transient_releases >= %(max_releases)s
    RETURNING id, attempt_id, transient_releases),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, %(attempt_id)s, 'Released', %(worker_id)s,
           %(cause)s || ': ' || %(reason)s
           || coalesce('; the next claim waits until ' || to_char(available_at AT TIME ZONE 'UTC',
                                                                   'HH24:MI:SS.MS') || ' UTC', ''),
           clock_timestamp()
    FROM released),
gave_up AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT id, attempt_id, 'AttemptsExhausted', %(worker_id)s,
           'given back ' || transient_releases || CASE WHEN transient_releases = 1 THEN ' time' ELSE ' times' END
           || ' after failures (the limit); this time '
           || %(cause)s || ': ' || %(reason)s,
           clock_timestamp()
    FROM exhausted),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent, available_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text, available_at
    FROM released)
SELECT id AS job_id, 'Released' AS ending, available_at FROM released
UNION ALL
SELECT id AS job_id, 'Exhausted' AS ending, NULL::timestamptz AS available_at FROM exhausted;

-- name: fence_upload_if_delivering
-- The upload fence: before any I/O with the partner, this attempt writes it, still Delivering, still the
-- owner, with a current lease. The uploader sends nothing unless this matched (or, after a lost answer,
-- the re-read shows its own fence). Recovery's fail_unpublished_delivery refuses a late one. It answers with
-- the whole row, as it wrote it or as the locking read found it, so the upload reads nothing else before it
-- starts (the terms cutoff 2 authorized are on it).
WITH job AS (
    SELECT e AS found, e.upload_fenced_at IS NOT NULL AS fenced,
           coalesce(e.lease_expires_at > clock_timestamp(), false) AS lease_current
    FROM export_jobs e WHERE e.id = %(job_id)s FOR UPDATE),
fenced AS (
    UPDATE export_jobs j
    SET upload_fenced_at = clock_timestamp()
    FROM job
    WHERE j.id = (job.found).id AND j.attempt_id = %(attempt_id)s AND j.status = 'Delivering'
      AND j.upload_fenced_at IS NULL AND j.lease_expires_at > clock_timestamp()
    RETURNING j.*),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, recorded_at)
    SELECT id, attempt_id, 'UploadFenced', claimed_by, upload_fenced_at FROM fenced)
SELECT true AS matched, true AS fenced, true AS lease_current, fenced.* FROM fenced
UNION ALL
SELECT false AS matched, job.fenced, job.lease_current, (job.found).*
FROM job WHERE NOT EXISTS (SELECT 1 FROM fenced);

-- name: fence_rename_if_delivering
-- The rename fence: after the upload to the temporary name and before the rename request, this attempt
-- writes it, still Delivering, still the owner, with a current lease and its upload fence. The rename is
-- never sent unless this matched; so an expired attempt without it never wrote the final name. It is
-- written only inside the destination's delivery window (0035), open now and still open margin_seconds from
-- now (the rename request follows the fence at once; windows change on the minute), so no rename is sent
-- outside it (issue #25.2); a closed window refuses it and the rename is never sent.
WITH job AS (
    SELECT id, status, attempt_id, rename_fenced_at IS NOT NULL AS fenced, tenant_id, destination_id,
           coalesce(lease_expires_at > clock_timestamp(), false) AS lease_current
    FROM export_jobs WHERE id = %(job_id)s FOR UPDATE),
win AS (
    SELECT delivery_window_open(d, w.at)
           AND delivery_window_open(d, w.at + make_interval(secs => %(window_margin_seconds)s::float8)) AS open
    FROM job, destinations d, (SELECT clock_timestamp() AS at) w
    WHERE d.tenant_id = job.tenant_id AND d.id = job.destination_id),
fenced AS (
    UPDATE export_jobs j
    SET rename_fenced_at = clock_timestamp()
    FROM job
    WHERE j.id = job.id AND j.attempt_id = %(attempt_id)s AND j.status = 'Delivering'
      AND j.upload_fenced_at IS NOT NULL AND j.rename_fenced_at IS NULL
      AND j.lease_expires_at > clock_timestamp()
      -- the partner takes deliveries now, and still will when the rename arrives
      AND coalesce((SELECT open FROM win), false)
    RETURNING j.id, j.status, j.attempt_id, j.rename_fenced_at, j.claimed_by),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, recorded_at)
    SELECT id, attempt_id, 'RenameFenced', claimed_by, rename_fenced_at FROM fenced)
SELECT true AS matched, status, attempt_id, true AS fenced, true AS lease_current, true AS window_open
FROM fenced
UNION ALL
SELECT false AS matched, status, attempt_id, fenced, lease_current,
       coalesce((SELECT open FROM win), false) AS window_open
FROM job WHERE NOT EXISTS (SELECT 1 FROM fenced);

-- name: finish_delivery
-- The attempt's terminal write: Delivering -> Completed, Failed (with a code) or OutcomeUnknown, for this
-- attempt only. A write after a takeover matches nothing; the evidence was appended before it. Completed
-- only once the manifest the authorized version asks for is in place, by the attempt's evidence (0037).
WITH finished AS (
    UPDATE export_jobs
    SET status = %(outcome)s,
        failure_reason = CASE WHEN %(outcome)s = 'Failed' THEN %(code)s::text END,
        lease_expires_at = NULL
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'Delivering'
      AND %(outcome)s IN ('Completed', 'Failed', 'OutcomeUnknown')
      AND (%(outcome)s <> 'Completed' OR manifest_in_place(export_jobs))
    RETURNING id, attempt_id, claimed_by, status, failure_reason)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
SELECT id, attempt_id, 'Finished', claimed_by,
       status || coalesce(' ' || failure_reason, '') || coalesce(': ' || %(summary)s::text, ''), clock_timestamp()
FROM finished
RETURNING id;

-- name: lock_job_for_retry
-- The retry's locking read, in the same short transaction as retry_delivery_if_delivering and before it: it
-- waits for a cancellation transaction that holds the row (lock_job_for_cancel), so the retry statement's
-- snapshot, taken after the wait, sees a TooLate request that transaction recorded. In one statement the
-- wait would not help: a TooLate request changes no job row, so the update would go on with the snapshot it
-- took before the wait and never see the request (001 "When Cancellation Loses").
SELECT id AS job_id FROM export_jobs WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s FOR UPDATE;

-- name: retry_delivery_if_delivering
-- The terminal write of a delivery that failed NotDelivered for a transient cause (issue #25.4,
-- rules/retries.py): Delivering -> Queued with its RetryScheduled event and a wake-up that waits as long as
-- the job (available_at = now + min(cap, base * 2^n) scaled by the jitter, n the attempts this job used before
-- this one), or, when a retry may not be made, Delivering -> Failed (NotDelivered) as finish_delivery writes
-- it, its Finished event saying why not. The retry is made only for this attempt, still Delivering, whose
-- row proves the rename was never sent (no rename fence: so the final name was never written), with no stop
-- request and no cancellation request recorded against this attempt (a cancel answered TooLate during it
-- stops the retry; 001: "TooLate" stays true), within the attempt cap (this attempt is a used one: the
-- retry, unlike a give-back, does not add to attempts_released). The delivery key and final name are the
-- job's and do not change; the next claim and cutoff 2 apply every rule again. The attempt's session slot
-- ends with its hold of the job (0029). Run after lock_job_for_retry, in the same transaction.
WITH job AS (
    SELECT j.id, j.status, j.attempt_id, j.claimed_by, j.stop_request_id,
           j.attempt_count - j.attempts_released AS used,
           j.rename_fenced_at IS NULL AS never_renamed,
           (SELECT r.id FROM cancellation_requests r
            WHERE r.tenant_id = j.tenant_id AND r.job_id = j.id AND r.found_attempt_id = j.attempt_id
            ORDER BY r.recorded_at, r.id LIMIT 1) AS request_id
    FROM export_jobs j
    WHERE j.id = %(job_id)s AND j.attempt_id = %(attempt_id)s AND j.status = 'Delivering'
    FOR UPDATE),
retried AS (
    UPDATE export_jobs j
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        woken_at = clock_timestamp(),
        available_at = clock_timestamp() + make_interval(
            secs => least(%(cap_seconds)s::float8, %(base_seconds)s::float8 * 2 ^ greatest(job.used - 1, 0))
                    * (0.5 + 0.5 * %(jitter)s::float8))
    FROM job
    WHERE j.id = job.id AND j.attempt_id = %(attempt_id)s AND j.status = 'Delivering'
      -- the row's own proof of NotDelivered: the rename is never sent without its fence
      AND j.rename_fenced_at IS NULL
      -- a stop or cancel recorded during the attempt is honoured: no retry
      AND j.stop_request_id IS NULL AND job.request_id IS NULL
      -- the failed attempt counts as used (002: "poison input cannot create infinite retries")
      AND job.used < %(max_attempts)s
    RETURNING j.id, j.available_at),
failed AS (
    UPDATE export_jobs j
    SET status = 'Failed', failure_reason = 'NotDelivered', lease_expires_at = NULL
    FROM job
    WHERE j.id = job.id AND j.attempt_id = %(attempt_id)s AND j.status = 'Delivering'
      AND NOT (j.rename_fenced_at IS NULL AND j.stop_request_id IS NULL AND job.request_id IS NULL
               AND job.used < %(max_attempts)s)
    RETURNING j.id),
retry_event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT job.id, job.attempt_id, 'RetryScheduled', job.claimed_by,
           %(cause)s || ': ' || %(summary)s || '; try ' || job.used || ' of ' || %(max_attempts)s
           || '; the next try waits until '
           || to_char(retried.available_at AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS.MS') || ' UTC',
           clock_timestamp()
    FROM retried, job),
failed_event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, worker_id, detail, recorded_at)
    SELECT job.id, job.attempt_id, 'Finished', job.claimed_by,
           'Failed NotDelivered: ' || %(summary)s || '; not retried (' || %(cause)s || '): '
           || CASE WHEN coalesce(job.stop_request_id, job.request_id) IS NOT NULL
                   THEN 'cancellation request ' || coalesce(job.stop_request_id, job.request_id)::text
                        || ' was recorded during this attempt'
                   WHEN NOT job.never_renamed THEN 'the rename fence was written'
                   ELSE 'try ' || job.used || ' of ' || %(max_attempts)s || ', the attempt cap' END,
           clock_timestamp()
    FROM failed, job),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent, available_at)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text, available_at
    FROM retried)
SELECT 'Retried' AS ending, retried.available_at, NULL::uuid AS request_id, job.used FROM retried, job
UNION ALL
SELECT 'Failed' AS ending, NULL::timestamptz AS available_at, coalesce(job.stop_request_id, job.request_id),
       job.used
FROM failed, job;

-- name: append_delivery_evidence
-- Evidence of what an attempt or a recovery run observed. An insert that never touches the job's status;
-- it is kept whoever owns the job now.
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, %(attempt_id)s, 'DeliveryEvidence', %(observed_by)s, %(detail)s, clock_timestamp()
FROM export_jobs WHERE id = %(job_id)s
RETURNING id;

-- name: append_delivery_evidence_many
-- Several observations of one attempt in one round trip, in the order given (their IDs and times keep it):
-- the delivering thread hands them over as it makes them and a writer appends what has gathered since its
-- last append. Like the single append, an insert that never touches the job's status.
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT j.id, %(attempt_id)s, 'DeliveryEvidence', %(observed_by)s, d.detail, clock_timestamp()
FROM export_jobs j, unnest(%(details)s::text[]) WITH ORDINALITY AS d(detail, n)
WHERE j.id = %(job_id)s
ORDER BY d.n
RETURNING id;

-- name: find_expired_leases
-- Recovery's scan. It only nominates: each takeover below repeats every condition it relied on. A
-- Delivering attempt whose resolution needs its partner (its rename fence was written, so only a listing or
-- a set-aside can settle it) waits while its partner's deliveries are paused: no session is opened to a
-- paused partner (23.5), and the scan passes over it so the jobs behind it are taken over meanwhile.
SELECT id, attempt_id, status, stop_request_id, attempt_count, attempts_released, replaces_job_id,
       fence_expected AND rename_fenced_at IS NULL AS unpublished
FROM export_jobs
WHERE status IN ('Running', 'Delivering') AND lease_expires_at < clock_timestamp()
  AND (status = 'Running' OR (fence_expected AND rename_fenced_at IS NULL)
       OR delivery_scope_open(tenant_id, destination_id))
ORDER BY lease_expires_at
LIMIT %(limit)s;

-- name: requeue_expired_attempt
-- An expired Running attempt with no stop request, under the cap, goes back to the queue with its event and
-- a new outbox row.
WITH requeued AS (
    UPDATE export_jobs
    SET status = 'Queued', attempt_id = NULL, claimed_by = NULL, lease_expires_at = NULL,
        woken_at = clock_timestamp()
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NULL AND attempt_count - attempts_released < %(max_attempts)s
      AND lease_expires_at < clock_timestamp()
    RETURNING id),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, recorded_at)
    SELECT id, %(expired_attempt_id)s, 'RequeuedByRecovery', %(recovery_run_id)s, clock_timestamp() FROM requeued),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM requeued)
SELECT id AS job_id FROM requeued;

-- name: stop_expired_attempt
-- An expired Running attempt with a recorded stop request is finished, not restarted. Terminal states keep
-- attempt_id for audit.
WITH stopped AS (
    UPDATE export_jobs
    SET status = 'Stopped', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NOT NULL
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id, stop_request_id),
event AS (
    INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
    SELECT id, attempt_id, 'StoppedByRecovery', %(recovery_run_id)s, 'for ' || stop_request_id::text,
           clock_timestamp()
    FROM stopped
    RETURNING id)
SELECT event.id, extract(epoch FROM clock_timestamp() - r.recorded_at)::float8 AS stop_latency_seconds
FROM event CROSS JOIN stopped LEFT JOIN cancellation_requests r ON r.id = stopped.stop_request_id;

-- name: exhaust_expired_attempt
-- An expired Running attempt at the attempt cap fails: a job that crashes its worker every time ends.
WITH exhausted AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'AttemptsExhausted', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Running' AND attempt_id = %(expired_attempt_id)s
      AND stop_request_id IS NULL AND attempt_count - attempts_released >= %(max_attempts)s
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id, attempt_count, attempts_released)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'AttemptsExhausted', %(recovery_run_id)s,
       'after ' || attempt_count - attempts_released || ' attempts',
       clock_timestamp()
FROM exhausted
RETURNING id;

-- name: resolve_expired_delivery
-- An expired Delivering attempt is resolved from evidence, never retried: Completed only on evidence,
-- otherwise OutcomeUnknown. The lease condition makes a renewal during recovery's lookup win. Completed only
-- once the manifest the authorized version asks for is in place, by evidence (0037: recovery publishes it
-- when the data file is proven in place and the manifest is not).
WITH resolved AS (
    UPDATE export_jobs
    SET status = %(resolution)s, lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Delivering' AND attempt_id = %(expired_attempt_id)s
      AND lease_expires_at < clock_timestamp()
      AND %(resolution)s IN ('Completed', 'OutcomeUnknown')
      AND (%(resolution)s <> 'Completed' OR manifest_in_place(export_jobs))
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'ResolvedByRecovery', %(recovery_run_id)s, status || ': ' || %(evidence_summary)s,
       clock_timestamp()
FROM resolved
RETURNING id;

-- name: fail_unpublished_delivery
-- An expired Delivering attempt that was to fence its rename and never did never wrote the final name:
-- it sent nothing (no upload fence either) or only a temporary file. Failed NotDelivered, with that
-- evidence (000: NotDelivered "when the destination or reconciliation proves the final name was never
-- written"). The same conditions refuse the attempt's late fences: once this commits the row is no longer
-- Delivering; if a fence commits first, this matches nothing.
WITH failed AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'NotDelivered', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Delivering' AND attempt_id = %(expired_attempt_id)s
      AND fence_expected AND rename_fenced_at IS NULL
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id, upload_fenced_at IS NOT NULL AS uploaded)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'ResolvedByRecovery', %(recovery_run_id)s,
       CASE WHEN uploaded
            THEN 'Failed NotDelivered: the attempt never fenced its rename, so it never wrote the final name'
            ELSE 'Failed NotDelivered: the attempt never fenced its upload, so it sent nothing' END,
       clock_timestamp()
FROM failed
RETURNING id;

-- name: fail_set_aside_delivery
-- An expired Delivering attempt that fenced its rename (its upload to the temporary name was complete),
-- whose temporary file recovery then moved to the attempt's set-aside name, or found there, with the final
-- name still as the attempt's baseline showed it: no rename of the temporary name can publish the file any
-- more, so the attempt never wrote the final name. Failed NotDelivered on that affirmative evidence (000
-- "Recovery": "the partner confirming that nothing was published and that the attempt's ... upload slot
-- can no longer publish"). The lease condition makes a renewal during recovery's move win; the worker
-- then finds its rename refused and records the same outcome itself.
WITH failed AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'NotDelivered', lease_expires_at = NULL
    WHERE id = %(job_id)s AND status = 'Delivering' AND attempt_id = %(expired_attempt_id)s
      AND rename_fenced_at IS NOT NULL
      AND lease_expires_at < clock_timestamp()
    RETURNING id, attempt_id)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'ResolvedByRecovery', %(recovery_run_id)s, 'Failed NotDelivered: ' || %(evidence_summary)s,
       clock_timestamp()
FROM failed
RETURNING id;

-- name: find_unknowns_to_recheck
-- Recovery's re-check of OutcomeUnknowns (0013). It only nominates: an attempt recorded OutcomeUnknown within
-- the last within_seconds and at least every_seconds ago, not reconciled, its job named by no replacement,
-- whose partner has not answered recovery yet (recovery, observed_by starting with observer_prefix, never
-- listed it, or its last listing or move got no answer: an 'error' in that evidence), and not listed by recovery in the last every_seconds; oldest first.
-- A partner that answered gave what it will give: a person weighs that.
SELECT j.id AS job_id, j.attempt_id
FROM export_jobs j
CROSS JOIN LATERAL (
    SELECT max(e.recorded_at) AS at FROM export_attempt_events e
    WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind IN ('Finished', 'ResolvedByRecovery')
) recorded
LEFT JOIN LATERAL (
    SELECT e.recorded_at AS at, e.detail::jsonb ? 'error' AS unanswered
    FROM export_attempt_events e
    WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind = 'DeliveryEvidence'
      AND starts_with(e.observed_by, %(observer_prefix)s)
    ORDER BY e.id DESC
    LIMIT 1
) listed ON true
WHERE j.status = 'OutcomeUnknown'
  AND recorded.at > clock_timestamp() - make_interval(secs => %(within_seconds)s)
  AND recorded.at < clock_timestamp() - make_interval(secs => %(every_seconds)s)
  AND (listed.at IS NULL
       OR (listed.unanswered AND listed.at < clock_timestamp() - make_interval(secs => %(every_seconds)s)))
  AND NOT EXISTS (SELECT 1 FROM export_attempt_events r
                  WHERE r.job_id = j.id AND r.attempt_id = j.attempt_id AND r.kind = 'Reconciled')
  AND NOT EXISTS (SELECT 1 FROM export_jobs s WHERE s.replaces_job_id = j.id)
  -- no session is opened to a paused partner: its re-check waits for the resume (23.5)
  AND delivery_scope_open(j.tenant_id, j.destination_id)
ORDER BY recorded.at
LIMIT %(limit)s;

-- name: lock_unknown_for_settling
-- The OutcomeUnknown row, locked first in settle_unknown_by_evidence's transaction: create_replacement locks it
-- FOR UPDATE too, so a replacement being created commits before the settling statement takes its snapshot,
-- and that statement's "no replacement" condition sees it (one statement's snapshot would not).
SELECT id AS job_id FROM export_jobs
WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'OutcomeUnknown'
FOR UPDATE;

-- name: settle_unknown_by_evidence
-- OutcomeUnknown -> Completed or Failed (NotDelivered) by recovery, on evidence a re-check found: the attempt's
-- one reconciliation (its 'Reconciled' event is unique per attempt), under the recovery run's ID. Only for that
-- attempt, and only on a job no replacement names: a replacement delivers under the same final name, so a
-- listing is no evidence for its original. A person who reconciled first changed the status: nothing matches.
WITH settled AS (
    UPDATE export_jobs
    SET status = %(resolution)s,
        failure_reason = CASE WHEN %(resolution)s = 'Failed' THEN 'NotDelivered' END
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'OutcomeUnknown'
      AND %(resolution)s IN ('Completed', 'Failed')
      AND NOT EXISTS (SELECT 1 FROM export_jobs r WHERE r.replaces_job_id = %(job_id)s)
      -- Completed only with the manifest the authorized version asks for in place, by evidence (0037)
      AND (%(resolution)s <> 'Completed' OR manifest_in_place(export_jobs))
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Reconciled', %(recovery_run_id)s, status || ': ' || %(evidence_summary)s, clock_timestamp()
FROM settled
RETURNING id;

-- name: find_unpublished_unknowns
-- Recovery's nomination of OutcomeUnknowns that the row's own fences settle (issue 23): the attempt was to
-- fence its rename before sending it, fenced its upload, and never fenced its rename, so it never sent the
-- rename request. No listing, window or interval: the proof is in the row. Oldest first; candidates only:
-- settle_unknown_by_fences repeats every condition.
SELECT id AS job_id, attempt_id
FROM export_jobs
WHERE status = 'OutcomeUnknown'
  AND fence_expected AND upload_fenced_at IS NOT NULL AND rename_fenced_at IS NULL
ORDER BY delivery_authorized_at
LIMIT %(limit)s;

-- name: settle_unknown_by_fences
-- OutcomeUnknown -> Failed (NotDelivered) by recovery, from the row's own fences: the attempt fenced its upload
-- and never its rename, and the rename request is never sent unless that fence matched, so the attempt never
-- wrote the final name (000: NotDelivered "when the destination or reconciliation proves the final name was
-- never written"). No fence can be written any more: both require Delivering. The attempt's one
-- reconciliation (its 'Reconciled' event, unique per attempt), under the recovery run's ID; a person who
-- reconciled first changed the status, so nothing matches. A replacement naming this job changes nothing:
-- the proof is this attempt's own requests, not a listing of the final name they share.
WITH settled AS (
    UPDATE export_jobs
    SET status = 'Failed', failure_reason = 'NotDelivered'
    WHERE id = %(job_id)s AND attempt_id = %(attempt_id)s AND status = 'OutcomeUnknown'
      AND fence_expected AND upload_fenced_at IS NOT NULL AND rename_fenced_at IS NULL
    RETURNING id, attempt_id)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Reconciled', %(recovery_run_id)s,
       'Failed: the attempt fenced its upload and never its rename, so it never sent the rename request '
       'and never wrote the final name',
       clock_timestamp()
FROM settled
RETURNING id;

-- name: reconcile_unknown
-- OutcomeUnknown -> Completed or Failed (NotDelivered), for that attempt, once: the unique index allows one
-- Reconciled event per attempt. No lease condition: recovery cleared the lease. Only by a reconciler: the one
-- named holds the reconciler role in the tenant (0032), so an operator's reconcile matches nothing here too.
WITH reconciled AS (
    UPDATE export_jobs
    SET status = %(resolution)s,
        failure_reason = CASE WHEN %(resolution)s = 'Failed' THEN 'NotDelivered' END
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = 'OutcomeUnknown' AND %(resolution)s IN ('Completed', 'Failed')
      AND principal_holds(%(tenant_id)s, %(reconciled_by)s, ARRAY['reconciler'])
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Reconciled', %(reconciled_by)s, status || ': ' || %(evidence_summary)s, clock_timestamp()
FROM reconciled
RETURNING id;

-- name: record_correction
-- The correction of one attempt's recorded outcome, with who and why; once per attempt (the primary key).
-- correct_outcome runs after it in the same transaction, and the trigger lets the status change only along
-- this row, to the failure code it records (only Failed carries one, 0019). Two people (0032): it matches
-- only under an approval of this correction that the reconciler recording it decided, asked by another.
INSERT INTO outcome_corrections (tenant_id, job_id, attempt_id, from_status, to_status, failure_reason,
                                 corrected_by, evidence_ref, why)
SELECT tenant_id, id, attempt_id, %(recorded_status)s, %(corrected_status)s,
       CASE WHEN %(corrected_status)s = 'Failed' THEN %(failure_reason)s::text END,
       %(corrected_by)s, %(evidence_ref)s, %(why)s
FROM export_jobs
WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND attempt_id = %(attempt_id)s
  AND status = %(recorded_status)s AND status IN ('Completed', 'Failed')
  AND %(corrected_status)s IN ('Completed', 'Failed') AND %(corrected_status)s <> %(recorded_status)s
  AND approved_action(tenant_id, ARRAY['correct_outcome'], id::text, %(corrected_by)s,
                      jsonb_build_object('attempt_id', attempt_id::text, 'corrected_status', %(corrected_status)s::text))
RETURNING job_id;

-- name: correct_outcome
-- A named reconciler corrects a recorded Completed or Failed once, with who and why, conditionally on
-- the recorded status and attempt (after record_correction, in its transaction).
WITH corrected AS (
    UPDATE export_jobs
    SET status = %(corrected_status)s,
        failure_reason = CASE WHEN %(corrected_status)s = 'Failed' THEN %(failure_reason)s::text END
    WHERE tenant_id = %(tenant_id)s AND id = %(job_id)s AND attempt_id = %(attempt_id)s
      AND status = %(recorded_status)s AND status IN ('Completed', 'Failed')
      AND %(corrected_status)s IN ('Completed', 'Failed') AND %(corrected_status)s <> %(recorded_status)s
    RETURNING id, attempt_id, status)
INSERT INTO export_attempt_events (job_id, attempt_id, kind, observed_by, detail, recorded_at)
SELECT id, attempt_id, 'Corrected', %(corrected_by)s,
       %(recorded_status)s || ' to ' || status || ': ' || %(evidence_ref)s || '; ' || %(why)s, clock_timestamp()
FROM corrected
RETURNING id;

-- name: sweep_stale_queued
-- The sweeper: a bounded batch of Queued jobs whose last wake-up is older than the threshold gets a fresh
-- outbox row. SKIP LOCKED leaves rows another writer holds to the next sweep; the update re-checks Queued.
-- A job whose scope is paused (any of its three switches missing or disabled) is skipped, so its
-- sweep_count does not climb while paused: the resume wakes it.
WITH due AS (
    SELECT j.id FROM export_jobs j
    WHERE j.status = 'Queued' AND j.woken_at < clock_timestamp() - make_interval(secs => %(older_than_seconds)s)
      -- every switch of its scope enabled (a missing row is paused), as a per-row filter: with the checks
      -- as EXISTS joins the planner estimated one row and then read and sorted every stale Queued job; as a
      -- filter it walks ix_export_jobs_woken in order and stops at the batch (bench scale_db: 6.5x slower
      -- than empty at 100k queued before).
      AND delivery_scope_open(j.tenant_id, j.destination_id)
      -- a job waiting after a give-back has a wake-up due at its available_at: it is not stranded
      AND (j.available_at IS NULL OR j.available_at <= clock_timestamp())
    ORDER BY j.woken_at
    LIMIT %(batch)s
    FOR UPDATE OF j SKIP LOCKED),
swept AS (
    UPDATE export_jobs j
    SET woken_at = clock_timestamp(), sweep_count = j.sweep_count + 1
    FROM due
    WHERE j.id = due.id AND j.status = 'Queued'
    RETURNING j.id),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM swept)
SELECT id AS job_id FROM swept;

-- name: record_cancellation_action
-- The ledger row of one cancellation request (0031), sent in its pipeline after cancel_and_record and before the
-- COMMIT, so it commits with the request: what was recorded for this request ID and export, as the API answers
-- it (200 done, 202 accepted, 409 refused; service/exports.py says the same per outcome), and the status found.
-- Nothing when the request recorded nothing here (no such export, a request ID of another request).
INSERT INTO operator_actions (tenant_id, principal, role, action, subject_kind, subject_id, request_id, reason,
                              outcome, detail, before, after)
SELECT r.tenant_id, %(principal)s, %(role)s, 'cancel', 'export', r.job_id::text, %(request_id)s, %(reason)s,
       CASE WHEN r.outcome IN ('CanceledWhileQueued', 'AlreadyCanceled') THEN 'done'
            WHEN r.outcome IN ('StopRequested', 'StopAlreadyRequested') THEN 'accepted'
            ELSE 'refused' END,
       r.outcome,
       jsonb_build_object('status', r.found_status, 'attempt_id', r.found_attempt_id),
       jsonb_build_object('cancellation_request_id', r.id, 'outcome', r.outcome)
FROM cancellation_requests r
WHERE r.tenant_id = %(tenant_id)s AND r.id = %(cancellation_request_id)s AND r.job_id = %(job_id)s
RETURNING id;

-- name: begin_transaction
-- Opens the short transaction that the next statements of a pipeline run in (the cancellation ledger).
BEGIN;

-- name: commit_transaction
-- Commits the short transaction a pipeline opened with begin_transaction.
COMMIT;

-- name: wake_resumed_queued
-- After a resume: a bounded batch of the Queued jobs in the resumed scope (every job, one tenant's, or one
-- destination's) that were last woken before the resume committed and whose whole scope is now enabled
-- gets a fresh wake-up, conditionally, as the sweeper's (woken_at moves past the resume, so the next
-- batch takes the next jobs). SKIP LOCKED: a row held now is held by a writer that leaves it with its own
-- wake-up or out of the queue. sweep_count is not touched: a resume is not a sweep.
WITH due AS (
    SELECT j.id FROM export_jobs j
    WHERE j.status = 'Queued' AND j.woken_at < %(resumed_at)s
      AND (%(tenant_id)s::uuid IS NULL OR j.tenant_id = %(tenant_id)s::uuid)
      AND (%(destination_id)s::uuid IS NULL OR j.destination_id = %(destination_id)s::uuid)
      -- every switch of its scope enabled (a missing row is paused), a per-row filter as in
      -- sweep_stale_queued, so the batch walks ix_export_jobs_woken in order.
      AND delivery_scope_open(j.tenant_id, j.destination_id)
      -- a job waiting after a give-back is woken by its own wake-up when its wait is over
      AND (j.available_at IS NULL OR j.available_at <= clock_timestamp())
    ORDER BY j.woken_at
    LIMIT %(batch)s
    FOR UPDATE OF j SKIP LOCKED),
woken AS (
    UPDATE export_jobs j
    SET woken_at = clock_timestamp()
    FROM due
    WHERE j.id = due.id AND j.status = 'Queued' AND j.woken_at < %(resumed_at)s
    RETURNING j.id),
woke AS (
    INSERT INTO outbox (message_id, kind, job_id, created_at, traceparent)
    SELECT gen_random_uuid(), 'ExportReady', id, clock_timestamp(), %(traceparent)s::text FROM woken)
SELECT id AS job_id FROM woken;

-- name: scope_activity
-- How many exports of a scope are Queued, Running and Delivering now (what a pause leaves behind it: the
-- Running ones are given back at cutoff 2, the Delivering ones were authorized before it and finish).
SELECT count(*) FILTER (WHERE status = 'Queued') AS queued,
       count(*) FILTER (WHERE status = 'Running') AS running,
       count(*) FILTER (WHERE status = 'Delivering') AS delivering
FROM export_jobs
WHERE status IN ('Queued', 'Running', 'Delivering')
  AND (%(tenant_id)s::uuid IS NULL OR tenant_id = %(tenant_id)s::uuid)
  AND (%(destination_id)s::uuid IS NULL OR destination_id = %(destination_id)s::uuid);

-- name: lock_job_for_cancel
-- The cancellation transaction's locking read: bounds this transaction's lock waits (SET LOCAL
-- lock_timeout: a wait past it is Busy), then locks this tenant's job row until commit. The row lock is
-- taken above the join, after set_config has run. It is its own statement, sent in the same pipeline as
-- cancel_and_record, so that statement's snapshot is taken after any wait for the lock: under READ
-- COMMITTED a single statement that waited would still read the other rows (an earlier request, the job's
-- own row for its UPDATE) as they were before the wait.
SELECT j.id
FROM (SELECT set_config('lock_timeout', %(timeout)s, true)) AS bounded, export_jobs j
WHERE j.id = %(job_id)s AND j.tenant_id = %(tenant_id)s
FOR UPDATE OF j;

-- name: cancel_and_record
-- The cancellation ledger's decision for one request in one statement (000 "Recording Cancellation
-- Requests", 001 "When Cancellation Loses"), run right after lock_job_for_cancel in the same transaction:
-- read the locked row, find an earlier submission of this request ID, classify from the locked row, take
-- the one guarded update the outcome needs, and record the request with what it found (and its batch, if
-- any). The request is recorded only together with the change its outcome names, so a change that matched
-- nothing records nothing. Answers with the job as found, the request recorded now or earlier, and whether
-- it was earlier; no row when this tenant has no such job (nothing is recorded).
-- The CASE is rules.cancellation.classify_cancellation; a test checks they agree for every status.
WITH found AS (   -- already locked by lock_job_for_cancel; FOR UPDATE again is free and keeps it so
    SELECT * FROM export_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s FOR UPDATE),
earlier AS (
    SELECT * FROM cancellation_requests WHERE tenant_id = %(tenant_id)s AND id = %(request_id)s),
decided AS (
    SELECT f.id, f.status, f.attempt_id, f.attempt_count, f.delivery_authorized_at,
           CASE
               WHEN f.status = 'Queued' THEN 'CanceledWhileQueued'
               WHEN f.status = 'Running' AND f.stop_request_id IS NULL THEN 'StopRequested'
               WHEN f.status = 'Running' THEN 'StopAlreadyRequested'
               WHEN f.status = 'Canceled' THEN 'AlreadyCanceled'
               WHEN f.status IN ('Rejected', 'Stopped', 'Failed') THEN 'AlreadyEnded'
               ELSE 'TooLate'   -- Delivering, Completed, OutcomeUnknown: delivery was authorized
           END AS outcome
    FROM found f
    WHERE NOT EXISTS (SELECT 1 FROM earlier)),
canceled AS (   -- Queued -> Canceled, recording the request that canceled it
    UPDATE export_jobs j
    SET status = 'Canceled', cancellation_request_id = %(request_id)s
    FROM decided d
    WHERE j.id = d.id AND j.tenant_id = %(tenant_id)s AND j.status = 'Queued'
      AND d.outcome = 'CanceledWhileQueued'
    RETURNING j.id),
stopped AS (   -- the first stop request on a Running job; cutoff 2 refuses while it is set
    UPDATE export_jobs j
    SET stop_request_id = %(request_id)s
    FROM decided d
    WHERE j.id = d.id AND j.tenant_id = %(tenant_id)s AND j.status = 'Running' AND j.stop_request_id IS NULL
      AND d.outcome = 'StopRequested'
    RETURNING j.id),
recorded AS (
    INSERT INTO cancellation_requests (tenant_id, id, job_id, requested_by, reason, outcome, found_status,
                                       found_attempt_id, found_attempt_count, found_delivery_authorized_at,
                                       batch_id)
    SELECT %(tenant_id)s, %(request_id)s, d.id, %(requested_by)s, %(reason)s, d.outcome, d.status,
           d.attempt_id, d.attempt_count, d.delivery_authorized_at, %(batch_id)s
    FROM decided d
    -- the two outcomes that change the job are true only if their change matched its row
    WHERE d.outcome NOT IN ('CanceledWhileQueued', 'StopRequested')
       OR EXISTS (SELECT 1 FROM canceled) OR EXISTS (SELECT 1 FROM stopped)
    RETURNING *)
SELECT f.*,
       coalesce((SELECT to_jsonb(r) FROM recorded r), (SELECT to_jsonb(e) FROM earlier e)) AS request,
       EXISTS (SELECT 1 FROM earlier) AS replayed
FROM found f;

-- name: find_cancellation_request
-- An earlier submission of this request ID in this tenant, if any.
SELECT * FROM cancellation_requests WHERE tenant_id = %(tenant_id)s AND id = %(request_id)s;

-- name: get_job
-- One export by ID (the worker's and recovery's view; job IDs are globally unique).
SELECT * FROM export_jobs WHERE id = %(job_id)s;

-- name: get_tenant_job
-- One export as a tenant sees it: another tenant's job is indistinguishable from a missing one.
SELECT * FROM export_jobs WHERE id = %(job_id)s AND tenant_id = %(tenant_id)s;

-- name: list_tenant_jobs
-- A tenant's exports, newest first.
SELECT * FROM export_jobs WHERE tenant_id = %(tenant_id)s ORDER BY created_at DESC, id LIMIT %(limit)s;

-- name: job_events
-- An export's attempt history, in the order it was recorded.
SELECT * FROM export_attempt_events WHERE job_id = %(job_id)s ORDER BY id;

-- name: tenant_job_events
-- An export's attempt history as its tenant may read it: nothing for another tenant's export, whatever
-- the caller checked before (the events carry no tenant; the job row decides).
SELECT e.* FROM export_attempt_events e
JOIN export_jobs j ON j.id = e.job_id
WHERE j.tenant_id = %(tenant_id)s AND e.job_id = %(job_id)s
ORDER BY e.id;

-- name: job_cancellation_requests
-- Every cancellation request recorded for an export, oldest first.
SELECT * FROM cancellation_requests WHERE tenant_id = %(tenant_id)s AND job_id = %(job_id)s
ORDER BY recorded_at, id;

-- name: take_unpublished
-- The dispatcher's batch, leased in one short statement: unpublished wake-ups, oldest first, that no other
-- dispatcher holds a current lease on, each leased until now + lease_seconds. It commits before any
-- workflow starts, so no lock is held across a start; SKIP LOCKED passes over rows another dispatcher is
-- taking at this moment, and the update repeats the conditions. A lease that passed with the row still
-- unpublished (its dispatcher died or its start failed) lets any dispatcher take it again, with the same
-- message ID. The lease is also the token release_unpublished must match. A wake-up that waits (a
-- give-back's available_at) is taken only once it is due.
WITH due AS (
    SELECT message_id FROM outbox
    WHERE published_at IS NULL AND (publishing_until IS NULL OR publishing_until < clock_timestamp())
      AND (available_at IS NULL OR available_at <= clock_timestamp())
    ORDER BY created_at
    LIMIT %(batch)s
    FOR UPDATE SKIP LOCKED),
lease AS (   -- volatile, so evaluated once: one lease value for the whole batch
    SELECT clock_timestamp() AS taken_at, clock_timestamp() + make_interval(secs => %(lease_seconds)s) AS until)
UPDATE outbox o
SET publishing_until = lease.until
FROM due, lease
WHERE o.message_id = due.message_id AND o.published_at IS NULL
  AND (o.publishing_until IS NULL OR o.publishing_until < lease.taken_at)
RETURNING o.message_id, o.kind, o.job_id, o.created_at, o.traceparent, o.publishing_until,
          extract(epoch FROM lease.taken_at - greatest(o.created_at, o.available_at))::float8 AS waited_seconds;

-- name: mark_published
-- Marks wake-ups published once their workflows started; the dispatcher may change nothing else. Not
-- conditional on the lease: a start that succeeded is a publish, whoever holds the row's lease now.
UPDATE outbox SET published_at = clock_timestamp()
WHERE message_id = ANY(%(message_ids)s::uuid[]) AND published_at IS NULL
RETURNING message_id;

-- name: release_unpublished
-- Gives leased rows back at once after their starts failed, so the next pass retries them with the same
-- message IDs; only while the row still carries this lease (a later dispatcher's lease is left alone).
UPDATE outbox SET publishing_until = NULL
WHERE message_id = ANY(%(message_ids)s::uuid[]) AND published_at IS NULL
  AND publishing_until = %(publishing_until)s
RETURNING message_id;

-- name: live_attempts
-- Of the given attempts, those that may still use a local export file: Running or Delivering with that
-- attempt. An attempt that is not live never becomes live again (a requeue clears it; a claim mints a new one).
SELECT attempt_id FROM export_jobs
WHERE attempt_id = ANY(%(attempt_ids)s::uuid[]) AND status IN ('Running', 'Delivering');

-- -- a partner's session slots (issue #25.3, migration 0029) ---------------------------------------------

-- name: take_session_slot
-- A session with a destination's partner is opened only under one of its slots, so the partner never sees
-- more sessions than its limit (max_sessions, read as it is now: not a delivery term). An attempt takes one
-- after its build and before it connects, only while it still holds its Running job with a current lease
-- (job_id given); its slot is then held for as long as the attempt holds that job Running or Delivering, and
-- its terminal write, a give-back or recovery's takeover ends it by changing the row (session_slot_held).
-- Any other holder (job_id null: recovery, a cleanup, a connection test) holds it for hold_seconds or until
-- release_session_slot. A holder that already holds a slot of the destination finds it again (a retried
-- take); else it takes a free one; only when none is free does it take over the slot of ``adopt`` (recovery,
-- for the expired attempt it settles: an attempt whose lease lapsed may still be alive and using its session,
-- so its slot is the last resort, not the first). A slot that looks free is locked FOR UPDATE: a concurrent
-- take of the same slot waits, then re-checks it on its newest version and moves on to the next free one, so
-- two takers never share a slot. Answers the limit (null: none), the slot taken (null: none free, or the
-- attempt no longer holds its job), whether it was adopted and, when none was taken, how many were held.
WITH limits AS (
    SELECT d.max_sessions FROM destinations d
    WHERE d.tenant_id = %(tenant_id)s AND d.id = %(destination_id)s),
eligible AS (
    -- an attempt takes a slot only while it holds its job Running with a current lease
    SELECT 1 AS ok
    WHERE %(job_id)s::uuid IS NULL
       OR EXISTS (SELECT 1 FROM export_jobs j
                  WHERE j.id = %(job_id)s::uuid AND j.attempt_id = %(holder)s AND j.status = 'Running'
                    AND j.lease_expires_at > clock_timestamp())),
own AS (
    SELECT s.slot FROM destination_session_slots s
    WHERE s.destination_id = %(destination_id)s AND s.holder = %(holder)s AND EXISTS (SELECT 1 FROM eligible)
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s),
free AS (
    SELECT s.slot FROM destination_session_slots s, limits l
    WHERE s.destination_id = %(destination_id)s AND s.slot <= l.max_sessions
      AND NOT EXISTS (SELECT 1 FROM own) AND EXISTS (SELECT 1 FROM eligible)
      AND NOT session_slot_held(s)
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s),
adopted AS (
    SELECT s.slot FROM destination_session_slots s
    WHERE s.destination_id = %(destination_id)s AND s.holder = %(adopt)s::uuid
      AND NOT EXISTS (SELECT 1 FROM own) AND NOT EXISTS (SELECT 1 FROM free) AND EXISTS (SELECT 1 FROM eligible)
    ORDER BY s.slot
    LIMIT 1
    FOR UPDATE OF s),
chosen AS (
    SELECT slot, false AS adopted FROM own
    UNION ALL
    SELECT slot, false FROM free
    UNION ALL
    SELECT slot, true FROM adopted),
taken AS (
    UPDATE destination_session_slots s
    SET holder = %(holder)s, job_id = %(job_id)s::uuid, purpose = %(purpose)s, taken_at = clock_timestamp(),
        expires_at = CASE WHEN %(job_id)s::uuid IS NULL
                          THEN clock_timestamp() + make_interval(secs => %(hold_seconds)s::float8) END
    FROM chosen c
    WHERE s.destination_id = %(destination_id)s AND s.slot = c.slot
    RETURNING s.slot, c.adopted)
SELECT EXISTS (SELECT 1 FROM limits) AS destination_found,
       (SELECT max_sessions FROM limits) AS max_sessions,
       t.slot,
       coalesce(t.adopted, false) AS adopted,
       EXISTS (SELECT 1 FROM eligible) AS eligible,
       -- counted only when none was taken (what a waiting attempt shows); a taker needs no count. The count
       -- reads the statement's snapshot, which may predate a concurrent take that the locks then saw; an
       -- eligible taker that found no slot free on their newest versions saw every one up to the limit held.
       CASE WHEN t.slot IS NULL AND (SELECT max_sessions FROM limits) IS NOT NULL
            THEN greatest((SELECT count(*) FROM destination_session_slots s
                           WHERE s.destination_id = %(destination_id)s AND session_slot_held(s))::int,
                          CASE WHEN EXISTS (SELECT 1 FROM eligible) THEN (SELECT max_sessions FROM limits) END)
            ELSE 0 END AS in_use
FROM (SELECT (SELECT slot FROM taken) AS slot, (SELECT adopted FROM taken) AS adopted) AS t;

-- name: release_session_slot
-- A holder that is not an attempt (recovery, a cleanup, a connection test) releases its slot once its
-- session is closed; ``return_to`` gives it back to the attempt it was adopted from instead (recovery found
-- that attempt alive after all: its renewal won). Only this holder's slot; a slot already taken by someone
-- else is not touched. An attempt never calls this: its slot ends with its hold of the job.
UPDATE destination_session_slots s
SET holder = %(return_to)s::uuid,
    job_id = CASE WHEN %(return_to)s::uuid IS NOT NULL THEN %(return_job_id)s::uuid END,
    purpose = CASE WHEN %(return_to)s::uuid IS NOT NULL THEN 'attempt' END,
    taken_at = CASE WHEN %(return_to)s::uuid IS NOT NULL THEN s.taken_at END,
    expires_at = NULL
WHERE s.holder = %(holder)s
RETURNING s.slot;

-- name: release_taken_over_slot
-- An attempt that found its job taken over (its renewal changed no row) gives back the slot recovery left held
-- for it (0041), once its session is closed: only its own, only while it is still held for it after the
-- takeover (the job no longer its), so a slot someone else has taken since is not touched.
UPDATE destination_session_slots s
SET holder = NULL, job_id = NULL, purpose = NULL, taken_at = NULL, expires_at = NULL
WHERE s.holder = %(holder)s AND s.purpose = 'attempt' AND s.expires_at IS NOT NULL
  AND NOT EXISTS (SELECT 1 FROM export_jobs j
                  WHERE j.id = s.job_id AND j.attempt_id = s.holder AND j.status IN ('Running', 'Delivering'))
RETURNING s.slot;

-- name: pause_destination_for_partner
-- The worker's one switch change (0029): pause one destination whose server presented a host key nobody
-- pinned, or refused our login, with that reason and the worker as who; never a resume, never another
-- scope, and an operator's pause already in place keeps its reason. Only while the destination's delivery
-- terms are still those of the version the worker checked (an admin's edit since, a key pinned, is not
-- undone by a pause). Answers whether it was enabled, whether this call paused it, and whether the
-- destination changed since that version.
SELECT was_enabled, paused, destination_changed
FROM pause_destination_for_partner(%(tenant_id)s, %(destination_id)s, %(version)s, %(reason)s, %(changed_by)s);
