-- Several pinned host keys, a partner's session limit held as slots, and the one narrow way the worker may
-- pause a destination (issue #24 items 3-4, issue #25 item 3).
--
-- 1. host_keys: every host key the destination trusts (1 to 10), so a partner's key rotation can overlap: an
--    admin pins the new key, deliveries go on while both are trusted, then the old one is removed. Each is
--    a recorded change (a new version through the statements of 0021), and a delivery term: a change during
--    a build gives the attempt back at cutoff 2. host_key stays, as the first of them (older readers, the
--    seeding code and the benchmarks write it): a trigger keeps the two together. An edit of host_key alone
--    pins that one key instead of the others; a destination never has none.
-- 2. max_sessions: how many SFTP sessions the partner allows at once (NULL: no limit). Not a delivery term
--    (changing it rebuilds nothing): what it bounds is how many sessions are open, not what a file is.
-- 3. destination_session_slots: a destination's limit as rows, slot 1..max_sessions (a trigger adds the rows
--    when the limit is set or raised). A session with the partner is opened only under a slot its holder
--    took with take_session_slot (db/queries.sql), a conditional statement. An attempt's slot names its job
--    and is held while that attempt holds its job Running or Delivering: the attempt's terminal write, a
--    give-back, and recovery's takeover each end it in their own statement, by changing the row, so no
--    statement has to remember to release it and none can leak it. Any other holder (recovery's listing of
--    an OutcomeUnknown, a cleanup, a connection test) holds it until it releases it or until expires_at.
-- 4. pause_destination_for_partner: the worker, which may not change switches (0006, 0019), pauses one
--    destination whose server presented a host key nobody pinned, or refused our login, with that reason.
--    Only a pause, only of an enabled destination switch, only with such a reason, and its history row;
--    never a resume. And only while the destination still pins what the worker checked: an admin who changed
--    its delivery terms since (a new key, a new host) is not second-guessed. SECURITY DEFINER, owned by
--    exports_api (the role that pauses destinations).

-- -- 1. several pinned host keys ---------------------------------------------------------------------------

