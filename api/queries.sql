-- The API's own statements, outside the row protocol: bearer tokens, display names, and the demo's seed
-- data. None of them writes export_jobs; every status change goes through db/queries.sql.

-- name: find_api_token
-- The tenant, principal and role a token's SHA-256 is bound to.
SELECT tenant_id, principal, role FROM api_tokens WHERE token_sha256 = %(token_sha256)s;

-- name: insert_api_token
-- Records a new token by its SHA-256 only (an administrator's connection: no application role may insert).
INSERT INTO api_tokens (token_sha256, tenant_id, principal, role)
VALUES (%(token_sha256)s, %(tenant_id)s, %(principal)s, %(role)s)
RETURNING tenant_id;

-- name: tenant_name
-- A tenant's display name.
SELECT name FROM tenants WHERE id = %(tenant_id)s;

-- name: tenant_destinations
-- A tenant's destinations for display: names and where they point, never the credential reference.
SELECT id, name, host, port, remote_dir FROM destinations WHERE tenant_id = %(tenant_id)s ORDER BY name, id;

-- name: insert_tenant
-- Seeds a tenant (administrator's connection).
INSERT INTO tenants (id, name) VALUES (%(id)s, %(name)s) RETURNING id;

-- name: insert_destination
-- Seeds a partner destination (administrator's connection).
INSERT INTO destinations (id, tenant_id, name, host, port, username, host_key, credential_ref, remote_dir,
                          name_and_size_identify, hash_evidence, ack_suffix, max_write_request)
VALUES (%(id)s, %(tenant_id)s, %(name)s, %(host)s, %(port)s, %(username)s, %(host_key)s, %(credential_ref)s,
        %(remote_dir)s, %(name_and_size_identify)s, %(hash_evidence)s, %(ack_suffix)s, %(max_write_request)s)
RETURNING id;

-- name: insert_generated_contacts
-- Seeds a list of synthetic contacts in one statement (administrator's connection).
INSERT INTO contacts (tenant_id, list_name, email, first_name, last_name)
SELECT %(tenant_id)s, %(list_name)s, 'contact' || n || '@example.test', 'First' || n, 'Last' || n
FROM generate_series(1, %(count)s) AS n;
