-- Issue 26 item 5: a console that stays honest at ten million exports.
--
-- Every filter of the export list gets an index that hands its rows over in the list's own order (a tenant's
-- exports newest first, keyset on (created_at, id)) for each status, so a page reads about as many index
-- entries as it shows, whatever the filter matches: a status, a destination, a list (one index scan per
-- status, merged; the reconciler's queue of OutcomeUnknown exports, oldest first, is the status's index read
-- backwards). An ID prefix is a range of the primary key and needs nothing new. Before this, a page filtered
-- on a rare status or list walked the tenant's whole history through ix_export_jobs_tenant_created_id,
-- discarding row after row.
--
-- IF NOT EXISTS on purpose: a migration runs in one transaction (db/migrate.py), where CREATE INDEX
-- CONCURRENTLY is not allowed, and a plain CREATE INDEX holds off every write to export_jobs while it builds
-- (tens of seconds per index at ten million exports: docs/benchmarks.md). On a large live table build them
-- first, outside the migration, with the same names and CREATE INDEX CONCURRENTLY (docs/operations.md), and
-- this finds them.
-- A concurrent build that failed leaves an INVALID index of that name, which IF NOT EXISTS would take for
-- done: refuse it instead.
DO $$
DECLARE
    invalid text;
BEGIN
    SELECT string_agg(c.relname, ', ') INTO invalid
    FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
    WHERE c.relname IN ('ix_export_jobs_tenant_status_created', 'ix_export_jobs_tenant_destination_status',
                        'ix_export_jobs_tenant_list_status')
      AND NOT i.indisvalid;
    IF invalid IS NOT NULL THEN
        RAISE EXCEPTION 'index % exists but is INVALID (a CREATE INDEX CONCURRENTLY that failed): drop it and '
                        'build it again, then migrate', invalid;
    END IF;
END $$;

CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_status_created
    ON export_jobs (tenant_id, status, created_at DESC, id DESC);
-- A destination's and a list's carry the status before the time, so a destination's exports of one status
-- are read, and counted, as one range of the index at any size: its page merges one ordered scan per status
-- (all of them when no status is asked for), its count by status reads that status's entries alone, from
-- the index. (With the status after the time, counting a middling destination's rarer statuses walked its
-- half a million entries once per status at ten million exports, past the bound.) The list's also carries
-- the destination, so one partner's list is counted from the index alone too.
CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_destination_status
    ON export_jobs (tenant_id, destination_id, status, created_at DESC, id DESC);
-- Also the console's list names: a skip scan over it reads one entry per name (tenant_list_names).
CREATE INDEX IF NOT EXISTS ix_export_jobs_tenant_list_status
    ON export_jobs (tenant_id, list_name, status, created_at DESC, id DESC) INCLUDE (destination_id);

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
