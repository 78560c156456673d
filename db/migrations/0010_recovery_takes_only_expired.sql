-- Recovery takes over only expired leases (issue 9.4: "the trigger ties each edge to the roles that may take
-- it; takeovers: recovery's role"). Until now exports_recovery could take every edge it shares with the
-- worker (Running -> Queued, Stopped, Failed; Delivering -> Completed, Failed, OutcomeUnknown) on any row,
-- although each of its statements (requeue_expired_attempt, stop_expired_attempt, exhaust_expired_attempt,
-- resolve_expired_delivery, fail_unpublished_delivery) acts only where lease_expires_at < clock_timestamp().
-- The guard now refuses a status change by exports_recovery unless the row's lease has expired on the
-- database clock (a missing lease counts as not expired), so not even a direct UPDATE by that role can take
-- a job from a worker whose lease is current. The role is current_user, as for every edge: the function is
-- not SECURITY DEFINER, so under SET ROLE it is the role the process set.
--
-- Everything else of 0006's guard is unchanged, the outcome_corrections lookup still under its own IF.

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
        -- compare it (lease_expires_at < clock_timestamp()); a renewed lease, or none, is the worker's. No
        -- table is read here, so no cached plan of it needs a privilege the role lacks (0006).
        IF current_user = 'exports_recovery' THEN
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
