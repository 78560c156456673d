-- Bulk cancel confirms one set and cancels that set (issue 23, point 7).
--
-- The console's "Cancel 3 exports" used to submit only the filter, so the batch covered whatever was live
-- when it was recorded, not the 3 the operator had confirmed. A preview now keeps the exact set it counted,
-- under a random token bound to its tenant and its principal; a batch submitted with that token covers
-- exactly that set (whatever each export's status is by then: the ledger gives one that ended meanwhile its
-- honest outcome) and nothing else. An export that became live after the preview is not touched.

CREATE TABLE cancellation_previews (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    id              uuid NOT NULL DEFAULT gen_random_uuid(),  -- the preview token: random, looked up per tenant
    previewed_by    text NOT NULL,                            -- only this principal may confirm it
    destination_id  uuid NOT NULL,
    list_name       text CHECK (list_name IS NULL OR length(list_name) BETWEEN 1 AND 200),  -- NULL: every list
    job_ids         uuid[] NOT NULL CHECK (cardinality(job_ids) > 0),  -- the live exports it counted
    previewed_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at      timestamptz NOT NULL,
    CONSTRAINT pk_cancellation_previews PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_cancellation_previews_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT ck_cancellation_previews_expiry CHECK (expires_at > previewed_at)
);
CREATE INDEX ix_cancellation_previews_expires ON cancellation_previews (expires_at);

-- The preview a batch confirmed (NULL: a batch of the exports live when it was recorded, as the command line
-- submits without a preview). No foreign key: previews expire and are deleted, and the batch keeps its set
-- in cancellation_batch_jobs.
ALTER TABLE cancellation_batches ADD COLUMN preview_id uuid;

-- The stop signals a bulk cancel delivered to Temporal, one per StopRequested request. A lane that lost its
-- connection left committed stop requests nobody signalled, and a replay of the batch decided only the
-- exports without a request; now every submission of a batch signals each of its StopRequested requests
-- that has no row here (and whose attempt is still running under it), and records the ones Temporal took.
CREATE TABLE cancellation_stop_signals (
    tenant_id     uuid NOT NULL,
    request_id    uuid NOT NULL,
    workflow_id   text NOT NULL,
    signalled_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_cancellation_stop_signals PRIMARY KEY (tenant_id, request_id),
    CONSTRAINT fk_cancellation_stop_signals_request FOREIGN KEY (tenant_id, request_id)
        REFERENCES cancellation_requests (tenant_id, id)
);

-- Least privilege: only the API previews and signals. A preview is not history (a credential-like token
-- that expires), so the API deletes expired ones on the way, as it does console sessions; a delivered
-- signal is history: insert and read only, for the API alone.
GRANT SELECT, INSERT, DELETE ON cancellation_previews TO exports_api;
GRANT SELECT, INSERT ON cancellation_stop_signals TO exports_api;
