"""The API keeps its published contract (issue 9, part 5): schemathesis 4 runs every phase (examples,
coverage, fuzzing, and stateful sequences over the OpenAPI links create -> get / edit / cancel) with every
check against the served schema of the real app over HTTP and real PostgreSQL. No 5xx but 503 (Busy), no
response the schema contradicts, no request the schema allows refused by validation (our own check in
schemathesis_hooks.py), every required header's absence refused, every path's Allow header true.

Bounded: a fixed seed, a few examples per operation and a time budget, well under a minute here.
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest

from api.server import BackgroundServer

ROOT = Path(__file__).resolve().parents[2]
ST = Path(sys.executable).with_name("st")

CONFIG = """
[checks.positive_data_acceptance]
# State-dependent answers to schema-valid requests (a moved-on version, an ID used before, a reference
# that is not the caller's); schema_valid_requests_pass_validation tells them from validation refusals.
expected-statuses = ["2xx", "400", "401", "403", "404", "409", "412", "422", "503"]

[checks.missing_required_header]
# A missing If-Match is 428 Precondition Required (RFC 6585), the answer made for it.
expected-statuses = ["400", "401", "403", "406", "415", "422", "428"]

[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", "503"]
"""

pytestmark = [pytest.mark.slow, pytest.mark.schemathesis]


async def test_schemathesis_finds_nothing_against_the_served_schema(make_app, acme, tmp_path):
    assert ST.exists(), "schemathesis is a test dependency (pip install -e '.[test]')"
    server = BackgroundServer(make_app())
    url = await server.start()
    config = tmp_path / "schemathesis.toml"
    config.write_text(CONFIG, encoding="utf-8")
    try:
        proc = await asyncio.create_subprocess_exec(
            str(ST),
            "--config-file",
            str(config),
            "run",
            f"{url}/openapi.json",
            "--checks",
            "all",
            "--header",
            # An admin may do what an operator may and manage destinations (#24), so every write route is
            # exercised past its permission check; reconciliation stays a 403 (documented).
            f"Authorization: {acme.admin['Authorization']}",
            "--max-examples",
            "12",
            "--seed",
            "20261101",
            "--max-time",
            "25",
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
            "--request-timeout",
            "10",
            cwd=tmp_path,  # its crash cache (.schemathesis/) goes there, not into the checkout
            env={**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks", "PYTHONPATH": str(ROOT)},
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=150)
    finally:
        await server.stop()
    report = out.decode(errors="replace")
    print(report[-5000:])  # shown with -s, and on failure
    assert proc.returncode == 0, report[-12000:]
    assert "stateful" in report.lower(), report[-3000:]
