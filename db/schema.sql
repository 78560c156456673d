-- The schema db/migrations leave, as pg_dump --schema-only --no-owner prints it (comments and SET lines
-- dropped). Generated: do not edit. After adding a migration, regenerate it with
--   python -m db.schema --write  (or: make schema)
-- tests/db/test_schema_file.py fails when a freshly migrated database differs from this file.

CREATE FUNCTION public.approval_role_of(p_tenant_id uuid, p_principal text, p_action text) RETURNS text
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT p.role FROM principals p
    WHERE p.tenant_id = p_tenant_id AND p.name = p_principal AND p.revoked_at IS NULL
      AND p.role = ANY (approval_roles(p_action))
$$;

CREATE FUNCTION public.approval_roles(p_action text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT CASE p_action
        WHEN 'resume_pause' THEN ARRAY['operator', 'reconciler', 'admin']
        WHEN 'pin_host_key' THEN ARRAY['admin']
        WHEN 'change_destination' THEN ARRAY['admin']
        WHEN 'correct_outcome' THEN ARRAY['reconciler']
        WHEN 'replace_with_overwrite' THEN ARRAY['operator', 'reconciler', 'admin']
        ELSE ARRAY[]::text[] END
$$;

CREATE FUNCTION public.approvals_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.approved_action(p_tenant_id uuid, p_actions text[], p_subject_id text, p_actor text, p_parameters jsonb) RETURNS boolean
    LANGUAGE sql STABLE
    AS $$
    SELECT EXISTS (
        SELECT 1 FROM approvals a
        WHERE a.tenant_id = p_tenant_id AND a.subject_id = p_subject_id AND a.action = ANY (p_actions)
          AND a.executed_at IS NULL AND a.decision = 'approved' AND a.decided_by = p_actor
          AND a.decided_by <> a.requested_by AND a.decided_at <= a.expires_at
          AND a.parameters @> p_parameters)
$$;

CREATE FUNCTION public.armored_public_keys_ok(keys text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(keys) <= 10
   AND coalesce((SELECT bool_and(k LIKE '-----BEGIN PGP PUBLIC KEY BLOCK-----%'
                                 AND k LIKE '%-----END PGP PUBLIC KEY BLOCK-----%'
                                 AND k NOT LIKE '%PRIVATE KEY%')
                 FROM unnest(keys) AS k), true)
$$;

CREATE FUNCTION public.csv_columns_ok(columns text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(columns) >= 1
   AND array_position(columns, NULL) IS NULL
   AND columns <@ ARRAY['email', 'first_name', 'last_name']
   AND (SELECT count(DISTINCT c) FROM unnest(columns) AS c) = cardinality(columns)
$$;

CREATE FUNCTION public.delivery_pauses_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.delivery_pauses_hold() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE delivery_switches s
    SET held_until = delivery_scope_held_until(NEW.scope, NEW.tenant_id, NEW.destination_id)
    WHERE s.scope = NEW.scope AND s.tenant_id IS NOT DISTINCT FROM NEW.tenant_id
      AND s.destination_id IS NOT DISTINCT FROM NEW.destination_id;
    RETURN NULL;
END $$;

CREATE FUNCTION public.delivery_scope_held_until(p_scope text, p_tenant_id uuid, p_destination_id uuid) RETURNS timestamp with time zone
    LANGUAGE sql STABLE
    AS $$
    SELECT max(coalesce(p.expires_at, 'infinity'::timestamptz)) FROM delivery_pauses p
    WHERE p.scope = p_scope AND p.tenant_id IS NOT DISTINCT FROM p_tenant_id
      AND p.destination_id IS NOT DISTINCT FROM p_destination_id AND p.released_at IS NULL
$$;

CREATE FUNCTION public.delivery_scope_hold(p_scope text, p_tenant_id uuid, p_destination_id uuid) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
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

CREATE FUNCTION public.delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
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

CREATE FUNCTION public.delivery_switch_changes_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'the history of switch changes is append-only' USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION public.delivery_switch_scope_owner() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    is_global boolean := NEW.scope = 'global' OR (TG_OP = 'UPDATE' AND OLD.scope = 'global');
BEGIN
    IF is_global AND current_user = 'exports_api' THEN
        RAISE EXCEPTION 'the global delivery switch is the platform''s (exports_platform), not exports_api''s'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_switches_global_owner';
    END IF;
    IF NOT is_global AND current_user = 'exports_platform' THEN
        RAISE EXCEPTION 'exports_platform changes the global delivery switch only, not a % switch', NEW.scope
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_delivery_switches_global_owner';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.delivery_switches_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.delivery_switches_hold() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.held_until := delivery_scope_held_until(NEW.scope, NEW.tenant_id, NEW.destination_id);
    RETURN NEW;
END $$;

CREATE FUNCTION public.host_keys_ok(keys text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(keys) BETWEEN 1 AND 10
   AND array_position(keys, NULL) IS NULL
   AND (SELECT count(DISTINCT k) FROM unnest(keys) AS k) = cardinality(keys)
   AND (SELECT bool_and(length(k) BETWEEN 1 AND 16600 AND k !~ '[[:cntrl:]]' AND upper(k) NOT LIKE '%PRIVATE%')
        FROM unnest(keys) AS k)
$$;

CREATE FUNCTION public.intake_time_zone_ok(tz text) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $_$
    SELECT tz IS NOT NULL AND tz ~ '^[A-Za-z][A-Za-z0-9_+-]*(/[A-Za-z0-9_+-]+)*$'
           AND EXISTS (SELECT 1 FROM pg_timezone_names WHERE name = tz)
$_$;

CREATE FUNCTION public.intake_week_of(hours text[]) RETURNS int4multirange
    LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
    AS $$
BEGIN
    IF hours IS NULL OR cardinality(hours) NOT BETWEEN 1 AND 50 OR array_position(hours, NULL) IS NOT NULL THEN
        RETURN NULL;
    END IF;
    RETURN (SELECT range_agg(w)
            FROM intake_ranges(hours) r,
                 LATERAL unnest(ARRAY[int4range(r.opens, least(r.closes, 10080)),
                                      int4range(0, greatest(r.closes - 10080, 0))]) AS w
            WHERE NOT isempty(w));
EXCEPTION WHEN invalid_parameter_value THEN
    RETURN NULL;
END $$;

CREATE TABLE public.destinations (
    id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    name text NOT NULL,
    host text NOT NULL,
    port integer NOT NULL,
    username text NOT NULL,
    host_key text NOT NULL,
    credential_ref text NOT NULL,
    remote_dir text NOT NULL,
    name_and_size_identify boolean DEFAULT false NOT NULL,
    hash_evidence text DEFAULT 'none'::text NOT NULL,
    ack_suffix text,
    max_write_request integer DEFAULT 32768 NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    contract_starts_on date DEFAULT ((clock_timestamp() AT TIME ZONE 'UTC'::text))::date NOT NULL,
    contract_ends_on date,
    retired_at timestamp with time zone,
    retired_by text,
    temporary_files text DEFAULT 'keep'::text NOT NULL,
    csv_header boolean DEFAULT true NOT NULL,
    csv_delimiter text DEFAULT ','::text NOT NULL,
    csv_columns text[] DEFAULT ARRAY['email'::text, 'first_name'::text, 'last_name'::text] NOT NULL,
    compression text DEFAULT 'none'::text NOT NULL,
    pgp_recipient_keys text[] DEFAULT '{}'::text[] NOT NULL,
    pgp_signing_key_ref text,
    version integer DEFAULT 1 NOT NULL,
    delivery_version integer DEFAULT 1 NOT NULL,
    host_keys text[] NOT NULL,
    max_sessions integer,
    intake_time_zone text DEFAULT 'UTC'::text NOT NULL,
    intake_hours text[],
    blackout_dates date[] DEFAULT '{}'::date[] NOT NULL,
    intake_week int4multirange GENERATED ALWAYS AS (public.intake_week_of(intake_hours)) STORED,
    manifest text DEFAULT 'none'::text NOT NULL,
    CONSTRAINT ck_destinations_ack CHECK (((hash_evidence = 'ack_file'::text) = (ack_suffix IS NOT NULL))),
    CONSTRAINT ck_destinations_blackout_dates CHECK (((cardinality(blackout_dates) <= 366) AND (array_position(blackout_dates, NULL::date) IS NULL))),
    CONSTRAINT ck_destinations_compression CHECK ((compression = ANY (ARRAY['none'::text, 'gzip'::text]))),
    CONSTRAINT ck_destinations_contract CHECK (((contract_ends_on IS NULL) OR (contract_ends_on >= contract_starts_on))),
    CONSTRAINT ck_destinations_credential_ref CHECK ((((length(credential_ref) >= 1) AND (length(credential_ref) <= 1000)) AND (credential_ref !~ '[[:cntrl:]]'::text) AND (credential_ref !~~ '%-----BEGIN%'::text) AND (credential_ref !~~ '%PRIVATE KEY%'::text))),
    CONSTRAINT ck_destinations_csv_columns CHECK (public.csv_columns_ok(csv_columns)),
    CONSTRAINT ck_destinations_csv_delimiter CHECK ((csv_delimiter = ANY (ARRAY[','::text, ';'::text, '|'::text, '	'::text]))),
    CONSTRAINT ck_destinations_host_keys CHECK ((public.host_keys_ok(host_keys) AND (host_key = host_keys[1]))),
    CONSTRAINT ck_destinations_intake_hours CHECK (((intake_hours IS NULL) = (intake_week IS NULL))),
    CONSTRAINT ck_destinations_intake_time_zone CHECK (public.intake_time_zone_ok(intake_time_zone)),
    CONSTRAINT ck_destinations_manifest CHECK ((manifest = ANY (ARRAY['none'::text, 'sha256'::text, 'json'::text, 'both'::text]))),
    CONSTRAINT ck_destinations_max_sessions CHECK (((max_sessions >= 1) AND (max_sessions <= 100))),
    CONSTRAINT ck_destinations_pgp_recipient_keys CHECK (public.armored_public_keys_ok(pgp_recipient_keys)),
    CONSTRAINT ck_destinations_pgp_signing_key_ref CHECK (((pgp_signing_key_ref <> ''::text) AND (pgp_signing_key_ref !~~ '%-----BEGIN%'::text))),
    CONSTRAINT ck_destinations_retired CHECK (((retired_at IS NULL) = (retired_by IS NULL))),
    CONSTRAINT ck_destinations_temporary_files CHECK ((temporary_files = ANY (ARRAY['keep'::text, 'remove'::text]))),
    CONSTRAINT ck_destinations_version CHECK (((version >= 1) AND ((delivery_version >= 1) AND (delivery_version <= version)))),
    CONSTRAINT destinations_hash_evidence_check CHECK ((hash_evidence = ANY (ARRAY['none'::text, 'read_back'::text, 'ack_file'::text]))),
    CONSTRAINT destinations_max_write_request_check CHECK (((max_write_request >= 1024) AND (max_write_request <= 261120))),
    CONSTRAINT destinations_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT destinations_port_check CHECK (((port >= 1) AND (port <= 65535)))
);

CREATE FUNCTION public.delivery_window_open(d public.destinations, at timestamp with time zone) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT d.intake_week IS NULL AND cardinality(d.blackout_dates) = 0
           OR (SELECT NOT (w::date = ANY (d.blackout_dates))
                      AND (d.intake_week IS NULL
                           OR d.intake_week @> ((extract(isodow FROM w)::int - 1) * 1440
                                                + extract(hour FROM w)::int * 60 + extract(minute FROM w)::int))
               FROM (SELECT at AT TIME ZONE d.intake_time_zone AS w) AS wall)
$$;

CREATE FUNCTION public.destination_delivery_terms(d public.destinations) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT destination_delivery_terms_before_windows(d)
       - ARRAY['intake_time_zone', 'intake_hours', 'blackout_dates', 'intake_week']
$$;

CREATE FUNCTION public.destination_delivery_terms_before_windows(d public.destinations) RETURNS jsonb
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT to_jsonb(d) - ARRAY['name', 'created_at', 'contract_starts_on', 'contract_ends_on', 'retired_at',
                           'retired_by', 'version', 'delivery_version', 'max_sessions']
$$;

CREATE FUNCTION public.destination_versions_approved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.destinations_change_recorded() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.destinations_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.destinations_host_keys() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.destinations_session_slots() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.max_sessions IS NOT NULL THEN
        INSERT INTO destination_session_slots (tenant_id, destination_id, slot)
        SELECT NEW.tenant_id, NEW.id, g FROM generate_series(1, NEW.max_sessions) AS g
        ON CONFLICT ON CONSTRAINT pk_destination_session_slots DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.export_jobs_backoff_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.transient_releases < OLD.transient_releases THEN
        RAISE EXCEPTION 'export %: the count of give-backs for failures never decreases', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    IF NEW.available_at IS DISTINCT FROM OLD.available_at
       AND NOT (OLD.status = 'Running' AND NEW.status = 'Queued')
       AND NOT (OLD.status = 'Delivering' AND NEW.status = 'Queued')
       AND NOT (OLD.status = 'Queued' AND NEW.status = 'Queued' AND NEW.available_at IS NOT NULL
                AND (OLD.available_at IS NULL OR NEW.available_at > OLD.available_at)
                AND EXISTS (SELECT 1 FROM destinations d
                            WHERE d.tenant_id = NEW.tenant_id AND d.id = NEW.destination_id
                              AND NOT delivery_window_open(d, clock_timestamp())
                              AND delivery_window_open(d, NEW.available_at))) THEN
        RAISE EXCEPTION 'export %: available_at is written only by a give-back (Running -> Queued) or a retry '
                        '(Delivering -> Queued), or moved later to its delivery window''s opening for a Queued '
                        'job outside it', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_backoff';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.export_jobs_correction_code_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM outcome_corrections c
        WHERE c.job_id = OLD.id AND c.attempt_id = OLD.attempt_id
          AND c.from_status = OLD.status AND c.to_status = NEW.status
          AND c.failure_reason IS NOT DISTINCT FROM NEW.failure_reason) THEN
        RAISE EXCEPTION 'export %: the correction % -> % of attempt % records another failure code than %',
                OLD.id, OLD.status, NEW.status, OLD.attempt_id, coalesce(NEW.failure_reason, 'none')
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_correction_code';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.export_jobs_destination_version_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT (OLD.status = 'Running' AND NEW.status = 'Delivering') THEN
        RAISE EXCEPTION 'export %: the destination version is recorded by cutoff 2 and never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_destination_version';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.export_jobs_expected_manifest_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT (OLD.status = 'Running' AND NEW.status = 'Delivering') THEN
        RAISE EXCEPTION 'export %: the expected manifest is recorded by cutoff 2 and never changes', OLD.id
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_expected_manifest_writer';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.export_jobs_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
        -- Recovery takes over only an expired lease, on the database clock, compared as its statements
        -- compare it (lease_expires_at < clock_timestamp()); a renewed lease, or none, is the worker's. An
        -- OutcomeUnknown has no lease and no worker: recovery settles it by evidence (0013). No table is
        -- read here, so no cached plan of it needs a privilege the role lacks (0006).
        IF current_user = 'exports_recovery' AND OLD.status <> 'OutcomeUnknown' THEN
            IF NOT coalesce(OLD.lease_expires_at < clock_timestamp(), false) THEN
                RAISE EXCEPTION 'export %: exports_recovery takes % -> % only once the lease has expired (lease_expires_at %)',
                        OLD.id, OLD.status, NEW.status, OLD.lease_expires_at
                    USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_export_jobs_recovery_lease';
            END IF;
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

CREATE FUNCTION public.export_jobs_insert_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.export_jobs_mark_outcome_unknown() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    NEW.outcome_unknown_at := clock_timestamp();
    RETURN NEW;
END $$;

CREATE FUNCTION public.export_jobs_no_delete() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'exports are never deleted' USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION public.export_jobs_replacement_terms_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'export % replaces export %: its list and destination are the original''s and never change',
            OLD.id, OLD.replaces_job_id
        USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_replacement_terms';
END $$;

CREATE FUNCTION public.export_jobs_transition_event_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    wanted text := CASE WHEN OLD.status = 'OutcomeUnknown' THEN 'Reconciled' ELSE 'Corrected' END;
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM export_attempt_events e
        WHERE e.job_id = OLD.id AND e.attempt_id = OLD.attempt_id AND e.kind = wanted) THEN
        RAISE EXCEPTION 'export %: % -> % of attempt % must commit with its % event',
                OLD.id, OLD.status, NEW.status, OLD.attempt_id, wanted
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_export_jobs_transition_event';
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.hold_session_slot_after_takeover() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    hold float8 := coalesce(nullif(current_setting('fenced.session_takeover_hold_seconds', true), '')::float8, 120);
BEGIN
    IF hold > 0 THEN
        UPDATE destination_session_slots s
        SET expires_at = clock_timestamp() + make_interval(secs => hold)
        WHERE s.holder = OLD.attempt_id AND s.job_id = OLD.id AND s.purpose = 'attempt';
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.intake_ranges(hours text[]) RETURNS TABLE(opens integer, closes integer)
    LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
    AS $_$
DECLARE
    day_names constant text[] := ARRAY['Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat', 'Sun'];
    entry text;
    m text[];
    part text;
    first_day int;
    last_day int;
    day int;
    open_minute int;
    close_minute int;
BEGIN
    FOREACH entry IN ARRAY hours LOOP
        m := regexp_match(entry,
            '^((?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun))?'
            '(?:,(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)(?:-(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun))?)*)'
            ' ([01][0-9]|2[0-3]):([0-5][0-9])-(?:([01][0-9]|2[0-3]):([0-5][0-9])|(24):(00))$');
        IF m IS NULL THEN
            RAISE EXCEPTION 'intake hours: % is not like ''Mon-Fri 08:00-18:00''', quote_literal(left(entry, 60))
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        open_minute := m[2]::int * 60 + m[3]::int;
        close_minute := coalesce(m[4], m[6])::int * 60 + coalesce(m[5], m[7])::int;
        IF close_minute = open_minute THEN
            RAISE EXCEPTION 'intake hours: % opens and closes at the same time', quote_literal(entry)
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        IF close_minute < open_minute THEN
            close_minute := close_minute + 1440;  -- overnight: closes the next day
        END IF;
        FOREACH part IN ARRAY string_to_array(m[1], ',') LOOP
            first_day := array_position(day_names, split_part(part, '-', 1)) - 1;
            last_day := coalesce(array_position(day_names, nullif(split_part(part, '-', 2), '')) - 1, first_day);
            day := first_day;
            LOOP
                opens := day * 1440 + open_minute;
                closes := day * 1440 + close_minute;
                RETURN NEXT;
                EXIT WHEN day = last_day;
                day := (day + 1) % 7;
            END LOOP;
        END LOOP;
    END LOOP;
END $_$;

CREATE FUNCTION public.listing_requests_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'listing requests are history: append-only'
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION public.lock_delivery_scope(p_tenant_id uuid, p_destination_id uuid) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
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

CREATE FUNCTION public.lost_cancellation_payload(request_id uuid, requested_by text, requested_at timestamp with time zone, authorized_at timestamp with time zone, job_id uuid, outcome text, failure_reason text, file_name text, file_bytes bigint, file_rows bigint, file_sha256 bytea, outcome_at timestamp with time zone) RETURNS jsonb
    LANGUAGE sql STABLE
    AS $$
    SELECT jsonb_strip_nulls(jsonb_build_object(
        'cancellation_request_id', request_id,
        'export_id', job_id,
        'requested_by', requested_by,
        'requested_at', notification_time(requested_at),
        'delivery_authorized_at', notification_time(authorized_at),
        'outcome', outcome,
        'outcome_at', notification_time(outcome_at),
        'failure_reason', failure_reason,
        'file', CASE WHEN file_sha256 IS NOT NULL THEN jsonb_build_object(
            'name', file_name, 'bytes', file_bytes, 'rows', file_rows, 'sha256', encode(file_sha256, 'hex')) END,
        'message', 'Your cancel of export ' || job_id || ' lost: delivery had been authorized at '
            || coalesce(notification_time(authorized_at), 'an earlier time') || '; '
            || CASE outcome
                   WHEN 'Completed' THEN 'delivered at ' || notification_time(outcome_at)
                       || coalesce(', sha256 ' || encode(file_sha256, 'hex'), '')
                   WHEN 'Failed' THEN 'it then failed (' || failure_reason || ') at ' || notification_time(outcome_at)
                   ELSE 'its outcome is unknown since ' || notification_time(outcome_at)
                       || ' (reconciliation needed)'
               END || '.'))
$$;

CREATE TABLE public.export_jobs (
    id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    status text NOT NULL,
    version integer NOT NULL,
    destination_id uuid NOT NULL,
    attempt_id uuid,
    attempt_count integer DEFAULT 0 NOT NULL,
    claimed_by text,
    lease_expires_at timestamp with time zone,
    stop_request_id uuid,
    cancellation_request_id uuid,
    expected_file_name text,
    expected_file_bytes bigint,
    expected_file_sha256 bytea,
    expected_file_rows bigint,
    delivery_authorized_at timestamp with time zone,
    woken_at timestamp with time zone NOT NULL,
    failure_reason text,
    delivery_key text NOT NULL,
    replaces_job_id uuid,
    created_by text NOT NULL,
    replacement_reason text,
    overwrite_agreement_ref text,
    sweep_count integer DEFAULT 0 NOT NULL,
    list_name text NOT NULL,
    rejection_reason text,
    workflow_id text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    attempts_released integer DEFAULT 0 NOT NULL,
    fence_expected boolean DEFAULT false NOT NULL,
    upload_fenced_at timestamp with time zone,
    rename_fenced_at timestamp with time zone,
    rejection_code text,
    available_at timestamp with time zone,
    transient_releases integer DEFAULT 0 NOT NULL,
    destination_version integer,
    outcome_unknown_at timestamp with time zone,
    expected_manifest text,
    CONSTRAINT ck_export_jobs_expected_manifest CHECK ((expected_manifest = ANY (ARRAY['none'::text, 'sha256'::text, 'json'::text, 'both'::text]))),
    CONSTRAINT ck_export_jobs_failure CHECK (((status = 'Failed'::text) = (failure_reason IS NOT NULL))),
    CONSTRAINT ck_export_jobs_fences CHECK (((rename_fenced_at IS NULL) OR (upload_fenced_at IS NOT NULL))),
    CONSTRAINT ck_export_jobs_outcome_unknown_at CHECK (((status <> 'OutcomeUnknown'::text) OR (outcome_unknown_at IS NOT NULL))),
    CONSTRAINT ck_export_jobs_overwrite CHECK (((overwrite_agreement_ref IS NULL) OR (replaces_job_id IS NOT NULL))),
    CONSTRAINT ck_export_jobs_rejection CHECK ((((status = 'Rejected'::text) = (rejection_code IS NOT NULL)) AND ((rejection_code IS NULL) OR (rejection_reason IS NOT NULL)))),
    CONSTRAINT ck_export_jobs_rejection_code CHECK ((rejection_code = ANY (ARRAY['list_invalid'::text, 'destination_not_found'::text, 'destination_retired'::text, 'contract_not_started'::text, 'contract_ended'::text, 'creator_unknown'::text, 'creator_revoked'::text, 'creator_not_permitted'::text, 'list_missing'::text]))),
    CONSTRAINT ck_export_jobs_replacement CHECK (((replaces_job_id IS NULL) = (replacement_reason IS NULL))),
    CONSTRAINT export_jobs_attempts_released_check CHECK ((attempts_released >= 0)),
    CONSTRAINT export_jobs_failure_reason_check CHECK ((failure_reason = ANY (ARRAY['BuildFailed'::text, 'AttemptsExhausted'::text, 'NotDelivered'::text, 'FinalNameOccupied'::text, 'OriginalDelivered'::text]))),
    CONSTRAINT export_jobs_status_check CHECK ((status = ANY (ARRAY['Queued'::text, 'Running'::text, 'Delivering'::text, 'Canceled'::text, 'Rejected'::text, 'Stopped'::text, 'Failed'::text, 'Completed'::text, 'OutcomeUnknown'::text]))),
    CONSTRAINT export_jobs_transient_releases_check CHECK ((transient_releases >= 0))
);

CREATE FUNCTION public.manifest_in_place(j public.export_jobs) RETURNS boolean
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
SELECT coalesce(j.expected_manifest, 'none') = 'none'
       OR NOT EXISTS (
           SELECT 1 FROM unnest(manifest_names(j.expected_file_name, j.expected_manifest)) AS wanted (name)
           WHERE NOT EXISTS (
               SELECT 1 FROM (
                   SELECT CASE WHEN e.kind = 'DeliveryEvidence' AND strpos(e.detail, '"manifest"') > 0
                                    AND NOT starts_with(coalesce(e.observed_by, ''), 'reconciler-request:')
                               THEN e.detail::jsonb END AS detail
                   FROM export_attempt_events e
                   WHERE e.job_id = j.id AND e.attempt_id = j.attempt_id) seen
               WHERE seen.detail ->> 'observation' = 'manifest'
                 AND seen.detail ->> 'name' = wanted.name
                 AND seen.detail ->> 'result' IN ('published', 'in_place')))
$$;

CREATE FUNCTION public.manifest_names(file_name text, choice text) RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
SELECT CASE choice
           WHEN 'sha256' THEN ARRAY[file_name || '.sha256']
           WHEN 'json' THEN ARRAY[file_name || '.manifest.json']
           WHEN 'both' THEN ARRAY[file_name || '.sha256', file_name || '.manifest.json']
           ELSE ARRAY[]::text[] END
$$;

CREATE FUNCTION public.next_window_opening(d public.destinations, at timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    AS $$
DECLARE
    tz constant text := d.intake_time_zone;
    first_day date;
    day date;
    best timestamptz;
    candidate timestamptz;
    opens_at int[];
BEGIN
    IF delivery_window_open(d, at) THEN
        RETURN at;
    END IF;
    first_day := (at AT TIME ZONE tz)::date;
    -- each entry's opening minutes of the day, by ISO day of the week (1 = Monday)
    FOR i IN 0..400 LOOP
        day := first_day + i;
        CONTINUE WHEN day = ANY (d.blackout_dates);
        -- the day's openings (a range's start; one that only continues past the week's end adds a harmless
        -- candidate, where the window is already open)
        SELECT coalesce(array_agg(DISTINCT lower(r) % 1440), '{}') INTO opens_at
        FROM unnest(coalesce(d.intake_week, '{}'::int4multirange)) AS r
        WHERE lower(r) / 1440 = extract(isodow FROM day)::int - 1;
        best := NULL;
        FOR candidate IN
            SELECT x FROM unnest(array_append(opens_at, 0)) AS o(minute),
                          LATERAL wall_clock_instants(day + make_interval(mins => o.minute), tz) AS x
            UNION ALL
            SELECT x FROM offset_change_between(day::timestamp AT TIME ZONE tz,
                                                (day + 1)::timestamp AT TIME ZONE tz, tz) AS x
        LOOP
            IF candidate > at AND (best IS NULL OR candidate < best) AND delivery_window_open(d, candidate) THEN
                best := candidate;
            END IF;
        END LOOP;
        IF best IS NOT NULL THEN
            RETURN best;
        END IF;
    END LOOP;
    RETURN NULL;
END $$;

CREATE FUNCTION public.notification_time(t timestamp with time zone) RETURNS text
    LANGUAGE sql STABLE PARALLEL SAFE
    AS $$
    SELECT to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')
$$;

CREATE FUNCTION public.notify_export_outcome() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
DECLARE
    at timestamptz := clock_timestamp();
BEGIN
    INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload, created_at)
    VALUES (NEW.tenant_id,
            CASE NEW.status
                WHEN 'Completed' THEN 'export.completed' WHEN 'Failed' THEN 'export.failed'
                WHEN 'Stopped' THEN 'export.stopped' WHEN 'Canceled' THEN 'export.canceled'
                WHEN 'Rejected' THEN 'export.rejected' ELSE 'export.outcome_unknown' END,
            NEW.id, NEW.id::text,
            jsonb_strip_nulls(jsonb_build_object(
                'export_id', NEW.id,
                'status', NEW.status,
                'previous_status', OLD.status,
                'outcome_at', notification_time(at),
                'destination_id', NEW.destination_id,
                'destination_name', (SELECT d.name FROM destinations d WHERE d.id = NEW.destination_id),
                'list_name', NEW.list_name,
                'created_by', NEW.created_by,
                'attempt_id', NEW.attempt_id,
                'replaces_export_id', NEW.replaces_job_id,
                'failure_reason', NEW.failure_reason,
                'rejection_code', NEW.rejection_code,
                'rejection_reason', NEW.rejection_reason,   -- the policy's sentence: names and dates only
                'stop_request_id', CASE WHEN NEW.status = 'Stopped' THEN NEW.stop_request_id END,
                'cancellation_request_id', NEW.cancellation_request_id,
                'delivery_authorized_at', notification_time(NEW.delivery_authorized_at),
                'reconciliation_needed', CASE WHEN NEW.status = 'OutcomeUnknown' THEN true END,
                'file', CASE WHEN NEW.expected_file_sha256 IS NOT NULL
                                  AND NEW.status IN ('Completed', 'Failed', 'OutcomeUnknown')
                             THEN jsonb_build_object(
                                 'name', NEW.expected_file_name, 'bytes', NEW.expected_file_bytes,
                                 'rows', NEW.expected_file_rows, 'sha256', encode(NEW.expected_file_sha256, 'hex'))
                        END)),
            at)
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;

    IF OLD.status = 'Delivering' THEN
        INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload, created_at)
        SELECT r.tenant_id, 'export.cancellation_lost', NEW.id, r.id::text,
               lost_cancellation_payload(
                   r.id, r.requested_by, r.recorded_at, r.found_delivery_authorized_at, NEW.id, NEW.status,
                   NEW.failure_reason, NEW.expected_file_name, NEW.expected_file_bytes, NEW.expected_file_rows,
                   NEW.expected_file_sha256, at), at
        FROM cancellation_requests r
        WHERE r.job_id = NEW.id AND r.tenant_id = NEW.tenant_id AND r.outcome = 'TooLate'
          AND r.found_status = 'Delivering' AND r.found_attempt_id IS NOT DISTINCT FROM OLD.attempt_id
        ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION public.notify_lost_cancellation() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
