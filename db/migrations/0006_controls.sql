-- Operator controls (issue 9, parts 1 and 2): the policy check as the seeds mean it, and fail-closed
-- kill switches.
--
-- 1. Destinations carry a contract window (UTC days, both ends inclusive; no end means open-ended) and
--    can be retired. Existing destinations get a window that starts on the day they were created.
-- 2. Principals: the people of a tenant, each with one role that can be revoked, and optionally the lists
--    they may export (NULL: every list of the tenant). An API token authenticates as a principal: it
--    references its principal row and is honored only while that principal is not revoked and holds the
--    token's role. Existing token holders and the creators of existing exports become principals, so an
--    upgrade rejects nothing that was allowed before.
-- 3. A Rejected export carries a reason code from a fixed list (rejection_code) beside the message people
--    read (rejection_reason); every Rejected row has both.
-- 4. Delivery switches: global, per tenant, per destination. A claim or cutoff 2 proceeds only when all
--    three rows of its job's scope exist and are enabled, read FOR SHARE inside those statements, so a
--    switch change and the decision serialize. A missing row is a paused scope (fail-closed): new tenants
--    and destinations start paused unless created enabled. The migration enables the global switch and
--    every existing tenant and destination, so an upgrade pauses nothing. Every change is also appended
--    to delivery_switch_changes (who, what, when, why), which nobody may update or delete.
-- 5. Fixes 0005's state-machine guard, whose cached generic plan refused every status change by a role
--    that may not read outcome_corrections after five uses on a connection (see below).

-- -- 1. contracts and retirement ---------------------------------------------------------------------

ALTER TABLE destinations
    ADD COLUMN contract_starts_on date NOT NULL DEFAULT ((clock_timestamp() AT TIME ZONE 'UTC')::date),
    ADD COLUMN contract_ends_on date,
    ADD COLUMN retired_at timestamptz,
    ADD COLUMN retired_by text,
    ADD CONSTRAINT ck_destinations_contract
        CHECK (contract_ends_on IS NULL OR contract_ends_on >= contract_starts_on),
    ADD CONSTRAINT ck_destinations_retired CHECK ((retired_at IS NULL) = (retired_by IS NULL));

UPDATE destinations SET contract_starts_on = (created_at AT TIME ZONE 'UTC')::date;

-- -- 2. principals -----------------------------------------------------------------------------------

CREATE TABLE principals (
    tenant_id     uuid NOT NULL REFERENCES tenants (id),
    name          text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    role          text NOT NULL CHECK (role IN ('operator', 'reconciler')),
    export_lists  text[],          -- the lists this principal may export; NULL: every list of the tenant
    revoked_at    timestamptz,
    revoked_by    text,
    created_at    timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_principals PRIMARY KEY (tenant_id, name),
    CONSTRAINT ck_principals_revoked CHECK ((revoked_at IS NULL) = (revoked_by IS NULL))
);

-- A name that holds tokens of both roles keeps the reconciler's (its operator tokens stop working).
INSERT INTO principals (tenant_id, name, role)
SELECT DISTINCT ON (tenant_id, principal) tenant_id, principal, role
FROM api_tokens
ORDER BY tenant_id, principal, (role = 'reconciler') DESC;

INSERT INTO principals (tenant_id, name, role)
SELECT DISTINCT tenant_id, created_by, 'operator' FROM export_jobs
WHERE length(created_by) BETWEEN 1 AND 200
ON CONFLICT (tenant_id, name) DO NOTHING;

ALTER TABLE api_tokens
    ADD CONSTRAINT fk_api_tokens_principal FOREIGN KEY (tenant_id, principal)
        REFERENCES principals (tenant_id, name);

-- -- 3. rejection codes ------------------------------------------------------------------------------

ALTER TABLE export_jobs
    ADD COLUMN rejection_code text CONSTRAINT ck_export_jobs_rejection_code CHECK (rejection_code IN (
        'list_invalid', 'destination_not_found', 'destination_retired', 'contract_not_started',
        'contract_ended', 'creator_unknown', 'creator_revoked', 'creator_not_permitted', 'list_missing'));

-- Rejections recorded before codes existed were all list-name checks. The guard trigger keeps Rejected
-- rows final, so it is set aside for this one backfill of a column that did not exist.
ALTER TABLE export_jobs DISABLE TRIGGER tr_export_jobs_guard;
UPDATE export_jobs SET rejection_code = 'list_invalid',
    rejection_reason = coalesce(rejection_reason, 'Rejected by the policy check')
