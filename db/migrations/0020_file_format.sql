-- What the partner receives (issue #24, item 5): per destination, the CSV's shape (a header line, the
-- delimiter, which contact columns in which order), optional gzip, and an optional OpenPGP layer: encryption
-- to the partner's public keys and signing with the tenant's key, held by reference. The defaults are the
-- file every destination received before: a header, commas, email/first_name/last_name, no compression, no
-- OpenPGP. Public keys are not secrets and are stored ASCII-armored; the signing key never is: the column
-- holds a reference (the path of its secret key file on the worker host, as credential_ref does for SFTP).
--
-- The table's existing grants cover the new columns (SELECT for exports_api, exports_worker,
-- exports_recovery and exports_reconciler; nobody else), and tr_destinations_guard still refuses every
-- UPDATE by exports_worker: the worker reads a format, it never changes one.

-- The columns a partner may receive, each at most once, at least one (the builder's COPY lists them as
-- identifiers; an unknown name never reaches it).
CREATE FUNCTION csv_columns_ok(columns text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(columns) >= 1
   AND array_position(columns, NULL) IS NULL
   AND columns <@ ARRAY['email', 'first_name', 'last_name']
   AND (SELECT count(DISTINCT c) FROM unnest(columns) AS c) = cardinality(columns)
$$;

-- Every recipient key is one ASCII-armored public key block, and no secret key is ever stored by mistake.
CREATE FUNCTION armored_public_keys_ok(keys text[]) RETURNS boolean
    LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
    AS $$
SELECT cardinality(keys) <= 10
   AND coalesce((SELECT bool_and(k LIKE '-----BEGIN PGP PUBLIC KEY BLOCK-----%'
                                 AND k LIKE '%-----END PGP PUBLIC KEY BLOCK-----%'
                                 AND k NOT LIKE '%PRIVATE KEY%')
                 FROM unnest(keys) AS k), true)
$$;

ALTER TABLE destinations
    ADD COLUMN csv_header boolean NOT NULL DEFAULT true,
    ADD COLUMN csv_delimiter text NOT NULL DEFAULT ','
        CONSTRAINT ck_destinations_csv_delimiter CHECK (csv_delimiter IN (',', ';', '|', E'\t')),
    ADD COLUMN csv_columns text[] NOT NULL DEFAULT ARRAY['email', 'first_name', 'last_name']
        CONSTRAINT ck_destinations_csv_columns CHECK (csv_columns_ok(csv_columns)),
    ADD COLUMN compression text NOT NULL DEFAULT 'none'
        CONSTRAINT ck_destinations_compression CHECK (compression IN ('none', 'gzip')),
    ADD COLUMN pgp_recipient_keys text[] NOT NULL DEFAULT '{}'
        CONSTRAINT ck_destinations_pgp_recipient_keys CHECK (armored_public_keys_ok(pgp_recipient_keys)),
    -- A reference, never the key: no armored block, nothing empty.
    ADD COLUMN pgp_signing_key_ref text
        CONSTRAINT ck_destinations_pgp_signing_key_ref
            CHECK (pgp_signing_key_ref <> '' AND pgp_signing_key_ref NOT LIKE '%-----BEGIN%');
