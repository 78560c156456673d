-- Bulk cancel (issue 9, part 3): one operator action that cancels every live export matching a filter.
-- Each matching job still gets its own cancellation request through the same ledger transaction as a
-- single cancel; the batch groups them with who, when, the filter and the reason. The jobs a batch
-- covers are fixed when the batch is first recorded, so re-submitting the same batch ID replays the
-- recorded outcomes and retries only the jobs that have no request yet (Busy, or never reached).

CREATE TABLE cancellation_batches (
    tenant_id       uuid NOT NULL REFERENCES tenants (id),
    id              uuid NOT NULL,                   -- the client's batch ID, reused on retry
    requested_by    text NOT NULL,
    reason          text NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    destination_id  uuid NOT NULL,
    list_name       text CHECK (list_name IS NULL OR length(list_name) BETWEEN 1 AND 200),  -- NULL: every list
    matched         int  NOT NULL CHECK (matched >= 0),   -- live exports the filter matched when recorded
    recorded_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_cancellation_batches PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_cancellation_batches_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id)
);

-- The jobs a batch covers, written in the same statement as the batch (read from export_jobs in that
-- statement). Deliberately no foreign key to export_jobs: its check would take a KEY SHARE lock on every
-- covered job, and so wait, with no lock_timeout, behind any cancellation holding a job's row lock.
-- Job rows are never deleted (no role may), so the reference cannot dangle.
CREATE TABLE cancellation_batch_jobs (
    tenant_id  uuid NOT NULL,
    batch_id   uuid NOT NULL,
    job_id     uuid NOT NULL,
    CONSTRAINT pk_cancellation_batch_jobs PRIMARY KEY (tenant_id, batch_id, job_id),
    CONSTRAINT fk_cancellation_batch_jobs_batch FOREIGN KEY (tenant_id, batch_id)
        REFERENCES cancellation_batches (tenant_id, id)
);

-- Each request of a batch names it; a single cancel leaves it NULL.
ALTER TABLE cancellation_requests
    ADD COLUMN batch_id uuid,
    ADD CONSTRAINT fk_cancellation_requests_batch FOREIGN KEY (tenant_id, batch_id)
        REFERENCES cancellation_batches (tenant_id, id);
CREATE INDEX ix_cancellation_requests_batch ON cancellation_requests (tenant_id, batch_id)
    WHERE batch_id IS NOT NULL;

-- Live exports of one destination, for the batch's matching read and the console's filter.
CREATE INDEX ix_export_jobs_tenant_destination_live ON export_jobs (tenant_id, destination_id)
    WHERE status IN ('Queued', 'Running', 'Delivering');

-- The console's keyset pagination orders by (created_at, id) newest first; ix_export_jobs_tenant_created
-- has no id, so a page boundary inside one created_at would need a sort. This index answers the page
-- straight from the index, in order.
CREATE INDEX ix_export_jobs_tenant_created_id ON export_jobs (tenant_id, created_at DESC, id DESC);

-- Least privilege: only the API records batches and their requests, insert and read only (no UPDATE or
-- DELETE for anyone: a batch, like every request, is history). The worker, the dispatcher and the
-- reconciler get nothing here: none of them reads or writes a batch.
GRANT SELECT, INSERT ON cancellation_batches, cancellation_batch_jobs TO exports_api;

-- The console's sign-in sessions (issue 9, part 5): the browser's cookie holds a random session ID, never
-- the bearer token. Only the SHA-256 of the session ID is stored, bound to the token it was opened with
-- (by that token's hash), with an expiry; signing out deletes the row, and a revoked token's sessions go
-- with it.
CREATE TABLE console_sessions (
    session_sha256  bytea PRIMARY KEY CHECK (length(session_sha256) = 32),
    token_sha256    bytea NOT NULL REFERENCES api_tokens (token_sha256) ON DELETE CASCADE,
    created_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at      timestamptz NOT NULL,
    CONSTRAINT ck_console_sessions_expiry CHECK (expires_at > created_at)
);
CREATE INDEX ix_console_sessions_expires ON console_sessions (expires_at);

-- The API opens, reads and ends sessions; nobody else touches them. DELETE here is sign-out (and the
-- removal of expired sessions), not history: a session is a credential, not a record.
GRANT SELECT, INSERT, DELETE ON console_sessions TO exports_api;