DECLARE
    j record;
    ended_at timestamptz;
BEGIN
    SELECT status, failure_reason, expected_file_name, expected_file_bytes, expected_file_rows, expected_file_sha256
    INTO j FROM export_jobs WHERE id = NEW.job_id AND tenant_id = NEW.tenant_id;
    SELECT e.created_at INTO ended_at FROM notification_events e
    WHERE e.tenant_id = NEW.tenant_id AND e.subject_key = NEW.job_id::text
      AND e.kind IN ('export.completed', 'export.failed', 'export.outcome_unknown')
    ORDER BY e.created_at
    LIMIT 1;
    INSERT INTO notification_events (tenant_id, kind, job_id, subject_key, payload)
    VALUES (NEW.tenant_id, 'export.cancellation_lost', NEW.job_id, NEW.id::text,
            lost_cancellation_payload(
                NEW.id, NEW.requested_by, NEW.recorded_at, NEW.found_delivery_authorized_at, NEW.job_id, j.status,
                j.failure_reason, j.expected_file_name, j.expected_file_bytes, j.expected_file_rows,
                j.expected_file_sha256, coalesce(ended_at, NEW.recorded_at)))
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING;
    RETURN NULL;
END $$;

CREATE FUNCTION public.notify_recurring_firing_row() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $$
BEGIN
    PERFORM notify_recurring_firing_skipped(
        NEW.tenant_id, NEW.recurring_export_id,
        (SELECT r.list_name || ' to ' || coalesce(d.name, r.destination_id::text)
         FROM recurring_exports r
         LEFT JOIN destinations d ON d.tenant_id = r.tenant_id AND d.id = r.destination_id
         WHERE r.tenant_id = NEW.tenant_id AND r.id = NEW.recurring_export_id),
        NEW.nominal_time, NEW.reason);
    RETURN NULL;