-- One to ten public key lines, none twice, none empty or private (the service checks each is a key).
CREATE FUNCTION host_keys_ok(keys text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(keys) BETWEEN 1 AND 10
   AND array_position(keys, NULL) IS NULL
   AND (SELECT count(DISTINCT k) FROM unnest(keys) AS k) = cardinality(keys)
   AND (SELECT bool_and(length(k) BETWEEN 1 AND 16600 AND k !~ '[[:cntrl:]]' AND upper(k) NOT LIKE '%PRIVATE%')
        FROM unnest(keys) AS k)
$$;

ALTER TABLE destinations ADD COLUMN host_keys text[];

-- The backfill is no change of any contract: every destination trusts the one key it pinned, as before. The
-- guard (every UPDATE is version + 1, recorded) is not for it.
ALTER TABLE destinations DISABLE TRIGGER tr_destinations_guard;
ALTER TABLE destinations DISABLE TRIGGER tr_destinations_change_recorded;
UPDATE destinations SET host_keys = ARRAY[host_key];
ALTER TABLE destinations ENABLE TRIGGER tr_destinations_guard;
ALTER TABLE destinations ENABLE TRIGGER tr_destinations_change_recorded;

ALTER TABLE destinations
    ALTER COLUMN host_keys SET NOT NULL,
    ADD CONSTRAINT ck_destinations_host_keys CHECK (host_keys_ok(host_keys) AND host_key = host_keys[1]);

-- host_key is the first pinned key. A writer that names host_keys sets it; one that names only host_key (an
-- insert by seeding, an edit of host_key) pins that key alone. Removing the last key is refused here, with
-- the constraint's name, before host_key would be left without a value.
CREATE FUNCTION destinations_host_keys() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        IF NEW.host_keys IS NULL THEN
            NEW.host_keys := ARRAY[NEW.host_key];
        END IF;
    ELSIF NEW.host_keys IS NOT DISTINCT FROM OLD.host_keys AND NEW.host_key IS DISTINCT FROM OLD.host_key THEN
        NEW.host_keys := ARRAY[NEW.host_key];
    END IF;
    IF coalesce(cardinality(NEW.host_keys), 0) = 0 THEN
        RAISE EXCEPTION 'destination % must keep at least one pinned host key', NEW.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destinations_host_keys';
    END IF;
    NEW.host_key := NEW.host_keys[1];
    RETURN NEW;
END $$;

CREATE TRIGGER tr_destinations_host_keys BEFORE INSERT OR UPDATE ON destinations
    FOR EACH ROW EXECUTE FUNCTION destinations_host_keys();

-- -- 2. the partner's session limit, not a delivery term -------------------------------------------------

ALTER TABLE destinations
    ADD COLUMN max_sessions integer CONSTRAINT ck_destinations_max_sessions CHECK (max_sessions BETWEEN 1 AND 100);

-- Replaces 0021's: the session limit joins the columns that do not change what is built, where it goes or how
-- it is proven.
CREATE OR REPLACE FUNCTION destination_delivery_terms(d destinations) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT to_jsonb(d) - ARRAY['name', 'created_at', 'contract_starts_on', 'contract_ends_on', 'retired_at',
                           'retired_by', 'version', 'delivery_version', 'max_sessions']
$$;

-- -- 3. the slots ---------------------------------------------------------------------------------------

CREATE TABLE destination_session_slots (
    tenant_id       uuid NOT NULL,
    destination_id  uuid NOT NULL,
    slot            smallint NOT NULL CHECK (slot >= 1),
    -- who holds it: an attempt's ID (with its job), or another holder's own ID; NULL when released
    holder          uuid,
    job_id          uuid,
    purpose         text CHECK (purpose IN ('attempt', 'recovery', 'cleanup', 'connection_test')),
    taken_at        timestamptz,
    -- a hold that is not an attempt's ends by itself then, if its holder never released it
    expires_at      timestamptz,
    CONSTRAINT pk_destination_session_slots PRIMARY KEY (destination_id, slot),
    CONSTRAINT fk_destination_session_slots_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT ck_destination_session_slots_holder CHECK (
        (holder IS NULL AND job_id IS NULL AND purpose IS NULL AND taken_at IS NULL AND expires_at IS NULL)
        OR (holder IS NOT NULL AND purpose = 'attempt' AND job_id IS NOT NULL AND taken_at IS NOT NULL
            AND expires_at IS NULL)
        OR (holder IS NOT NULL AND purpose <> 'attempt' AND job_id IS NULL AND taken_at IS NOT NULL
            AND expires_at IS NOT NULL))
);
CREATE INDEX ix_destination_session_slots_holder ON destination_session_slots (holder) WHERE holder IS NOT NULL;

-- Whether slot ``s`` is held now, as the statement that asks sees it. An attempt's slot is held while that
-- attempt holds its job Running or Delivering (an expired lease included: its session may still be open
-- until recovery takes it over); another holder's until released or until expires_at. A slot taken since
-- the asking statement began counts as held whatever its job shows: that job's claim may be newer than the
-- statement's snapshot, which would take it for ended (a take that began earlier found its claim committed
-- before it, and so before this statement's snapshot). STABLE: its query sees the caller's snapshot.
CREATE FUNCTION session_slot_held(s destination_session_slots) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT coalesce(
    s.holder IS NOT NULL
    AND (coalesce(s.expires_at > statement_timestamp(), false)
         OR (s.job_id IS NOT NULL
             AND (s.taken_at >= statement_timestamp()
                  OR EXISTS (SELECT 1 FROM export_jobs j
                             WHERE j.id = s.job_id AND j.attempt_id = s.holder
                               AND j.status IN ('Running', 'Delivering'))))),
    false)
$$;

-- Slot rows 1..max_sessions, added when a limit is set or raised (a lowered limit leaves the rows above it,
-- which no take uses any more). Runs as the writer of the destination: the API's role and the owner.
CREATE FUNCTION destinations_session_slots() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.max_sessions IS NOT NULL THEN
        INSERT INTO destination_session_slots (tenant_id, destination_id, slot)
        SELECT NEW.tenant_id, NEW.id, g FROM generate_series(1, NEW.max_sessions) AS g
        ON CONFLICT ON CONSTRAINT pk_destination_session_slots DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tr_destinations_session_slots AFTER INSERT OR UPDATE OF max_sessions ON destinations
    FOR EACH ROW EXECUTE FUNCTION destinations_session_slots();

-- -- 4. the worker's pause of a destination that must not be trusted ------------------------------------

CREATE FUNCTION pause_destination_for_partner(
    p_tenant_id uuid, p_destination_id uuid, p_version integer, p_reason text, p_changed_by text)
    RETURNS TABLE (was_enabled boolean, paused boolean, destination_changed boolean)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    AS $$
DECLARE
    enabled_now boolean;
    changed boolean;
BEGIN
    IF p_reason IS NULL OR p_reason !~ '^(host key changed|authentication refused): ' OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a partner pause says why: "host key changed: ..." or "authentication refused: ..."'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_partner_pause_reason';
    END IF;
    -- The row lock a pause takes: claims and cutoff 2 read it FOR SHARE, so they see this pause once it commits.
    SELECT s.enabled INTO enabled_now FROM delivery_switches s
    WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id AND s.destination_id = p_destination_id
    FOR UPDATE;
    -- The destination as the worker checked it (version p_version's delivery terms): read FOR SHARE, so an
    -- admin's edit (a key pinned meanwhile) and this pause serialize; an edit first means no pause.
    SELECT d.delivery_version > p_version INTO changed FROM destinations d
    WHERE d.tenant_id = p_tenant_id AND d.id = p_destination_id
    FOR SHARE;
    IF enabled_now IS NOT TRUE OR changed IS NOT FALSE THEN
        -- paused already (or never enabled: no row), by someone else, for their reason, which stays; or the
        -- destination's terms changed since the version checked (or it is gone)
        RETURN QUERY SELECT enabled_now, false, changed IS NOT FALSE;
        RETURN;
    END IF;
    UPDATE delivery_switches
    SET enabled = false, reason = p_reason, changed_by = p_changed_by, changed_at = clock_timestamp()
    WHERE scope = 'destination' AND tenant_id = p_tenant_id AND destination_id = p_destination_id;
    INSERT INTO delivery_switch_changes (scope, tenant_id, destination_id, enabled, was_enabled, reason,
                                         changed_by, changed_at)
    VALUES ('destination', p_tenant_id, p_destination_id, false, true, p_reason, p_changed_by, clock_timestamp());
    RETURN QUERY SELECT true, true, false;
END $$;

ALTER FUNCTION pause_destination_for_partner(uuid, uuid, integer, text, text) OWNER TO exports_api;
REVOKE ALL ON FUNCTION pause_destination_for_partner(uuid, uuid, integer, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION pause_destination_for_partner(uuid, uuid, integer, text, text) TO exports_worker;

-- -- grants ---------------------------------------------------------------------------------------------

-- An admin pins and removes keys and sets the limit (each a recorded version, 0021's statements); the slot
-- rows the limit needs are inserted by the trigger, as the writer.
GRANT UPDATE (host_keys, max_sessions) ON destinations TO exports_api;
GRANT SELECT, INSERT ON destination_session_slots TO exports_api;
-- The attempts and recovery take and release slots; nobody deletes one.
GRANT SELECT, UPDATE (holder, job_id, purpose, taken_at, expires_at)
    ON destination_session_slots TO exports_worker, exports_recovery;
REVOKE ALL ON FUNCTION session_slot_held(destination_session_slots) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION session_slot_held(destination_session_slots)
    TO exports_api, exports_worker, exports_recovery;
