-- What the partner receives, set and rotated by an admin (issue #24, items 1, 2 and 5).
--
-- Migration 0020 added the file's format and its OpenPGP layer to destinations (csv_header, csv_delimiter,
-- csv_columns, compression, pgp_recipient_keys, pgp_signing_key_ref) with their checks, but exports_api could
-- only insert them (its table-wide INSERT, 0021): no admin could change a format or rotate a partner's key
-- without editing the database by hand. This grants the UPDATE of those six columns; the API changes them only
-- through edit_destination_if_version, which records each change as the destination's next version.
--
-- Nothing else changes:
-- - they are delivery terms already (destination_delivery_terms() excludes none of them: 0021, 0035), so an
--   edit during a build moves delivery_version and cutoff 2 gives the attempt back (DestinationChanged);
-- - pgp_recipient_keys and pgp_signing_key_ref already take two admins (two_person_destination_fields(), 0032);
-- - tr_destinations_guard still refuses every UPDATE by exports_worker.

GRANT UPDATE (csv_header, csv_delimiter, csv_columns, compression, pgp_recipient_keys, pgp_signing_key_ref)
    ON destinations TO exports_api;
