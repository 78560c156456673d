-- The database itself enforces the seed's state diagram (001 "A Second Cutoff"), so no repair script,
-- admin path or direct UPDATE can move a job along an edge the design does not have: Canceled never goes
-- back to Queued. A recorded Completed or Failed changes only by a correction, and only the
-- exports_reconciler role may make one. Immutable identity columns never change.

CREATE TABLE export_status_edges (
    from_status  text NOT NULL,
    to_status    text NOT NULL,
    via          text NOT NULL,     -- the statement that takes this edge
    PRIMARY KEY (from_status, to_status)
);

INSERT INTO export_status_edges (from_status, to_status, via) VALUES
    ('Queued',         'Running',        'claim_if_queued'),
    ('Queued',         'Canceled',       'cancel_if_queued'),
    ('Queued',         'Rejected',       'reject_if_queued'),
    ('Running',        'Delivering',     'authorize_delivery_if_running'),
    ('Running',        'Stopped',        'finish_stopped / stop_expired_attempt'),
    ('Running',        'Failed',         'finish_failed / exhaust_expired_attempt'),
    ('Running',        'Queued',         'requeue_expired_attempt'),
    ('Delivering',     'Completed',      'finish_delivery / resolve_expired_delivery'),
    ('Delivering',     'Failed',         'finish_delivery'),
    ('Delivering',     'OutcomeUnknown', 'finish_delivery / resolve_expired_delivery'),
    ('OutcomeUnknown', 'Completed',      'reconcile_unknown'),
    ('OutcomeUnknown', 'Failed',         'reconcile_unknown'),
    ('Completed',      'Failed',         'correct_outcome'),
    ('Failed',         'Completed',      'correct_outcome');

CREATE FUNCTION export_jobs_guard() RETURNS trigger LANGUAGE plpgsql AS $$
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

    IF NEW.status IS DISTINCT FROM OLD.status AND NOT EXISTS (
        SELECT 1 FROM export_status_edges e WHERE e.from_status = OLD.status AND e.to_status = NEW.status) THEN
        RAISE EXCEPTION 'export %: % -> % is not an edge of the state diagram', OLD.id, OLD.status, NEW.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND NEW.status = OLD.status THEN
        RAISE EXCEPTION 'export % is a recorded %; a correction changes its status', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_export_jobs_guard BEFORE UPDATE ON export_jobs
    FOR EACH ROW EXECUTE FUNCTION export_jobs_guard();

-- A new job always starts Queued: nothing is inserted past the first cutoff.
CREATE FUNCTION export_jobs_insert_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'Queued' OR NEW.attempt_id IS NOT NULL OR NEW.attempt_count <> 0 THEN
        RAISE EXCEPTION 'a new export starts Queued with no attempt'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_export_jobs_insert_guard BEFORE INSERT ON export_jobs
    FOR EACH ROW EXECUTE FUNCTION export_jobs_insert_guard();

-- Nothing deletes a job: its history references it, and the record is the point.
CREATE FUNCTION export_jobs_no_delete() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'exports are never deleted' USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE TRIGGER tr_export_jobs_no_delete BEFORE DELETE ON export_jobs
    FOR EACH ROW EXECUTE FUNCTION export_jobs_no_delete();
