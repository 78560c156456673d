-- A replacement delivers its original's contacts to its original's partner, under the original's delivery
-- key and final name (000 "Replacements"): that is what makes the original's evidence and the replacement's
-- one delivery. Editing its list or its destination would send other contacts, or send them elsewhere, under
-- that key and name. edit_terms_if_queued refuses a replacement in its own conditions; this trigger refuses it
-- for every writer, a repair script as superuser included. A replacement with other terms is a new export.
CREATE FUNCTION export_jobs_replacement_terms_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'export % replaces export %: its list and destination are the original''s and never change',
            OLD.id, OLD.replaces_job_id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_replacement_terms';
END $$;

CREATE TRIGGER tr_export_jobs_replacement_terms
    BEFORE UPDATE OF destination_id, list_name ON export_jobs
    FOR EACH ROW
    WHEN (OLD.replaces_job_id IS NOT NULL
          AND (NEW.destination_id IS DISTINCT FROM OLD.destination_id OR NEW.list_name IS DISTINCT FROM OLD.list_name))
    EXECUTE FUNCTION export_jobs_replacement_terms_guard();
