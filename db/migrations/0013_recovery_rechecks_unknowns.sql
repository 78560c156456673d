-- Recovery re-checks an OutcomeUnknown against its partner and settles it when the evidence has become
-- conclusive (000 "Recovery": an interrupted delivery "is OutcomeUnknown until evidence resolves it"). A
-- partner that did not answer while recovery took an expired attempt over, or while a worker settled a lost
-- rename answer, left an OutcomeUnknown that a later listing can settle by the same rules recovery applies
-- at a takeover: Completed when the final name shows the attempt's expected file, Failed NotDelivered once
-- the attempt's temporary file is set aside and the final name still shows the baseline. The settlement is
-- the attempt's one reconciliation (its 'Reconciled' event, unique per attempt), recorded under the recovery
-- run's ID, so a person reconciles only what evidence could not settle; a person who reconciled first wins.
--
-- exports_recovery now takes OutcomeUnknown -> Completed and Failed too, through settle_unknown_by_evidence
-- only on an original that no replacement names. The guard's lease rule for that role applies to the
-- attempt's live states only: an OutcomeUnknown has no lease (the terminal write cleared it).

UPDATE export_status_edges SET roles = '{exports_reconciler,exports_recovery}',
    via = 'reconcile_unknown (reconciler) / settle_unknown_by_evidence (recovery)'
    WHERE from_status = 'OutcomeUnknown';

-- A replacement delivers under its original's final name, so an original some replacement names is never
-- settled by a listing; found by this index, not by reading every job.
CREATE INDEX ix_export_jobs_replaces ON export_jobs (replaces_job_id) WHERE replaces_job_id IS NOT NULL;

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
        -- Recovery takes over only an expired lease, on the database clock, compared as its statements
        -- compare it (lease_expires_at < clock_timestamp()); a renewed lease, or none, is the worker's. An
        -- OutcomeUnknown has no lease and no worker: recovery settles it by evidence (0013). No table is
        -- read here, so no cached plan of it needs a privilege the role lacks (0006).
        IF current_user = 'exports_recovery' AND OLD.status <> 'OutcomeUnknown' THEN
            IF NOT coalesce(OLD.lease_expires_at < clock_timestamp(), false) THEN
                RAISE EXCEPTION 'export %: exports_recovery takes % -> % only once the lease has expired (lease_expires_at %)',
                        OLD.id, OLD.status, NEW.status, OLD.lease_expires_at
                    USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_recovery_lease';
            END IF;
        END IF;
        -- A recorded outcome changes once per attempt, along the correction recorded for it. Nested, not
        -- "AND NOT EXISTS": as one expression its cached generic plan keeps the subquery, and PostgreSQL
        -- checks the table privilege of every plan before running it, so after five uses on a connection
        -- every status change by a role that may not read outcome_corrections failed (0006 fixes 0005).
        IF OLD.status IN ('Completed', 'Failed') THEN
            IF NOT EXISTS (
                SELECT 1 FROM outcome_corrections c
                WHERE c.job_id = OLD.id AND c.attempt_id = OLD.attempt_id
                  AND c.from_status = OLD.status AND c.to_status = NEW.status) THEN
                RAISE EXCEPTION 'export %: % -> % needs its recorded correction', OLD.id, OLD.status, NEW.status
                    USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_correction';
            END IF;
        END IF;
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND NEW.status = OLD.status THEN
        RAISE EXCEPTION 'export % is a recorded %; a correction changes its status', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    RETURN NEW;
END $$;
