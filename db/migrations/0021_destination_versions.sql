-- Destinations as versioned contracts (issue #24, items 1 and 2).
--
-- 1. A destination has a version. Every change writes version + 1, one step at a time, and commits with its
--    record in destination_versions: who (the principal and its role), when, why, and the whole row before
--    and after. The record is append-only (INSERT and SELECT only, for every role).
-- 2. What a delivery uses is every column but a short list (the display name, the contract window, the
--    retirement, the timestamps, the versions): a column another migration adds counts as delivery terms
--    until it is listed here, so forgetting it costs a rebuild, never a delivery on terms nobody built for.
--    delivery_version is the version whose change last touched those terms. The trigger computes it, for
--    every writer: the row holds the decision.
-- 3. Cutoff 2 authorizes only the version its build read: it refuses (DestinationChanged) when
--    delivery_version moved past that version, reading the destination row FOR SHARE as it already does, so
--    an edit and cutoff 2 serialize. The job records the version cutoff 2 authorized
--    (export_jobs.destination_version, and the DeliveryAuthorized event's destination_version); the delivery
--    and recovery load that version's contract, not the row as it is now.
-- 4. The API's role (an admin's requests, service/destinations.py) creates, edits and retires destinations
--    through the statements create_destination, edit_destination_if_version and
--    retire_destination_if_active; the worker and recovery read the versions. Secrets are never stored: the
--    credential is a reference (the path of a key file on the worker host), and the column refuses key
--    material.

ALTER TABLE destinations
    ADD COLUMN version integer NOT NULL DEFAULT 1,
    ADD COLUMN delivery_version integer NOT NULL DEFAULT 1,
    ADD CONSTRAINT ck_destinations_version CHECK (version >= 1 AND delivery_version BETWEEN 1 AND version),
    -- A reference, never the key: one line, no PEM block, no OpenSSH private key.
    ADD CONSTRAINT ck_destinations_credential_ref
        CHECK (length(credential_ref) BETWEEN 1 AND 1000 AND credential_ref !~ '[[:cntrl:]]'
               AND credential_ref NOT LIKE '%-----BEGIN%' AND credential_ref NOT LIKE '%PRIVATE KEY%');

-- What a delivery of this destination uses, as JSON: the row without the columns that do not change what is
-- built, where it goes or how it is proven (cutoff 2 re-checks the contract window and the retirement by
-- themselves).
CREATE FUNCTION destination_delivery_terms(d destinations) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT to_jsonb(d) - ARRAY['name', 'created_at', 'contract_starts_on', 'contract_ends_on', 'retired_at',
                           'retired_by', 'version', 'delivery_version']
$$;

-- Each version of a destination and the change that made it. ``after`` is the whole row this change left
-- (the contract a delivery authorized at this version uses), ``before`` the whole row it replaced (NULL when
-- it was created); ``changed_fields`` names the columns that differ. A destination inserted by seeding or by
-- hand has no 'created' record; its first change records its row before, so every version stays loadable.
CREATE TABLE destination_versions (
    tenant_id uuid NOT NULL,
    destination_id uuid NOT NULL,
    version integer NOT NULL CHECK (version >= 1),
    change text NOT NULL CHECK (change IN ('created', 'edited', 'retired')),
    changed_by text NOT NULL CHECK (length(changed_by) BETWEEN 1 AND 200),
    -- the tenant role that asked ('admin'), or 'owner' for an administrator's database connection (seeding)
    changed_role text NOT NULL CHECK (changed_role IN ('admin', 'owner')),
    reason text NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    changed_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    before jsonb,
    after jsonb NOT NULL,
    changed_fields text[] NOT NULL,
    delivery_changed boolean NOT NULL,
    -- POST /destinations' Idempotency-Key and the fingerprint of its request (creation only)
    request_key text CHECK (length(request_key) BETWEEN 1 AND 200),
    request_fingerprint text,
    CONSTRAINT pk_destination_versions PRIMARY KEY (tenant_id, destination_id, version),
    CONSTRAINT fk_destination_versions_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT ck_destination_versions_before CHECK ((change = 'created') = (before IS NULL)),
    CONSTRAINT ck_destination_versions_request
        CHECK ((request_key IS NULL) = (request_fingerprint IS NULL) AND (request_key IS NULL OR change = 'created'))
);

CREATE UNIQUE INDEX uq_destination_versions_request ON destination_versions (tenant_id, request_key)
    WHERE request_key IS NOT NULL;

-- The version a job's delivery was authorized for (cutoff 2), and the DeliveryAuthorized event that names it.
ALTER TABLE export_jobs ADD COLUMN destination_version integer;
ALTER TABLE export_attempt_events ADD COLUMN destination_version integer;

-- -- the row's rules ----------------------------------------------------------------------------------

-- Replaces 0006's guard: the worker still never changes a destination and its identity never changes; now
-- also its creation time, a retirement is final, every change steps the version by one, and delivery_version
-- follows the delivery terms whoever writes the row.
CREATE OR REPLACE FUNCTION destinations_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        NEW.version := 1;
        NEW.delivery_version := 1;
        RETURN NEW;
    END IF;
    IF current_user = 'exports_worker' THEN
        RAISE EXCEPTION 'exports_worker reads destinations, it never changes them'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_destinations_writer';
    END IF;
    IF NEW.id <> OLD.id OR NEW.tenant_id <> OLD.tenant_id OR NEW.created_at IS DISTINCT FROM OLD.created_at THEN
        RAISE EXCEPTION 'destination % never changes its identity', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_identity';
    END IF;
    IF OLD.retired_at IS NOT NULL
       AND (NEW.retired_at IS DISTINCT FROM OLD.retired_at OR NEW.retired_by IS DISTINCT FROM OLD.retired_by) THEN
        RAISE EXCEPTION 'destination % was retired on %: a retirement is final', OLD.id, OLD.retired_at
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_retirement_final';
    END IF;
    IF NEW.version IS DISTINCT FROM OLD.version + 1 THEN
        RAISE EXCEPTION 'destination % is at version %: a change writes version %, one step at a time',
                OLD.id, OLD.version, OLD.version + 1
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_version_step';
    END IF;
    NEW.delivery_version := CASE
        WHEN destination_delivery_terms(NEW) IS DISTINCT FROM destination_delivery_terms(OLD) THEN NEW.version
        ELSE OLD.delivery_version END;
    RETURN NEW;
END $$;

DROP TRIGGER tr_destinations_guard ON destinations;
CREATE TRIGGER tr_destinations_guard BEFORE INSERT OR UPDATE ON destinations
    FOR EACH ROW EXECUTE FUNCTION destinations_guard();

-- A change commits with its record, for every writer (the owner's repairs included): the statements insert
-- it in another CTE of the same statement, which a BEFORE trigger cannot see, so this one runs at commit.
CREATE FUNCTION destinations_change_recorded() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM destination_versions v
        WHERE v.tenant_id = NEW.tenant_id AND v.destination_id = NEW.id AND v.version = NEW.version) THEN
        RAISE EXCEPTION 'destination %: version % must commit with its record in destination_versions',
                NEW.id, NEW.version
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_change_recorded';
    END IF;
    RETURN NULL;
END $$;

CREATE CONSTRAINT TRIGGER tr_destinations_change_recorded
    AFTER UPDATE ON destinations
    DEFERRABLE INITIALLY DEFERRED
    FOR EACH ROW EXECUTE FUNCTION destinations_change_recorded();

-- A job's authorized destination version is written by cutoff 2 (Running -> Delivering) and never again.
CREATE FUNCTION export_jobs_destination_version_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT (OLD.status = 'Running' AND NEW.status = 'Delivering') THEN
        RAISE EXCEPTION 'export %: the destination version is recorded by cutoff 2 and never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_destination_version';
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER tr_export_jobs_destination_version
    BEFORE UPDATE OF destination_version ON export_jobs
    FOR EACH ROW
    WHEN (NEW.destination_version IS DISTINCT FROM OLD.destination_version)
    EXECUTE FUNCTION export_jobs_destination_version_guard();

-- -- grants ---------------------------------------------------------------------------------------------

-- The API (an admin's requests) creates a destination, changes the columns an admin may change, and records
-- each version. A column another migration adds is an admin's to change once it is granted here too; the
-- identity, created_at and delivery_version are nobody's to write (the trigger sets delivery_version).
GRANT INSERT ON destinations TO exports_api;
GRANT UPDATE (name, host, port, username, host_key, credential_ref, remote_dir, name_and_size_identify,
              hash_evidence, ack_suffix, max_write_request, temporary_files, contract_starts_on,
              contract_ends_on, retired_at, retired_by, version)
    ON destinations TO exports_api;
GRANT SELECT, INSERT ON destination_versions TO exports_api;
-- The delivery and recovery load the version a job was authorized for.
GRANT SELECT ON destination_versions TO exports_worker, exports_recovery;
-- Cutoff 2 records the version it authorized.
GRANT UPDATE (destination_version) ON export_jobs TO exports_worker;
