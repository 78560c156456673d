-- Retries that wait (issue #25, item 4): a delivery that failed NotDelivered for a transient cause (a connect
-- refused or not answered, a session cut before the rename request, a partner refusing writes for lack of
-- space; rules/retries.py) goes back to Queued, to be tried again in a new attempt after a backoff, instead
-- of Failed. One new edge, Delivering -> Queued, taken only by retry_delivery_if_delivering (db/queries.sql),
-- which repeats every condition: this attempt, still Delivering, its rename fence never written (the row's
-- own proof that the rename was never sent, so the final name was never written), no stop request and no
-- cancellation request recorded against this attempt (a TooLate cancel stops the retry), and the attempt cap
-- not reached (the failed attempt is a used one, unlike a give-back). Its RetryScheduled event commits in the
-- same statement.
--
-- Why the edge is safe: the file was provably never published (no rename fence, so no rename request), the
-- retry keeps the delivery key and final name (they are the job's), and the next attempt passes cutoff 1 and
-- cutoff 2 again with every rule (switches, window, slots, policy, destination version). "A cancel answered
-- TooLate stays true" still holds: such a request blocks the edge, and the job ends Failed NotDelivered.

INSERT INTO export_status_edges (from_status, to_status, via, roles) VALUES
    ('Delivering', 'Queued', 'retry_delivery_if_delivering (a transient NotDelivered, within the attempt cap)',
     '{exports_worker}');

ALTER TABLE export_attempt_events DROP CONSTRAINT export_attempt_events_kind_check;
ALTER TABLE export_attempt_events ADD CONSTRAINT export_attempt_events_kind_check CHECK (kind IN (
    'Claimed', 'DeliveryAuthorized', 'Stopped', 'Failed', 'Finished', 'RequeuedByRecovery', 'StoppedByRecovery',
    'AttemptsExhausted', 'ResolvedByRecovery', 'Reconciled', 'Corrected', 'DeliveryEvidence',
    'Released', 'UploadFenced', 'RenameFenced', 'RetryScheduled'));

-- available_at is written by a give-back (Running -> Queued), by a retry (Delivering -> Queued), or moved
-- later to the window's opening for a Queued job outside it (0035). Replaces 0035's function.
CREATE OR REPLACE FUNCTION export_jobs_backoff_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.transient_releases < OLD.transient_releases THEN
        RAISE EXCEPTION 'export %: the count of give-backs for failures never decreases', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (OLD.status = 'Running' AND NEW.status = 'Queued')
       AND NOT (OLD.status = 'Delivering' AND NEW.status = 'Queued')
       AND NOT (OLD.status = 'Queued' AND NEW.status = 'Queued' AND NEW.available_at IS NOT NULL
                AND (OLD.available_at IS NULL OR NEW.available_at > OLD.available_at)
                AND EXISTS (SELECT 1 FROM destinations d
                            WHERE d.tenant_id = NEW.tenant_id AND d.id = NEW.destination_id
                              AND NOT delivery_window_open(d, clock_timestamp())
                              AND delivery_window_open(d, NEW.available_at))) THEN
        RAISE EXCEPTION 'export %: available_at is written only by a give-back (Running -> Queued) or a retry '
                        '(Delivering -> Queued), or moved later to its delivery window''s opening for a Queued '
                        'job outside it', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    RETURN NEW;
END $$;
