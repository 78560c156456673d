-- The tenant roles the next issues name (#24, #26): viewer (read only), operator, reconciler, admin (manages
-- the tenant's partner contracts, recurring exports and notification endpoints). What each may do is stated
-- once in service/permissions.py; here a principal and a token may hold any of the four.
ALTER TABLE principals DROP CONSTRAINT principals_role_check;
ALTER TABLE principals ADD CONSTRAINT principals_role_check
    CHECK (role IN ('viewer', 'operator', 'reconciler', 'admin'));

ALTER TABLE api_tokens DROP CONSTRAINT api_tokens_role_check;
ALTER TABLE api_tokens ADD CONSTRAINT api_tokens_role_check
    CHECK (role IN ('viewer', 'operator', 'reconciler', 'admin'));
