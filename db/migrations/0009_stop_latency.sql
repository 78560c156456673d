-- Recovery's stop_expired_attempt reports how long the stop took, from the request's recorded_at to its
-- Stopped write (the fenced_exports_stop_latency_seconds histogram): it may read when a request was
-- recorded, and its ID to find it, nothing else of the ledger.
GRANT SELECT (id, recorded_at) ON cancellation_requests TO exports_recovery;