WHERE status = 'Rejected';
ALTER TABLE export_jobs ENABLE TRIGGER tr_export_jobs_guard;

ALTER TABLE export_jobs
    ADD CONSTRAINT ck_export_jobs_rejection CHECK (
        (status = 'Rejected') = (rejection_code IS NOT NULL)
        AND (rejection_code IS NULL OR rejection_reason IS NOT NULL));

-- -- 4. delivery switches ----------------------------------------------------------------------------

CREATE TABLE delivery_switches (
    scope           text NOT NULL CHECK (scope IN ('global', 'tenant', 'destination')),
    tenant_id       uuid REFERENCES tenants (id),
    destination_id  uuid,
    enabled         boolean NOT NULL,      -- deliveries may run in this scope
    reason          text NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    changed_by      text NOT NULL CHECK (length(changed_by) BETWEEN 1 AND 200),
    changed_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT ck_delivery_switches_scope CHECK (
        (scope = 'global' AND tenant_id IS NULL AND destination_id IS NULL)
        OR (scope = 'tenant' AND tenant_id IS NOT NULL AND destination_id IS NULL)
        OR (scope = 'destination' AND tenant_id IS NOT NULL AND destination_id IS NOT NULL)),
    CONSTRAINT fk_delivery_switches_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT uq_delivery_switches_scope UNIQUE NULLS NOT DISTINCT (scope, tenant_id, destination_id)
);

-- Append-only: every change, with who, when and why, and what the switch said before (NULL: no row).
CREATE TABLE delivery_switch_changes (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope           text NOT NULL,
    tenant_id       uuid,
    destination_id  uuid,
    enabled         boolean NOT NULL,
    was_enabled     boolean,
    reason          text NOT NULL,
    changed_by      text NOT NULL,
    changed_at      timestamptz NOT NULL
);
CREATE INDEX ix_delivery_switch_changes_tenant ON delivery_switch_changes (tenant_id, id);

INSERT INTO delivery_switches (scope, enabled, reason, changed_by)
VALUES ('global', true, 'enabled at installation (migration 0006)', 'migration');
INSERT INTO delivery_switches (scope, tenant_id, enabled, reason, changed_by)
SELECT 'tenant', id, true, 'existing tenant, enabled by migration 0006', 'migration' FROM tenants;
INSERT INTO delivery_switches (scope, tenant_id, destination_id, enabled, reason, changed_by)
SELECT 'destination', tenant_id, id, true, 'existing destination, enabled by migration 0006', 'migration'
FROM destinations;
INSERT INTO delivery_switch_changes (scope, tenant_id, destination_id, enabled, was_enabled, reason, changed_by,
                                     changed_at)
SELECT scope, tenant_id, destination_id, enabled, NULL, reason, changed_by, changed_at FROM delivery_switches;

-- -- 5. the state machine's guard, fixed --------------------------------------------------------------