END $$;

CREATE FUNCTION public.notify_recurring_firing_skipped(p_tenant_id uuid, p_recurring_export_id uuid, p_recurring_name text, p_scheduled_for timestamp with time zone, p_reason text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'public'
    AS $_$
DECLARE
    new_id uuid;
BEGIN
    IF p_reason IS NULL OR p_reason !~ '^[a-z][a-z0-9_]{0,63}$' THEN
        RAISE EXCEPTION 'a skipped firing''s reason is a short code (lower case, digits, _), not %', p_reason
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_notification_events_skip_reason';
    END IF;
    INSERT INTO notification_events (tenant_id, kind, subject_key, payload)
    VALUES (p_tenant_id, 'recurring_export.firing_skipped',
            p_recurring_export_id::text || '@' || notification_time(p_scheduled_for),
            jsonb_strip_nulls(jsonb_build_object(
                'recurring_export_id', p_recurring_export_id,
                'recurring_export_name', p_recurring_name,
                'scheduled_for', notification_time(p_scheduled_for),
                'reason', p_reason)))
    ON CONFLICT ON CONSTRAINT uq_notification_events_subject DO NOTHING
    RETURNING id INTO new_id;
    RETURN new_id;
END $_$;

CREATE FUNCTION public.offset_change_between(low timestamp with time zone, high timestamp with time zone, tz text) RETURNS SETOF timestamp with time zone
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    AS $$
DECLARE
    lo bigint := floor(extract(epoch FROM low));
    hi bigint := ceil(extract(epoch FROM high));
    target constant interval := (high AT TIME ZONE tz) - (high AT TIME ZONE 'UTC');
    mid bigint;
BEGIN
    IF (low AT TIME ZONE tz) - (low AT TIME ZONE 'UTC') = target THEN
        RETURN;
    END IF;
    WHILE hi - lo > 1 LOOP
        mid := (lo + hi) / 2;
        IF (to_timestamp(mid) AT TIME ZONE tz) - (to_timestamp(mid) AT TIME ZONE 'UTC') = target THEN
            hi := mid;
        ELSE
            lo := mid;
        END IF;
    END LOOP;
    RETURN NEXT to_timestamp(hi);
END $$;

CREATE FUNCTION public.operator_action_json_ok(j jsonb) RETURNS boolean
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $_$
    SELECT j IS NULL OR NOT jsonb_path_exists(
        j,
        'lax $.** ? (@.type() == "object").keyvalue() ? ((@.key like_regex "_ref$" && @.key != "evidence_ref" && @.key != "overwrite_agreement_ref" && @.value != "set" && @.value != null) || (@.key like_regex "secret|password|private_key" && @.value != null))')
$_$;

CREATE FUNCTION public.operator_actions_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'the ledger of operator actions is append-only'
        USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_operator_actions_append_only';
END $$;

CREATE FUNCTION public.outbox_notify() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM pg_notify('outbox', '');
    RETURN NULL;
END $$;

CREATE FUNCTION public.outcome_corrections_approved() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NOT approved_action(NEW.tenant_id, ARRAY['correct_outcome'], NEW.job_id::text, NEW.corrected_by,
                           jsonb_build_object('attempt_id', NEW.attempt_id::text, 'corrected_status', NEW.to_status)) THEN
        RAISE EXCEPTION 'export %: a correction to % needs another principal''s approval of it, decided by %',
                NEW.job_id, NEW.to_status, NEW.corrected_by
            USING ERRCODE = 'check_violation', CONSTRAINT = 'ck_outcome_corrections_approved';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.pause_destination_for_partner(p_tenant_id uuid, p_destination_id uuid, p_version integer, p_reason text, p_changed_by text) RETURNS TABLE(was_enabled boolean, paused boolean, destination_changed boolean)
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
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

CREATE FUNCTION public.principal_holds(p_tenant_id uuid, p_principal text, p_roles text[]) RETURNS boolean
    LANGUAGE sql STABLE SECURITY DEFINER
    SET search_path TO 'public', 'pg_temp'
    AS $$
    SELECT EXISTS (SELECT 1 FROM principals p
                   WHERE p.tenant_id = p_tenant_id AND p.name = p_principal AND p.revoked_at IS NULL
                     AND p.role = ANY (p_roles))
$$;

CREATE FUNCTION public.principals_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF current_user = 'exports_worker' THEN
        RAISE EXCEPTION 'exports_worker reads principals, it never changes them'
            USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_principals_writer';
    END IF;
    RETURN NEW;
END $$;

CREATE FUNCTION public.recurring_export_firings_append_only() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    RAISE EXCEPTION 'the firings of recurring exports are history: append-only'
        USING ERRCODE = 'insufficient_privilege';
END $$;

CREATE FUNCTION public.recurring_exports_guard() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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

CREATE TABLE public.destination_session_slots (
    tenant_id uuid NOT NULL,
    destination_id uuid NOT NULL,
    slot smallint NOT NULL,
    holder uuid,
    job_id uuid,
    purpose text,
    taken_at timestamp with time zone,
    expires_at timestamp with time zone,
    CONSTRAINT ck_destination_session_slots_holder CHECK ((((holder IS NULL) AND (job_id IS NULL) AND (purpose IS NULL) AND (taken_at IS NULL) AND (expires_at IS NULL)) OR ((holder IS NOT NULL) AND (purpose = 'attempt'::text) AND (job_id IS NOT NULL) AND (taken_at IS NOT NULL)) OR ((holder IS NOT NULL) AND (purpose <> 'attempt'::text) AND (job_id IS NULL) AND (taken_at IS NOT NULL) AND (expires_at IS NOT NULL)))),
    CONSTRAINT destination_session_slots_purpose_check CHECK ((purpose = ANY (ARRAY['attempt'::text, 'recovery'::text, 'cleanup'::text, 'connection_test'::text]))),
    CONSTRAINT destination_session_slots_slot_check CHECK ((slot >= 1))
);

CREATE FUNCTION public.session_slot_held(s public.destination_session_slots) RETURNS boolean
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

CREATE FUNCTION public.two_person_destination_fields() RETURNS text[]
    LANGUAGE sql IMMUTABLE PARALLEL SAFE
    AS $$
    SELECT ARRAY['host', 'port', 'username', 'credential_ref', 'host_key', 'host_keys', 'pgp_recipient_keys',
                 'pgp_signing_key_ref']
$$;

CREATE FUNCTION public.wall_clock_instants(wall timestamp without time zone, tz text) RETURNS SETOF timestamp with time zone
    LANGUAGE plpgsql STABLE PARALLEL SAFE
    AS $$
DECLARE
    guess constant timestamptz := wall AT TIME ZONE tz;
    before_offset interval;
    after_offset interval;
    earlier timestamptz;
    later timestamptz;
BEGIN
    before_offset := ((guess - interval '1 day') AT TIME ZONE tz) - ((guess - interval '1 day') AT TIME ZONE 'UTC');
    after_offset := ((guess + interval '1 day') AT TIME ZONE tz) - ((guess + interval '1 day') AT TIME ZONE 'UTC');
    earlier := (wall - before_offset) AT TIME ZONE 'UTC';
    later := (wall - after_offset) AT TIME ZONE 'UTC';
    IF later < earlier THEN
        SELECT later, earlier INTO earlier, later;
    END IF;
    IF (earlier AT TIME ZONE tz) = wall THEN
        RETURN NEXT earlier;
    END IF;
    IF later <> earlier AND (later AT TIME ZONE tz) = wall THEN
        RETURN NEXT later;
    END IF;
END $$;

CREATE TABLE public.api_tokens (
    token_sha256 bytea NOT NULL,
    tenant_id uuid NOT NULL,
    principal text NOT NULL,
    role text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT api_tokens_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'reconciler'::text, 'admin'::text])))
);

CREATE TABLE public.approvals (
    tenant_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    action text NOT NULL,
    subject_kind text NOT NULL,
    subject_id text NOT NULL,
    parameters jsonb NOT NULL,
    reason text NOT NULL,
    requested_by text NOT NULL,
    requested_role text NOT NULL,
    requested_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    decision text,
    decided_by text,
    decided_role text,
    decided_at timestamp with time zone,
    decision_reason text,
    executed_at timestamp with time zone,
    outcome text,
    CONSTRAINT approvals_action_check CHECK ((action = ANY (ARRAY['resume_pause'::text, 'pin_host_key'::text, 'change_destination'::text, 'correct_outcome'::text, 'replace_with_overwrite'::text]))),
    CONSTRAINT approvals_decided_by_check CHECK (((length(decided_by) >= 1) AND (length(decided_by) <= 200))),
    CONSTRAINT approvals_decision_check CHECK ((decision = ANY (ARRAY['approved'::text, 'declined'::text]))),
    CONSTRAINT approvals_decision_reason_check CHECK (((length(decision_reason) >= 1) AND (length(decision_reason) <= 1000))),
    CONSTRAINT approvals_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT approvals_requested_by_check CHECK (((length(requested_by) >= 1) AND (length(requested_by) <= 200))),
    CONSTRAINT approvals_subject_id_check CHECK (((length(subject_id) >= 1) AND (length(subject_id) <= 200))),
    CONSTRAINT approvals_subject_kind_check CHECK ((subject_kind = ANY (ARRAY['delivery_pause'::text, 'destination'::text, 'export'::text]))),
    CONSTRAINT ck_approvals_decision CHECK ((((decision IS NULL) = (decided_by IS NULL)) AND ((decision IS NULL) = (decided_role IS NULL)) AND ((decision IS NULL) = (decided_at IS NULL)))),
    CONSTRAINT ck_approvals_executed CHECK ((((executed_at IS NULL) = (outcome IS NULL)) AND ((executed_at IS NULL) OR (decision = 'approved'::text)))),
    CONSTRAINT ck_approvals_in_time CHECK (((decided_at IS NULL) OR (decided_at <= expires_at))),
    CONSTRAINT ck_approvals_no_secrets CHECK ((NOT jsonb_path_exists(parameters, '$.**?(@.type() == "object").keyvalue()?(@."key" like_regex "secret|password|private_key" && @."value" != null)'::jsonpath))),
    CONSTRAINT ck_approvals_second_person CHECK (((decided_by IS NULL) OR (decided_by <> requested_by))),
    CONSTRAINT ck_approvals_window CHECK (((expires_at > requested_at) AND (expires_at <= (requested_at + '7 days'::interval))))
);

