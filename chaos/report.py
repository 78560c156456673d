"""The soak's report: a JSON-able dict, and the text a person reads."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import asdict
from pathlib import Path
from typing import Any

from chaos.audit import AuditResult
from chaos.config import SoakConfig
from chaos.driver import ExportRecord
from chaos.faults import FaultRecord
from chaos.plan import Plan

MAX_EXAMPLES = 8


def build_report(
    *,
    config: SoakConfig,
    plan: Plan,
    command: str,
    run_dir: Path,
    timings: dict[str, float],
    settled: bool,
    audit: AuditResult,
    faults: list[FaultRecord],
    records: list[ExportRecord],
    harness: list[str],
    load: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the run found, as plain data (``violations`` empty means it passed)."""
    from chaos.soak import config_dict

    by_kind: dict[str, Counter[str]] = defaultdict(Counter)
    for fault in faults:
        by_kind[fault.kind]["skipped" if fault.skipped else "done" if fault.ok else "failed"] += 1
    return {
        "seed": config.seed,
        "plan_digest": plan.digest(),
        "command": command,
        "config": config_dict(config),
        "run_dir": str(run_dir),
        "timings": {k: round(v, 1) for k, v in timings.items()},
        "load_average": {k: round(v, 2) if isinstance(v, float) else v for k, v in (load or {}).items()},
        "settled": settled,
        "exports_planned": len(plan.exports),
        "exports_created": sum(1 for r in records if r.job_id and r.role == "original"),
        "counts": audit.counts,
        "faults_by_kind": {k: dict(v) for k, v in sorted(by_kind.items())},
        "faults": [asdict(f) for f in sorted(faults, key=lambda f: f.started)],
        "violations": [asdict(v) for v in audit.violations],
        "violations_by_invariant": audit.counts.get("violations_by_invariant", {}),
        "findings": audit.findings,
        "harness_errors": harness,
    }


