-- Least privilege in the state machine itself, and the fences that let recovery prove "not delivered".
--
-- 1. Each edge of the diagram names the roles that may take it (issue 9): the claim, cutoff 2, release and
--    the attempt's terminal writes belong to exports_worker; takeovers to exports_recovery; cancel to
--    exports_api; reconciliation and correction to exports_reconciler. A direct UPDATE by any other role,
--    the superuser's included, is refused by the trigger.
-- 2. A recorded Completed or Failed changes only with a matching outcome_corrections row, one per attempt,
--    so even a direct UPDATE corrects an outcome once.
-- 3. release_attempt_if_running (Running -> Queued by the owning worker, for a drain or a pause) gives the
--    attempt back: attempts_released counts them, and the attempt cap counts only attempts not given back.
-- 4. The fences (issue 10): between cutoff 2 and the first byte sent, the worker writes upload_fenced_at
--    for its attempt (still Delivering, still owner, lease current); between the upload and the rename
--    request it writes rename_fenced_at the same way. Cutoff 2 marks the attempt fence_expected. Recovery,
--    finding an expired attempt whose rename fence was never written, proves the final name was never
--    written by it (it sent nothing, or only a temporary file) and records Failed NotDelivered through a
--    statement that also refuses a late fence. An attempt authorized before fences existed is resolved
--    from evidence, as before.

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_recovery') THEN
        CREATE ROLE exports_recovery NOLOGIN;
    END IF;
END $$;

-- -- the job row -------------------------------------------------------------------------------------

ALTER TABLE export_jobs
    ADD COLUMN attempts_released int NOT NULL DEFAULT 0 CHECK (attempts_released >= 0),
    ADD COLUMN fence_expected boolean NOT NULL DEFAULT false,
    ADD COLUMN upload_fenced_at timestamptz,
    ADD COLUMN rename_fenced_at timestamptz,
    ADD CONSTRAINT ck_export_jobs_fences CHECK (rename_fenced_at IS NULL OR upload_fenced_at IS NOT NULL);

ALTER TABLE export_attempt_events DROP CONSTRAINT export_attempt_events_kind_check;
ALTER TABLE export_attempt_events ADD CONSTRAINT export_attempt_events_kind_check CHECK (kind IN (
    'Claimed', 'DeliveryAuthorized', 'Stopped', 'Failed', 'Finished', 'RequeuedByRecovery', 'StoppedByRecovery',
    'AttemptsExhausted', 'ResolvedByRecovery', 'Reconciled', 'Corrected', 'DeliveryEvidence',
    'Released', 'UploadFenced', 'RenameFenced'));

-- -- corrections -------------------------------------------------------------------------------------

-- One per attempt: the request a reconciler makes to change a recorded outcome, with who and why. The
-- trigger lets a Completed/Failed change only along the row recorded here.
CREATE TABLE outcome_corrections (
    tenant_id      uuid NOT NULL,
    job_id         uuid NOT NULL,
    attempt_id     uuid NOT NULL,
    from_status    text NOT NULL CHECK (from_status IN ('Completed', 'Failed')),
    to_status      text NOT NULL CHECK (to_status IN ('Completed', 'Failed')),
    failure_reason text,
    corrected_by   text NOT NULL,
    evidence_ref   text NOT NULL,
    why            text NOT NULL,
    recorded_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_outcome_corrections PRIMARY KEY (job_id, attempt_id),
    CONSTRAINT ck_outcome_corrections_change CHECK (from_status <> to_status),
    CONSTRAINT fk_outcome_corrections_job FOREIGN KEY (tenant_id, job_id) REFERENCES export_jobs (tenant_id, id)
);

-- -- which role takes which edge ---------------------------------------------------------------------

ALTER TABLE export_status_edges ADD COLUMN roles text[] NOT NULL DEFAULT '{}';

UPDATE export_status_edges SET roles = '{exports_worker}', via = 'claim_if_queued'
    WHERE (from_status, to_status) = ('Queued', 'Running');
UPDATE export_status_edges SET roles = '{exports_api}', via = 'cancel_and_record (the cancellation transaction)'
    WHERE (from_status, to_status) = ('Queued', 'Canceled');
UPDATE export_status_edges SET roles = '{exports_worker}', via = 'reject_if_queued'
    WHERE (from_status, to_status) = ('Queued', 'Rejected');