CREATE TABLE public.cancellation_batch_jobs (
    tenant_id uuid NOT NULL,
    batch_id uuid NOT NULL,
    job_id uuid NOT NULL
);

CREATE TABLE public.cancellation_batches (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    requested_by text NOT NULL,
    reason text NOT NULL,
    destination_id uuid NOT NULL,
    list_name text,
    matched integer NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    preview_id uuid,
    CONSTRAINT cancellation_batches_list_name_check CHECK (((list_name IS NULL) OR ((length(list_name) >= 1) AND (length(list_name) <= 200)))),
    CONSTRAINT cancellation_batches_matched_check CHECK ((matched >= 0)),
    CONSTRAINT cancellation_batches_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000)))
);

CREATE TABLE public.cancellation_previews (
    tenant_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    previewed_by text NOT NULL,
    destination_id uuid NOT NULL,
    list_name text,
    job_ids uuid[] NOT NULL,
    previewed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT cancellation_previews_job_ids_check CHECK ((cardinality(job_ids) > 0)),
    CONSTRAINT cancellation_previews_list_name_check CHECK (((list_name IS NULL) OR ((length(list_name) >= 1) AND (length(list_name) <= 200)))),
    CONSTRAINT ck_cancellation_previews_expiry CHECK ((expires_at > previewed_at))
);

CREATE TABLE public.cancellation_requests (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    job_id uuid NOT NULL,
    requested_by text NOT NULL,
    reason text,
    outcome text NOT NULL,
    found_status text NOT NULL,
    found_attempt_id uuid,
    found_attempt_count integer NOT NULL,
    found_delivery_authorized_at timestamp with time zone,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    batch_id uuid,
    CONSTRAINT cancellation_requests_outcome_check CHECK ((outcome = ANY (ARRAY['CanceledWhileQueued'::text, 'StopRequested'::text, 'StopAlreadyRequested'::text, 'AlreadyCanceled'::text, 'AlreadyEnded'::text, 'TooLate'::text])))
);

CREATE TABLE public.cancellation_stop_signals (
    tenant_id uuid NOT NULL,
    request_id uuid NOT NULL,
    workflow_id text NOT NULL,
    signalled_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE TABLE public.console_sessions (
    session_sha256 bytea NOT NULL,
    token_sha256 bytea NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    CONSTRAINT ck_console_sessions_expiry CHECK ((expires_at > created_at)),
    CONSTRAINT console_sessions_session_sha256_check CHECK ((length(session_sha256) = 32))
);

CREATE TABLE public.contacts (
    tenant_id uuid NOT NULL,
    id bigint NOT NULL,
    list_name text NOT NULL,
    email text NOT NULL,
    first_name text DEFAULT ''::text NOT NULL,
    last_name text DEFAULT ''::text NOT NULL
);

ALTER TABLE public.contacts ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.contacts_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.deliveries (
    tenant_id uuid NOT NULL,
    delivery_key text NOT NULL,
    original_job_id uuid NOT NULL
);

CREATE TABLE public.delivery_pauses (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    scope text NOT NULL,
    tenant_id uuid,
    destination_id uuid,
    kind text DEFAULT 'manual'::text NOT NULL,
    owner text NOT NULL,
    reason text NOT NULL,
    paused_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    expires_at timestamp with time zone,
    released_at timestamp with time zone,
    released_by text,
    release_reason text,
    CONSTRAINT ck_delivery_pauses_expiry CHECK (((expires_at IS NULL) OR (expires_at > paused_at))),
    CONSTRAINT ck_delivery_pauses_released CHECK ((((released_at IS NULL) = (released_by IS NULL)) AND ((released_at IS NULL) = (release_reason IS NULL)))),
    CONSTRAINT ck_delivery_pauses_scope CHECK ((((scope = 'global'::text) AND (tenant_id IS NULL) AND (destination_id IS NULL)) OR ((scope = 'tenant'::text) AND (tenant_id IS NOT NULL) AND (destination_id IS NULL)) OR ((scope = 'destination'::text) AND (tenant_id IS NOT NULL) AND (destination_id IS NOT NULL)))),
    CONSTRAINT delivery_pauses_kind_check CHECK ((kind = ANY (ARRAY['manual'::text, 'host_key'::text]))),
    CONSTRAINT delivery_pauses_owner_check CHECK (((length(owner) >= 1) AND (length(owner) <= 200))),
    CONSTRAINT delivery_pauses_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT delivery_pauses_release_reason_check CHECK (((length(release_reason) >= 1) AND (length(release_reason) <= 1000))),
    CONSTRAINT delivery_pauses_released_by_check CHECK (((length(released_by) >= 1) AND (length(released_by) <= 200))),
    CONSTRAINT delivery_pauses_scope_check CHECK ((scope = ANY (ARRAY['global'::text, 'tenant'::text, 'destination'::text])))
);

CREATE TABLE public.delivery_switch_changes (
    id bigint NOT NULL,
    scope text NOT NULL,
    tenant_id uuid,
    destination_id uuid,
    enabled boolean NOT NULL,
    was_enabled boolean,
    reason text NOT NULL,
    changed_by text NOT NULL,
    changed_at timestamp with time zone NOT NULL,
    pause_ids uuid[]
);

ALTER TABLE public.delivery_switch_changes ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.delivery_switch_changes_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.delivery_switches (
    scope text NOT NULL,
    tenant_id uuid,
    destination_id uuid,
    enabled boolean NOT NULL,
    reason text NOT NULL,
    changed_by text NOT NULL,
    changed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    held_until timestamp with time zone,
    CONSTRAINT ck_delivery_switches_scope CHECK ((((scope = 'global'::text) AND (tenant_id IS NULL) AND (destination_id IS NULL)) OR ((scope = 'tenant'::text) AND (tenant_id IS NOT NULL) AND (destination_id IS NULL)) OR ((scope = 'destination'::text) AND (tenant_id IS NOT NULL) AND (destination_id IS NOT NULL)))),
    CONSTRAINT delivery_switches_changed_by_check CHECK (((length(changed_by) >= 1) AND (length(changed_by) <= 200))),
    CONSTRAINT delivery_switches_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT delivery_switches_scope_check CHECK ((scope = ANY (ARRAY['global'::text, 'tenant'::text, 'destination'::text])))
);

CREATE TABLE public.destination_versions (
    tenant_id uuid NOT NULL,
    destination_id uuid NOT NULL,
    version integer NOT NULL,
    change text NOT NULL,
    changed_by text NOT NULL,
    changed_role text NOT NULL,
    reason text NOT NULL,
    changed_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    before jsonb,
    after jsonb NOT NULL,
    changed_fields text[] NOT NULL,
    delivery_changed boolean NOT NULL,
    request_key text,
    request_fingerprint text,
    CONSTRAINT ck_destination_versions_before CHECK (((change = 'created'::text) = (before IS NULL))),
    CONSTRAINT ck_destination_versions_request CHECK ((((request_key IS NULL) = (request_fingerprint IS NULL)) AND ((request_key IS NULL) OR (change = 'created'::text)))),
    CONSTRAINT destination_versions_change_check CHECK ((change = ANY (ARRAY['created'::text, 'edited'::text, 'retired'::text]))),
    CONSTRAINT destination_versions_changed_by_check CHECK (((length(changed_by) >= 1) AND (length(changed_by) <= 200))),
    CONSTRAINT destination_versions_changed_role_check CHECK ((changed_role = ANY (ARRAY['admin'::text, 'owner'::text]))),
    CONSTRAINT destination_versions_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT destination_versions_request_key_check CHECK (((length(request_key) >= 1) AND (length(request_key) <= 200))),
    CONSTRAINT destination_versions_version_check CHECK ((version >= 1))
);

CREATE TABLE public.export_attempt_events (
    id bigint NOT NULL,
    job_id uuid NOT NULL,
    attempt_id uuid NOT NULL,
    kind text NOT NULL,
    version integer,
    worker_id text,
    observed_by text,
    detail text,
    recorded_at timestamp with time zone NOT NULL,
    destination_version integer,
    CONSTRAINT export_attempt_events_kind_check CHECK ((kind = ANY (ARRAY['Claimed'::text, 'DeliveryAuthorized'::text, 'Stopped'::text, 'Failed'::text, 'Finished'::text, 'RequeuedByRecovery'::text, 'StoppedByRecovery'::text, 'AttemptsExhausted'::text, 'ResolvedByRecovery'::text, 'Reconciled'::text, 'Corrected'::text, 'DeliveryEvidence'::text, 'Released'::text, 'UploadFenced'::text, 'RenameFenced'::text, 'RetryScheduled'::text])))
);

ALTER TABLE public.export_attempt_events ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.export_attempt_events_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.export_status_edges (
    from_status text NOT NULL,
    to_status text NOT NULL,
    via text NOT NULL,
    roles text[] DEFAULT '{}'::text[] NOT NULL
);

CREATE TABLE public.idempotency_keys (
    tenant_id uuid NOT NULL,
    operation text NOT NULL,
    key text NOT NULL,
    fingerprint text NOT NULL,
    job_id uuid NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT idempotency_keys_key_check CHECK (((length(key) >= 1) AND (length(key) <= 200)))
);

CREATE TABLE public.listing_requests (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    job_id uuid NOT NULL,
    attempt_id uuid NOT NULL,
    requested_by text NOT NULL,
    requested_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT listing_requests_requested_by_check CHECK (((length(requested_by) >= 1) AND (length(requested_by) <= 200)))
);

CREATE TABLE public.notification_events (
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    tenant_id uuid NOT NULL,
    kind text NOT NULL,
    job_id uuid,
    subject_key text NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    fanned_out_at timestamp with time zone,
    CONSTRAINT notification_events_kind_check CHECK ((kind = ANY (ARRAY['export.completed'::text, 'export.failed'::text, 'export.stopped'::text, 'export.canceled'::text, 'export.rejected'::text, 'export.outcome_unknown'::text, 'export.cancellation_lost'::text, 'recurring_export.firing_skipped'::text]))),
    CONSTRAINT notification_events_subject_key_check CHECK (((length(subject_key) >= 1) AND (length(subject_key) <= 200)))
);

CREATE TABLE public.operator_actions (
    id bigint NOT NULL,
    tenant_id uuid,
    at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    principal text NOT NULL,
    role text NOT NULL,
    action text NOT NULL,
    subject_kind text NOT NULL,
    subject_id text,
    request_id text,
    reason text,
    outcome text NOT NULL,
    detail text,
    approval_id uuid,
    requested_by text,
    before jsonb,
    after jsonb,
    CONSTRAINT ck_operator_actions_action CHECK ((action = ANY (ARRAY['cancel'::text, 'bulk_cancel'::text, 'pause'::text, 'resume'::text, 'reconcile'::text, 'correct'::text, 'replace'::text, 'destination.create'::text, 'destination.edit'::text, 'destination.retire'::text, 'destination.pin_key'::text, 'recurring.create'::text, 'recurring.edit'::text, 'recurring.pause'::text, 'recurring.resume'::text, 'recurring.delete'::text, 'token.mint'::text, 'token.revoke'::text, 'principal.grant'::text, 'principal.revoke'::text, 'webhook.create'::text, 'webhook.edit'::text, 'webhook.delete'::text, 'webhook.redeliver'::text, 'listing.request'::text, 'approval.approve'::text, 'approval.decline'::text]))),
    CONSTRAINT ck_operator_actions_no_secrets CHECK ((public.operator_action_json_ok(before) AND public.operator_action_json_ok(after))),
    CONSTRAINT ck_operator_actions_outcome CHECK ((outcome = ANY (ARRAY['done'::text, 'created'::text, 'accepted'::text, 'partial'::text, 'malformed'::text, 'forbidden'::text, 'not_found'::text, 'refused'::text, 'stale'::text, 'invalid'::text, 'precondition_required'::text]))),
    CONSTRAINT ck_operator_actions_second_person CHECK (((requested_by IS NULL) OR ((approval_id IS NOT NULL) AND (requested_by <> principal)))),
    CONSTRAINT ck_operator_actions_subject_kind CHECK ((subject_kind = ANY (ARRAY['export'::text, 'cancellation_batch'::text, 'delivery_scope'::text, 'destination'::text, 'recurring_export'::text, 'principal'::text, 'token'::text, 'approval'::text, 'webhook_endpoint'::text]))),
    CONSTRAINT operator_actions_detail_check CHECK (((length(detail) >= 1) AND (length(detail) <= 2000))),
    CONSTRAINT operator_actions_principal_check CHECK (((length(principal) >= 1) AND (length(principal) <= 200))),
    CONSTRAINT operator_actions_reason_check CHECK (((length(reason) >= 1) AND (length(reason) <= 1000))),
    CONSTRAINT operator_actions_request_id_check CHECK (((length(request_id) >= 1) AND (length(request_id) <= 200))),
    CONSTRAINT operator_actions_requested_by_check CHECK (((length(requested_by) >= 1) AND (length(requested_by) <= 200))),
    CONSTRAINT operator_actions_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'reconciler'::text, 'admin'::text, 'owner'::text, 'platform'::text]))),
    CONSTRAINT operator_actions_subject_id_check CHECK (((length(subject_id) >= 1) AND (length(subject_id) <= 200)))
);

