-- A session slot taken over by recovery stays held for a while (issue #25.3, found by the 2,000-export soak).
--
-- An attempt's slot is held while its attempt holds the job Running or Delivering (0029). Recovery takes an
-- attempt over when its lease has expired; the row changes and the slot looked free at once. But an attempt
-- whose lease expired may still be alive: a worker paused (or cut off from PostgreSQL) with its partner
-- session open, or half-way through the SSH handshake, holds that connection at the partner until it wakes,
-- finds its job gone and closes it, or until the partner drops it. Another attempt that took the slot in
-- between made the partner see one session more than its limit (the soak's witness: 7 at once, limit 6, for
-- 0.11 s, after a PostgreSQL restart had let leases lapse and a worker was paused mid-handshake).
--
-- So a takeover by recovery (role exports_recovery) of an attempt that held a slot leaves that slot held for
-- fenced.session_takeover_hold_seconds (the recovery pool sets it from EXPORTS_SESSION_TAKEOVER_HOLD_SECONDS;
-- 120 s, OpenSSH's LoginGraceTime, when unset): as long as the partner may keep a stalled client's
-- connection. The old attempt gives it back sooner itself (release_taken_over_slot) once it has found its job
-- gone and closed its session. The attempt's own writes (terminal write, give-back) leave no hold: it closes
-- its session before them. In the same statement as the takeover: this trigger, so no takeover can forget it.

ALTER TABLE destination_session_slots DROP CONSTRAINT ck_destination_session_slots_holder;
ALTER TABLE destination_session_slots ADD CONSTRAINT ck_destination_session_slots_holder CHECK (
    (holder IS NULL AND job_id IS NULL AND purpose IS NULL AND taken_at IS NULL AND expires_at IS NULL)
    -- an attempt's: held while it holds its job, and after recovery took it over until expires_at
    OR (holder IS NOT NULL AND purpose = 'attempt' AND job_id IS NOT NULL AND taken_at IS NOT NULL)
    OR (holder IS NOT NULL AND purpose <> 'attempt' AND job_id IS NULL AND taken_at IS NOT NULL
        AND expires_at IS NOT NULL));

-- SECURITY INVOKER: current_user is the writer's role, and exports_recovery may update expires_at (0029).
CREATE FUNCTION hold_session_slot_after_takeover() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    hold float8 := coalesce(nullif(current_setting('fenced.session_takeover_hold_seconds', true), '')::float8, 120);
BEGIN
    IF hold > 0 THEN
        UPDATE destination_session_slots s
        SET expires_at = clock_timestamp() + make_interval(secs => hold)
        WHERE s.holder = OLD.attempt_id AND s.job_id = OLD.id AND s.purpose = 'attempt';
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tr_export_jobs_hold_slot_after_takeover
    AFTER UPDATE OF status, attempt_id ON export_jobs
    FOR EACH ROW
    -- recovery's takeovers only (the role in the WHEN, so the worker's own writes never call the function)
    WHEN (current_user = 'exports_recovery'
          AND OLD.status IN ('Running', 'Delivering') AND OLD.attempt_id IS NOT NULL
          AND (NEW.status NOT IN ('Running', 'Delivering') OR NEW.attempt_id IS DISTINCT FROM OLD.attempt_id))
    EXECUTE FUNCTION hold_session_slot_after_takeover();

REVOKE ALL ON FUNCTION hold_session_slot_after_takeover() FROM PUBLIC;
