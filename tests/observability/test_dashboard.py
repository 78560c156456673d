"""The Grafana dashboard and the Prometheus configuration: every query is valid PromQL (promtool parses
it), reads only metrics a real scrape has, and the provisioning files agree with the dashboard."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from observability.db_gauges import DatabaseGauges
from observability.metrics import ExportMetrics
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy" / "grafana"
DASHBOARD = GRAFANA / "fenced-exports.json"
PROMETHEUS = ROOT / "deploy" / "prometheus" / "prometheus.yml"

# The Temporal SDK's metrics the dashboard reads; test_metrics.py checks them against a real runtime scrape.
TEMPORAL_METRICS = {
    "temporal_worker_task_slots_available",
    "temporal_workflow_task_schedule_to_start_latency_seconds_bucket",
    "temporal_activity_schedule_to_start_latency_seconds_bucket",
    "temporal_activity_execution_latency_seconds_bucket",
    "temporal_request_total",
}


def promtool() -> str:
    path = shutil.which("promtool")
    require(path is not None, "promtool (Debian package prometheus)")
    assert path is not None
    return path


def panels() -> list[dict]:
    return [p for p in json.loads(DASHBOARD.read_text())["panels"] if p["type"] != "row"]


def expressions() -> list[str]:
    return [t["expr"] for p in panels() for t in p["targets"]]


def metric_names(expr: str) -> set[str]:
    return set(re.findall(r"\b((?:fenced_exports|temporal)_[a-z_]+)\b", expr))


def test_every_panel_uses_the_datasource_variable_and_fits_the_grid():
    dashboard = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    assert dashboard["uid"] == "fenced-exports"
    for panel in panels():
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24, panel["title"]


def test_every_query_is_valid_promql(tmp_path):
    # promtool parses rule expressions: each query becomes a recording rule.
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$__rate_interval", "5m")}
        for i, expr in enumerate(expressions())
    ]
    path = tmp_path / "dashboard_rules.yml"
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    done = subprocess.run(
        [promtool(), "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_every_metric_the_dashboard_reads_is_exported():
    registry = CollectorRegistry()
    metrics = ExportMetrics(registry)
    metrics.describe_settings(recovery_every_seconds=30)
    scraped = {
        s.name for f in text_string_to_metric_families(generate_latest(registry).decode()) for s in f.samples
    }
    gauges = DatabaseGauges("postgresql://unused", cache_seconds=0)
    scraped |= {s.name for f in gauges.describe() for s in f.samples} | {f.name for f in gauges.describe()}
    used = set().union(*(metric_names(e) for e in expressions()))
    assert {n for n in used if n.startswith("temporal_")} == TEMPORAL_METRICS
    missing = {n for n in used if n.startswith("fenced_exports_")} - scraped
    assert not missing


def test_provisioning_points_at_the_dashboard_and_its_datasource():
    datasource = yaml.safe_load((GRAFANA / "provisioning" / "datasources" / "prometheus.yml").read_text())
    (source,) = datasource["datasources"]
    variable = json.loads(DASHBOARD.read_text())["templating"]["list"][0]
    assert variable["type"] == "datasource" and variable["current"]["value"] == source["uid"]
    providers = yaml.safe_load((GRAFANA / "provisioning" / "dashboards" / "fenced-exports.yml").read_text())
    assert providers["providers"][0]["type"] == "file"


def test_promtool_accepts_the_prometheus_configuration():
    done = subprocess.run(
        [promtool(), "check", "config", str(PROMETHEUS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("expr", expressions())
def test_queries_aggregate_across_workers(expr):
    # Every worker serves the same database gauges: a bare gauge would draw one line per worker.
    for name in metric_names(expr):
        if name.startswith("fenced_exports_") and "(" not in expr:
            pytest.fail(f"{expr} is not aggregated")
