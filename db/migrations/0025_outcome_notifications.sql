-- Outcome notifications (issue 26, item 1): an event per terminal outcome, per lost cancellation and per
-- skipped recurring firing, written in the transaction of what it reports; webhook endpoints a tenant's
-- admins register; one delivery row per (event, endpoint) that the worker's webhook dispatcher retries.
--
-- The events are written by triggers, not by the statements of queries.sql: every edge into a terminal
-- status (or OutcomeUnknown) then reports itself, whichever statement, role or repair took it, and no
-- statement of the row protocol changes. The trigger functions are SECURITY DEFINER with a fixed
-- search_path: no application role holds INSERT on notification_events, so nobody writes an event but
-- the transition it reports (and the documented recurring function below).
--
-- Cost on the hot path: one AFTER ROW trigger per terminal write (the WHEN clause is false for the claim,
-- cutoff 2, the fences and renewals), one insert of a small JSON row with three index entries, and for a
-- write out of Delivering one probe of ix_cancellation_requests_job. No NOTIFY: NOTIFY serializes
-- committing transactions on a cluster-wide queue lock; the dispatcher polls instead.

CREATE TABLE notification_events (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),   -- the webhook-id: the receivers' idempotency key
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    kind text NOT NULL CHECK (kind IN (
        'export.completed', 'export.failed', 'export.stopped', 'export.canceled', 'export.rejected',
        'export.outcome_unknown', 'export.cancellation_lost', 'recurring_export.firing_skipped')),
    job_id uuid,            -- the export it reports (none for a skipped recurring firing)
    -- what makes it one event: the export (with the kind, its outcome), the cancellation request that lost,
    -- the recurring export and the firing skipped. The unique key makes "one event per (export, outcome)"
    -- a property of the table, whatever fires twice.
    subject_key text NOT NULL CHECK (length(subject_key) BETWEEN 1 AND 200),
    -- IDs, names, counts and hashes only: never a contact's data, never a free-text reason a person typed
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    fanned_out_at timestamptz,   -- when the dispatcher made its deliveries (one per subscribed endpoint)
    CONSTRAINT uq_notification_events_subject UNIQUE (tenant_id, kind, subject_key)
);

CREATE INDEX ix_notification_events_unfanned ON notification_events (created_at) WHERE fanned_out_at IS NULL;

CREATE TABLE webhook_endpoints (
    tenant_id uuid NOT NULL REFERENCES tenants (id),
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    url text NOT NULL CHECK (length(url) BETWEEN 8 AND 2000),
    -- Standard Webhooks' form: whsec_ and the base64 of 24 to 64 random bytes. HMAC needs it in clear to
    -- sign, so it is stored as given; exports_api may write it and never read it (column grants below), so
    -- no route can return it after creation; only exports_dispatcher reads it, to sign.
    secret text NOT NULL CHECK (secret ~ '^whsec_[A-Za-z0-9+/]{32,88}={0,2}$'),
    events text[] NOT NULL CHECK (cardinality(events) BETWEEN 1 AND 8 AND events <@ ARRAY[
        'export.completed', 'export.failed', 'export.stopped', 'export.canceled', 'export.rejected',
        'export.outcome_unknown', 'export.cancellation_lost', 'recurring_export.firing_skipped']::text[]),
    description text CHECK (description IS NULL OR length(description) BETWEEN 1 AND 200),
    enabled boolean NOT NULL DEFAULT true,
    version integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_by text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by text,
    updated_at timestamptz,
    CONSTRAINT pk_webhook_endpoints PRIMARY KEY (id),
    CONSTRAINT uq_webhook_endpoints_tenant UNIQUE (tenant_id, id)
);