ALTER TABLE public.operator_actions ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.operator_actions_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.outbox (
    message_id uuid NOT NULL,
    kind text NOT NULL,
    job_id uuid NOT NULL,
    created_at timestamp with time zone NOT NULL,
    published_at timestamp with time zone,
    traceparent text,
    publishing_until timestamp with time zone,
    available_at timestamp with time zone,
    CONSTRAINT ck_outbox_traceparent CHECK ((traceparent ~ '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'::text))
);

CREATE TABLE public.outcome_corrections (
    tenant_id uuid NOT NULL,
    job_id uuid NOT NULL,
    attempt_id uuid NOT NULL,
    from_status text NOT NULL,
    to_status text NOT NULL,
    failure_reason text,
    corrected_by text NOT NULL,
    evidence_ref text NOT NULL,
    why text NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT ck_outcome_corrections_change CHECK ((from_status <> to_status)),
    CONSTRAINT outcome_corrections_from_status_check CHECK ((from_status = ANY (ARRAY['Completed'::text, 'Failed'::text]))),
    CONSTRAINT outcome_corrections_to_status_check CHECK ((to_status = ANY (ARRAY['Completed'::text, 'Failed'::text])))
);

CREATE TABLE public.principals (
    tenant_id uuid NOT NULL,
    name text NOT NULL,
    role text NOT NULL,
    export_lists text[],
    revoked_at timestamp with time zone,
    revoked_by text,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT ck_principals_revoked CHECK (((revoked_at IS NULL) = (revoked_by IS NULL))),
    CONSTRAINT principals_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200))),
    CONSTRAINT principals_role_check CHECK ((role = ANY (ARRAY['viewer'::text, 'operator'::text, 'reconciler'::text, 'admin'::text])))
);

CREATE TABLE public.recurring_export_firings (
    tenant_id uuid NOT NULL,
    recurring_export_id uuid NOT NULL,
    nominal_time timestamp with time zone NOT NULL,
    id bigint NOT NULL,
    outcome text NOT NULL,
    reason text,
    message text NOT NULL,
    job_id uuid,
    late boolean NOT NULL,
    fired_by text NOT NULL,
    recorded_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT ck_recurring_export_firings_outcome CHECK ((((outcome = 'created'::text) AND (reason IS NULL) AND (job_id IS NOT NULL)) OR ((outcome = 'skipped'::text) AND (reason IS NOT NULL) AND ((job_id IS NULL) OR (reason = 'overlap'::text))))),
    CONSTRAINT recurring_export_firings_fired_by_check CHECK (((length(fired_by) >= 1) AND (length(fired_by) <= 400))),
    CONSTRAINT recurring_export_firings_message_check CHECK (((length(message) >= 1) AND (length(message) <= 2000))),
    CONSTRAINT recurring_export_firings_outcome_check CHECK ((outcome = ANY (ARRAY['created'::text, 'skipped'::text]))),
    CONSTRAINT recurring_export_firings_reason_check CHECK ((reason = ANY (ARRAY['overlap'::text, 'deliveries_paused'::text, 'recurring_paused'::text, 'recurring_deleted'::text, 'catch_up'::text, 'outside_window'::text, 'list_invalid'::text, 'destination_not_found'::text, 'destination_retired'::text, 'contract_not_started'::text, 'contract_ended'::text, 'creator_unknown'::text, 'creator_revoked'::text, 'creator_not_permitted'::text])))
);

ALTER TABLE public.recurring_export_firings ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME public.recurring_export_firings_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

CREATE TABLE public.recurring_exports (
    tenant_id uuid NOT NULL,
    id uuid NOT NULL,
    destination_id uuid NOT NULL,
    list_name text NOT NULL,
    cron text,
    interval_seconds integer,
    time_zone text NOT NULL,
    starts_at timestamp with time zone,
    ends_at timestamp with time zone,
    paused boolean DEFAULT false NOT NULL,
    paused_reason text,
    deleted_at timestamp with time zone,
    deleted_by text,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_by text NOT NULL,
    updated_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    CONSTRAINT ck_recurring_exports_deleted CHECK (((deleted_at IS NULL) = (deleted_by IS NULL))),
    CONSTRAINT ck_recurring_exports_paused CHECK ((paused OR (paused_reason IS NULL))),
    CONSTRAINT ck_recurring_exports_when CHECK (((cron IS NULL) <> (interval_seconds IS NULL))),
    CONSTRAINT ck_recurring_exports_window CHECK (((starts_at IS NULL) OR (ends_at IS NULL) OR (ends_at > starts_at))),
    CONSTRAINT recurring_exports_cron_check CHECK (((length(cron) >= 1) AND (length(cron) <= 200))),
    CONSTRAINT recurring_exports_interval_seconds_check CHECK (((interval_seconds >= 60) AND (interval_seconds <= 31622400))),
    CONSTRAINT recurring_exports_list_name_check CHECK (((length(list_name) >= 1) AND (length(list_name) <= 200))),
    CONSTRAINT recurring_exports_paused_reason_check CHECK (((length(paused_reason) >= 1) AND (length(paused_reason) <= 1000))),
    CONSTRAINT recurring_exports_time_zone_check CHECK (((length(time_zone) >= 1) AND (length(time_zone) <= 64))),
    CONSTRAINT recurring_exports_version_check CHECK ((version >= 1))
);

CREATE TABLE public.schema_migrations (
    name text NOT NULL,
    applied_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL
);

CREATE TABLE public.tenants (
    id uuid NOT NULL,
    name text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT tenants_name_check CHECK (((length(name) >= 1) AND (length(name) <= 200)))
);

CREATE TABLE public.webhook_deliveries (
    tenant_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    event_id uuid NOT NULL,
    endpoint_id uuid NOT NULL,
    state text DEFAULT 'pending'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone NOT NULL,
    give_up_at timestamp with time zone NOT NULL,
    leased_until timestamp with time zone,
    last_attempt_at timestamp with time zone,
    last_status_code integer,
    last_error text,
    delivered_at timestamp with time zone,
    redeliveries integer DEFAULT 0 NOT NULL,
    redelivered_by text,
    redelivered_at timestamp with time zone,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    CONSTRAINT ck_webhook_deliveries_delivered CHECK (((state = 'delivered'::text) <= (delivered_at IS NOT NULL))),
    CONSTRAINT webhook_deliveries_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT webhook_deliveries_last_error_check CHECK (((last_error IS NULL) OR (length(last_error) <= 200))),
    CONSTRAINT webhook_deliveries_redeliveries_check CHECK ((redeliveries >= 0)),
    CONSTRAINT webhook_deliveries_state_check CHECK ((state = ANY (ARRAY['pending'::text, 'delivered'::text, 'failed'::text])))
);

CREATE TABLE public.webhook_endpoints (
    tenant_id uuid NOT NULL,
    id uuid DEFAULT gen_random_uuid() NOT NULL,
    url text NOT NULL,
    secret text NOT NULL,
    events text[] NOT NULL,
    description text,
    enabled boolean DEFAULT true NOT NULL,
    version integer DEFAULT 1 NOT NULL,
    created_by text NOT NULL,
    created_at timestamp with time zone DEFAULT clock_timestamp() NOT NULL,
    updated_by text,
    updated_at timestamp with time zone,
    CONSTRAINT webhook_endpoints_description_check CHECK (((description IS NULL) OR ((length(description) >= 1) AND (length(description) <= 200)))),
    CONSTRAINT webhook_endpoints_events_check CHECK ((((cardinality(events) >= 1) AND (cardinality(events) <= 8)) AND (events <@ ARRAY['export.completed'::text, 'export.failed'::text, 'export.stopped'::text, 'export.canceled'::text, 'export.rejected'::text, 'export.outcome_unknown'::text, 'export.cancellation_lost'::text, 'recurring_export.firing_skipped'::text]))),
    CONSTRAINT webhook_endpoints_secret_check CHECK ((secret ~ '^whsec_[A-Za-z0-9+/]{32,88}={0,2}$'::text)),
    CONSTRAINT webhook_endpoints_url_check CHECK (((length(url) >= 8) AND (length(url) <= 2000))),
    CONSTRAINT webhook_endpoints_version_check CHECK ((version >= 1))
);

ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_pkey PRIMARY KEY (token_sha256);

ALTER TABLE ONLY public.console_sessions
    ADD CONSTRAINT console_sessions_pkey PRIMARY KEY (session_sha256);

ALTER TABLE ONLY public.delivery_switch_changes
    ADD CONSTRAINT delivery_switch_changes_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.export_attempt_events
    ADD CONSTRAINT export_attempt_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT export_jobs_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.export_status_edges
    ADD CONSTRAINT export_status_edges_pkey PRIMARY KEY (from_status, to_status);

ALTER TABLE ONLY public.listing_requests
    ADD CONSTRAINT listing_requests_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.notification_events
    ADD CONSTRAINT notification_events_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.outbox
    ADD CONSTRAINT outbox_pkey PRIMARY KEY (message_id);

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT pk_approvals PRIMARY KEY (tenant_id, id);

ALTER TABLE ONLY public.cancellation_batch_jobs
    ADD CONSTRAINT pk_cancellation_batch_jobs PRIMARY KEY (tenant_id, batch_id, job_id);

ALTER TABLE ONLY public.cancellation_batches
    ADD CONSTRAINT pk_cancellation_batches PRIMARY KEY (tenant_id, id);

ALTER TABLE ONLY public.cancellation_previews
    ADD CONSTRAINT pk_cancellation_previews PRIMARY KEY (tenant_id, id);

ALTER TABLE ONLY public.cancellation_requests
    ADD CONSTRAINT pk_cancellation_requests PRIMARY KEY (tenant_id, id);

ALTER TABLE ONLY public.cancellation_stop_signals
    ADD CONSTRAINT pk_cancellation_stop_signals PRIMARY KEY (tenant_id, request_id);

ALTER TABLE ONLY public.contacts
    ADD CONSTRAINT pk_contacts PRIMARY KEY (tenant_id, list_name, id);

ALTER TABLE ONLY public.deliveries
    ADD CONSTRAINT pk_deliveries PRIMARY KEY (tenant_id, delivery_key);

ALTER TABLE ONLY public.delivery_pauses
    ADD CONSTRAINT pk_delivery_pauses PRIMARY KEY (id);

ALTER TABLE ONLY public.destination_session_slots
    ADD CONSTRAINT pk_destination_session_slots PRIMARY KEY (destination_id, slot);

ALTER TABLE ONLY public.destination_versions
    ADD CONSTRAINT pk_destination_versions PRIMARY KEY (tenant_id, destination_id, version);

ALTER TABLE ONLY public.destinations
    ADD CONSTRAINT pk_destinations PRIMARY KEY (id);

ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT pk_idempotency_keys PRIMARY KEY (tenant_id, operation, key);

ALTER TABLE ONLY public.operator_actions
    ADD CONSTRAINT pk_operator_actions PRIMARY KEY (id);

ALTER TABLE ONLY public.outcome_corrections
    ADD CONSTRAINT pk_outcome_corrections PRIMARY KEY (job_id, attempt_id);

ALTER TABLE ONLY public.principals
    ADD CONSTRAINT pk_principals PRIMARY KEY (tenant_id, name);

ALTER TABLE ONLY public.recurring_export_firings
    ADD CONSTRAINT pk_recurring_export_firings PRIMARY KEY (tenant_id, recurring_export_id, nominal_time);

ALTER TABLE ONLY public.recurring_exports
    ADD CONSTRAINT pk_recurring_exports PRIMARY KEY (tenant_id, id);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT pk_webhook_deliveries PRIMARY KEY (id);

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT pk_webhook_endpoints PRIMARY KEY (id);

ALTER TABLE ONLY public.schema_migrations
    ADD CONSTRAINT schema_migrations_pkey PRIMARY KEY (name);

ALTER TABLE ONLY public.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (id);

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT uq_approvals_id UNIQUE (id);

ALTER TABLE ONLY public.deliveries
    ADD CONSTRAINT uq_deliveries_original UNIQUE (tenant_id, delivery_key, original_job_id);

ALTER TABLE ONLY public.delivery_switches
    ADD CONSTRAINT uq_delivery_switches_scope UNIQUE NULLS NOT DISTINCT (scope, tenant_id, destination_id);

ALTER TABLE ONLY public.destinations
    ADD CONSTRAINT uq_destinations_tenant UNIQUE (tenant_id, id);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT uq_export_jobs_tenant UNIQUE (tenant_id, id);

ALTER TABLE ONLY public.notification_events
    ADD CONSTRAINT uq_notification_events_subject UNIQUE (tenant_id, kind, subject_key);

ALTER TABLE ONLY public.recurring_export_firings
    ADD CONSTRAINT uq_recurring_export_firings_id UNIQUE (id);

ALTER TABLE ONLY public.recurring_exports
    ADD CONSTRAINT uq_recurring_exports_id UNIQUE (id);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT uq_webhook_deliveries_event_endpoint UNIQUE (event_id, endpoint_id);

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT uq_webhook_endpoints_tenant UNIQUE (tenant_id, id);

CREATE INDEX ix_approvals_subject ON public.approvals USING btree (tenant_id, subject_id, action) WHERE (executed_at IS NULL);

CREATE INDEX ix_approvals_tenant ON public.approvals USING btree (tenant_id, requested_at DESC, id);

CREATE INDEX ix_attempt_events_job ON public.export_attempt_events USING btree (job_id, id);

CREATE INDEX ix_cancellation_previews_expires ON public.cancellation_previews USING btree (expires_at);

CREATE INDEX ix_cancellation_requests_batch ON public.cancellation_requests USING btree (tenant_id, batch_id) WHERE (batch_id IS NOT NULL);

CREATE INDEX ix_cancellation_requests_job ON public.cancellation_requests USING btree (job_id, recorded_at);

CREATE INDEX ix_console_sessions_expires ON public.console_sessions USING btree (expires_at);

CREATE INDEX ix_delivery_switch_changes_tenant ON public.delivery_switch_changes USING btree (tenant_id, id);

CREATE INDEX ix_destination_session_slots_holder ON public.destination_session_slots USING btree (holder) WHERE (holder IS NOT NULL);

