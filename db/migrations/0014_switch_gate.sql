-- The three-scope delivery gate stated once (issue 22): every switch of a job's scope (global, its tenant,
-- its destination) exists and is enabled; a missing row is a paused scope (004, fail-closed). Until now the
-- policy read, the sweeper and a resume's wake-up each wrote the three checks out. The claim and cutoff 2
-- keep their own reads of the three rows: they take them FOR SHARE, so a concurrent pause waits for them or
-- is seen by them (the locking reads return the latest committed versions), which a non-locking verdict
-- read with the statement's snapshot would not.
--
-- Three scalar subqueries, one row each by uq_delivery_switches_scope, not EXISTS joins: as per-row filters
-- the sweeper and a resume walk ix_export_jobs_woken in order and stop at the batch.
--
-- SECURITY INVOKER (the default): the caller's own SELECT on delivery_switches decides whether it may read
-- the switches, so the function opens no path around the grants; only the roles whose statements use it may
-- call it.

-- STABLE, not VOLATILE: the verdict is read with the calling statement's snapshot, like the subqueries it
-- replaces, rather than a fresh snapshot per call (and per row) under READ COMMITTED.
CREATE FUNCTION delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.enabled FROM delivery_switches s WHERE s.scope = 'global'), false)
           AND coalesce((SELECT s.enabled FROM delivery_switches s
                         WHERE s.scope = 'tenant' AND s.tenant_id = p_tenant_id), false)
           AND coalesce((SELECT s.enabled FROM delivery_switches s
                         WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id
                           AND s.destination_id = p_destination_id), false)
$$;

REVOKE ALL ON FUNCTION delivery_scope_open(uuid, uuid) FROM PUBLIC;
-- the worker's policy read and sweeper, the API's resume wake-up
GRANT EXECUTE ON FUNCTION delivery_scope_open(uuid, uuid) TO exports_worker, exports_api;