def render(report: dict[str, Any]) -> str:
    """The report as text: counts first, then where work goes to a person, then every violation."""
    out: list[str] = []
    add = out.append
    c = report["counts"]
    t = report["timings"]
    add("")
    add(f"== chaos soak: seed {report['seed']}, plan {report['plan_digest']}, "
        f"{report['exports_created']}/{report['exports_planned']} exports created, {c.get('jobs', 0)} jobs "
        f"({c.get('replacements', 0)} replacements), {c.get('attempts', 0)} attempts ==")  # fmt: skip
    add(
        "run times: "
        + ", ".join(f"{k} {v:.0f}s" for k, v in t.items())
        + ("" if report["settled"] else "  (NOT SETTLED)")
    )
    load = report.get("load_average") or {}
    if load:
        add(f"machine load (1-min average, {load.get('cpus')} CPUs): start {load.get('at_start')}, mean "
            f"{load.get('mean')}, max {load.get('max')}; timing-driven findings grow with it")  # fmt: skip
    add("final states: " + ", ".join(f"{k} {v}" for k, v in c.get("final_states", {}).items()))
    add("faults by kind: " + ", ".join(
        f"{k} {v.get('done', 0)}" + (f" (+{v['skipped']} skipped)" if v.get("skipped") else "")
        + (f" (+{v['failed']} failed)" if v.get("failed") else "")
        for k, v in report["faults_by_kind"].items()))  # fmt: skip
    add(f"recovery takeovers: {c.get('recovery_takeovers', {})}")
    add(f"partner: {c.get('final_name_writes', 0)} final-name writes, {c.get('temporary_files_created', 0)} "
        f"temporary files created, {c.get('partner_temporary_files_left', 0)} left behind "
        f"({c.get('partner_temporary_files_left_by_failed', 0)} of Failed attempts); writes by "
        f"{c.get('final_name_writes_by', {})}, {c.get('final_name_writes_unattributed', 0)} not attributable")  # fmt: skip
    if c.get("webhooks"):
        add(f"webhooks: {c['webhooks']}")
    add(f"workflow histories checked: {c.get('histories_checked', 0)}; export workflow results: "
        f"{c.get('export_workflow_results', {})}")  # fmt: skip
    add("")
    add("cancellations (client's point -> final answer):")
    for point, outcomes in c.get("cancel_outcomes_by_point", {}).items():
        seen = c.get("status_seen_before_cancel", {}).get(point, {})
        add(f"  {point:18} {outcomes}   seen before: {seen}")
    add(f"  recorded: {c.get('cancellation_outcomes', {})}")
    add(f"edits: {c.get('edits', {})}; duplicate creates: {c.get('duplicate_creates', {})}")
    add(
        f"recurring exports' firings: {c.get('recurring_firings', {})} (each created one export; none created two)"
    )
    add("")
    add("HTTP answers by route: ")
    for route, statuses in c.get("http_answers", {}).items():
        add(f"  {route:36} {statuses}")
    if c.get("client_errors"):
        add(f"client-side errors (no answer; not 5xx): {c['client_errors']}")
    findings = report["findings"]
    if findings.get("http_5xx"):
        add(f"5xx answers: {c.get('http_5xx_by_route', {})}")
        for group in findings.get("api_tracebacks", [])[:MAX_EXAMPLES]:
            add(f"  traceback x{group['count']} {group['routes']}: {group['summary']}")
    unknown = findings.get("outcome_unknown", {})
    add("")
    add(f"OutcomeUnknown: {sum(v['count'] for v in unknown.values())}")
    jobs = {j["job_id"]: j for j in findings.get("outcome_unknown_jobs", [])}
    for cause, info in unknown.items():
        add(f"  {info['count']:4}  {cause}{'  (expected)' if info['expected'] else ''}")
        add(
            f"        faults on its worker/workflow or nearby: {info.get('likely_faults', {})}; e.g. {', '.join(info['examples'][:3])}"
        )
        example = jobs.get(info["examples"][0]) if info["examples"] else None
        if example:
            add(
                f"        example {example['job_id']} (worker {example['worker']}; faults {example['faults_near'][:3]}):"
            )
            for line in example["events"][-6:]:
                add(f"          {line}")
            for line in (example.get("attempt_workflow") or (example.get("workflows") or [[]])[-1])[-10:]:
                add(f"          | {line}")
    failed = findings.get("failed", {})
    if failed:
        add(f"Failed: {sum(v['count'] for v in failed.values())}")
        for cause, info in failed.items():
            add(f"  {info['count']:4}  {cause}  e.g. {', '.join(info['examples'][:3])}")
    recovery = findings.get("recovery", {})
    if recovery:
        add(f"recovery: {recovery.get('runs')} runs every {recovery.get('interval_seconds')}s; longest gap "
            f"{recovery.get('longest_gap_seconds')}s; {len(recovery.get('slow_runs', []))} slow runs")  # fmt: skip
    for stall in findings.get("recovery_stalls", []):
        add(f"  STALL: {stall}")
    slow = findings.get("slow_to_settle", [])
    if slow:
        add(
            f"slow to settle (last transition > 20s after the faults stopped): {c.get('slow_to_settle', 0)} jobs, e.g."
        )
        for item in slow[:3]:
            add(
                f"  {item['job_id']} {item['status']} +{item['seconds_after_faults']}s: {' | '.join(item['events'][-4:])}"
            )
    outbox = findings.get("outbox_unpublished") or {}
    if outbox.get("rows"):
        add(
            f"outbox at the audit: {outbox['rows']} unpublished wake-ups for {outbox['jobs']} jobs, oldest {outbox['oldest_seconds']}s"
        )
    for tx in findings.get("open_transactions", [])[:MAX_EXAMPLES]:
        add(f"  open transaction {tx['xact_seconds']}s: {tx['application_name']} {tx['state']} "
            f"(waits {tx['wait_event_type']}/{tx['wait_event']}): {tx['query'][:100]}")  # fmt: skip
    exits = findings.get("unexpected_exits", [])
    if exits:
        add(f"processes that exited by themselves (restarted by the soak): {len(exits)}")
        for e in exits[:MAX_EXAMPLES]:
            lines = [ln.partition(" ")[2] for ln in e["log_tail"].splitlines() if ln.strip()]
            errors = [ln for ln in lines if re.match(r"^[\w.]+(Error|Exception)\b", ln)] or lines[-1:] or [""]
            add(f"  {e['process']} code {e['code']}: {errors[-1][:200]}")
    if report["harness_errors"]:
        add(f"harness problems: {report['harness_errors'][:MAX_EXAMPLES]}")
    add("")
    violations = report["violations"]
    add(f"VIOLATIONS: {len(violations)}  {report['violations_by_invariant']}")
    by_invariant: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for v in violations:
        by_invariant[v["invariant"]].append(v)
    for invariant, items in by_invariant.items():
        add(f"  [{invariant}] x{len(items)}")
        for v in items[:MAX_EXAMPLES]:
            add(f"    job {v['job_id']}: {v['detail']}")
            for line in v["evidence"].get("events", [])[-12:]:
                add(f"        {line}")
    add("")
    add(f"reproduce: {report['command']}")
    add(f"logs: {report['run_dir']}")
    return "\n".join(out)
