-- Issue 26 item 5: a console that stays honest at ten million exports.
--
-- Every filter of the export list gets an index that hands its rows over in the list's own order (a tenant's
-- exports newest first, keyset on (created_at, id)), so a page reads about as many index entries as it shows,
-- whatever the filter matches: a status (one index scan per status asked for, merged; the reconciler's queue
-- of OutcomeUnknown exports, oldest first, is the same index read backwards), a destination, a list. An ID
-- prefix is a range of the primary key and needs nothing new. Before this, a page filtered on a rare status
-- or list walked the tenant's whole history through ix_export_jobs_tenant_created_id, discarding row after row.
--
-- IF NOT EXISTS on purpose: a migration runs in one transaction (db/migrate.py), where CREATE INDEX
-- CONCURRENTLY is not allowed, and a plain CREATE INDEX holds off every write to export_jobs while it builds
-- (about 20 s per index per ten million rows on 2 cores). On a large live table build them first, outside the
-- migration, with the same names and CREATE INDEX CONCURRENTLY (docs/operations.md), and this finds them.
-- A concurrent build that failed leaves an INVALID index of that name, which IF NOT EXISTS would take for
-- done: refuse it instead.
DO $$
DECLARE
    invalid text;
BEGIN
    SELECT string_agg(c.relname, ', ') INTO invalid
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relname IN ('ix_export_jobs_tenant_status_created', 'ix_export_jobs_tenant_destination_created',
                        'ix_export_jobs_tenant_list_created')
      AND NOT i.indisvalid;
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'index % exists but is INVALID (a CREATE INDEX CONCURRENTLY that failed): drop it and '
                        'build it again, then migrate', invalid;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_status_created
    ON export_jobs (tenant_id, status, created_at DESC, id DESC);
-- The destination's and the list's carry the status too (INCLUDE: not a key, so their order stays the list's),
-- so the counts of a destination or a list by status read the index alone, never the rows.
CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_destination_created
    ON export_jobs (tenant_id, destination_id, created_at DESC, id DESC) INCLUDE (status);
-- Also the console's list names: a skip scan over it reads one entry per name (tenant_list_names).
CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_list_created
    ON export_jobs (tenant_id, list_name, created_at DESC, id DESC) INCLUDE (status);

-- (tenant_id, created_at DESC) is a prefix of ix_export_jobs_tenant_created_id (0007), which answers every
-- read it served; each index of export_jobs costs an entry on every status change (none of them is HOT:
-- status is indexed), so the three above replace it rather than join it.
DROP INDEX IF EXISTS ix_export_jobs_tenant_created;

-- A count too large to take exactly is shown as the planner's estimate, labelled "about". Its estimate of
-- "this tenant and this destination" multiplies the two selectivities as if they were independent, and a
-- destination belongs to one tenant: for a tenant with 5 % of the exports it was 20 times too low. Functional
-- dependencies tell it that a destination (and mostly a list name) implies the tenant; ANALYZE (autovacuum's,
-- or the one below) builds them. (An MCV list over (tenant_id, status) as well was tried: PostgreSQL applies
-- MCV statistics first, that one took the tenant's clause, and the dependency then had nothing to join.)
CREATE STATISTICS IF NOT EXISTS st_export_jobs_tenant_scope (dependencies)
    ON tenant_id, destination_id, list_name FROM export_jobs;
ANALYZE export_jobs;