CREATE TABLE webhook_deliveries (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL DEFAULT gen_random_uuid(),
    event_id uuid NOT NULL REFERENCES notification_events (id),
    endpoint_id uuid NOT NULL,
    state text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL,
    give_up_at timestamptz NOT NULL,   -- the retry window's end: a failure after it is final ('failed')
    leased_until timestamptz,          -- an attempt in flight (the dispatcher holds no lock across the POST)
    last_attempt_at timestamptz,
    last_status_code integer,
    last_error text CHECK (last_error IS NULL OR length(last_error) <= 200),
    delivered_at timestamptz,
    redeliveries integer NOT NULL DEFAULT 0 CHECK (redeliveries >= 0),
    redelivered_by text,
    redelivered_at timestamptz,
    created_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_webhook_deliveries PRIMARY KEY (id),
    CONSTRAINT uq_webhook_deliveries_event_endpoint UNIQUE (event_id, endpoint_id),
    -- an endpoint deleted takes its deliveries with it (the events stay)
    CONSTRAINT fk_webhook_deliveries_endpoint FOREIGN KEY (tenant_id, endpoint_id)
        REFERENCES webhook_endpoints (tenant_id, id) ON DELETE CASCADE,
    CONSTRAINT ck_webhook_deliveries_delivered CHECK ((state = 'delivered') <= (delivered_at IS NOT NULL))
);

CREATE INDEX ix_webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE state = 'pending';
CREATE INDEX ix_webhook_deliveries_endpoint ON webhook_deliveries (endpoint_id, created_at DESC, id DESC);

-- -- the events ------------------------------------------------------------------------------------------

-- A timestamp as the events spell it, whatever the session's TimeZone: UTC, ISO 8601, microseconds.
CREATE FUNCTION notification_time(t timestamptz) RETURNS text LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

-- What a lost cancellation reports (001 "When Cancellation Loses"): the request, when delivery had been
-- authorized, and how the delivery it lost to ended, with the file's name and SHA-256 when it was built.
-- Scalars, not the two row types: a function over a table's row type makes pg_dump move the table ahead of
-- every function, and db/schema.sql would be rewritten from top to bottom.
CREATE FUNCTION lost_cancellation_payload(
    request_id uuid, requested_by text, requested_at timestamptz, authorized_at timestamptz, job_id uuid,
    outcome text, failure_reason text, file_name text, file_bytes bigint, file_rows bigint, file_sha256 bytea,
    outcome_at timestamptz)
RETURNS jsonb LANGUAGE sql STABLE AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'cancellation_request_id', request_id,
        'export_id', job_id,
        'requested_by', requested_by,
        'requested_at', notification_time(requested_at),
        'delivery_authorized_at', notification_time(authorized_at),
        'outcome', outcome,
        'outcome_at', notification_time(outcome_at),
        'failure_reason', failure_reason,
        'file', CASE WHEN file_sha256 IS NOT NULL THEN jsonb_build_object(
            'name', file_name, 'bytes', file_bytes, 'rows', file_rows, 'sha256', encode(file_sha256, 'hex')) END,
        'message', 'Your cancel of export ' || job_id || ' lost: delivery had been authorized at '
            || coalesce(notification_time(authorized_at), 'an earlier time') || '; '
            || CASE outcome
                   WHEN 'Completed' THEN 'delivered at ' || notification_time(outcome_at)
                       || coalesce(', sha256 ' || encode(file_sha256, 'hex'), '')
                   WHEN 'Failed' THEN 'it then failed (' || failure_reason || ') at ' || notification_time(outcome_at)
                   ELSE 'its outcome is unknown since ' || notification_time(outcome_at)
                       || ' (reconciliation needed)'
               END || '.'))
$$;