CREATE INDEX ix_export_jobs_lease ON public.export_jobs USING btree (lease_expires_at) WHERE (status = ANY (ARRAY['Running'::text, 'Delivering'::text]));

CREATE INDEX ix_export_jobs_live_status ON public.export_jobs USING btree (status, lease_expires_at) WHERE (status = ANY (ARRAY['Queued'::text, 'Running'::text, 'Delivering'::text, 'OutcomeUnknown'::text]));

CREATE INDEX ix_export_jobs_outcome_unknown ON public.export_jobs USING btree (delivery_authorized_at) INCLUDE (id, attempt_id) WHERE (status = 'OutcomeUnknown'::text);

CREATE INDEX ix_export_jobs_queued_created ON public.export_jobs USING btree (created_at) WHERE (status = 'Queued'::text);

CREATE INDEX ix_export_jobs_queued_sweeps ON public.export_jobs USING btree (sweep_count) WHERE (status = 'Queued'::text);

CREATE INDEX ix_export_jobs_replaces ON public.export_jobs USING btree (replaces_job_id) WHERE (replaces_job_id IS NOT NULL);

CREATE INDEX ix_export_jobs_tenant_created_id ON public.export_jobs USING btree (tenant_id, created_at DESC, id DESC);

CREATE INDEX ix_export_jobs_tenant_destination_live ON public.export_jobs USING btree (tenant_id, destination_id) WHERE (status = ANY (ARRAY['Queued'::text, 'Running'::text, 'Delivering'::text]));

CREATE INDEX ix_export_jobs_tenant_destination_status ON public.export_jobs USING btree (tenant_id, destination_id, status, created_at DESC, id DESC);

CREATE INDEX ix_export_jobs_tenant_list_status ON public.export_jobs USING btree (tenant_id, list_name, status, created_at DESC, id DESC) INCLUDE (destination_id);

CREATE INDEX ix_export_jobs_tenant_outcome_unknown ON public.export_jobs USING btree (tenant_id, outcome_unknown_at, id) WHERE (status = 'OutcomeUnknown'::text);

CREATE INDEX ix_export_jobs_tenant_status_created ON public.export_jobs USING btree (tenant_id, status, created_at DESC, id DESC);

CREATE INDEX ix_export_jobs_transient_releases ON public.export_jobs USING btree (transient_releases) WHERE ((status = ANY (ARRAY['Queued'::text, 'Running'::text])) AND (transient_releases > 0));

CREATE INDEX ix_export_jobs_woken ON public.export_jobs USING btree (woken_at) WHERE (status = 'Queued'::text);

CREATE INDEX ix_listing_requests_job ON public.listing_requests USING btree (job_id, requested_at);

CREATE INDEX ix_listing_requests_requested ON public.listing_requests USING btree (requested_at);

CREATE INDEX ix_notification_events_unfanned ON public.notification_events USING btree (created_at) WHERE (fanned_out_at IS NULL);

CREATE INDEX ix_operator_actions_action ON public.operator_actions USING btree (tenant_id, action, id);

CREATE INDEX ix_operator_actions_at ON public.operator_actions USING btree (tenant_id, at, id);

CREATE INDEX ix_operator_actions_principal ON public.operator_actions USING btree (tenant_id, principal, id);

CREATE INDEX ix_operator_actions_subject ON public.operator_actions USING btree (tenant_id, subject_kind, subject_id, id);

CREATE INDEX ix_operator_actions_subject_id ON public.operator_actions USING btree (tenant_id, subject_id, id);

CREATE INDEX ix_operator_actions_tenant ON public.operator_actions USING btree (tenant_id, id);

CREATE INDEX ix_outbox_deferred ON public.outbox USING btree (available_at) WHERE ((published_at IS NULL) AND (available_at IS NOT NULL));

CREATE INDEX ix_outbox_unpublished ON public.outbox USING btree (created_at) WHERE (published_at IS NULL);

CREATE INDEX ix_recurring_export_firings_created ON public.recurring_export_firings USING btree (tenant_id, recurring_export_id, id DESC) WHERE (outcome = 'created'::text);

CREATE INDEX ix_recurring_export_firings_recent ON public.recurring_export_firings USING btree (tenant_id, recurring_export_id, id DESC);

CREATE INDEX ix_recurring_exports_tenant_created ON public.recurring_exports USING btree (tenant_id, created_at DESC, id);

CREATE INDEX ix_webhook_deliveries_due ON public.webhook_deliveries USING btree (next_attempt_at) WHERE (state = 'pending'::text);

CREATE INDEX ix_webhook_deliveries_endpoint ON public.webhook_deliveries USING btree (endpoint_id, created_at DESC, id DESC);

CREATE UNIQUE INDEX uq_attempt_transition ON public.export_attempt_events USING btree (job_id, attempt_id, kind) WHERE (kind <> 'DeliveryEvidence'::text);

CREATE UNIQUE INDEX uq_delivery_pauses_active ON public.delivery_pauses USING btree (scope, tenant_id, destination_id, owner, reason) NULLS NOT DISTINCT WHERE (released_at IS NULL);

CREATE UNIQUE INDEX uq_destination_versions_request ON public.destination_versions USING btree (tenant_id, request_key) WHERE (request_key IS NOT NULL);

CREATE UNIQUE INDEX uq_export_jobs_one_replacement ON public.export_jobs USING btree (tenant_id, replaces_job_id) WHERE ((replaces_job_id IS NOT NULL) AND ((status <> ALL (ARRAY['Canceled'::text, 'Rejected'::text, 'Stopped'::text, 'Failed'::text])) OR (failure_reason = 'OriginalDelivered'::text)));

CREATE UNIQUE INDEX uq_export_jobs_original_key ON public.export_jobs USING btree (tenant_id, delivery_key) WHERE (replaces_job_id IS NULL);

CREATE UNIQUE INDEX uq_recurring_export_firings_job ON public.recurring_export_firings USING btree (job_id) WHERE (outcome = 'created'::text);

CREATE STATISTICS public.st_export_jobs_tenant_scope (dependencies) ON tenant_id, destination_id, list_name FROM public.export_jobs;

CREATE TRIGGER tr_approvals_guard BEFORE INSERT OR DELETE OR UPDATE ON public.approvals FOR EACH ROW EXECUTE FUNCTION public.approvals_guard();

CREATE TRIGGER tr_cancellation_requests_notify_lost AFTER INSERT ON public.cancellation_requests FOR EACH ROW WHEN (((new.outcome = 'TooLate'::text) AND (new.found_status = ANY (ARRAY['Completed'::text, 'Failed'::text, 'OutcomeUnknown'::text])))) EXECUTE FUNCTION public.notify_lost_cancellation();

CREATE TRIGGER tr_delivery_pauses_guard BEFORE DELETE OR UPDATE ON public.delivery_pauses FOR EACH ROW EXECUTE FUNCTION public.delivery_pauses_guard();

CREATE TRIGGER tr_delivery_pauses_hold AFTER INSERT OR UPDATE ON public.delivery_pauses FOR EACH ROW EXECUTE FUNCTION public.delivery_pauses_hold();

CREATE TRIGGER tr_delivery_pauses_scope_owner BEFORE INSERT OR UPDATE ON public.delivery_pauses FOR EACH ROW EXECUTE FUNCTION public.delivery_switch_scope_owner();

CREATE TRIGGER tr_delivery_switch_changes_append_only BEFORE DELETE OR UPDATE ON public.delivery_switch_changes FOR EACH ROW EXECUTE FUNCTION public.delivery_switch_changes_append_only();

CREATE TRIGGER tr_delivery_switch_changes_scope_owner BEFORE INSERT ON public.delivery_switch_changes FOR EACH ROW EXECUTE FUNCTION public.delivery_switch_scope_owner();

CREATE TRIGGER tr_delivery_switches_guard BEFORE UPDATE ON public.delivery_switches FOR EACH ROW EXECUTE FUNCTION public.delivery_switches_guard();

CREATE TRIGGER tr_delivery_switches_hold BEFORE INSERT ON public.delivery_switches FOR EACH ROW EXECUTE FUNCTION public.delivery_switches_hold();

CREATE TRIGGER tr_delivery_switches_scope_owner BEFORE INSERT OR UPDATE ON public.delivery_switches FOR EACH ROW EXECUTE FUNCTION public.delivery_switch_scope_owner();

CREATE TRIGGER tr_destination_versions_approved BEFORE INSERT ON public.destination_versions FOR EACH ROW WHEN (((new.change = 'edited'::text) AND (new.changed_role <> 'owner'::text) AND (new.changed_fields && public.two_person_destination_fields()))) EXECUTE FUNCTION public.destination_versions_approved();

CREATE CONSTRAINT TRIGGER tr_destinations_change_recorded AFTER UPDATE ON public.destinations DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.destinations_change_recorded();

CREATE TRIGGER tr_destinations_guard BEFORE INSERT OR UPDATE ON public.destinations FOR EACH ROW EXECUTE FUNCTION public.destinations_guard();

CREATE TRIGGER tr_destinations_host_keys BEFORE INSERT OR UPDATE ON public.destinations FOR EACH ROW EXECUTE FUNCTION public.destinations_host_keys();

CREATE TRIGGER tr_destinations_session_slots AFTER INSERT OR UPDATE OF max_sessions ON public.destinations FOR EACH ROW EXECUTE FUNCTION public.destinations_session_slots();

CREATE TRIGGER tr_export_jobs_backoff_guard BEFORE UPDATE OF available_at, transient_releases ON public.export_jobs FOR EACH ROW EXECUTE FUNCTION public.export_jobs_backoff_guard();

CREATE TRIGGER tr_export_jobs_destination_version BEFORE UPDATE OF destination_version ON public.export_jobs FOR EACH ROW WHEN ((new.destination_version IS DISTINCT FROM old.destination_version)) EXECUTE FUNCTION public.export_jobs_destination_version_guard();

CREATE TRIGGER tr_export_jobs_expected_manifest BEFORE UPDATE OF expected_manifest ON public.export_jobs FOR EACH ROW WHEN ((new.expected_manifest IS DISTINCT FROM old.expected_manifest)) EXECUTE FUNCTION public.export_jobs_expected_manifest_guard();

CREATE TRIGGER tr_export_jobs_guard BEFORE UPDATE ON public.export_jobs FOR EACH ROW EXECUTE FUNCTION public.export_jobs_guard();

CREATE TRIGGER tr_export_jobs_guard_correction_code BEFORE UPDATE OF status ON public.export_jobs FOR EACH ROW WHEN (((old.status = ANY (ARRAY['Completed'::text, 'Failed'::text])) AND (new.status IS DISTINCT FROM old.status))) EXECUTE FUNCTION public.export_jobs_correction_code_guard();

CREATE TRIGGER tr_export_jobs_hold_slot_after_takeover AFTER UPDATE OF status, attempt_id ON public.export_jobs FOR EACH ROW WHEN (((CURRENT_USER = 'exports_recovery'::name) AND (old.status = ANY (ARRAY['Running'::text, 'Delivering'::text])) AND (old.attempt_id IS NOT NULL) AND ((new.status <> ALL (ARRAY['Running'::text, 'Delivering'::text])) OR (new.attempt_id IS DISTINCT FROM old.attempt_id)))) EXECUTE FUNCTION public.hold_session_slot_after_takeover();

CREATE TRIGGER tr_export_jobs_insert_guard BEFORE INSERT ON public.export_jobs FOR EACH ROW EXECUTE FUNCTION public.export_jobs_insert_guard();

CREATE TRIGGER tr_export_jobs_no_delete BEFORE DELETE ON public.export_jobs FOR EACH ROW EXECUTE FUNCTION public.export_jobs_no_delete();

CREATE TRIGGER tr_export_jobs_notify_outcome AFTER UPDATE OF status ON public.export_jobs FOR EACH ROW WHEN (((new.status IS DISTINCT FROM old.status) AND (new.status = ANY (ARRAY['Completed'::text, 'Failed'::text, 'Stopped'::text, 'Canceled'::text, 'Rejected'::text, 'OutcomeUnknown'::text])))) EXECUTE FUNCTION public.notify_export_outcome();

CREATE TRIGGER tr_export_jobs_outcome_unknown_at BEFORE UPDATE OF status ON public.export_jobs FOR EACH ROW WHEN (((new.status = 'OutcomeUnknown'::text) AND (old.status IS DISTINCT FROM 'OutcomeUnknown'::text))) EXECUTE FUNCTION public.export_jobs_mark_outcome_unknown();

CREATE TRIGGER tr_export_jobs_replacement_terms BEFORE UPDATE OF destination_id, list_name ON public.export_jobs FOR EACH ROW WHEN (((old.replaces_job_id IS NOT NULL) AND ((new.destination_id IS DISTINCT FROM old.destination_id) OR (new.list_name IS DISTINCT FROM old.list_name)))) EXECUTE FUNCTION public.export_jobs_replacement_terms_guard();

CREATE CONSTRAINT TRIGGER tr_export_jobs_transition_event AFTER UPDATE OF status ON public.export_jobs DEFERRABLE INITIALLY DEFERRED FOR EACH ROW WHEN (((old.status = ANY (ARRAY['OutcomeUnknown'::text, 'Completed'::text, 'Failed'::text])) AND (new.status IS DISTINCT FROM old.status))) EXECUTE FUNCTION public.export_jobs_transition_event_guard();

CREATE TRIGGER tr_listing_requests_append_only BEFORE DELETE OR UPDATE ON public.listing_requests FOR EACH ROW EXECUTE FUNCTION public.listing_requests_append_only();

CREATE TRIGGER tr_operator_actions_append_only BEFORE DELETE OR UPDATE ON public.operator_actions FOR EACH ROW EXECUTE FUNCTION public.operator_actions_append_only();

CREATE TRIGGER tr_operator_actions_no_truncate BEFORE TRUNCATE ON public.operator_actions FOR EACH STATEMENT EXECUTE FUNCTION public.operator_actions_append_only();

