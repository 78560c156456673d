"""deploy/prometheus/alerts.yml: valid for promtool, and each alert fires on series taken from real scrapes
of the collector and the metrics (a real database in the state the alert is about), while a healthy run
fires nothing.

Each scenario scrapes a fresh database and an ``ExportMetrics`` as Prometheus would, once per simulated
minute, adds the labels Prometheus attaches (instance, job), turns the scrapes into ``promtool test
rules`` input series and states which alert fires (with the labels and annotations of alerts.yml) and
that every other alert stays silent. Without promtool these tests skip on a developer machine and fail
when CI=true (``.ci/run`` installs Debian's prometheus package).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from db.embedded import free_port
from db.pool import open_pool
from db.stores.api import ApiStore
from db.stores.protocol import WorkerStore
from domain.models import JobStatus, ReleaseCause
from observability.db_gauges import DatabaseGauges
from observability.metrics import ExportMetrics
from testbed.pg import clone_database
from tests.conftest import require
from tests.support.factories import Factory

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"
TARGET = {"instance": "worker-1:9464", "job": "fenced-exports-worker"}
DEFAULTS = {
    "recovery_every_seconds": 30,
    "renew_every_seconds": 20,
    "lease_seconds": 60,
    "sweep_after_seconds": 1800,
    "sweep_every_seconds": 300,
}


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "promtool (Debian package prometheus)")
    assert path is not None
    return path


def rules() -> dict[str, dict]:
    loaded = yaml.safe_load(ALERTS.read_text())
    return {rule["alert"]: rule for group in loaded["groups"] for rule in group["rules"]}


# -- scrapes to promtool series -----------------------------------------------------------------------


def selector(name: str, labels: dict[str, str]) -> str:
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return f"{name}{{{inner}}}"


def input_series(scrapes: list[str], hold_minutes: int = 0) -> list[dict[str, str]]:
    """One promtool input series per sample seen, a value per scrape (``_`` where absent), the last value
    held ``hold_minutes`` more."""
    table: dict[str, list[float | None]] = {}
    for i, text in enumerate(scrapes):
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # creation timestamps: no rule reads them
                key = selector(sample.name, {**sample.labels, **TARGET})
                table.setdefault(key, [None] * len(scrapes))[i] = sample.value
    series = []
    for key, values in table.items():
        tokens = ["_" if v is None else repr(float(v)) for v in values]
        if hold_minutes:
            tokens.append(f"{tokens[-1]}x{hold_minutes}")
        series.append({"series": key, "values": " ".join(tokens)})
    return series


def run_promtool_test(tmp_path: Path, series: list[dict], eval_time: str, firing: str | None) -> None:
    """Every alert at ``eval_time``: ``firing`` with its labels and annotations, all others silent."""
    alert_tests = []
    for name, rule in rules().items():
        expected = []
        if name == firing:
            labels = dict(rule.get("labels", {}))
            if "by (instance)" in rule["expr"]:
                labels["instance"] = TARGET["instance"]
            expected = [{"exp_labels": labels, "exp_annotations": rule.get("annotations", {})}]
        alert_tests.append({"eval_time": eval_time, "alertname": name, "exp_alerts": expected})
    spec = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": alert_tests}],
    }
    path = tmp_path / "alerts_test.yml"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    done = subprocess.run(
        [promtool(), "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def wake_up_ages(scrape: str) -> list[float]:
    """The oldest Queued wake-up's age in one scrape (empty when no job is Queued)."""
    return [
        sample.value
        for family in text_string_to_metric_families(scrape)
        for sample in family.samples
        if sample.name == "fenced_exports_queued_wake_up_oldest_age_seconds"
    ]


# -- fixtures -----------------------------------------------------------------------------------------


@pytest.fixture
async def fresh(pg_server, pg_template) -> AsyncIterator[tuple[Factory, WorkerStore, str]]:
    """A fresh database for one scenario: (factory, worker store, the application login's URL)."""
    database = clone_database(pg_server, pg_template)
    api_pool = await open_pool(database.app_url, "exports_api", max_size=2)
    worker_pool = await open_pool(database.app_url, "exports_worker", max_size=2)
    worker = WorkerStore(worker_pool, lease_seconds=60)
    yield Factory(database, api=ApiStore(api_pool), worker=worker), worker, database.app_url
    await api_pool.close()
    await worker_pool.close()


