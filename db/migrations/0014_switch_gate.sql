-- The three-scope delivery gate stated once (issue 22): every switch of a job's scope (global, its tenant,
-- its destination) exists and is enabled; a missing row is a paused scope (004, fail-closed). Until now the
-- policy read, the claim, cutoff 2, the sweeper and a resume's wake-up each wrote the three checks out.
-- Two variants of one rule: the claim and cutoff 2 read the three rows FOR SHARE (lock_delivery_scope), so
-- a concurrent pause waits for them or is seen by them (a locking read returns the latest committed version
-- after any wait), which a non-locking read with the statement's snapshot would not; the others only read.
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

-- VOLATILE, as it must be to lock (a non-volatile function may not take row locks): each read takes its own
-- snapshot, which changes nothing here, since a FOR SHARE read returns the latest committed row after any
-- wait. The locks are held to the end of the caller's transaction, as the statement's own FOR SHARE were.
CREATE FUNCTION lock_delivery_scope(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    global_enabled boolean;
    tenant_enabled boolean;
    destination_enabled boolean;
BEGIN
    -- each found through uq_delivery_switches_scope; no row leaves its variable null
    SELECT s.enabled INTO global_enabled FROM delivery_switches s WHERE s.scope = 'global' FOR SHARE;
    SELECT s.enabled INTO tenant_enabled FROM delivery_switches s
    WHERE s.scope = 'tenant' AND s.tenant_id = p_tenant_id FOR SHARE;
    SELECT s.enabled INTO destination_enabled FROM delivery_switches s
    WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id AND s.destination_id = p_destination_id
    FOR SHARE;
    -- a missing row is a paused scope
    RETURN coalesce(global_enabled, false) AND coalesce(tenant_enabled, false)
           AND coalesce(destination_enabled, false);
END
$$;

REVOKE ALL ON FUNCTION lock_delivery_scope(uuid, uuid) FROM PUBLIC;
-- the worker's claim and cutoff 2 (its UPDATE (scope) grant on delivery_switches is what FOR SHARE needs)
GRANT EXECUTE ON FUNCTION lock_delivery_scope(uuid, uuid) TO exports_worker;