CREATE TRIGGER tr_outbox_notify AFTER INSERT ON public.outbox FOR EACH STATEMENT EXECUTE FUNCTION public.outbox_notify();

CREATE TRIGGER tr_outcome_corrections_approved BEFORE INSERT ON public.outcome_corrections FOR EACH ROW EXECUTE FUNCTION public.outcome_corrections_approved();

CREATE TRIGGER tr_principals_guard BEFORE UPDATE ON public.principals FOR EACH ROW EXECUTE FUNCTION public.principals_guard();

CREATE TRIGGER tr_recurring_export_firings_append_only BEFORE DELETE OR UPDATE ON public.recurring_export_firings FOR EACH ROW EXECUTE FUNCTION public.recurring_export_firings_append_only();

CREATE TRIGGER tr_recurring_export_firings_notify_skipped AFTER INSERT ON public.recurring_export_firings FOR EACH ROW WHEN ((new.outcome = 'skipped'::text)) EXECUTE FUNCTION public.notify_recurring_firing_row();

CREATE TRIGGER tr_recurring_exports_guard BEFORE DELETE OR UPDATE ON public.recurring_exports FOR EACH ROW EXECUTE FUNCTION public.recurring_exports_guard();

ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT api_tokens_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.approvals
    ADD CONSTRAINT approvals_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.cancellation_batches
    ADD CONSTRAINT cancellation_batches_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.cancellation_previews
    ADD CONSTRAINT cancellation_previews_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.console_sessions
    ADD CONSTRAINT console_sessions_token_sha256_fkey FOREIGN KEY (token_sha256) REFERENCES public.api_tokens(token_sha256) ON DELETE CASCADE;

ALTER TABLE ONLY public.contacts
    ADD CONSTRAINT contacts_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.delivery_pauses
    ADD CONSTRAINT delivery_pauses_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.delivery_switches
    ADD CONSTRAINT delivery_switches_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.destinations
    ADD CONSTRAINT destinations_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.export_attempt_events
    ADD CONSTRAINT export_attempt_events_job_id_fkey FOREIGN KEY (job_id) REFERENCES public.export_jobs(id);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT export_jobs_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.api_tokens
    ADD CONSTRAINT fk_api_tokens_principal FOREIGN KEY (tenant_id, principal) REFERENCES public.principals(tenant_id, name);

ALTER TABLE ONLY public.cancellation_batch_jobs
    ADD CONSTRAINT fk_cancellation_batch_jobs_batch FOREIGN KEY (tenant_id, batch_id) REFERENCES public.cancellation_batches(tenant_id, id);

ALTER TABLE ONLY public.cancellation_batches
    ADD CONSTRAINT fk_cancellation_batches_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.cancellation_previews
    ADD CONSTRAINT fk_cancellation_previews_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.cancellation_requests
    ADD CONSTRAINT fk_cancellation_requests_batch FOREIGN KEY (tenant_id, batch_id) REFERENCES public.cancellation_batches(tenant_id, id);

ALTER TABLE ONLY public.cancellation_requests
    ADD CONSTRAINT fk_cancellation_requests_job FOREIGN KEY (tenant_id, job_id) REFERENCES public.export_jobs(tenant_id, id);

ALTER TABLE ONLY public.cancellation_stop_signals
    ADD CONSTRAINT fk_cancellation_stop_signals_request FOREIGN KEY (tenant_id, request_id) REFERENCES public.cancellation_requests(tenant_id, id);

ALTER TABLE ONLY public.deliveries
    ADD CONSTRAINT fk_deliveries_original FOREIGN KEY (tenant_id, original_job_id) REFERENCES public.export_jobs(tenant_id, id) DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE ONLY public.delivery_pauses
    ADD CONSTRAINT fk_delivery_pauses_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.delivery_switches
    ADD CONSTRAINT fk_delivery_switches_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.destination_session_slots
    ADD CONSTRAINT fk_destination_session_slots_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.destination_versions
    ADD CONSTRAINT fk_destination_versions_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT fk_export_jobs_delivery FOREIGN KEY (tenant_id, delivery_key) REFERENCES public.deliveries(tenant_id, delivery_key);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT fk_export_jobs_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.export_jobs
    ADD CONSTRAINT fk_export_jobs_replaces FOREIGN KEY (tenant_id, delivery_key, replaces_job_id) REFERENCES public.deliveries(tenant_id, delivery_key, original_job_id);

ALTER TABLE ONLY public.idempotency_keys
    ADD CONSTRAINT fk_idempotency_keys_job FOREIGN KEY (tenant_id, job_id) REFERENCES public.export_jobs(tenant_id, id) DEFERRABLE INITIALLY DEFERRED;

ALTER TABLE ONLY public.listing_requests
    ADD CONSTRAINT fk_listing_requests_job FOREIGN KEY (tenant_id, job_id) REFERENCES public.export_jobs(tenant_id, id);

ALTER TABLE ONLY public.outcome_corrections
    ADD CONSTRAINT fk_outcome_corrections_job FOREIGN KEY (tenant_id, job_id) REFERENCES public.export_jobs(tenant_id, id);

ALTER TABLE ONLY public.recurring_export_firings
    ADD CONSTRAINT fk_recurring_export_firings_job FOREIGN KEY (tenant_id, job_id) REFERENCES public.export_jobs(tenant_id, id);

ALTER TABLE ONLY public.recurring_export_firings
    ADD CONSTRAINT fk_recurring_export_firings_recurring FOREIGN KEY (tenant_id, recurring_export_id) REFERENCES public.recurring_exports(tenant_id, id);

ALTER TABLE ONLY public.recurring_exports
    ADD CONSTRAINT fk_recurring_exports_creator FOREIGN KEY (tenant_id, created_by) REFERENCES public.principals(tenant_id, name);

ALTER TABLE ONLY public.recurring_exports
    ADD CONSTRAINT fk_recurring_exports_destination FOREIGN KEY (tenant_id, destination_id) REFERENCES public.destinations(tenant_id, id);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT fk_webhook_deliveries_endpoint FOREIGN KEY (tenant_id, endpoint_id) REFERENCES public.webhook_endpoints(tenant_id, id) ON DELETE CASCADE;

ALTER TABLE ONLY public.notification_events
    ADD CONSTRAINT notification_events_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.operator_actions
    ADD CONSTRAINT operator_actions_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.principals
    ADD CONSTRAINT principals_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.recurring_exports
    ADD CONSTRAINT recurring_exports_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

ALTER TABLE ONLY public.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_event_id_fkey FOREIGN KEY (event_id) REFERENCES public.notification_events(id);

ALTER TABLE ONLY public.webhook_endpoints
    ADD CONSTRAINT webhook_endpoints_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES public.tenants(id);

REVOKE ALL ON FUNCTION public.approval_role_of(p_tenant_id uuid, p_principal text, p_action text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.approval_role_of(p_tenant_id uuid, p_principal text, p_action text) TO exports_api;
GRANT ALL ON FUNCTION public.approval_role_of(p_tenant_id uuid, p_principal text, p_action text) TO exports_reconciler;

REVOKE ALL ON FUNCTION public.delivery_scope_hold(p_scope text, p_tenant_id uuid, p_destination_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.delivery_scope_hold(p_scope text, p_tenant_id uuid, p_destination_id uuid) TO exports_api;
GRANT ALL ON FUNCTION public.delivery_scope_hold(p_scope text, p_tenant_id uuid, p_destination_id uuid) TO exports_platform;

REVOKE ALL ON FUNCTION public.delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) TO exports_worker;
GRANT ALL ON FUNCTION public.delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) TO exports_api;
GRANT ALL ON FUNCTION public.delivery_scope_open(p_tenant_id uuid, p_destination_id uuid) TO exports_recovery;

