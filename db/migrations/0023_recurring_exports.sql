-- Recurring exports on Temporal Schedules (issue 25, item 1).
--
-- 1. recurring_exports: a tenant's standing order to export one list to one destination on a cron expression
--    or an interval, in a timezone, between an optional start and end. This row is the source of truth; the
--    Temporal Schedule "recurring-export-<id>" is reconciled from it (created, updated, paused, deleted after
--    the row commits; re-created by a worker at start). Never deleted: a deletion is recorded (deleted_at,
--    deleted_by), so its firings and the exports they made keep their definition.
-- 2. recurring_export_firings: one row per nominal fire time of a recurring export, append-only, in
--    PostgreSQL so the history does not depend on Temporal's retention: created export X, or skipped with
--    the reason and the message people read. The primary key (tenant, recurring export, nominal time) is the
--    firing's identity: a duplicate or caught-up firing of the same time finds it and records nothing. The
--    export a firing creates commits with its firing row in one transaction, under the idempotency key
--    "recurring-export-<id>@<nominal time>" of the same create (create_original).

CREATE TABLE recurring_exports (
    tenant_id         uuid NOT NULL REFERENCES tenants (id),
    id                uuid NOT NULL,
    destination_id    uuid NOT NULL,
    list_name         text NOT NULL CHECK (length(list_name) BETWEEN 1 AND 200),
    cron              text CHECK (length(cron) BETWEEN 1 AND 200),
    interval_seconds  integer CHECK (interval_seconds BETWEEN 60 AND 31622400),  -- a minute to 366 days
    time_zone         text NOT NULL CHECK (length(time_zone) BETWEEN 1 AND 64),
    starts_at         timestamptz,
    ends_at           timestamptz,
    paused            boolean NOT NULL DEFAULT false,
    paused_reason     text CHECK (length(paused_reason) BETWEEN 1 AND 1000),
    deleted_at        timestamptz,
    deleted_by        text,
    created_by        text NOT NULL,
    created_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_by        text NOT NULL,
    updated_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    version           integer NOT NULL DEFAULT 1 CHECK (version >= 1),
    CONSTRAINT pk_recurring_exports PRIMARY KEY (tenant_id, id),
    CONSTRAINT uq_recurring_exports_id UNIQUE (id),  -- the Schedule's ID is global: recurring-export-<id>
    CONSTRAINT fk_recurring_exports_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    -- the firing's export is created by this principal: the claim's policy check evaluates it
    CONSTRAINT fk_recurring_exports_creator FOREIGN KEY (tenant_id, created_by)
        REFERENCES principals (tenant_id, name),
    CONSTRAINT ck_recurring_exports_when CHECK ((cron IS NULL) <> (interval_seconds IS NULL)),
    CONSTRAINT ck_recurring_exports_window CHECK (starts_at IS NULL OR ends_at IS NULL OR ends_at > starts_at),
    CONSTRAINT ck_recurring_exports_paused CHECK (paused OR paused_reason IS NULL),
    CONSTRAINT ck_recurring_exports_deleted CHECK ((deleted_at IS NULL) = (deleted_by IS NULL))
);
CREATE INDEX ix_recurring_exports_tenant_created ON recurring_exports (tenant_id, created_at DESC, id);