UPDATE export_status_edges SET roles = '{exports_worker}', via = 'authorize_delivery_if_running'
    WHERE (from_status, to_status) = ('Running', 'Delivering');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'finish_stopped (worker) / stop_expired_attempt (recovery)'
    WHERE (from_status, to_status) = ('Running', 'Stopped');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'finish_failed (worker) / exhaust_expired_attempt (recovery)'
    WHERE (from_status, to_status) = ('Running', 'Failed');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'release_attempt_if_running (worker) / requeue_expired_attempt (recovery)'
    WHERE (from_status, to_status) = ('Running', 'Queued');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'finish_delivery (worker) / resolve_expired_delivery (recovery)'
    WHERE (from_status, to_status) = ('Delivering', 'Completed');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'finish_delivery (worker) / fail_unpublished_delivery (recovery)'
    WHERE (from_status, to_status) = ('Delivering', 'Failed');
UPDATE export_status_edges SET roles = '{exports_worker,exports_recovery}',
    via = 'finish_delivery (worker) / resolve_expired_delivery (recovery)'
    WHERE (from_status, to_status) = ('Delivering', 'OutcomeUnknown');
UPDATE export_status_edges SET roles = '{exports_reconciler}', via = 'reconcile_unknown'
    WHERE from_status = 'OutcomeUnknown';
UPDATE export_status_edges SET roles = '{exports_reconciler}', via = 'correct_outcome'
    WHERE from_status IN ('Completed', 'Failed');

CREATE OR REPLACE FUNCTION export_jobs_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    edge_roles text[];
BEGIN
    IF NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.delivery_key <> OLD.delivery_key
       OR NEW.replaces_job_id IS DISTINCT FROM OLD.replaces_job_id OR NEW.created_by <> OLD.created_by THEN
        RAISE EXCEPTION 'export % identity columns never change', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_identity';
    END IF;

    IF OLD.status IN ('Canceled', 'Rejected', 'Stopped') THEN
        RAISE EXCEPTION 'export % is % and final', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND current_user <> 'exports_reconciler' THEN
        RAISE EXCEPTION 'export % is a recorded %; only exports_reconciler may correct it', OLD.id, OLD.status
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_recorded_outcome';
    END IF;

    IF NEW.status IS DISTINCT FROM OLD.status THEN
        SELECT e.roles INTO edge_roles FROM export_status_edges e
        WHERE e.from_status = OLD.status AND e.to_status = NEW.status;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'export %: % -> % is not an edge of the state diagram', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
        END IF;
        IF NOT current_user = ANY (edge_roles) THEN
            RAISE EXCEPTION 'export %: % -> % is taken only by %, not by %',
                    OLD.id, OLD.status, NEW.status, edge_roles, current_user
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_edge_role';
        END IF;
        -- A recorded outcome changes once per attempt, along the correction recorded for it.
        IF OLD.status IN ('Completed', 'Failed') AND NOT EXISTS (
            SELECT 1 FROM outcome_corrections c
            WHERE c.job_id = OLD.id AND c.attempt_id = OLD.attempt_id
              AND c.from_status = OLD.status AND c.to_status = NEW.status) THEN
            RAISE EXCEPTION 'export %: % -> % needs its recorded correction', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_correction';
        END IF;
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND NEW.status = OLD.status THEN
        RAISE EXCEPTION 'export % is a recorded %; a correction changes its status', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    RETURN NEW;
END $$;

-- -- grants ------------------------------------------------------------------------------------------

-- Recovery: the takeovers, as their own role.
GRANT SELECT ON export_jobs, export_attempt_events, destinations, tenants, export_status_edges
    TO exports_recovery;
GRANT INSERT ON export_attempt_events, outbox TO exports_recovery;
GRANT UPDATE (status, attempt_id, claimed_by, lease_expires_at, woken_at, failure_reason) ON export_jobs
    TO exports_recovery;

-- The worker gives attempts back and fences its uploads.
GRANT UPDATE (attempts_released, fence_expected, upload_fenced_at, rename_fenced_at) ON export_jobs
    TO exports_worker;

-- The API never reads contact data, and no longer writes outcomes: reconciliation is the reconciler's.
REVOKE SELECT ON contacts FROM exports_api;
REVOKE UPDATE (failure_reason) ON export_jobs FROM exports_api;

-- Corrections: recorded by the reconciler, readable by the API for the timeline.
GRANT SELECT, INSERT ON outcome_corrections TO exports_reconciler;
GRANT SELECT ON outcome_corrections TO exports_api;
GRANT SELECT ON tenants, destinations TO exports_reconciler;
