-- One ledger of operator actions (issue #26, item 2).
--
-- Every control-plane action goes into operator_actions: cancel, bulk cancel, pause and resume, reconcile,
-- correct, replacement, destination and host-key changes, recurring-export changes, token mint and revoke,
-- role grants, webhook endpoint changes and redeliveries, a reconciler's listing request, and the decisions on
-- two-person actions. A row says who (the principal and the role they
-- acted with), when, what (the action and its subject), why, the request ID, the outcome, and the subject
-- before and after, without secrets.
--
-- 1. Append-only by privileges: the roles that write it (exports_api, exports_reconciler, exports_platform)
--    hold INSERT and SELECT and nothing else, and a trigger refuses UPDATE and DELETE to everyone, the
--    owner's scripts included (as delivery_switch_changes does).
-- 2. Written in the transaction of the action it records where the action is a database write (so an action
--    that rolled back is not in the ledger); a refusal (403, 404, 409, ...) is recorded on its own.
-- 3. Never a secret: a reference to a secret (a column named *_ref) appears as "set", and a key naming a
--    secret, a password or a private key never carries a value; the check below refuses the row otherwise,
--    whoever writes it.
-- 4. Read newest first by keyset (id), filtered by principal, action, subject and time: one index per filter,
--    each ending in id, so a page is an index range however long the ledger grows.
-- The per-feature histories (cancellation_requests, delivery_switch_changes, outcome_corrections,
-- cancellation_batches, destination_versions, recurring_export_firings) stay as they are.

-- Whether a before/after document is free of secrets: no *_ref key (a reference to a secret, as a destination's
-- credential_ref; evidence_ref and overwrite_agreement_ref name documents) with a value other than "set" or
-- null, and no key naming a secret, a password or a private key with a value, at any depth.
CREATE FUNCTION operator_action_json_ok(j jsonb) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT j IS NULL OR NOT jsonb_path_exists(
        j,
        'lax $.** ? (@.type() == "object").keyvalue() ? ((@.key like_regex "_ref$" && @.key != "evidence_ref" && @.key != "overwrite_agreement_ref" && @.value != "set" && @.value != null) || (@.key like_regex "secret|password|private_key" && @.value != null))')
$$;

CREATE TABLE operator_actions (
    id            bigint GENERATED ALWAYS AS IDENTITY,
    tenant_id     uuid REFERENCES tenants (id),   -- NULL: the platform's own actions (the global switch)
    at            timestamptz NOT NULL DEFAULT clock_timestamp(),
    principal     text NOT NULL CHECK (length(principal) BETWEEN 1 AND 200),
    -- the tenant role acted with; 'owner' for an administrator's database connection (tokens, principals),
    -- 'platform' for the platform's operators (the global switch)
    role          text NOT NULL CHECK (role IN ('viewer', 'operator', 'reconciler', 'admin', 'owner', 'platform')),
    action        text NOT NULL,
    subject_kind  text NOT NULL,
    subject_id    text CHECK (length(subject_id) BETWEEN 1 AND 200),
    request_id    text CHECK (length(request_id) BETWEEN 1 AND 200),
    reason        text CHECK (length(reason) BETWEEN 1 AND 1000),
    -- what came of it, as the API's answer kinds name it (service/outcomes.py Kind)
    outcome       text NOT NULL,
    detail        text CHECK (length(detail) BETWEEN 1 AND 2000),
    -- a two-person action: the approval it runs under, and (at its approval) the principal who requested it
    approval_id   uuid,
    requested_by  text CHECK (length(requested_by) BETWEEN 1 AND 200),
    before        jsonb,
    after         jsonb,
    CONSTRAINT pk_operator_actions PRIMARY KEY (id),
    CONSTRAINT ck_operator_actions_action CHECK (action IN (
        'cancel', 'bulk_cancel', 'pause', 'resume', 'reconcile', 'correct', 'replace',
        'destination.create', 'destination.edit', 'destination.retire', 'destination.pin_key',
        'recurring.create', 'recurring.edit', 'recurring.pause', 'recurring.resume', 'recurring.delete',
        'token.mint', 'token.revoke', 'principal.grant', 'principal.revoke',
        'webhook.create', 'webhook.edit', 'webhook.delete', 'webhook.redeliver', 'listing.request',
        'approval.approve', 'approval.decline')),
    CONSTRAINT ck_operator_actions_subject_kind CHECK (subject_kind IN (
        'export', 'cancellation_batch', 'delivery_scope', 'destination', 'recurring_export', 'principal',
        'token', 'approval', 'webhook_endpoint')),
    CONSTRAINT ck_operator_actions_outcome CHECK (outcome IN (
        'done', 'created', 'accepted', 'partial', 'malformed', 'forbidden', 'not_found', 'refused', 'stale',
        'invalid', 'precondition_required')),
    -- the second person of a two-person action is never its first
    CONSTRAINT ck_operator_actions_second_person
        CHECK (requested_by IS NULL OR (approval_id IS NOT NULL AND requested_by <> principal)),
    CONSTRAINT ck_operator_actions_no_secrets
        CHECK (operator_action_json_ok(before) AND operator_action_json_ok(after))
);

-- Newest first, one tenant (the platform's rows have none), by each filter the API offers.
CREATE INDEX ix_operator_actions_tenant ON operator_actions (tenant_id, id);
CREATE INDEX ix_operator_actions_principal ON operator_actions (tenant_id, principal, id);
CREATE INDEX ix_operator_actions_action ON operator_actions (tenant_id, action, id);
CREATE INDEX ix_operator_actions_subject ON operator_actions (tenant_id, subject_kind, subject_id, id);
CREATE INDEX ix_operator_actions_at ON operator_actions (tenant_id, at, id);

CREATE FUNCTION operator_actions_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'the ledger of operator actions is append-only'
        USING ERRCODE = 'insufficient_privilege', CONSTRAINT = 'ck_operator_actions_append_only';
END $$;
CREATE TRIGGER tr_operator_actions_append_only BEFORE UPDATE OR DELETE ON operator_actions
    FOR EACH ROW EXECUTE FUNCTION operator_actions_append_only();
CREATE TRIGGER tr_operator_actions_no_truncate BEFORE TRUNCATE ON operator_actions
    FOR EACH STATEMENT EXECUTE FUNCTION operator_actions_append_only();

-- The roles whose actions it records write it in their own transactions, and read it (the API serves it);
-- nobody holds UPDATE, DELETE or TRUNCATE. The worker, recovery and the dispatcher neither read nor write it.
GRANT SELECT, INSERT ON operator_actions TO exports_api, exports_reconciler, exports_platform;
