-- The database refuses what the service refuses (issue 23, points 10 and 5).
--
-- 1. A correction's failure code is its recorded row's. export_jobs_guard lets a recorded Completed/Failed
--    change only along its outcome_corrections row (from, to), but took any failure code: a direct UPDATE
--    could correct to Failed BuildFailed along a row that records NotDelivered. Now the row the job ends as
--    carries the code the correction recorded (NULL for a correction to Completed).
-- 2. A status change out of OutcomeUnknown commits with the attempt's Reconciled event, and one out of
--    Completed/Failed with its Corrected event (000 "Reconciliation is one-shot: the unique index allows one
--    Reconciled event per attempt"; "one Corrected event per attempt"). The statements insert the event in
--    another CTE of the same statement, which a BEFORE row trigger cannot see, so a deferred constraint
--    trigger checks at commit that the event exists; with uq_attempt_transition that makes each edge one-shot
--    per attempt for every writer, a superuser's repair acting as the reconciler included.
-- 3. The global delivery switch is the platform's (004; service/switches.py answers 403 for it over HTTP):
--    exports_api may no longer insert or update it, nor record its history; the new NOLOGIN role
--    exports_platform (`starter.py pause --global` / `resume --global`) changes the global switch and nothing
--    else.
--
-- The rules are triggers of their own, not another CREATE OR REPLACE of export_jobs_guard, so no later
-- migration that replaces the guard can drop them by restating an older body.

-- -- 1. a correction carries its recorded failure code ------------------------------------------------

-- Named to fire after tr_export_jobs_guard (BEFORE triggers fire in name order), which has already refused
-- every role but the reconciler, an edge off the diagram and a correction with no row at all; so this one
-- only tells a wrong code apart, and only the reconciler (which may read outcome_corrections) reaches it.
CREATE FUNCTION export_jobs_correction_code_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM outcome_corrections c
        WHERE c.job_id = OLD.id AND c.attempt_id = OLD.attempt_id
          AND c.from_status = OLD.status AND c.to_status = NEW.status
          AND c.failure_reason IS NOT DISTINCT FROM NEW.failure_reason) THEN
        RAISE EXCEPTION 'export %: the correction % -> % of attempt % records another failure code than %',
                OLD.id, OLD.status, NEW.status, OLD.attempt_id, coalesce(NEW.failure_reason, 'none')
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_correction_code';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_export_jobs_guard_correction_code
    BEFORE UPDATE OF status ON export_jobs
    FOR EACH ROW
    WHEN (OLD.status IN ('Completed', 'Failed') AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION export_jobs_correction_code_guard();

-- -- 2. leaving OutcomeUnknown, Completed or Failed commits with its event ---------------------------

-- Runs at commit as the role then current: the reconciler and recovery, the only roles the guard lets take
-- these edges, both read export_attempt_events. The WHEN clause is evaluated when the row is updated, and an
-- update for which it is false queues no event: every other edge (the claim, cutoff 2, the terminal writes)
-- pays for that comparison only.
CREATE FUNCTION export_jobs_transition_event_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    wanted text := CASE WHEN OLD.status = 'OutcomeUnknown' THEN 'Reconciled' ELSE 'Corrected' END;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM export_attempt_events e
        WHERE e.job_id = OLD.id AND e.attempt_id = OLD.attempt_id AND e.kind = wanted) THEN
        RAISE EXCEPTION 'export %: % -> % of attempt % must commit with its % event',
                OLD.id, OLD.status, NEW.status, OLD.attempt_id, wanted
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_transition_event';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER tr_export_jobs_transition_event
    AFTER UPDATE OF status ON export_jobs
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW
    WHEN (OLD.status IN ('OutcomeUnknown', 'Completed', 'Failed') AND NEW.status IS DISTINCT FROM OLD.status)
    EXECUTE FUNCTION export_jobs_transition_event_guard();

-- -- 3. the global switch is the platform's ----------------------------------------------------------

DO $$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'exports_platform') THEN
        CREATE ROLE exports_platform NOLOGIN;
    END IF;
END $$;

-- What lock_delivery_switch (SELECT ... FOR UPDATE: SELECT and an UPDATE column) and set_delivery_switch (the
-- upsert and its history entry, RETURNING both) need; the trigger below keeps the role to the global row.
GRANT SELECT, INSERT ON delivery_switches TO exports_platform;
GRANT UPDATE (enabled, reason, changed_by, changed_at) ON delivery_switches TO exports_platform;
GRANT SELECT, INSERT ON delivery_switch_changes TO exports_platform;

-- Grants are per table, not per row: which role writes which scope is this trigger's, for the switch row and
-- for its history entry alike. The owner's repairs are not held to it (as with every switch row until now).
CREATE FUNCTION delivery_switch_scope_owner() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    is_global boolean := NEW.scope = 'global' OR (TG_OP = 'UPDATE' AND OLD.scope = 'global');
BEGIN
    IF is_global AND current_user = 'exports_api' THEN
        RAISE EXCEPTION 'the global delivery switch is the platform''s (exports_platform), not exports_api''s'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_switches_global_owner';
    END IF;
    IF NOT is_global AND current_user = 'exports_platform' THEN
        RAISE EXCEPTION 'exports_platform changes the global delivery switch only, not a % switch', NEW.scope
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_switches_global_owner';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_delivery_switches_scope_owner BEFORE INSERT OR UPDATE ON delivery_switches
    FOR EACH ROW EXECUTE FUNCTION delivery_switch_scope_owner();
CREATE TRIGGER tr_delivery_switch_changes_scope_owner BEFORE INSERT ON delivery_switch_changes
    FOR EACH ROW EXECUTE FUNCTION delivery_switch_scope_owner();
