-- A manifest published last (issue #24, item 6).
--
-- 1. A destination asks for a manifest beside each delivered file: none, a coreutils `.sha256` sidecar, a
--    JSON manifest, or both (destinations.manifest). It changes what is delivered, so it is a delivery term:
--    it stays out of destination_delivery_terms()'s exclusions, and a change during a build makes cutoff 2
--    refuse the file built for the version before (DestinationChanged). An admin sets it through the recorded
--    versions (create_destination, edit_destination_if_version).
-- 2. Cutoff 2 records on the job what the version it authorized asks for (export_jobs.expected_manifest),
--    and nobody else writes it: recovery and the statements below read the contract there.
-- 3. Such a delivery is Completed only once its manifest is in place, by evidence: the attempt's
--    DeliveryEvidence (the worker's or recovery's, never a listing a reconciler asked for) says of each
--    manifest name that it was published, or found in place with the same bytes. finish_delivery,
--    resolve_expired_delivery and settle_unknown_by_evidence repeat that condition for Completed
--    (manifest_in_place); a person's reconciliation and corrections keep their own judgement.

ALTER TABLE destinations
    ADD COLUMN manifest text NOT NULL DEFAULT 'none'
        CONSTRAINT ck_destinations_manifest CHECK (manifest IN ('none', 'sha256', 'json', 'both'));

ALTER TABLE export_jobs
    ADD COLUMN expected_manifest text
        CONSTRAINT ck_export_jobs_expected_manifest CHECK (expected_manifest IN ('none', 'sha256', 'json', 'both'));

-- The manifest names a choice puts beside a delivered file (domain/manifest.py states the same names).
CREATE FUNCTION manifest_names(file_name text, choice text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT CASE choice
           WHEN 'sha256' THEN ARRAY[file_name || '.sha256']
           WHEN 'json' THEN ARRAY[file_name || '.manifest.json']
           WHEN 'both' THEN ARRAY[file_name || '.sha256', file_name || '.manifest.json']
           ELSE ARRAY[]::text[] END
$$;

-- Whether the job's attempt has every manifest its authorized version asks for in place, by its evidence: for
-- each name, a 'manifest' observation of this attempt whose result is 'published' or 'in_place'. True when
-- none is asked for. The cast to jsonb is reached only for DeliveryEvidence (always JSON) that mentions a
-- manifest: CASE keeps the order.
CREATE FUNCTION manifest_in_place(j export_jobs) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT coalesce(j.expected_manifest, 'none') = 'none'
       OR NOT EXISTS (
           SELECT 1 FROM unnest(manifest_names(j.expected_file_name, j.expected_manifest)) AS wanted (name)
           WHERE NOT EXISTS (
               SELECT 1 FROM (
                   SELECT CASE WHEN e.kind = 'DeliveryEvidence' AND strpos(e.detail, '"manifest"') > 0
                                    AND NOT starts_with(coalesce(e.observed_by, ''), 'reconciler-request:')
                               THEN e.detail::jsonb END AS detail
                   FROM export_attempt_events e
                   WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id) seen
               WHERE seen.detail ->> 'observation' = 'manifest'
                 AND seen.detail ->> 'name' = wanted.name
                 AND seen.detail ->> 'result' IN ('published', 'in_place')))
$$;

-- A job's expected manifest is written by cutoff 2 (Running -> Delivering) and never otherwise, as its
-- destination version (0021).
CREATE FUNCTION export_jobs_expected_manifest_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (OLD.status = 'Running' AND NEW.status = 'Delivering') THEN
        RAISE EXCEPTION 'export %: the expected manifest is recorded by cutoff 2 and never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_expected_manifest_writer';
    END IF;
    RETURN NEW;
END $$;

REVOKE ALL ON FUNCTION export_jobs_expected_manifest_guard() FROM PUBLIC;

CREATE TRIGGER tr_export_jobs_expected_manifest
    BEFORE UPDATE OF expected_manifest ON export_jobs
    FOR EACH ROW
    WHEN (NEW.expected_manifest IS DISTINCT FROM OLD.expected_manifest)
    EXECUTE FUNCTION export_jobs_expected_manifest_guard();

-- -- grants ---------------------------------------------------------------------------------------------

-- An admin chooses the manifest (a recorded version).
GRANT UPDATE (manifest) ON destinations TO exports_api;
-- Cutoff 2 records what the authorized version asks for.
GRANT UPDATE (expected_manifest) ON export_jobs TO exports_worker;

REVOKE ALL ON FUNCTION manifest_names(text, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION manifest_in_place(export_jobs) FROM PUBLIC;
-- the worker's terminal write, recovery's resolution and settlement; the API reads names for the console
GRANT EXECUTE ON FUNCTION manifest_names(text, text), manifest_in_place(export_jobs)
    TO exports_worker, exports_recovery, exports_api, exports_reconciler;