-- 0005's guard evaluated "OLD.status IN ('Completed', 'Failed') AND NOT EXISTS (SELECT ... FROM
-- outcome_corrections ...)" as one plpgsql expression. Once its cached plan turns generic (after five
-- executions on a connection, with statistics), the plan keeps the subquery and PostgreSQL checks SELECT on
-- outcome_corrections before running it: every status change by exports_worker or exports_recovery, which
-- may not read that table, then failed with "permission denied". Same rules, the subquery nested.
CREATE OR REPLACE FUNCTION export_jobs_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    edge_roles text[];
BEGIN
    IF NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.delivery_key <> OLD.delivery_key
       OR NEW.replaces_job_id IS DISTINCT FROM OLD.replaces_job_id OR NEW.created_by <> OLD.created_by THEN
        RAISE EXCEPTION 'export % identity columns never change', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_identity';
    END IF;

    IF OLD.status IN ('Canceled', 'Rejected', 'Stopped') THEN
        RAISE EXCEPTION 'export % is % and final', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND current_user <> 'exports_reconciler' THEN
        RAISE EXCEPTION 'export % is a recorded %; only exports_reconciler may correct it', OLD.id, OLD.status
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_recorded_outcome';
    END IF;

    IF NEW.status IS DISTINCT FROM OLD.status THEN
        SELECT e.roles INTO edge_roles FROM export_status_edges e
        WHERE e.from_status = OLD.status AND e.to_status = NEW.status;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'export %: % -> % is not an edge of the state diagram', OLD.id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
        END IF;
        IF NOT current_user = ANY (edge_roles) THEN
            RAISE EXCEPTION 'export %: % -> % is taken only by %, not by %',
                    OLD.id, OLD.status, NEW.status, edge_roles, current_user
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_edge_role';
        END IF;
        -- A recorded outcome changes once per attempt, along the correction recorded for it. Nested, not
        -- "AND NOT EXISTS": as one expression its cached generic plan keeps the subquery, and PostgreSQL
        -- checks the table privilege of every plan before running it, so after five uses on a connection
        -- every status change by a role that may not read outcome_corrections failed (0006 fixes 0005).
        IF OLD.status IN ('Completed', 'Failed') THEN
            IF NOT EXISTS (
                SELECT 1 FROM outcome_corrections c
                WHERE c.job_id = OLD.id AND c.attempt_id = OLD.attempt_id
                  AND c.from_status = OLD.status AND c.to_status = NEW.status) THEN
                RAISE EXCEPTION 'export %: % -> % needs its recorded correction', OLD.id, OLD.status, NEW.status
                    USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_correction';
            END IF;
        END IF;
    END IF;

    IF OLD.status IN ('Completed', 'Failed') AND NEW.status = OLD.status THEN
        RAISE EXCEPTION 'export % is a recorded %; a correction changes its status', OLD.id, OLD.status
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    RETURN NEW;
END $$;

-- -- grants ------------------------------------------------------------------------------------------

-- The worker: the policy's facts, the switches its claim and cutoff 2 read, the rejection code.
GRANT SELECT ON principals, delivery_switches TO exports_worker;
GRANT UPDATE (rejection_code) ON export_jobs TO exports_worker;

-- The claim and cutoff 2 read the switch rows (and cutoff 2 the destination row) FOR SHARE, which
-- PostgreSQL allows only to a role with an UPDATE privilege on some column of the table. The worker gets
-- one on an identity column of each, for the lock alone; these triggers refuse every UPDATE it could make
-- with it, and every change of an identity column by anyone.
GRANT UPDATE (scope) ON delivery_switches TO exports_worker;
GRANT UPDATE (id) ON destinations TO exports_worker;

CREATE FUNCTION delivery_switches_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_user = 'exports_worker' THEN
        RAISE EXCEPTION 'exports_worker reads delivery switches, it never changes them'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_switches_writer';
    END IF;
    IF NEW.scope <> OLD.scope OR NEW.tenant_id IS DISTINCT FROM OLD.tenant_id
       OR NEW.destination_id IS DISTINCT FROM OLD.destination_id THEN
        RAISE EXCEPTION 'a delivery switch never changes its scope'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_delivery_switches_identity';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_delivery_switches_guard BEFORE UPDATE ON delivery_switches
    FOR EACH ROW EXECUTE FUNCTION delivery_switches_guard();

CREATE FUNCTION destinations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF current_user = 'exports_worker' THEN
        RAISE EXCEPTION 'exports_worker reads destinations, it never changes them'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_destinations_writer';
    END IF;
    IF NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id THEN
        RAISE EXCEPTION 'destination % never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_identity';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_destinations_guard BEFORE UPDATE ON destinations
    FOR EACH ROW EXECUTE FUNCTION destinations_guard();

-- Nothing rewrites or deletes the history of switch changes, the owner's scripts included.
CREATE FUNCTION delivery_switch_changes_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the history of switch changes is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER tr_delivery_switch_changes_append_only BEFORE UPDATE OR DELETE ON delivery_switch_changes
    FOR EACH ROW EXECUTE FUNCTION delivery_switch_changes_append_only();

-- The API (and the command line, which runs as it): tokens resolve through principals; operators pause and
-- resume, with the change appended to the history in the same statement; a resume re-wakes Queued jobs
-- (woken_at and the outbox, already granted).
GRANT SELECT ON principals TO exports_api;
GRANT SELECT, INSERT ON delivery_switches TO exports_api;
GRANT UPDATE (enabled, reason, changed_by, changed_at) ON delivery_switches TO exports_api;
GRANT SELECT, INSERT ON delivery_switch_changes TO exports_api;
