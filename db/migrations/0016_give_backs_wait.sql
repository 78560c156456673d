-- Give-backs that wait and end (issue 23.1; 002 "Backoff": "Persist available_at so a restart preserves
-- delay", "poison input cannot create infinite retries"), recovery that honours a pause (23.5), cutoff 2
-- that re-checks the creator (23.6).
--
-- A release for a failure (the build interrupted, a switch read that failed, a workflow nobody could
-- confirm) is counted in transient_releases and makes the job wait: available_at, on the database clock, is
-- when the next claim may take it, and the release's wake-up waits in the outbox until then
-- (outbox.available_at). Past the bound the release ends the job Failed (AttemptsExhausted) instead. A
-- drain or a pause gives the job back at once, uncounted: it is nobody's failure.
ALTER TABLE export_jobs
    ADD COLUMN available_at timestamptz,
    ADD COLUMN transient_releases int NOT NULL DEFAULT 0 CHECK (transient_releases >= 0);

ALTER TABLE outbox ADD COLUMN available_at timestamptz;
-- the gauges (run as exports_worker) tell a wake-up that waits from one that is late
GRANT SELECT (available_at) ON outbox TO exports_worker;

GRANT UPDATE (available_at, transient_releases) ON export_jobs TO exports_worker;

-- The delay is written only by a give-back (Running -> Queued), and the count of counted give-backs only
-- grows: no other writer, a repair script as superuser included, can make a waiting job claimable early or
-- hide the give-backs that led to its end.
CREATE FUNCTION export_jobs_backoff_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.transient_releases < OLD.transient_releases THEN
        RAISE EXCEPTION 'export %: the count of give-backs for failures never decreases', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (OLD.status = 'Running' AND NEW.status = 'Queued') THEN
        RAISE EXCEPTION 'export %: available_at is written only by a give-back (Running -> Queued)', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_export_jobs_backoff_guard
    BEFORE UPDATE OF available_at, transient_releases ON export_jobs
    FOR EACH ROW EXECUTE FUNCTION export_jobs_backoff_guard();

-- Wake-ups not yet due, for the dispatcher's take (it skips them) and the gauges.
CREATE INDEX ix_outbox_deferred ON outbox (available_at) WHERE published_at IS NULL AND available_at IS NOT NULL;

-- Jobs given back again and again (the gauge behind the alert): a partial index of what is in flight.
CREATE INDEX ix_export_jobs_transient_releases ON export_jobs (transient_releases)
    WHERE status IN ('Queued', 'Running') AND transient_releases > 0;

-- Recovery reads the delivery switches before it opens a session with a partner (23.5: a pause for
-- "partner compromised" stops recovery's listings, set-asides and removals too; they wait for the resume).
GRANT SELECT ON delivery_switches TO exports_recovery;
GRANT EXECUTE ON FUNCTION delivery_scope_open(uuid, uuid) TO exports_recovery;

-- Cutoff 2 reads the creator's principal row FOR SHARE (23.6; 001 "facts that live outside the claimed
-- row"), so a revocation and the authorization serialize: whichever commits first, the other sees it. FOR
-- SHARE needs an UPDATE grant on some column; the worker still never changes a principal (the trigger).
GRANT UPDATE (name) ON principals TO exports_worker;

CREATE FUNCTION principals_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_user = 'exports_worker' THEN
        RAISE EXCEPTION 'exports_worker reads principals, it never changes them'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_principals_writer';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_principals_guard BEFORE UPDATE ON principals FOR EACH ROW EXECUTE FUNCTION principals_guard();
