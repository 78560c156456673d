-- Issue 26 item 4: the reconciler's console. Its queue shows a tenant's OutcomeUnknown exports oldest first, by
-- when each was recorded OutcomeUnknown, and a reconciler may ask for today's listing of an export's final name.
--
-- 1. When an export became OutcomeUnknown, on the row. The events say it too (the attempt's Finished or
--    ResolvedByRecovery), but a queue ordered by an event's time reads every unknown export's events before
--    it can show the first page. The column is set by the database, in the statement that makes the change
--    (finish_delivery, resolve_expired_delivery: every writer, none of them changed), on the database clock;
--    no role may write it. An export enters OutcomeUnknown at most once (the diagram has no edge back to it).
ALTER TABLE export_jobs ADD COLUMN outcome_unknown_at timestamptz;

CREATE FUNCTION export_jobs_mark_outcome_unknown() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.outcome_unknown_at := clock_timestamp();
    RETURN NEW;
END $$;

REVOKE ALL ON FUNCTION export_jobs_mark_outcome_unknown() FROM PUBLIC;

CREATE TRIGGER tr_export_jobs_outcome_unknown_at
    BEFORE UPDATE OF status ON export_jobs
    FOR EACH ROW
    WHEN (NEW.status = 'OutcomeUnknown' AND OLD.status IS DISTINCT FROM 'OutcomeUnknown')
    EXECUTE FUNCTION export_jobs_mark_outcome_unknown();

-- The exports already OutcomeUnknown: the time of the attempt's write that recorded it (the worker's
-- Finished or recovery's ResolvedByRecovery), else when its delivery was authorized.
UPDATE export_jobs j
SET outcome_unknown_at = coalesce(
    (SELECT max(e.recorded_at) FROM export_attempt_events e
     WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id AND e.kind IN ('Finished', 'ResolvedByRecovery')),
    j.delivery_authorized_at, j.created_at)
WHERE j.status = 'OutcomeUnknown';

-- Every OutcomeUnknown knows since when, even one loaded with the triggers off (a benchmark's history must
-- set it): the queue's order is never a guess.
ALTER TABLE export_jobs ADD CONSTRAINT ck_export_jobs_outcome_unknown_at
    CHECK (status <> 'OutcomeUnknown' OR outcome_unknown_at IS NOT NULL);

-- The queue, per tenant, oldest first, keyset on (outcome_unknown_at, id): a page reads as many index entries
-- as it shows, and its count reads at most its cap of them, whatever the tenant's history holds.
-- ix_export_jobs_outcome_unknown (0004) has no tenant: a tenant's page would walk every tenant's unknowns.
CREATE INDEX ix_export_jobs_tenant_outcome_unknown
    ON export_jobs (tenant_id, outcome_unknown_at, id) WHERE status = 'OutcomeUnknown';

-- 2. Today's listing of the final name, asked by a reconciler. The API process holds no partner credentials
--    (a destination's key is a reference resolved on the worker hosts), so it records the request and
--    recovery's next run, on a worker, lists the name (unless the partner's deliveries are paused) and appends
--    what it saw as the attempt's DeliveryEvidence, observed by 'reconciler-request:<request id>': that event
--    is the answer, so the request itself never changes. Append-only, as every history here.
CREATE TABLE listing_requests (
    id uuid PRIMARY KEY DEFAULT gen_random_uuid(),
    tenant_id uuid NOT NULL,
    job_id uuid NOT NULL,
    attempt_id uuid NOT NULL,
    requested_by text NOT NULL CHECK (length(requested_by) BETWEEN 1 AND 200),
    requested_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT fk_listing_requests_job FOREIGN KEY (tenant_id, job_id) REFERENCES export_jobs (tenant_id, id)
);

CREATE INDEX ix_listing_requests_job ON listing_requests (job_id, requested_at);
-- recovery's nomination: the recent requests, oldest first
CREATE INDEX ix_listing_requests_requested ON listing_requests (requested_at);

CREATE FUNCTION listing_requests_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'listing requests are history: append-only'
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER tr_listing_requests_append_only BEFORE UPDATE OR DELETE ON listing_requests
    FOR EACH ROW EXECUTE FUNCTION listing_requests_append_only();

GRANT SELECT, INSERT ON listing_requests TO exports_api;
GRANT SELECT ON listing_requests TO exports_recovery;