-- One event per terminal outcome (and OutcomeUnknown), in the transaction of the write that took the edge;
-- and, for a write out of Delivering, one per cancellation that lost to that delivery (recorded TooLate
-- while it was Delivering, for this attempt). ON CONFLICT: an export reaches each outcome at most once
-- (a correction is once per attempt), so a conflict would be a second report of the same outcome.
CREATE FUNCTION notify_export_outcome() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    at timestamptz := clock_timestamp();
BEGIN
    INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload, created_at)
    VALUES (NEW.tenant_id,
            CASE NEW.status
                WHEN 'Completed' THEN 'export.completed' WHEN 'Failed' THEN 'export.failed'
                WHEN 'Stopped' THEN 'export.stopped' WHEN 'Canceled' THEN 'export.canceled'
                WHEN 'Rejected' THEN 'export.rejected' ELSE 'export.outcome_unknown' END,
            NEW.id, NEW.id::text,
            jsonb_strip_nulls(jsonb_build_object(
                'export_id', NEW.id,
                'status', NEW.status,
                'previous_status', OLD.status,
                'outcome_at', notification_time(at),
                'destination_id', NEW.destination_id,
                'destination_name', (SELECT d.name FROM destinations d WHERE d.id = NEW.destination_id),
                'list_name', NEW.list_name,
                'created_by', NEW.created_by,
                'attempt_id', NEW.attempt_id,
                'replaces_export_id', NEW.replaces_job_id,
                'failure_reason', NEW.failure_reason,
                'rejection_code', NEW.rejection_code,
                'rejection_reason', NEW.rejection_reason,   -- the policy's sentence: names and dates only
                'stop_request_id', CASE WHEN NEW.status = 'Stopped' THEN NEW.stop_request_id END,
                'cancellation_request_id', NEW.cancellation_request_id,
                'delivery_authorized_at', notification_time(NEW.delivery_authorized_at),
                'reconciliation_needed', CASE WHEN NEW.status = 'OutcomeUnknown' THEN true END,
                'file', CASE WHEN NEW.expected_file_sha256 IS NOT NULL
                                  AND NEW.status IN ('Completed', 'Failed', 'OutcomeUnknown')
                             THEN jsonb_build_object(
                                 'name', NEW.expected_file_name, 'bytes', NEW.expected_file_bytes,
                                 'rows', NEW.expected_file_rows, 'sha256', encode(NEW.expected_file_sha256, 'hex'))
                        END)),
            at)
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;

    IF OLD.status = 'Delivering' THEN
        INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload, created_at)
        SELECT r.tenant_id, 'export.cancellation_lost', NEW.id, r.id::text,
               lost_cancellation_payload(
                   r.id, r.requested_by, r.recorded_at, r.found_delivery_authorized_at, NEW.id, NEW.status,
                   NEW.failure_reason, NEW.expected_file_name, NEW.expected_file_bytes, NEW.expected_file_rows,
                   NEW.expected_file_sha256, at), at
        FROM cancellation_requests r
        WHERE r.job_id = NEW.id AND r.tenant_id = NEW.tenant_id AND r.outcome = 'TooLate'
          AND r.found_status = 'Delivering' AND r.found_attempt_id IS NOT DISTINCT FROM OLD.attempt_id
        ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tr_export_jobs_notify_outcome
    AFTER UPDATE OF status ON export_jobs
    FOR EACH ROW
    WHEN (NEW.status IS DISTINCT FROM OLD.status
          AND NEW.status IN ('Completed', 'Failed', 'Stopped', 'Canceled', 'Rejected', 'OutcomeUnknown'))
    EXECUTE FUNCTION notify_export_outcome();

-- A cancellation recorded TooLate against an export whose outcome is already known (Completed, Failed,
-- OutcomeUnknown) lost to a delivery that has ended: its event is written with the request. One recorded
-- while Delivering waits for that delivery's end (notify_export_outcome). The cancellation row locks the
-- job row first (lock_job_for_cancel), so the two orders serialize and each request gets its one event.
CREATE FUNCTION notify_lost_cancellation() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    j record;
    ended_at timestamptz;
BEGIN
    SELECT status, failure_reason, expected_file_name, expected_file_bytes, expected_file_rows, expected_file_sha256
    INTO j FROM export_jobs WHERE id = NEW.job_id AND tenant_id = NEW.tenant_id;
    SELECT e.created_at INTO ended_at FROM notification_events e
    WHERE e.tenant_id = NEW.tenant_id AND e.subject_key = NEW.job_id::text
      AND e.kind IN ('export.completed', 'export.failed', 'export.outcome_unknown')
    ORDER BY e.created_at
    LIMIT 1;
    INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload)
    VALUES (NEW.tenant_id, 'export.cancellation_lost', NEW.job_id, NEW.id::text,
            lost_cancellation_payload(
                NEW.id, NEW.requested_by, NEW.recorded_at, NEW.found_delivery_authorized_at, NEW.job_id, j.status,
                j.failure_reason, j.expected_file_name, j.expected_file_bytes, j.expected_file_rows,
                j.expected_file_sha256, coalesce(ended_at, NEW.recorded_at)))
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;
    RETURN NULL;
END $$;

