-- The seed's five tables (000 "The Tables"), every constraint and index it gives, and the project
-- tables it leaves implicit: tenants, destinations, contacts, idempotency keys, API tokens.

CREATE TABLE tenants (
    id          uuid PRIMARY KEY,
    name        text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
);

-- A partner's SFTP endpoint and the contract agreed with it. No secret is stored here: the private key
-- lives in a file on the worker host, named by credential_ref.
CREATE TABLE destinations (
    id                        uuid NOT NULL,
    tenant_id                 uuid NOT NULL REFERENCES tenants (id),
    name                      text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    host                      text NOT NULL,
    port                      int  NOT NULL CHECK (port BETWEEN 1 AND 65535),
    username                  text NOT NULL,
    host_key                  text NOT NULL,      -- pinned: "ssh-ed25519 AAAA..."; never auto-added
    credential_ref            text NOT NULL,      -- path of the private key file on the worker host
    remote_dir                text NOT NULL,
    -- The partner contract (000 "An existing final name", "Completed needs evidence"):
    name_and_size_identify    boolean NOT NULL DEFAULT false,   -- name+size identifies a delivered file
    hash_evidence             text NOT NULL DEFAULT 'none'
                              CHECK (hash_evidence IN ('none', 'read_back', 'ack_file')),
    ack_suffix                text,                             -- the partner writes {final}{ack_suffix}
    max_write_request         int  NOT NULL DEFAULT 32768 CHECK (max_write_request BETWEEN 1024 AND 261120),
    created_at                timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_destinations PRIMARY KEY (id),
    CONSTRAINT uq_destinations_tenant UNIQUE (tenant_id, id),
    CONSTRAINT ck_destinations_ack CHECK ((hash_evidence = 'ack_file') = (ack_suffix IS NOT NULL))
);

CREATE TABLE contacts (
    tenant_id   uuid NOT NULL REFERENCES tenants (id),
    id          bigint GENERATED ALWAYS AS IDENTITY,
    list_name   text NOT NULL,
    email       text NOT NULL,
    first_name  text NOT NULL DEFAULT '',
    last_name   text NOT NULL DEFAULT '',
    CONSTRAINT pk_contacts PRIMARY KEY (tenant_id, list_name, id)
);

CREATE TABLE export_jobs (
    id                       uuid PRIMARY KEY,
    tenant_id                uuid NOT NULL REFERENCES tenants (id),
    status                   text NOT NULL CHECK (status IN ('Queued', 'Running', 'Delivering', 'Canceled',
                                 'Rejected', 'Stopped', 'Failed', 'Completed', 'OutcomeUnknown')),
    version                  int  NOT NULL,
    destination_id           uuid NOT NULL,
    attempt_id               uuid,
    attempt_count            int  NOT NULL DEFAULT 0,
    claimed_by               text,
    lease_expires_at         timestamptz,
    stop_request_id          uuid,
    cancellation_request_id  uuid,
    expected_file_name       text,
    expected_file_bytes      bigint,
    expected_file_sha256     bytea,
    expected_file_rows       bigint,            -- project column: contacts in the file, for people
    delivery_authorized_at   timestamptz,
    woken_at                 timestamptz NOT NULL,
    failure_reason           text CHECK (failure_reason IN ('BuildFailed', 'AttemptsExhausted', 'NotDelivered',
                                 'FinalNameOccupied', 'OriginalDelivered')),
    delivery_key             text NOT NULL,
    replaces_job_id          uuid,
    created_by               text NOT NULL,
    replacement_reason       text,
    overwrite_agreement_ref  text,
    sweep_count              int  NOT NULL DEFAULT 0,
    -- Project columns: the export's scope is one of its terms (an edit increments version), and
    -- the policy's reason when it rejects a version.
    list_name                text NOT NULL,
    rejection_reason         text,
    workflow_id              text,              -- the Temporal workflow of the current attempt, set by the claim
    created_at               timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT uq_export_jobs_tenant UNIQUE (tenant_id, id),
    CONSTRAINT fk_export_jobs_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT ck_export_jobs_replacement CHECK ((replaces_job_id IS NULL) = (replacement_reason IS NULL)),
    CONSTRAINT ck_export_jobs_overwrite CHECK (overwrite_agreement_ref IS NULL OR replaces_job_id IS NOT NULL),
    CONSTRAINT ck_export_jobs_failure CHECK ((status = 'Failed') = (failure_reason IS NOT NULL))
);

-- One row per delivery key, written by the statement that creates the original job.
CREATE TABLE deliveries (
    tenant_id        uuid NOT NULL,
    delivery_key     text NOT NULL,
    original_job_id  uuid NOT NULL,
    CONSTRAINT pk_deliveries PRIMARY KEY (tenant_id, delivery_key),
    CONSTRAINT uq_deliveries_original UNIQUE (tenant_id, delivery_key, original_job_id),
    CONSTRAINT fk_deliveries_original FOREIGN KEY (tenant_id, original_job_id)
        REFERENCES export_jobs (tenant_id, id) DEFERRABLE INITIALLY DEFERRED   -- the two rows reference each other
);

