-- The database gauges of observability/db_gauges.py, in one statement run at scrape time.
--
-- Each part reads a partial index whose size is the work in flight (0004_observability.sql), never the
-- history: counts stop at %(cap)s rows each, minimums are one index probe, and the OutcomeUnknown wait
-- looks up the outcome event of at most %(unknown_probe)s jobs (those whose delivery began first). Ages are
-- on the database clock, like every lease, and are 0 when nothing is waiting.
WITH unknown_since AS (
    SELECT min(e.recorded_at) AS since
    FROM (SELECT id, attempt_id FROM export_jobs
          WHERE status = 'OutcomeUnknown'
          ORDER BY delivery_authorized_at
          LIMIT %(unknown_probe)s) u
    CROSS JOIN LATERAL (
        SELECT recorded_at FROM export_attempt_events e
        WHERE e.job_id = u.id AND e.attempt_id = u.attempt_id
          AND e.kind IN ('Finished', 'ResolvedByRecovery') AND e.kind <> 'DeliveryEvidence') e
)
SELECT
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Queued' LIMIT %(cap)s) c) AS queued,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Running' LIMIT %(cap)s) c) AS running,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'Delivering' LIMIT %(cap)s) c) AS delivering,
    (SELECT count(*) FROM (SELECT FROM export_jobs WHERE status = 'OutcomeUnknown' LIMIT %(cap)s) c)
        AS outcome_unknown,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Running' AND lease_expires_at < statement_timestamp()
                           LIMIT %(cap)s) c) AS running_expired,
    (SELECT count(*) FROM (SELECT FROM export_jobs
                           WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp()
                           LIMIT %(cap)s) c) AS delivering_expired,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Running' AND lease_expires_at < statement_timestamp())
        AS running_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(lease_expires_at)), 0)::float8
     FROM export_jobs WHERE status = 'Delivering' AND lease_expires_at < statement_timestamp())
        AS delivering_expired_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(created_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(woken_at)), 0)::float8
     FROM export_jobs WHERE status = 'Queued') AS queued_oldest_wake_up_age,
    (SELECT coalesce(max(sweep_count), 0) FROM export_jobs WHERE status = 'Queued') AS queued_max_sweep_count,
    (SELECT count(*) FROM (SELECT FROM outbox WHERE published_at IS NULL LIMIT %(cap)s) c) AS outbox_unpublished,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - min(created_at)), 0)::float8
     FROM outbox WHERE published_at IS NULL) AS outbox_oldest_age,
    (SELECT coalesce(extract(epoch FROM statement_timestamp() - since), 0)::float8 FROM unknown_since)
        AS outcome_unknown_oldest_age;
