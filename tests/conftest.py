"""Session-wide real servers and per-module fresh databases. No mocks of PostgreSQL, Temporal or SFTP.

The fixtures come from the plugins below: ``tests/fix_db.py`` (PostgreSQL), ``tests/fix_temporal.py``
(one time-skipping server and one dev server for the session) and ``tests/fix_sftp.py`` (the SFTP servers).
"""

from __future__ import annotations

import os

import pytest

pytest_plugins = ("tests.fix_db", "tests.fix_temporal", "tests.fix_sftp", "tests.fix_gpg")

IN_CI = os.environ.get("CI", "").lower() == "true"

# Workers started by tests serve no fixed port (several test runs share this machine); a test that reads a
# worker's /metrics, /healthz or /readyz, or the SDK's metrics, gives it a free port of its own.
os.environ.setdefault("EXPORTS_METRICS_PORT", "0")
os.environ.setdefault("EXPORTS_TEMPORAL_METRICS_PORT", "0")


def require(condition: bool, what: str) -> None:
    """Skip on a developer machine, fail in CI: a missing server is never a pass."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"{what} is missing, and CI=true: failing rather than skipping")
    pytest.skip(f"{what} is missing")
