-- Recovery may now prove NotDelivered for an attempt that fenced its rename: it moves the attempt's
-- temporary file to its set-aside name at the partner, so the rename can never publish it, and records
-- Failed NotDelivered through fail_set_aside_delivery (db/queries.sql). That is the edge Delivering -> Failed
-- recovery already takes (fail_unpublished_delivery), by the same role and only over an expired lease: the
-- guard is unchanged, only the edge's description names the new statement.
UPDATE export_status_edges
SET via = 'finish_delivery (worker) / fail_unpublished_delivery, fail_set_aside_delivery (recovery)'
WHERE (from_status, to_status) = ('Delivering', 'Failed');