class Target:
    """What Prometheus scrapes from one worker: the metrics and, optionally, the database gauges."""

    def __init__(self, url: str | None) -> None:
        self.registry = CollectorRegistry()
        self.metrics = ExportMetrics(self.registry)
        self.metrics.describe_settings(**DEFAULTS)
        self.gauges = DatabaseGauges(url, cache_seconds=0) if url else None
        if self.gauges:
            self.registry.register(self.gauges)
        self.scrapes: list[str] = []

    def scrape(self) -> str:
        text = generate_latest(self.registry).decode()
        self.scrapes.append(text)
        return text

    def every_minute(self, minutes: int, between: Callable[[int], None] | None = None) -> None:
        for minute in range(minutes):
            if between:
                between(minute)
            self.scrape()

    def close(self) -> None:
        if self.gauges:
            self.gauges.close()


# -- the rules file --------------------------------------------------------------------------------------


def test_promtool_accepts_the_rules():
    done = subprocess.run(
        [promtool(), "check", "rules", str(ALERTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 9 rules found" in done.stdout


@pytest.fixture
async def fresh_scrape_names(fresh) -> set[str]:
    _, _, url = fresh
    target = Target(url)
    try:
        text = target.scrape()
    finally:
        target.close()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_metric_an_alert_reads_is_one_we_export(fresh_scrape_names):
    for name, rule in rules().items():
        for metric in set(re.findall(r"\b(fenced_exports_[a-z_]+)", rule["expr"])):
            assert metric in fresh_scrape_names, (name, metric)


def test_promtool_finds_nothing_to_lint_in_a_scrape(tmp_path):
    target = Target(None)
    target.metrics.observe_build(3.0, 100, 2000)
    done = subprocess.run(
        [promtool(), "check", "metrics"], input=target.scrape(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and not done.stdout.strip(), done.stdout + done.stderr


# -- a healthy run fires nothing --------------------------------------------------------------------------


async def test_a_healthy_run_fires_nothing(fresh, tmp_path):
    factory, _, url = fresh
    await factory.in_status(JobStatus.COMPLETED)
    await factory.running()
    await factory.queued()  # its wake-up is fresh and unpublished: the dispatcher is about to take it
    target = Target(url)
    try:
        with target.metrics.holding_lease():

            def work(minute: int) -> None:
                for _ in range(3):
                    target.metrics.observe_lease_renewal(0.002, "renewed")
                target.metrics.observe_cancellation("StopRequested")

            target.every_minute(40, work)
    finally:
        target.close()
    series = input_series(target.scrapes)
    # The Queued job's wake-up is in the scrapes, fresh: FencedExportsQueuedJobStranded stays silent on it.
    assert wake_up_ages(target.scrapes[-1]) and max(wake_up_ages(target.scrapes[-1])) < 600
    for eval_time in ("10m", "25m", "39m"):
        run_promtool_test(tmp_path, series, eval_time, firing=None)


# -- each alert fires on the state it is about -------------------------------------------------------------


async def test_an_outcome_unknown_older_than_an_hour_fires(fresh, tmp_path):
    factory, _, url = fresh
    job, attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    await factory.admin(
        "UPDATE export_attempt_events SET recorded_at = clock_timestamp() - interval '2 hours'"
        " WHERE job_id = %(id)s AND attempt_id = %(a)s AND kind = 'Finished'",
        {"id": job.id, "a": attempt},
    )
    target = Target(url)
    try:
        target.scrape()
    finally:
        target.close()
    run_promtool_test(
        tmp_path, input_series(target.scrapes, hold_minutes=20), "15m", "FencedExportsOutcomeUnknownWaiting"
    )


async def test_an_outcome_unknown_younger_than_the_threshold_does_not(fresh, tmp_path):
    factory, _, url = fresh
    await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    target = Target(url)
    try:
        target.scrape()
    finally:
        target.close()
    run_promtool_test(tmp_path, input_series(target.scrapes, hold_minutes=20), "15m", None)


async def test_a_wake_up_unpublished_for_minutes_fires_outbox_lag(fresh, tmp_path):
    factory, _, url = fresh
    job = await factory.queued()
    await factory.admin(
        "UPDATE outbox SET created_at = clock_timestamp() - interval '10 minutes' WHERE job_id = %(id)s",
        {"id": job.id},
    )
    target = Target(url)
    try:
        target.scrape()
    finally:
        target.close()
    run_promtool_test(tmp_path, input_series(target.scrapes, hold_minutes=10), "8m", "FencedExportsOutboxLag")


async def test_a_lease_expired_for_two_recovery_intervals_fires(fresh, tmp_path):
    factory, _, url = fresh
    job, _ = await factory.running()
    await factory.expire_lease(job.id, seconds_ago=300)
    target = Target(url)
    try:
        target.scrape()
    finally:
        target.close()
    run_promtool_test(
        tmp_path, input_series(target.scrapes, hold_minutes=5), "3m", "FencedExportsExpiredLeaseNotTakenOver"
    )


async def test_a_queued_job_swept_again_and_again_fires(fresh, tmp_path):
    factory, worker, url = fresh
    job = await factory.queued()
    target = Target(url)
    try:
        for _ in range(3):  # each sweep: the wake-up is stale again, the sweeper re-wakes it
            await factory.age_wake_up(job.id, minutes=45)
            assert await worker.sweep_stale_queued(older_than_seconds=1800) == [job.id]
            target.scrape()
    finally:
        target.close()
    assert (
        'fenced_exports_queued_job_sweep_count_max{instance="worker-1:9464",job="fenced-exports-worker"}'
        in [s["series"] for s in input_series(target.scrapes)]
    )
    run_promtool_test(
        tmp_path, input_series(target.scrapes, hold_minutes=10), "5m", "FencedExportsSweepCountRising"
    )


async def test_a_queued_job_not_woken_for_twice_the_sweep_threshold_fires(fresh, tmp_path):
    factory, _, url = fresh
    job = await factory.queued()
    # Its wake-up was published (no outbox lag) and reached no worker; the sweeper has not re-woken it since.
    await factory.admin(
        "UPDATE outbox SET published_at = clock_timestamp() WHERE job_id = %(id)s", {"id": job.id}
    )
    await factory.age_wake_up(job.id, minutes=90)  # over 2 x sweep_after_seconds (1800 s)
    target = Target(url)
    try:
        target.scrape()
    finally:
        target.close()
    assert min(wake_up_ages(target.scrapes[0])) > 2 * DEFAULTS["sweep_after_seconds"]
    series = input_series(target.scrapes, hold_minutes=30)
    run_promtool_test(tmp_path, series, "14m", None)  # pending: its for: is 15m
    run_promtool_test(tmp_path, series, "16m", "FencedExportsQueuedJobStranded")


async def test_busy_answers_every_few_seconds_fire(tmp_path):
    target = Target(None)

    def busy(minute: int) -> None:
        for _ in range(30):  # half a Busy answer per second
            target.metrics.observe_cancellation("Busy", source="api")

    target.every_minute(15, busy)
    run_promtool_test(tmp_path, input_series(target.scrapes), "14m", "FencedExportsBusySpike")


async def test_a_worker_holding_leases_without_renewing_fires(tmp_path):
    target = Target(None)
    with target.metrics.holding_lease():

        def renew_for_a_while(minute: int) -> None:
            if minute < 3:
                target.metrics.observe_lease_renewal(0.002, "renewed")
            else:
                target.metrics.observe_lease_renewal(5.0, "error")  # the database stopped answering it

        target.every_minute(15, renew_for_a_while)
    run_promtool_test(tmp_path, input_series(target.scrapes), "14m", "FencedExportsWorkerWithoutRenewals")


async def test_a_worker_that_cannot_read_the_gauges_fires(tmp_path):
    target = Target(f"postgresql://exports_app@127.0.0.1:{free_port()}/{uuid.uuid4().hex}")
    try:
        target.scrape()
    finally:
        target.close()
    run_promtool_test(
        tmp_path, input_series(target.scrapes, hold_minutes=10), "8m", "FencedExportsDatabaseGaugesDown"
    )


async def test_a_job_given_back_again_and_again_fires(fresh, tmp_path):
    factory, worker, url = fresh
    job = await factory.queued()
    target = Target(url)
    try:
        for _ in range(3):  # three give-backs for a failure: the build's backend killed each time
            job, attempt = await factory.running(await factory.job(job.id))
            await worker.release_attempt_if_running(
                job.id, attempt, "worker-3", "build interrupted: CopyFailed", ReleaseCause.TRANSIENT
            )
            await factory.end_wait(job.id)
            target.scrape()
    finally:
        target.close()
    assert (await factory.job(job.id)).transient_releases == 3
    series = input_series(target.scrapes, hold_minutes=15)
    run_promtool_test(tmp_path, series, "9m", None)  # pending: its for: is 10m
    run_promtool_test(tmp_path, series, "12m", "FencedExportsJobReleasedRepeatedly")