CREATE TRIGGER tr_cancellation_requests_notify_lost
    AFTER INSERT ON cancellation_requests
    FOR EACH ROW
    WHEN (NEW.outcome = 'TooLate' AND NEW.found_status IN ('Completed', 'Failed', 'OutcomeUnknown'))
    EXECUTE FUNCTION notify_lost_cancellation();

-- A skipped recurring firing (issue 26 item 1; recurring exports are built on another branch). The
-- recurring code calls this in the transaction that decides to skip a firing:
--     SELECT notify_recurring_firing_skipped(%(tenant_id)s, %(recurring_export_id)s, %(recurring_name)s,
--                                            %(scheduled_for)s, %(reason)s);
-- One event per (recurring export, scheduled time): it answers the new event's ID, or NULL when that
-- firing's skip was already recorded. The reason is a short code (e.g. previous_still_running, paused),
-- never free text a person typed.
CREATE FUNCTION notify_recurring_firing_skipped(
    p_tenant_id uuid, p_recurring_export_id uuid, p_recurring_name text, p_scheduled_for timestamptz,
    p_reason text)
RETURNS uuid LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, public AS $$
DECLARE
    new_id uuid;
BEGIN
    IF p_reason IS NULL OR p_reason !~ '^[a-z][a-z0-9_]{0,63}$' THEN
        RAISE EXCEPTION 'a skipped firing''s reason is a short code (lower case, digits, _), not %', p_reason
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_notification_events_skip_reason';
    END IF;
    INSERT INTO notification_events (tenant_id, kind, subject_key, payload)
    VALUES (p_tenant_id, 'recurring_export.firing_skipped',
            p_recurring_export_id::text || '@' || notification_time(p_scheduled_for),
            jsonb_strip_nulls(jsonb_build_object(
                'recurring_export_id', p_recurring_export_id,
                'recurring_export_name', p_recurring_name,
                'scheduled_for', notification_time(p_scheduled_for),
                'reason', p_reason)))
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING
    RETURNING id INTO new_id;
    RETURN new_id;
END $$;

REVOKE ALL ON FUNCTION notify_export_outcome() FROM PUBLIC;
REVOKE ALL ON FUNCTION notify_lost_cancellation() FROM PUBLIC;
REVOKE ALL ON FUNCTION lost_cancellation_payload(uuid, text, timestamptz, timestamptz, uuid, text, text, text, bigint,
    bigint, bytea, timestamptz) FROM PUBLIC;
REVOKE ALL ON FUNCTION notify_recurring_firing_skipped(uuid, uuid, text, timestamptz, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION notify_recurring_firing_skipped(uuid, uuid, text, timestamptz, text)
    TO exports_worker, exports_api;

-- -- grants ------------------------------------------------------------------------------------------------

-- exports_api: a tenant's admins manage its endpoints and redeliver by hand; everyone reads delivery status.
-- The secret is written, never read back (no SELECT on it).
GRANT SELECT (tenant_id, id, url, events, description, enabled, version, created_by, created_at, updated_by,
              updated_at) ON webhook_endpoints TO exports_api;
GRANT INSERT (tenant_id, id, url, secret, events, description, enabled, created_by) ON webhook_endpoints
    TO exports_api;
GRANT UPDATE (url, secret, events, description, enabled, version, updated_by, updated_at) ON webhook_endpoints
    TO exports_api;
GRANT DELETE ON webhook_endpoints TO exports_api;
GRANT SELECT ON webhook_deliveries TO exports_api;
GRANT UPDATE (state, next_attempt_at, give_up_at, redeliveries, redelivered_by, redelivered_at)
    ON webhook_deliveries TO exports_api;
GRANT SELECT ON notification_events TO exports_api;

-- exports_dispatcher: fans events out to endpoints, leases due deliveries, records each attempt.
GRANT SELECT ON notification_events TO exports_dispatcher;
GRANT UPDATE (fanned_out_at) ON notification_events TO exports_dispatcher;
GRANT SELECT ON webhook_endpoints TO exports_dispatcher;
GRANT SELECT, INSERT ON webhook_deliveries TO exports_dispatcher;
GRANT UPDATE (state, attempts, next_attempt_at, leased_until, last_attempt_at, last_status_code, last_error,
              delivered_at) ON webhook_deliveries TO exports_dispatcher;
