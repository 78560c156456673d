"""The gauges query's plan reads the partial indexes of 0004, never export_jobs sequentially, on a few
thousand rows of the benchmark's production-like mix (97 % history). The million-row scrape and its 50 ms
budget are ``python -m bench obs scrape``: loading them takes a minute and a half, and a wall-clock
threshold flakes on a shared machine; a plan does not."""

from __future__ import annotations

import re

from bench.obs import explain, load
from db.gauges import GaugesReader

ROWS = 5_000


def test_the_gauges_query_reads_indexes_not_the_jobs_table(database):
    load(database.admin_url, rows=ROWS)
    plan = explain(database.app_url, analyze=False)
    print(plan)
    # Nothing is read sequentially: on this history the planner may pick any of the jobs' indexes for a
    # part (the partial ones of 0004 win as the history grows), but never the table itself.
    assert "Seq Scan" not in plan, plan
    assert len(re.findall(r"Index (Only )?Scan\b.* on export_jobs\b", plan)) >= 10, plan
    # And it answers what the rows hold (5 per mille Queued, 2 Running, 1 Delivering; one OutcomeUnknown).
    reader = GaugesReader(database.app_url)
    try:
        values = reader.read()
    finally:
        reader.close()
    assert (values.queued, values.running, values.delivering, values.outcome_unknown) == (25, 10, 5, 1)
    assert values.outbox_unpublished == ROWS // 1000