REVOKE ALL ON FUNCTION public.intake_time_zone_ok(tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.intake_time_zone_ok(tz text) TO exports_api;

REVOKE ALL ON FUNCTION public.intake_week_of(hours text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.intake_week_of(hours text[]) TO exports_api;

GRANT SELECT,INSERT ON TABLE public.destinations TO exports_api;
GRANT SELECT ON TABLE public.destinations TO exports_worker;
GRANT SELECT ON TABLE public.destinations TO exports_reconciler;
GRANT SELECT ON TABLE public.destinations TO exports_recovery;

GRANT UPDATE(id) ON TABLE public.destinations TO exports_worker;

GRANT UPDATE(name) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(host) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(port) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(username) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(host_key) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(credential_ref) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(remote_dir) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(name_and_size_identify) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(hash_evidence) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(ack_suffix) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(max_write_request) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(contract_starts_on) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(contract_ends_on) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(retired_at) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(retired_by) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(temporary_files) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(csv_header) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(csv_delimiter) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(csv_columns) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(compression) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(pgp_recipient_keys) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(pgp_signing_key_ref) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(version) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(host_keys) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(max_sessions) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(intake_time_zone) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(intake_hours) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(blackout_dates) ON TABLE public.destinations TO exports_api;

GRANT UPDATE(manifest) ON TABLE public.destinations TO exports_api;

REVOKE ALL ON FUNCTION public.delivery_window_open(d public.destinations, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.delivery_window_open(d public.destinations, at timestamp with time zone) TO exports_worker;
GRANT ALL ON FUNCTION public.delivery_window_open(d public.destinations, at timestamp with time zone) TO exports_api;

REVOKE ALL ON FUNCTION public.export_jobs_expected_manifest_guard() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.export_jobs_mark_outcome_unknown() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.hold_session_slot_after_takeover() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.intake_ranges(hours text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.intake_ranges(hours text[]) TO exports_worker;
GRANT ALL ON FUNCTION public.intake_ranges(hours text[]) TO exports_api;

REVOKE ALL ON FUNCTION public.lock_delivery_scope(p_tenant_id uuid, p_destination_id uuid) FROM PUBLIC;
GRANT ALL ON FUNCTION public.lock_delivery_scope(p_tenant_id uuid, p_destination_id uuid) TO exports_worker;

REVOKE ALL ON FUNCTION public.lost_cancellation_payload(request_id uuid, requested_by text, requested_at timestamp with time zone, authorized_at timestamp with time zone, job_id uuid, outcome text, failure_reason text, file_name text, file_bytes bigint, file_rows bigint, file_sha256 bytea, outcome_at timestamp with time zone) FROM PUBLIC;

GRANT SELECT,INSERT ON TABLE public.export_jobs TO exports_api;
GRANT SELECT ON TABLE public.export_jobs TO exports_worker;
GRANT SELECT ON TABLE public.export_jobs TO exports_reconciler;
GRANT SELECT ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(status) ON TABLE public.export_jobs TO exports_api;
GRANT UPDATE(status) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(status) ON TABLE public.export_jobs TO exports_reconciler;
GRANT UPDATE(status) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(version) ON TABLE public.export_jobs TO exports_api;

GRANT UPDATE(destination_id) ON TABLE public.export_jobs TO exports_api;

GRANT UPDATE(attempt_id) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(attempt_id) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(attempt_count) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(claimed_by) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(claimed_by) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(lease_expires_at) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(lease_expires_at) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(stop_request_id) ON TABLE public.export_jobs TO exports_api;

GRANT UPDATE(cancellation_request_id) ON TABLE public.export_jobs TO exports_api;

GRANT UPDATE(expected_file_name) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(expected_file_bytes) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(expected_file_sha256) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(expected_file_rows) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(delivery_authorized_at) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(woken_at) ON TABLE public.export_jobs TO exports_api;
GRANT UPDATE(woken_at) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(woken_at) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(failure_reason) ON TABLE public.export_jobs TO exports_worker;
GRANT UPDATE(failure_reason) ON TABLE public.export_jobs TO exports_reconciler;
GRANT UPDATE(failure_reason) ON TABLE public.export_jobs TO exports_recovery;

GRANT UPDATE(sweep_count) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(list_name) ON TABLE public.export_jobs TO exports_api;

GRANT UPDATE(rejection_reason) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(workflow_id) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(attempts_released) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(fence_expected) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(upload_fenced_at) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(rename_fenced_at) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(rejection_code) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(available_at) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(transient_releases) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(destination_version) ON TABLE public.export_jobs TO exports_worker;

GRANT UPDATE(expected_manifest) ON TABLE public.export_jobs TO exports_worker;

REVOKE ALL ON FUNCTION public.manifest_in_place(j public.export_jobs) FROM PUBLIC;
GRANT ALL ON FUNCTION public.manifest_in_place(j public.export_jobs) TO exports_worker;
GRANT ALL ON FUNCTION public.manifest_in_place(j public.export_jobs) TO exports_recovery;
GRANT ALL ON FUNCTION public.manifest_in_place(j public.export_jobs) TO exports_api;
GRANT ALL ON FUNCTION public.manifest_in_place(j public.export_jobs) TO exports_reconciler;

REVOKE ALL ON FUNCTION public.manifest_names(file_name text, choice text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.manifest_names(file_name text, choice text) TO exports_worker;
GRANT ALL ON FUNCTION public.manifest_names(file_name text, choice text) TO exports_recovery;
GRANT ALL ON FUNCTION public.manifest_names(file_name text, choice text) TO exports_api;
GRANT ALL ON FUNCTION public.manifest_names(file_name text, choice text) TO exports_reconciler;

REVOKE ALL ON FUNCTION public.next_window_opening(d public.destinations, at timestamp with time zone) FROM PUBLIC;
GRANT ALL ON FUNCTION public.next_window_opening(d public.destinations, at timestamp with time zone) TO exports_worker;
GRANT ALL ON FUNCTION public.next_window_opening(d public.destinations, at timestamp with time zone) TO exports_api;

REVOKE ALL ON FUNCTION public.notify_export_outcome() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.notify_lost_cancellation() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.notify_recurring_firing_row() FROM PUBLIC;

REVOKE ALL ON FUNCTION public.notify_recurring_firing_skipped(p_tenant_id uuid, p_recurring_export_id uuid, p_recurring_name text, p_scheduled_for timestamp with time zone, p_reason text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.notify_recurring_firing_skipped(p_tenant_id uuid, p_recurring_export_id uuid, p_recurring_name text, p_scheduled_for timestamp with time zone, p_reason text) TO exports_worker;
GRANT ALL ON FUNCTION public.notify_recurring_firing_skipped(p_tenant_id uuid, p_recurring_export_id uuid, p_recurring_name text, p_scheduled_for timestamp with time zone, p_reason text) TO exports_api;

REVOKE ALL ON FUNCTION public.offset_change_between(low timestamp with time zone, high timestamp with time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.offset_change_between(low timestamp with time zone, high timestamp with time zone, tz text) TO exports_worker;
GRANT ALL ON FUNCTION public.offset_change_between(low timestamp with time zone, high timestamp with time zone, tz text) TO exports_api;

REVOKE ALL ON FUNCTION public.pause_destination_for_partner(p_tenant_id uuid, p_destination_id uuid, p_version integer, p_reason text, p_changed_by text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.pause_destination_for_partner(p_tenant_id uuid, p_destination_id uuid, p_version integer, p_reason text, p_changed_by text) TO exports_worker;

REVOKE ALL ON FUNCTION public.principal_holds(p_tenant_id uuid, p_principal text, p_roles text[]) FROM PUBLIC;
GRANT ALL ON FUNCTION public.principal_holds(p_tenant_id uuid, p_principal text, p_roles text[]) TO exports_reconciler;

GRANT SELECT,INSERT ON TABLE public.destination_session_slots TO exports_api;
GRANT SELECT ON TABLE public.destination_session_slots TO exports_worker;
GRANT SELECT ON TABLE public.destination_session_slots TO exports_recovery;

GRANT UPDATE(holder) ON TABLE public.destination_session_slots TO exports_worker;
GRANT UPDATE(holder) ON TABLE public.destination_session_slots TO exports_recovery;

GRANT UPDATE(job_id) ON TABLE public.destination_session_slots TO exports_worker;
GRANT UPDATE(job_id) ON TABLE public.destination_session_slots TO exports_recovery;

GRANT UPDATE(purpose) ON TABLE public.destination_session_slots TO exports_worker;
GRANT UPDATE(purpose) ON TABLE public.destination_session_slots TO exports_recovery;

GRANT UPDATE(taken_at) ON TABLE public.destination_session_slots TO exports_worker;
GRANT UPDATE(taken_at) ON TABLE public.destination_session_slots TO exports_recovery;

GRANT UPDATE(expires_at) ON TABLE public.destination_session_slots TO exports_worker;
GRANT UPDATE(expires_at) ON TABLE public.destination_session_slots TO exports_recovery;

REVOKE ALL ON FUNCTION public.session_slot_held(s public.destination_session_slots) FROM PUBLIC;
GRANT ALL ON FUNCTION public.session_slot_held(s public.destination_session_slots) TO exports_api;
GRANT ALL ON FUNCTION public.session_slot_held(s public.destination_session_slots) TO exports_worker;
GRANT ALL ON FUNCTION public.session_slot_held(s public.destination_session_slots) TO exports_recovery;

REVOKE ALL ON FUNCTION public.wall_clock_instants(wall timestamp without time zone, tz text) FROM PUBLIC;
GRANT ALL ON FUNCTION public.wall_clock_instants(wall timestamp without time zone, tz text) TO exports_worker;
GRANT ALL ON FUNCTION public.wall_clock_instants(wall timestamp without time zone, tz text) TO exports_api;

GRANT SELECT ON TABLE public.api_tokens TO exports_api;

GRANT SELECT,INSERT ON TABLE public.approvals TO exports_api;
GRANT SELECT ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(decision) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(decision) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(decided_by) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(decided_by) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(decided_role) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(decided_role) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(decided_at) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(decided_at) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(decision_reason) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(decision_reason) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(executed_at) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(executed_at) ON TABLE public.approvals TO exports_reconciler;

GRANT UPDATE(outcome) ON TABLE public.approvals TO exports_api;
GRANT UPDATE(outcome) ON TABLE public.approvals TO exports_reconciler;

GRANT SELECT,INSERT ON TABLE public.cancellation_batch_jobs TO exports_api;

GRANT SELECT,INSERT ON TABLE public.cancellation_batches TO exports_api;

GRANT SELECT,INSERT,DELETE ON TABLE public.cancellation_previews TO exports_api;

GRANT SELECT,INSERT ON TABLE public.cancellation_requests TO exports_api;
GRANT SELECT ON TABLE public.cancellation_requests TO exports_worker;
GRANT SELECT ON TABLE public.cancellation_requests TO exports_reconciler;

GRANT SELECT(id) ON TABLE public.cancellation_requests TO exports_recovery;

GRANT SELECT(recorded_at) ON TABLE public.cancellation_requests TO exports_recovery;

GRANT SELECT,INSERT ON TABLE public.cancellation_stop_signals TO exports_api;

GRANT SELECT,INSERT,DELETE ON TABLE public.console_sessions TO exports_api;

GRANT SELECT ON TABLE public.contacts TO exports_worker;

GRANT SELECT,INSERT ON TABLE public.deliveries TO exports_api;
GRANT SELECT ON TABLE public.deliveries TO exports_worker;
GRANT SELECT ON TABLE public.deliveries TO exports_reconciler;

GRANT SELECT,INSERT ON TABLE public.delivery_pauses TO exports_api;
GRANT SELECT,INSERT ON TABLE public.delivery_pauses TO exports_platform;

GRANT UPDATE(expires_at) ON TABLE public.delivery_pauses TO exports_api;
GRANT UPDATE(expires_at) ON TABLE public.delivery_pauses TO exports_platform;

GRANT UPDATE(released_at) ON TABLE public.delivery_pauses TO exports_api;
GRANT UPDATE(released_at) ON TABLE public.delivery_pauses TO exports_platform;

GRANT UPDATE(released_by) ON TABLE public.delivery_pauses TO exports_api;
GRANT UPDATE(released_by) ON TABLE public.delivery_pauses TO exports_platform;

GRANT UPDATE(release_reason) ON TABLE public.delivery_pauses TO exports_api;
GRANT UPDATE(release_reason) ON TABLE public.delivery_pauses TO exports_platform;

GRANT SELECT,INSERT ON TABLE public.delivery_switch_changes TO exports_api;
GRANT SELECT,INSERT ON TABLE public.delivery_switch_changes TO exports_platform;

GRANT SELECT ON TABLE public.delivery_switches TO exports_worker;
GRANT SELECT,INSERT ON TABLE public.delivery_switches TO exports_api;
GRANT SELECT ON TABLE public.delivery_switches TO exports_recovery;
GRANT SELECT,INSERT ON TABLE public.delivery_switches TO exports_platform;

GRANT UPDATE(scope) ON TABLE public.delivery_switches TO exports_worker;

GRANT UPDATE(enabled) ON TABLE public.delivery_switches TO exports_api;
GRANT UPDATE(enabled) ON TABLE public.delivery_switches TO exports_platform;

GRANT UPDATE(reason) ON TABLE public.delivery_switches TO exports_api;
GRANT UPDATE(reason) ON TABLE public.delivery_switches TO exports_platform;

GRANT UPDATE(changed_by) ON TABLE public.delivery_switches TO exports_api;
GRANT UPDATE(changed_by) ON TABLE public.delivery_switches TO exports_platform;

GRANT UPDATE(changed_at) ON TABLE public.delivery_switches TO exports_api;
GRANT UPDATE(changed_at) ON TABLE public.delivery_switches TO exports_platform;

GRANT UPDATE(held_until) ON TABLE public.delivery_switches TO exports_api;
GRANT UPDATE(held_until) ON TABLE public.delivery_switches TO exports_platform;

GRANT SELECT,INSERT ON TABLE public.destination_versions TO exports_api;
GRANT SELECT ON TABLE public.destination_versions TO exports_worker;
GRANT SELECT ON TABLE public.destination_versions TO exports_recovery;

GRANT SELECT,INSERT ON TABLE public.export_attempt_events TO exports_api;
GRANT SELECT,INSERT ON TABLE public.export_attempt_events TO exports_worker;
GRANT SELECT,INSERT ON TABLE public.export_attempt_events TO exports_reconciler;
GRANT SELECT,INSERT ON TABLE public.export_attempt_events TO exports_recovery;

GRANT SELECT ON TABLE public.export_status_edges TO exports_api;
GRANT SELECT ON TABLE public.export_status_edges TO exports_worker;
GRANT SELECT ON TABLE public.export_status_edges TO exports_reconciler;
GRANT SELECT ON TABLE public.export_status_edges TO exports_recovery;

GRANT SELECT,INSERT ON TABLE public.idempotency_keys TO exports_api;

GRANT SELECT,INSERT ON TABLE public.listing_requests TO exports_api;
GRANT SELECT ON TABLE public.listing_requests TO exports_recovery;

GRANT SELECT ON TABLE public.notification_events TO exports_api;
GRANT SELECT ON TABLE public.notification_events TO exports_dispatcher;

GRANT UPDATE(fanned_out_at) ON TABLE public.notification_events TO exports_dispatcher;

GRANT SELECT,INSERT ON TABLE public.operator_actions TO exports_api;
GRANT SELECT,INSERT ON TABLE public.operator_actions TO exports_reconciler;
GRANT SELECT,INSERT ON TABLE public.operator_actions TO exports_platform;

GRANT INSERT ON TABLE public.outbox TO exports_api;
GRANT INSERT ON TABLE public.outbox TO exports_worker;
GRANT SELECT ON TABLE public.outbox TO exports_dispatcher;
GRANT INSERT ON TABLE public.outbox TO exports_recovery;

GRANT SELECT(created_at) ON TABLE public.outbox TO exports_worker;

GRANT UPDATE(published_at) ON TABLE public.outbox TO exports_dispatcher;
GRANT SELECT(published_at) ON TABLE public.outbox TO exports_worker;

GRANT UPDATE(publishing_until) ON TABLE public.outbox TO exports_dispatcher;

GRANT SELECT(available_at) ON TABLE public.outbox TO exports_worker;

GRANT SELECT,INSERT ON TABLE public.outcome_corrections TO exports_reconciler;
GRANT SELECT ON TABLE public.outcome_corrections TO exports_api;

GRANT SELECT ON TABLE public.principals TO exports_worker;
GRANT SELECT ON TABLE public.principals TO exports_api;

GRANT UPDATE(name) ON TABLE public.principals TO exports_worker;

GRANT SELECT,INSERT ON TABLE public.recurring_export_firings TO exports_api;

GRANT SELECT,INSERT ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(destination_id) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(list_name) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(cron) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(interval_seconds) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(time_zone) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(starts_at) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(ends_at) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(paused) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(paused_reason) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(deleted_at) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(deleted_by) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(updated_by) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(updated_at) ON TABLE public.recurring_exports TO exports_api;

GRANT UPDATE(version) ON TABLE public.recurring_exports TO exports_api;

GRANT SELECT ON TABLE public.schema_migrations TO exports_api;
GRANT SELECT ON TABLE public.schema_migrations TO exports_worker;
GRANT SELECT ON TABLE public.schema_migrations TO exports_dispatcher;
GRANT SELECT ON TABLE public.schema_migrations TO exports_reconciler;

GRANT SELECT ON TABLE public.tenants TO exports_api;
GRANT SELECT ON TABLE public.tenants TO exports_worker;
GRANT SELECT ON TABLE public.tenants TO exports_reconciler;
GRANT SELECT ON TABLE public.tenants TO exports_recovery;

GRANT SELECT ON TABLE public.webhook_deliveries TO exports_api;
GRANT SELECT,INSERT ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(state) ON TABLE public.webhook_deliveries TO exports_api;
GRANT UPDATE(state) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(attempts) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(next_attempt_at) ON TABLE public.webhook_deliveries TO exports_api;
GRANT UPDATE(next_attempt_at) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(give_up_at) ON TABLE public.webhook_deliveries TO exports_api;

GRANT UPDATE(leased_until) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(last_attempt_at) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(last_status_code) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(last_error) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(delivered_at) ON TABLE public.webhook_deliveries TO exports_dispatcher;

GRANT UPDATE(redeliveries) ON TABLE public.webhook_deliveries TO exports_api;

GRANT UPDATE(redelivered_by) ON TABLE public.webhook_deliveries TO exports_api;

GRANT UPDATE(redelivered_at) ON TABLE public.webhook_deliveries TO exports_api;

GRANT DELETE ON TABLE public.webhook_endpoints TO exports_api;
GRANT SELECT ON TABLE public.webhook_endpoints TO exports_dispatcher;

GRANT SELECT(tenant_id),INSERT(tenant_id) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(id),INSERT(id) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(url),INSERT(url),UPDATE(url) ON TABLE public.webhook_endpoints TO exports_api;

GRANT INSERT(secret),UPDATE(secret) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(events),INSERT(events),UPDATE(events) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(description),INSERT(description),UPDATE(description) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(enabled),INSERT(enabled),UPDATE(enabled) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(version),UPDATE(version) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(created_by),INSERT(created_by) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(created_at) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(updated_by),UPDATE(updated_by) ON TABLE public.webhook_endpoints TO exports_api;

GRANT SELECT(updated_at),UPDATE(updated_at) ON TABLE public.webhook_endpoints TO exports_api;

-- The roles 0003, 0005 and 0019 create (cluster objects, checked by the same test):
-- ALTER ROLE exports_api WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- ALTER ROLE exports_dispatcher WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- ALTER ROLE exports_platform WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- ALTER ROLE exports_reconciler WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- ALTER ROLE exports_recovery WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- ALTER ROLE exports_worker WITH NOSUPERUSER INHERIT NOCREATEROLE NOCREATEDB NOLOGIN NOREPLICATION NOBYPASSRLS;
-- CREATE ROLE exports_api;
-- CREATE ROLE exports_dispatcher;
-- CREATE ROLE exports_platform;
-- CREATE ROLE exports_reconciler;
-- CREATE ROLE exports_recovery;
-- CREATE ROLE exports_worker;
