-- The dispatcher publishes outside a transaction (issue 10.7): it leases a batch of unpublished rows by
-- setting publishing_until in one short statement, commits, starts their workflows concurrently, then
-- marks them published. A row whose lease has passed and that is still unpublished is taken again, by
-- any dispatcher, with the same message ID (the workflow ID makes the second start reach the same run).
-- NULL: never taken, or given back after a failed start.
ALTER TABLE outbox ADD COLUMN publishing_until timestamptz;

-- The dispatcher may change only what it must: when a row was published and its publishing lease.
GRANT UPDATE (publishing_until) ON outbox TO exports_dispatcher;
