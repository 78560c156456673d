-- The ledger filtered by a subject's ID alone (issue #26: the console's and the API's Subject box, which does
-- not ask for the subject's kind). No index of 0031 starts with (tenant_id, subject_id): PostgreSQL 18 skip-
-- scans ix_operator_actions_subject over the kinds, but 16 and 15 read the tenant's whole ledger (430 ms at
-- 1,500,000 rows). This one serves page_operator_actions newest first, backwards from its keyset bound, for
-- the subject's entries alone. An index only: no grant or trigger changes.
CREATE INDEX ix_operator_actions_subject_id ON operator_actions (tenant_id, subject_id, id);