CREATE TABLE recurring_export_firings (
    tenant_id            uuid NOT NULL,
    recurring_export_id  uuid NOT NULL,
    nominal_time         timestamptz NOT NULL,
    id                   bigint GENERATED ALWAYS AS IDENTITY,
    outcome              text NOT NULL CHECK (outcome IN ('created', 'skipped')),
    reason               text CHECK (reason IN (
        'overlap', 'deliveries_paused', 'recurring_paused', 'recurring_deleted', 'catch_up', 'outside_window',
        'list_invalid', 'destination_not_found', 'destination_retired', 'contract_not_started', 'contract_ended',
        'creator_unknown', 'creator_revoked', 'creator_not_permitted')),
    message              text NOT NULL CHECK (length(message) BETWEEN 1 AND 2000),
    job_id               uuid,        -- created: the export; an overlap: the live export it waited for
    late                 boolean NOT NULL,  -- fired later than its nominal time by more than the lateness bound
    fired_by             text NOT NULL CHECK (length(fired_by) BETWEEN 1 AND 400),  -- the action's workflow
    recorded_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT pk_recurring_export_firings PRIMARY KEY (tenant_id, recurring_export_id, nominal_time),
    CONSTRAINT uq_recurring_export_firings_id UNIQUE (id),
    CONSTRAINT fk_recurring_export_firings_recurring FOREIGN KEY (tenant_id, recurring_export_id)
        REFERENCES recurring_exports (tenant_id, id),
    CONSTRAINT fk_recurring_export_firings_job FOREIGN KEY (tenant_id, job_id)
        REFERENCES export_jobs (tenant_id, id),
    CONSTRAINT ck_recurring_export_firings_outcome CHECK (
        (outcome = 'created' AND reason IS NULL AND job_id IS NOT NULL)
        OR (outcome = 'skipped' AND reason IS NOT NULL AND (job_id IS NULL OR reason = 'overlap')))
);
-- one export per firing: an export is created by at most one firing
CREATE UNIQUE INDEX uq_recurring_export_firings_job ON recurring_export_firings (job_id)
    WHERE outcome = 'created';
-- the overlap check reads the latest created firing; the console pages a recurring export's firings
CREATE INDEX ix_recurring_export_firings_created
    ON recurring_export_firings (tenant_id, recurring_export_id, id DESC) WHERE outcome = 'created';
CREATE INDEX ix_recurring_export_firings_recent ON recurring_export_firings (tenant_id, recurring_export_id, id DESC);

-- Append-only by privileges (nobody holds UPDATE or DELETE), and for the owner too.
CREATE FUNCTION recurring_export_firings_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the firings of recurring exports are history: append-only'
        USING ERRCODE = 'insufficient_privilege';
END $$;
CREATE TRIGGER tr_recurring_export_firings_append_only BEFORE UPDATE OR DELETE ON recurring_export_firings
    FOR EACH ROW EXECUTE FUNCTION recurring_export_firings_append_only();

-- A recurring export is never deleted, its identity never changes, and a deletion is final.
CREATE FUNCTION recurring_exports_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'recurring exports are never deleted; record the deletion instead'
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    IF NEW.tenant_id <> OLD.tenant_id OR NEW.id <> OLD.id OR NEW.created_by <> OLD.created_by
       OR NEW.created_at <> OLD.created_at THEN
        RAISE EXCEPTION 'recurring export % identity columns never change', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_recurring_exports_identity';
    END IF;
    IF OLD.deleted_at IS NOT NULL THEN
        RAISE EXCEPTION 'recurring export % was deleted and is final', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_recurring_exports_deleted_final';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_recurring_exports_guard BEFORE UPDATE OR DELETE ON recurring_exports
    FOR EACH ROW EXECUTE FUNCTION recurring_exports_guard();

-- -- grants ------------------------------------------------------------------------------------------

-- The API defines, edits, pauses, resumes and deletes (records the deletion of) recurring exports; the
-- firing activity runs over an exports_api pool too, because a firing creates its export through the same
-- create as POST /exports, and locks its recurring export's row FOR UPDATE to serialize its firings.
GRANT SELECT, INSERT ON recurring_exports TO exports_api;
GRANT UPDATE (destination_id, list_name, cron, interval_seconds, time_zone, starts_at, ends_at, paused,
              paused_reason, deleted_at, deleted_by, updated_by, updated_at, version)
    ON recurring_exports TO exports_api;
GRANT SELECT, INSERT ON recurring_export_firings TO exports_api;
-- A worker reconciles the Schedules at start over the same exports_api pool as its firings; no other role
-- reads or writes these tables.
