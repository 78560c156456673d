-- A second person for what re-opens deliveries (issue #26, item 3).
--
-- 1. Owned, overlapping pauses. A pause is a row of delivery_pauses: a scope (global, a tenant, one of its
--    destinations), an owner, a reason, a kind ('manual', or 'host_key' when a changed host key tripped it) and
--    an optional expiry. A scope delivers while its three switch rows are on (a missing or off row: never
--    enabled, fail-closed, as before) and no pause of the three scopes is active (unreleased, unexpired). A
--    resume releases only the pauses it names (by default, its own): an incident pause, a deploy pause and a
--    contract pause do not undo each other. Pausing again with the same owner and reason re-arms that pause.
--    The two gate functions of 0014 read the pauses through the switch row they already read (held_until, kept
--    by a trigger on the pauses); their callers (the claim, cutoff 2, the sweeper, a resume's wake-up,
--    recovery) are unchanged, and the claim and cutoff 2 still read the switch rows FOR SHARE, which every pause
--    and release updates: a pause and those decisions serialize. Every paused switch row becomes an open row
--    with a pause owned by whoever paused it.
-- 2. approvals: a two-person action waiting for its second person. What (the action and its parameters, a
--    secret only ever as a reference), who asked and with which role, when it expires; then who decided, with
--    which role, when, and what came of it when it ran. The database refuses a decision by the requester
--    (ck_approvals_second_person), after expiry (ck_approvals_expired), or by a principal whose role may not
--    do the action (ck_approvals_role), and a second decision.
-- 3. The actions that need two people, refused by the database without an approval that another principal of
--    the tenant decided in time and that was not used yet (approved_action below):
--    - releasing a pause that someone else set, or that a host-key change tripped (delivery_pauses' guard);
--    - pinning a new host key, changing a destination's host, port, account, credential or encryption keys
--      (an admin's change of those fields: destination_versions' guard, which also holds the change to the
--      values approved);
--    - correcting a recorded outcome (outcome_corrections' guard, for that attempt and that status);
--    - a replacement with an overwrite agreement (export_jobs' insert guard, for that agreement).
--    The statements that run them also join the approval in their WHERE, so a missing one matches nothing.

-- -- 1. pauses ----------------------------------------------------------------------------------------------

CREATE TABLE delivery_pauses (
    id              uuid NOT NULL DEFAULT gen_random_uuid(),
    scope           text NOT NULL CHECK (scope IN ('global', 'tenant', 'destination')),
    tenant_id       uuid REFERENCES tenants (id),
    destination_id  uuid,
    kind            text NOT NULL DEFAULT 'manual' CHECK (kind IN ('manual', 'host_key')),
    owner           text NOT NULL CHECK (length(owner) BETWEEN 1 AND 200),
    reason          text NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    paused_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at      timestamptz,      -- NULL: until released
    released_at     timestamptz,
    released_by     text CHECK (length(released_by) BETWEEN 1 AND 200),
    release_reason  text CHECK (length(release_reason) BETWEEN 1 AND 1000),
    CONSTRAINT pk_delivery_pauses PRIMARY KEY (id),
    CONSTRAINT ck_delivery_pauses_scope CHECK (
        (scope = 'global' AND tenant_id IS NULL AND destination_id IS NULL)
        OR (scope = 'tenant' AND tenant_id IS NOT NULL AND destination_id IS NULL)
        OR (scope = 'destination' AND tenant_id IS NOT NULL AND destination_id IS NOT NULL)),
    CONSTRAINT fk_delivery_pauses_destination FOREIGN KEY (tenant_id, destination_id)
        REFERENCES destinations (tenant_id, id),
    CONSTRAINT ck_delivery_pauses_released
        CHECK ((released_at IS NULL) = (released_by IS NULL) AND (released_at IS NULL) = (release_reason IS NULL)),
    CONSTRAINT ck_delivery_pauses_expiry CHECK (expires_at IS NULL OR expires_at > paused_at)
);

-- One unreleased pause per scope, owner and reason (pausing again re-arms it); a scope's unreleased pauses
-- (what held_until below is computed from) are this index's prefix.
CREATE UNIQUE INDEX uq_delivery_pauses_active ON delivery_pauses (scope, tenant_id, destination_id, owner, reason)
    NULLS NOT DISTINCT WHERE released_at IS NULL;

ALTER TABLE delivery_switch_changes ADD COLUMN pause_ids uuid[];

-- What the gate reads of the pauses, kept on the scope's own switch row: until when its pauses hold it (the
-- latest expiry of its unreleased pauses; 'infinity' when one has none; NULL when none is unreleased). The scope
-- is held while now < held_until: an expired pause lifts itself, with no write. The claim and cutoff 2 already
-- read the switch row FOR SHARE, so the pauses cost them one comparison, not a lookup; and every pause change
-- updates that row, so it serializes with them whoever writes it.
ALTER TABLE delivery_switches ADD COLUMN held_until timestamptz;

CREATE FUNCTION delivery_scope_held_until(p_scope text, p_tenant_id uuid, p_destination_id uuid)
RETURNS timestamptz LANGUAGE sql STABLE AS $$
    SELECT max(coalesce(p.expires_at, 'infinity'::timestamptz)) FROM delivery_pauses p
    WHERE p.scope = p_scope AND p.tenant_id IS NOT DISTINCT FROM p_tenant_id
      AND p.destination_id IS NOT DISTINCT FROM p_destination_id AND p.released_at IS NULL
$$;

-- held_until follows the pauses, for every writer: a pause, a re-armed expiry, a release (its row's lock,
-- taken here if the writer has not taken it, orders it after every claim and cutoff 2 that read the row).
CREATE FUNCTION delivery_pauses_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE delivery_switches s
    SET held_until = delivery_scope_held_until(NEW.scope, NEW.tenant_id, NEW.destination_id)
    WHERE s.scope = NEW.scope AND s.tenant_id IS NOT DISTINCT FROM NEW.tenant_id
      AND s.destination_id IS NOT DISTINCT FROM NEW.destination_id;
    RETURN NULL;
END $$;
CREATE TRIGGER tr_delivery_pauses_hold AFTER INSERT OR UPDATE ON delivery_pauses
    FOR EACH ROW EXECUTE FUNCTION delivery_pauses_hold();

-- a scope's switch row made after its pauses (a scope never enabled, then resumed) starts held by them
CREATE FUNCTION delivery_switches_hold() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.held_until := delivery_scope_held_until(NEW.scope, NEW.tenant_id, NEW.destination_id);
    RETURN NEW;
END $$;
CREATE TRIGGER tr_delivery_switches_hold BEFORE INSERT ON delivery_switches
    FOR EACH ROW EXECUTE FUNCTION delivery_switches_hold();

-- Every paused scope keeps its pause, now owned by whoever paused it: resuming it is theirs alone, or anyone's
-- with a second person. Its switch row becomes open (the pause holds the scope).
INSERT INTO delivery_pauses (scope, tenant_id, destination_id, kind, owner, reason, paused_at)
SELECT scope, tenant_id, destination_id, 'manual', changed_by, reason, changed_at
FROM delivery_switches WHERE NOT enabled;
UPDATE delivery_switches SET enabled = true WHERE NOT enabled;

-- The three-scope gate of 0014, now with the pauses: every switch row of the job's scope exists, is on, and is
-- not held by a pause. Still three scalar lookups by uq_delivery_switches_scope, a per-row filter for the sweeper
-- and a resume's wake-up. statement_timestamp() is stable within the calling statement, as the function is.
CREATE OR REPLACE FUNCTION delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT coalesce((SELECT s.enabled AND NOT coalesce(s.held_until > statement_timestamp(), false)
                     FROM delivery_switches s WHERE s.scope = 'global'), false)
           AND coalesce((SELECT s.enabled AND NOT coalesce(s.held_until > statement_timestamp(), false)
                         FROM delivery_switches s
                         WHERE s.scope = 'tenant' AND s.tenant_id = p_tenant_id), false)
           AND coalesce((SELECT s.enabled AND NOT coalesce(s.held_until > statement_timestamp(), false)
                         FROM delivery_switches s
                         WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id
                           AND s.destination_id = p_destination_id), false)
$$;

-- The claim's and cutoff 2's variant: the three switch rows FOR SHARE, as in 0014 (a pause or a release updates
-- its scope's row, so these wait for it and it for them, and a locking read returns the row as last committed).
CREATE OR REPLACE FUNCTION lock_delivery_scope(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    global_open boolean;
    tenant_open boolean;
    destination_open boolean;
BEGIN
    -- each found through uq_delivery_switches_scope; no row leaves its variable null (a paused scope); a row
    -- held by a pause until a time still to come is paused
    SELECT s.enabled AND NOT coalesce(s.held_until > clock_timestamp(), false) INTO global_open
    FROM delivery_switches s WHERE s.scope = 'global' FOR SHARE;
    SELECT s.enabled AND NOT coalesce(s.held_until > clock_timestamp(), false) INTO tenant_open
    FROM delivery_switches s WHERE s.scope = 'tenant' AND s.tenant_id = p_tenant_id FOR SHARE;
    SELECT s.enabled AND NOT coalesce(s.held_until > clock_timestamp(), false) INTO destination_open
    FROM delivery_switches s
    WHERE s.scope = 'destination' AND s.tenant_id = p_tenant_id AND s.destination_id = p_destination_id
    FOR SHARE;
    RETURN coalesce(global_open, false) AND coalesce(tenant_open, false) AND coalesce(destination_open, false);
END
$$;

-- What holds one scope (not the scopes above it): NULL when it is open, else why, in words: its switch row is
-- missing ('never enabled') or off (its reason), or the latest of its active pauses (its reason).
CREATE FUNCTION delivery_scope_hold(p_scope text, p_tenant_id uuid, p_destination_id uuid) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE AS $$
    SELECT CASE
        WHEN s.scope IS NULL THEN 'never enabled'
        WHEN NOT s.enabled THEN s.reason
        ELSE (SELECT p.reason FROM delivery_pauses p
              WHERE p.scope = p_scope AND p.tenant_id IS NOT DISTINCT FROM p_tenant_id
                AND p.destination_id IS NOT DISTINCT FROM p_destination_id AND p.released_at IS NULL
                AND (p.expires_at IS NULL OR p.expires_at > statement_timestamp())
              ORDER BY p.paused_at DESC LIMIT 1) END
    FROM (SELECT 1) AS one
    LEFT JOIN delivery_switches s
           ON s.scope = p_scope AND s.tenant_id IS NOT DISTINCT FROM p_tenant_id
          AND s.destination_id IS NOT DISTINCT FROM p_destination_id
$$;
REVOKE ALL ON FUNCTION delivery_scope_hold(text, uuid, uuid) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION delivery_scope_hold(text, uuid, uuid) TO exports_api, exports_platform;

-- -- 2. approvals ------------------------------------------------------------------------------------------

-- The tenant roles that may request and approve each two-person action: the roles that may do it
-- (service/permissions.py states the same; tests/db/test_two_person.py holds the two to each other).
CREATE FUNCTION approval_roles(p_action text) RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT CASE p_action
        WHEN 'resume_pause' THEN ARRAY['operator', 'reconciler', 'admin']
        WHEN 'pin_host_key' THEN ARRAY['admin']
        WHEN 'change_destination' THEN ARRAY['admin']
        WHEN 'correct_outcome' THEN ARRAY['reconciler']
        WHEN 'replace_with_overwrite' THEN ARRAY['operator', 'reconciler', 'admin']
        ELSE ARRAY[]::text[] END
$$;

-- The destination fields whose change takes two people: where deliveries go (host, port), as whom (username,
-- credential), whom they trust (the pinned host key) and to whom they are readable (the encryption keys, the
-- signing key).
CREATE FUNCTION two_person_destination_fields() RETURNS text[]
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT ARRAY['host', 'port', 'username', 'credential_ref', 'host_key', 'pgp_recipient_keys',
                 'pgp_signing_key_ref']
$$;

CREATE TABLE approvals (
    tenant_id        uuid NOT NULL REFERENCES tenants (id),
    id               uuid NOT NULL DEFAULT gen_random_uuid(),
    action           text NOT NULL CHECK (action IN (
        'resume_pause', 'pin_host_key', 'change_destination', 'correct_outcome', 'replace_with_overwrite')),
    subject_kind     text NOT NULL CHECK (subject_kind IN ('delivery_pause', 'destination', 'export')),
    subject_id       text NOT NULL CHECK (length(subject_id) BETWEEN 1 AND 200),
    -- what runs at approval; a secret only ever as a reference (the API shows a reference as "set")
    parameters       jsonb NOT NULL,
    reason           text NOT NULL CHECK (length(reason) BETWEEN 1 AND 1000),
    requested_by     text NOT NULL CHECK (length(requested_by) BETWEEN 1 AND 200),
    requested_role   text NOT NULL,
    requested_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at       timestamptz NOT NULL,
    decision         text CHECK (decision IN ('approved', 'declined')),
    decided_by       text CHECK (length(decided_by) BETWEEN 1 AND 200),
    decided_role     text,
    decided_at       timestamptz,
    decision_reason  text CHECK (length(decision_reason) BETWEEN 1 AND 1000),
    executed_at      timestamptz,     -- when the approved action ran (once)
    outcome          text,            -- what it answered then (service/outcomes.py Kind)
    CONSTRAINT pk_approvals PRIMARY KEY (tenant_id, id),
    CONSTRAINT uq_approvals_id UNIQUE (id),
    CONSTRAINT ck_approvals_second_person CHECK (decided_by IS NULL OR decided_by <> requested_by),
    CONSTRAINT ck_approvals_decision CHECK (
        (decision IS NULL) = (decided_by IS NULL) AND (decision IS NULL) = (decided_role IS NULL)
        AND (decision IS NULL) = (decided_at IS NULL)),
    CONSTRAINT ck_approvals_in_time CHECK (decided_at IS NULL OR decided_at <= expires_at),
    CONSTRAINT ck_approvals_window CHECK (expires_at > requested_at AND expires_at <= requested_at + interval '7 days'),
    CONSTRAINT ck_approvals_executed
        CHECK ((executed_at IS NULL) = (outcome IS NULL) AND (executed_at IS NULL OR decision = 'approved')),
    CONSTRAINT ck_approvals_no_secrets CHECK (NOT jsonb_path_exists(
        parameters, 'lax $.** ? (@.type() == "object").keyvalue() ? (@.key like_regex "secret|password|private_key" && @.value != null)'))
);
CREATE INDEX ix_approvals_tenant ON approvals (tenant_id, requested_at DESC, id);
CREATE INDEX ix_approvals_subject ON approvals (tenant_id, subject_id, action) WHERE executed_at IS NULL;

-- The role a principal of the tenant holds while not revoked, if it may take part in the action; else NULL.
-- SECURITY DEFINER, so the guard can ask it of the reconciler's role without that role reading principals
-- (one row's role, for a name the caller gives, is all it answers).
CREATE FUNCTION approval_role_of(p_tenant_id uuid, p_principal text, p_action text) RETURNS text
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT p.role FROM principals p
    WHERE p.tenant_id = p_tenant_id AND p.name = p_principal AND p.revoked_at IS NULL
      AND p.role = ANY (approval_roles(p_action))
$$;
REVOKE ALL ON FUNCTION approval_role_of(uuid, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION approval_role_of(uuid, text, text) TO exports_api, exports_reconciler;

CREATE FUNCTION approvals_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'approvals are history: nobody deletes one'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_approvals_append_only';
    END IF;
    IF TG_OP = 'INSERT' THEN
        NEW.requested_at := clock_timestamp();
        IF NEW.decision IS NOT NULL OR NEW.executed_at IS NOT NULL THEN
            RAISE EXCEPTION 'an approval starts undecided'
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_decision';
        END IF;
        IF approval_role_of(NEW.tenant_id, NEW.requested_by, NEW.action) IS DISTINCT FROM NEW.requested_role THEN
            RAISE EXCEPTION '% may not request %: that needs a principal of the tenant with a role of %',
                    NEW.requested_by, NEW.action, approval_roles(NEW.action)
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_approvals_role';
        END IF;
        RETURN NEW;
    END IF;
    IF (NEW.tenant_id, NEW.id, NEW.action, NEW.subject_kind, NEW.subject_id, NEW.parameters, NEW.reason,
        NEW.requested_by, NEW.requested_role, NEW.requested_at, NEW.expires_at)
       IS DISTINCT FROM (OLD.tenant_id, OLD.id, OLD.action, OLD.subject_kind, OLD.subject_id, OLD.parameters,
                         OLD.reason, OLD.requested_by, OLD.requested_role, OLD.requested_at, OLD.expires_at) THEN
        RAISE EXCEPTION 'approval %: what was asked, by whom and until when never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_identity';
    END IF;
    IF OLD.decision IS NOT NULL THEN
        IF (NEW.decision, NEW.decided_by, NEW.decided_role, NEW.decided_at, NEW.decision_reason)
           IS DISTINCT FROM (OLD.decision, OLD.decided_by, OLD.decided_role, OLD.decided_at, OLD.decision_reason) THEN
            RAISE EXCEPTION 'approval % was % by %: a decision is final', OLD.id, OLD.decision, OLD.decided_by
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_decided';
        END IF;
    ELSIF NEW.decision IS NOT NULL THEN
        NEW.decided_at := clock_timestamp();
        IF NEW.decided_by = OLD.requested_by THEN
            RAISE EXCEPTION 'approval %: % asked for it and may not decide it; that takes another principal',
                    OLD.id, OLD.requested_by
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_second_person';
        END IF;
        IF NEW.decided_at > OLD.expires_at THEN
            RAISE EXCEPTION 'approval % expired at %', OLD.id, OLD.expires_at
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_expired';
        END IF;
        IF approval_role_of(OLD.tenant_id, NEW.decided_by, OLD.action) IS DISTINCT FROM NEW.decided_role THEN
            RAISE EXCEPTION '% may not decide %: that needs a principal of the tenant with a role of %',
                    NEW.decided_by, OLD.action, approval_roles(OLD.action)
                USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_approvals_role';
        END IF;
    END IF;
    IF OLD.executed_at IS NOT NULL AND (NEW.executed_at, NEW.outcome) IS DISTINCT FROM (OLD.executed_at, OLD.outcome) THEN
        RAISE EXCEPTION 'approval % ran at %: an approval runs once', OLD.id, OLD.executed_at
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_approvals_executed';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_approvals_guard BEFORE INSERT OR UPDATE OR DELETE ON approvals
    FOR EACH ROW EXECUTE FUNCTION approvals_guard();

-- Whether an approval of one of p_actions for this subject, whose parameters hold p_parameters (jsonb
-- containment: every key given, with that value), was approved in time by p_actor (the second person, who runs
-- it), asked by another, and has not run yet. What the guards and the statements below ask.
CREATE FUNCTION approved_action(p_tenant_id uuid, p_actions text[], p_subject_id text, p_actor text,
                                p_parameters jsonb) RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT EXISTS (
        SELECT 1 FROM approvals a
        WHERE a.tenant_id = p_tenant_id AND a.subject_id = p_subject_id AND a.action = ANY (p_actions)
          AND a.executed_at IS NULL AND a.decision = 'approved' AND a.decided_by = p_actor
          AND a.decided_by <> a.requested_by AND a.decided_at <= a.expires_at
          AND a.parameters @> p_parameters)
$$;

-- -- 3. the guards -----------------------------------------------------------------------------------------

-- A pause: its scope, owner, reason, kind and start never change; a release is final; only its owner re-arms
-- its expiry; and releasing a pause someone else set, or that a host-key change tripped, needs an approval that
-- names this pause, decided by the one who releases it. The global scope is the platform's: its operators act
-- on the command line, with no tenant to approve within.
CREATE FUNCTION delivery_pauses_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'DELETE' THEN
        RAISE EXCEPTION 'a pause is released, never deleted'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_pauses_append_only';
    END IF;
    IF (NEW.id, NEW.scope, NEW.tenant_id, NEW.destination_id, NEW.kind, NEW.owner, NEW.reason, NEW.paused_at)
       IS DISTINCT FROM (OLD.id, OLD.scope, OLD.tenant_id, OLD.destination_id, OLD.kind, OLD.owner, OLD.reason,
                         OLD.paused_at) THEN
        RAISE EXCEPTION 'pause %: its scope, owner, reason and start never change', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_delivery_pauses_identity';
    END IF;
    IF OLD.released_at IS NOT NULL THEN
        RAISE EXCEPTION 'pause % was released at % by %: a release is final', OLD.id, OLD.released_at,
                OLD.released_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_delivery_pauses_released';
    END IF;
    IF NEW.released_at IS NULL THEN
        RETURN NEW;  -- its owner re-arming its expiry (the statement matches the owner's own pause only)
    END IF;
    IF OLD.scope = 'global' OR (NEW.released_by = OLD.owner AND OLD.kind = 'manual') THEN
        RETURN NEW;
    END IF;
    -- nested, so that the platform's role, which reads no approvals, never evaluates it
    IF NOT approved_action(OLD.tenant_id, ARRAY['resume_pause'], OLD.id::text, NEW.released_by, '{}') THEN
        RAISE EXCEPTION 'pause % (%, by %) is released by % only with another principal''s approval',
                OLD.id, OLD.reason, OLD.owner, NEW.released_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_delivery_pauses_second_person';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_delivery_pauses_guard BEFORE UPDATE OR DELETE ON delivery_pauses
    FOR EACH ROW EXECUTE FUNCTION delivery_pauses_guard();
-- which role writes which scope (0019): the API a tenant's and its destinations', the platform the global one
CREATE TRIGGER tr_delivery_pauses_scope_owner BEFORE INSERT OR UPDATE ON delivery_pauses
    FOR EACH ROW EXECUTE FUNCTION delivery_switch_scope_owner();

-- A correction of a recorded outcome: approved for this export, this attempt and this status, by the reconciler
-- who records it, requested by another.
CREATE FUNCTION outcome_corrections_approved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NOT approved_action(NEW.tenant_id, ARRAY['correct_outcome'], NEW.job_id::text, NEW.corrected_by,
                           jsonb_build_object('attempt_id', NEW.attempt_id::text, 'corrected_status', NEW.to_status)) THEN
        RAISE EXCEPTION 'export %: a correction to % needs another principal''s approval of it, decided by %',
                NEW.job_id, NEW.to_status, NEW.corrected_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_outcome_corrections_approved';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_outcome_corrections_approved BEFORE INSERT ON outcome_corrections
    FOR EACH ROW EXECUTE FUNCTION outcome_corrections_approved();

-- An admin's change of where deliveries go or whom they trust: approved for this destination, by the admin who
-- makes it, with exactly the values approved for each such field. An administrator's connection ('owner') is
-- not held to it: it is the platform's, outside any tenant's roles.
CREATE FUNCTION destination_versions_approved() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    -- each field of this change that takes two people, with the value it sets
    wanted jsonb := jsonb_build_object('changes', (
        SELECT coalesce(jsonb_object_agg(f.name, NEW.after -> f.name), '{}'::jsonb)
        FROM unnest(NEW.changed_fields) AS f(name)
        WHERE f.name = ANY (two_person_destination_fields())));
BEGIN
    IF NOT approved_action(NEW.tenant_id, ARRAY['change_destination', 'pin_host_key'], NEW.destination_id::text,
                           NEW.changed_by, wanted) THEN
        RAISE EXCEPTION 'destination %: changing % needs another admin''s approval of these values, decided by %',
                NEW.destination_id, NEW.changed_fields, NEW.changed_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_destination_versions_approved';
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER tr_destination_versions_approved BEFORE INSERT ON destination_versions
    FOR EACH ROW
    WHEN (NEW.change = 'edited' AND NEW.changed_role <> 'owner'
          AND NEW.changed_fields && two_person_destination_fields())
    EXECUTE FUNCTION destination_versions_approved();

-- 0001's insert guard, and a replacement with an overwrite agreement: approved for this original and this
-- agreement, by its creator, requested by another. The IF costs an export that names no agreement nothing.
CREATE OR REPLACE FUNCTION export_jobs_insert_guard() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.status <> 'Queued' OR NEW.attempt_id IS NOT NULL OR NEW.attempt_count <> 0 THEN
        RAISE EXCEPTION 'a new export starts Queued with no attempt'
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_state_machine';
    END IF;
    IF NEW.overwrite_agreement_ref IS NOT NULL THEN
        IF NEW.replaces_job_id IS NULL
           OR NOT approved_action(NEW.tenant_id, ARRAY['replace_with_overwrite'], NEW.replaces_job_id::text,
                                  NEW.created_by,
                                  jsonb_build_object('overwrite_agreement_ref', NEW.overwrite_agreement_ref)) THEN
            RAISE EXCEPTION 'a replacement of % with the overwrite agreement % needs another principal''s approval, decided by %',
                    NEW.replaces_job_id, NEW.overwrite_agreement_ref, NEW.created_by
                USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_overwrite_approved';
        END IF;
    END IF;
    RETURN NEW;
END $$;

-- -- 4. an operator's reconcile, refused by the database ----------------------------------------------------

-- Reconciliation runs over the reconciler's role only (the API's role cannot take that edge, 0002); and now the
-- statement itself names who reconciles: reconcile_unknown matches only when reconciled_by is a principal of the
-- tenant holding the reconciler role, not revoked, so a service that sent an operator's request over the
-- reconciler's pool would still change nothing. SECURITY DEFINER: the reconciler's role reads no principals.
CREATE FUNCTION principal_holds(p_tenant_id uuid, p_principal text, p_roles text[]) RETURNS boolean
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = public, pg_temp AS $$
    SELECT EXISTS (SELECT 1 FROM principals p
                   WHERE p.tenant_id = p_tenant_id AND p.name = p_principal AND p.revoked_at IS NULL
                     AND p.role = ANY (p_roles))
$$;
REVOKE ALL ON FUNCTION principal_holds(uuid, text, text[]) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION principal_holds(uuid, text, text[]) TO exports_reconciler;

-- -- grants ------------------------------------------------------------------------------------------------

-- The pauses are read by the roles that write them (the switches page, the trigger that keeps held_until); the
-- worker and recovery read the gate through the switch rows alone.
GRANT SELECT ON delivery_pauses TO exports_api, exports_platform;
-- Pausing, re-arming and releasing (its identity is the trigger's to keep), and the scope's held_until that the
-- trigger keeps; nobody deletes a pause.
GRANT INSERT ON delivery_pauses TO exports_api, exports_platform;
GRANT UPDATE (expires_at, released_at, released_by, release_reason) ON delivery_pauses TO exports_api, exports_platform;
GRANT UPDATE (held_until) ON delivery_switches TO exports_api, exports_platform;

-- The API requests, decides and runs approvals; the reconciler decides and runs the corrections it approves,
-- in the transaction of the correction. Nobody deletes one. The platform's role reads none: a release of the
-- global scope never asks for one.
GRANT SELECT, INSERT ON approvals TO exports_api;
GRANT UPDATE (decision, decided_by, decided_role, decided_at, decision_reason, executed_at, outcome)
    ON approvals TO exports_api, exports_reconciler;
GRANT SELECT ON approvals TO exports_reconciler;
