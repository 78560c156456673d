-- What observability needs from the database (issue 11): indexes that keep the scrape-time gauges
-- (observability/gauges.sql) bounded by the live work rather than the history, the read grants the
-- collector and the readiness check need, and the outbox's trace context.

-- Jobs in a non-terminal status, by status and lease expiry: counts per status and expired leases per
-- status (with the oldest) read this index alone. Terminal rows never enter it, so its size is the work
-- in flight, whatever the history holds. Status and lease_expires_at are already indexed columns, so no
-- update that was HOT becomes non-HOT.
CREATE INDEX ix_export_jobs_live_status ON export_jobs (status, lease_expires_at)
    WHERE status IN ('Queued', 'Running', 'Delivering', 'OutcomeUnknown');

-- The oldest Queued job by age, and the highest sweep_count among Queued jobs: one index probe each.
CREATE INDEX ix_export_jobs_queued_created ON export_jobs (created_at) WHERE status = 'Queued';
CREATE INDEX ix_export_jobs_queued_sweeps ON export_jobs (sweep_count) WHERE status = 'Queued';

-- OutcomeUnknown jobs in the order their delivery began, with what finds their outcome event.
CREATE INDEX ix_export_jobs_outcome_unknown ON export_jobs (delivery_authorized_at) INCLUDE (id, attempt_id)
    WHERE status = 'OutcomeUnknown';

-- The collector runs as exports_worker: it may read when wake-ups were created and published, nothing
-- else of the outbox.
GRANT SELECT (created_at, published_at) ON outbox TO exports_worker;

-- Readiness (/readyz) compares the applied migrations with the ones this build ships, as any role.
GRANT SELECT ON schema_migrations TO exports_api, exports_worker, exports_dispatcher, exports_reconciler;

-- The W3C trace context of the request that wrote a wake-up, so the dispatcher's workflow start joins the
-- trace of the API call (or recovery run) that caused it. IDs and flags only: the CHECK keeps anything
-- else out.
ALTER TABLE outbox ADD COLUMN traceparent text
    CONSTRAINT ck_outbox_traceparent CHECK (traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$');
