-- Where the pinned host keys (0029) meet the two-person rule (0032), written after both were merged.
--
-- 1. Pinning a host key is an edit of host_keys since 0029 (host_key follows as its first), so host_keys is one
--    of the fields that take two admins: without it one admin could trust a new key by adding it second.
--    Because each of host_key and host_keys sets the other (destinations_host_keys), an approval of either one
--    approves the change: the guard accepts one that names the values of the changed two-person fields, less
--    the one derived from the other. Removing pinned keys (the keys after a part of the keys before) trusts
--    less, never more, and takes one admin.
-- 2. The worker's pause of a destination whose server presented a key nobody pinned, or refused our login, is
--    an owned pause (0032's delivery_pauses) of kind 'host_key' (a changed key) or of the worker's own
--    (a refused login), never a switch turned off: resuming it is then releasing a pause someone else set, or
--    that a host-key change tripped, which takes an approval (delivery_pauses' guard). 0029's version turned
--    the switch off, which any one operator's resume turned on again.

CREATE OR REPLACE FUNCTION two_person_destination_fields() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['host', 'port', 'username', 'credential_ref', 'host_key', 'host_keys', 'pgp_recipient_keys',
                 'pgp_signing_key_ref']
$$;

CREATE OR REPLACE FUNCTION destination_versions_approved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- each field of this change that takes two people, with the value it sets
    wanted jsonb := jsonb_build_object('changes', (
        SELECT coalesce(jsonb_object_agg(f.name, NEW.after -> f.name), '{}'::jsonb)
        FROM unnest(NEW.changed_fields) AS f(name)
        WHERE f.name = ANY (two_person_destination_fields())));
    actions text[] := ARRAY['change_destination', 'pin_host_key'];
BEGIN
    -- Removing pinned keys, and nothing else that takes two: trusting less takes one admin.
    IF (SELECT array_agg(f ORDER BY f) FROM unnest(NEW.changed_fields) AS f
        WHERE f = ANY (two_person_destination_fields())) <@ ARRAY['host_key', 'host_keys']
       AND (NEW.before -> 'host_keys') @> (NEW.after -> 'host_keys') THEN
        RETURN NEW;
    END IF;
    IF NOT (approved_action(NEW.tenant_id, actions, NEW.destination_id::text, NEW.changed_by, wanted)
            -- host_key follows host_keys[1], and host_key alone pins that key alone: either approves both
            OR (wanted -> 'changes' ? 'host_keys'
                AND approved_action(NEW.tenant_id, actions, NEW.destination_id::text, NEW.changed_by,
                                    jsonb_build_object('changes', (wanted -> 'changes') - 'host_key')))
            OR (wanted -> 'changes' ? 'host_key'
                AND approved_action(NEW.tenant_id, actions, NEW.destination_id::text, NEW.changed_by,
                                    jsonb_build_object('changes', (wanted -> 'changes') - 'host_keys')))) THEN
        RAISE EXCEPTION 'destination %: changing % needs another admin''s approval of these values, decided by %',
                NEW.destination_id, NEW.changed_fields, NEW.changed_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destination_versions_approved';
    END IF;
    RETURN NEW;
END $$;

CREATE OR REPLACE FUNCTION pause_destination_for_partner(
    p_tenant_id uuid, p_destination_id uuid, p_version integer, p_reason text, p_changed_by text)
    RETURNS TABLE (was_enabled boolean, paused boolean, destination_changed boolean)
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public, pg_temp
    AS $$
DECLARE
    open_now boolean;
    changed boolean;
    pause_id uuid;
BEGIN
    IF p_reason IS NULL OR p_reason !~ '^(host key changed|authentication refused): ' OR length(p_reason) > 1000 THEN
        RAISE EXCEPTION 'a partner pause says why: "host key changed: ..." or "authentication refused: ..."'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_partner_pause_reason';
    END IF;
    -- The row lock a pause takes: claims and cutoff 2 read it FOR SHARE, so they see this pause once it commits.
    SELECT s.enabled AND NOT coalesce(s.held_until > statement_timestamp(), false) INTO open_now
    FROM delivery_switches s
    WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id AND s.destination_id = p_destination_id
    FOR UPDATE;
    -- The destination as the worker checked it (version p_version's delivery terms): read FOR SHARE, so an
    -- admin's edit (a key pinned meanwhile) and this pause serialize; an edit first means no pause.
    SELECT d.delivery_version > p_version INTO changed FROM destinations d
    WHERE d.tenant_id = p_tenant_id AND d.id = p_destination_id
    FOR SHARE;
    IF open_now IS NOT TRUE OR changed IS NOT FALSE THEN
        -- paused already (or never enabled: no row), by someone else, for their reason, which stays (its next
        -- check, once that pause is lifted, trips its own); or the destination's terms changed since the
        -- version checked (or it is gone)
        RETURN QUERY SELECT coalesce(open_now, false), false, changed IS NOT FALSE;
        RETURN;
    END IF;
    -- Its own pause; the same owner and reason again is the same pause.
    INSERT INTO delivery_pauses (scope, tenant_id, destination_id, kind, owner, reason)
    VALUES ('destination', p_tenant_id, p_destination_id,
            CASE WHEN p_reason LIKE 'host key changed: %' THEN 'host_key' ELSE 'manual' END, p_changed_by, p_reason)
    ON CONFLICT (scope, tenant_id, destination_id, owner, reason) WHERE released_at IS NULL DO NOTHING
    RETURNING id INTO pause_id;
    IF pause_id IS NULL THEN
        RETURN QUERY SELECT open_now, false, false;
        RETURN;
    END IF;
    UPDATE delivery_switches
    SET reason = p_reason, changed_by = p_changed_by, changed_at = clock_timestamp()
    WHERE scope = 'destination' AND tenant_id = p_tenant_id AND destination_id = p_destination_id;
    INSERT INTO delivery_switch_changes (scope, tenant_id, destination_id, enabled, was_enabled, reason,
                                         changed_by, changed_at, pause_ids)
    VALUES ('destination', p_tenant_id, p_destination_id, false, open_now, p_reason, p_changed_by,
            clock_timestamp(), ARRAY[pause_id]);
    RETURN QUERY SELECT open_now, true, false;
END $$;