ALTER TABLE export_jobs
    ADD CONSTRAINT fk_export_jobs_delivery FOREIGN KEY (tenant_id, delivery_key)
        REFERENCES deliveries (tenant_id, delivery_key),
    ADD CONSTRAINT fk_export_jobs_replaces FOREIGN KEY (tenant_id, delivery_key, replaces_job_id)
        REFERENCES deliveries (tenant_id, delivery_key, original_job_id);   -- same tenant, same key, the original

-- Only an original mints a key, so two originals can never share one, even if inserted directly.
CREATE UNIQUE INDEX uq_export_jobs_original_key ON export_jobs (tenant_id, delivery_key)
    WHERE replaces_job_id IS NULL;

-- At most one replacement per original that is live, has delivered, or found the original's file.
CREATE UNIQUE INDEX uq_export_jobs_one_replacement ON export_jobs (tenant_id, replaces_job_id)
    WHERE replaces_job_id IS NOT NULL
      AND (status NOT IN ('Canceled', 'Rejected', 'Stopped', 'Failed') OR failure_reason = 'OriginalDelivered');

CREATE INDEX ix_export_jobs_lease ON export_jobs (lease_expires_at) WHERE status IN ('Running', 'Delivering');
CREATE INDEX ix_export_jobs_woken ON export_jobs (woken_at) WHERE status = 'Queued';
CREATE INDEX ix_export_jobs_tenant_created ON export_jobs (tenant_id, created_at DESC);

CREATE TABLE export_attempt_events (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    job_id       uuid NOT NULL REFERENCES export_jobs (id),
    attempt_id   uuid NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('Claimed', 'DeliveryAuthorized', 'Stopped', 'Failed',
                     'Finished', 'RequeuedByRecovery', 'StoppedByRecovery', 'AttemptsExhausted',
                     'ResolvedByRecovery', 'Reconciled', 'Corrected', 'DeliveryEvidence')),
    version      int,
    worker_id    text,
    observed_by  text,
    detail       text,
    recorded_at  timestamptz NOT NULL
);

-- Each transition happens at most once per attempt; evidence may be appended many times.
CREATE UNIQUE INDEX uq_attempt_transition ON export_attempt_events (job_id, attempt_id, kind)
    WHERE kind <> 'DeliveryEvidence';
CREATE INDEX ix_attempt_events_job ON export_attempt_events (job_id, id);

CREATE TABLE cancellation_requests (
    tenant_id                     uuid NOT NULL,
    id                            uuid NOT NULL,
    job_id                        uuid NOT NULL,
    requested_by                  text NOT NULL,
    reason                        text,
    outcome                       text NOT NULL CHECK (outcome IN ('CanceledWhileQueued', 'StopRequested',
                                      'StopAlreadyRequested', 'AlreadyCanceled', 'AlreadyEnded', 'TooLate')),
    found_status                  text NOT NULL,
    found_attempt_id              uuid,
    found_attempt_count           int  NOT NULL,
    found_delivery_authorized_at  timestamptz,
    recorded_at                   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_cancellation_requests PRIMARY KEY (tenant_id, id),
    CONSTRAINT fk_cancellation_requests_job FOREIGN KEY (tenant_id, job_id)
        REFERENCES export_jobs (tenant_id, id)
);
CREATE INDEX ix_cancellation_requests_job ON cancellation_requests (job_id, recorded_at);

CREATE TABLE outbox (
    message_id    uuid PRIMARY KEY,    -- a new ID for every row; reused only when the dispatcher retries this row
    kind          text NOT NULL,
    job_id        uuid NOT NULL,
    created_at    timestamptz NOT NULL,
    published_at  timestamptz
);
CREATE INDEX ix_outbox_unpublished ON outbox (created_at) WHERE published_at IS NULL;

-- The dispatcher wakes on NOTIFY and falls back to polling, so a lost notification only delays.
CREATE FUNCTION outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;
CREATE TRIGGER tr_outbox_notify AFTER INSERT ON outbox FOR EACH STATEMENT EXECUTE FUNCTION outbox_notify();

-- Idempotent creation (002): a key scoped to tenant and operation, bound to a canonical request fingerprint,
-- written in the same statement as the job it names.
CREATE TABLE idempotency_keys (
    tenant_id    uuid NOT NULL,
    operation    text NOT NULL,
    key          text NOT NULL CHECK (length(key) BETWEEN 1 AND 200),
    fingerprint  text NOT NULL,
    job_id       uuid NOT NULL,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_idempotency_keys PRIMARY KEY (tenant_id, operation, key),
    CONSTRAINT fk_idempotency_keys_job FOREIGN KEY (tenant_id, job_id)
        REFERENCES export_jobs (tenant_id, id) DEFERRABLE INITIALLY DEFERRED
);

-- Bearer tokens for the API, stored as SHA-256 of the token; each is bound to a tenant, a principal, a role.
CREATE TABLE api_tokens (
    token_sha256  bytea PRIMARY KEY,
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    principal     text NOT NULL,
    role          text NOT NULL CHECK (role IN ('operator', 'reconciler')),
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp()
);
