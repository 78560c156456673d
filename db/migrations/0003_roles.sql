-- Least-privilege roles (000 "The Tables"): the history tables and deliveries are INSERT+SELECT only for
-- everyone, the outbox is insert-only except UPDATE (published_at) for the dispatcher, and corrections
-- belong to the reconciler alone (enforced with the trigger in 0002). Roles are cluster-wide, so each is
-- created only when missing; processes log in as a member and SET ROLE to the one they need.

DO $$
DECLARE r text;
BEGIN
    FOREACH r IN ARRAY ARRAY['exports_api', 'exports_worker', 'exports_dispatcher', 'exports_reconciler'] LOOP
        IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = r) THEN
            EXECUTE format('CREATE ROLE %I NOLOGIN', r);
        END IF;
    END LOOP;
END $$;

-- Reference data every role may read.
GRANT SELECT ON tenants, destinations, export_status_edges
    TO exports_api, exports_worker, exports_reconciler;

-- The API: creates, edits queued terms, records cancellation requests, reconciles an OutcomeUnknown.
GRANT SELECT ON export_jobs, deliveries, export_attempt_events, cancellation_requests, idempotency_keys,
    api_tokens, contacts TO exports_api;
GRANT INSERT ON export_jobs, deliveries, outbox, cancellation_requests, idempotency_keys TO exports_api;
GRANT INSERT ON export_attempt_events TO exports_api;
GRANT UPDATE (status, cancellation_request_id, stop_request_id, destination_id, list_name, version, woken_at,
    failure_reason) ON export_jobs TO exports_api;

-- The worker: claims, authorizes, finishes, renews, appends evidence, recovers and sweeps.
GRANT SELECT ON export_jobs, deliveries, export_attempt_events, cancellation_requests, contacts
    TO exports_worker;
GRANT INSERT ON export_attempt_events, outbox TO exports_worker;
GRANT UPDATE (status, attempt_id, attempt_count, claimed_by, lease_expires_at, expected_file_name,
    expected_file_bytes, expected_file_sha256, expected_file_rows, delivery_authorized_at, failure_reason, woken_at, sweep_count,
    rejection_reason, workflow_id) ON export_jobs TO exports_worker;

-- The dispatcher: reads unpublished wake-ups and marks them published; nothing else.
GRANT SELECT ON outbox TO exports_dispatcher;
GRANT UPDATE (published_at) ON outbox TO exports_dispatcher;

-- The reconciler: corrections of a recorded outcome, once, with who and why.
GRANT SELECT ON export_jobs, deliveries, export_attempt_events, cancellation_requests TO exports_reconciler;
GRANT INSERT ON export_attempt_events TO exports_reconciler;
GRANT UPDATE (status, failure_reason) ON export_jobs TO exports_reconciler;
