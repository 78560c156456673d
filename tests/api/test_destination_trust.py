"""Onboarding a partner's server without trust on first use, over HTTP and from the command line (issue #24,
items 3 and 4), with a worker host on the Temporal dev server and the in-process SFTP server as the partner.

- ``POST /destinations/{id}/connection-tests`` (and ``starter.py destination test``) runs on a worker and
  reports the host key the server presented, its fingerprint and whether it is pinned; our login, the
  directory, posix-rename and the write limit only for a pinned key. It pins nothing and records nothing. An
  operator, a reconciler and an admin may run it; a viewer may not (403).
- ``POST /destinations/{id}/host-keys`` (``starter.py destination pin-key``) pins one more key, and
  ``.../host-keys/removal`` (``unpin-key``) removes one: an admin's recorded versions, If-Match on the version
  read; the last key is never removed. Every other role is refused and nothing is recorded.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from typing import Any

import asyncssh
import httpx
import pytest
from temporalio.testing import WorkflowEnvironment

from api.app import create_app
from domain.destination import host_key_fingerprint
from partner.local_server import LocalSftpServer
from service.exports import Exports
from service.signals import TemporalStopSignaller
from settings import Settings
from testbed import pg
from tests.api.conftest import TenantKeys, another, approve, client_for
from tests.api.test_destinations import recorded
from tests.api.test_starter import ROOT
from tests.support.factories import Factory
from tests.workflows.harness import Host, make_host


def another_key() -> str:
    return asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()


@pytest.fixture(scope="module")
def queue() -> str:
    return f"exports-trust-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
async def worker_host(
    dev_env: WorkflowEnvironment,
    database: pg.TestDatabase,
    queue: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> AsyncIterator[Host]:
    """One worker host: it runs the connection tests (it holds the login key)."""
    host = await make_host(
        f"trust-{uuid.uuid4().hex[:6]}",
        env_client=dev_env.client,
        database=database,
        shared_queue=queue,
        work_root=tmp_path_factory.mktemp("trust"),
    )
    yield host
    await host.close()


@pytest.fixture(scope="module")
async def api(
    dev_env, api_store, reconciler_store, queue: str, worker_host: Host
) -> AsyncIterator[httpx.AsyncClient]:
    """The API with a Temporal client on the worker's queue."""
    settings = Settings(task_queue=queue, temporal_ui_url="http://ui.test:8233")
    exports = Exports(api_store, reconciler_store, TemporalStopSignaller(dev_env.client))
    async with client_for(create_app(settings, exports=exports)) as c:
        yield c


async def on_partner(
    factory: Factory, keys: TenantKeys, partner: LocalSftpServer, **fields: Any
) -> uuid.UUID:
    """A destination of ``keys``' tenant on the in-process SFTP server, pinning its key unless told otherwise."""
    name = uuid.uuid4().hex
    (partner.root / name).mkdir()
    row = {
        "host": partner.host,
        "port": partner.port,
        "username": "partner",
        "host_key": partner.host_key_line,
        "credential_ref": str(partner.client_key_path),
        "remote_dir": f"/{name}",
    }
    row.update(fields)
    return await factory.destination(keys.id, **row)


async def switch_changes(factory, destination_id) -> int:
    rows = await factory.admin(
        "SELECT count(*) AS n FROM delivery_switch_changes WHERE destination_id = %(d)s",
        {"d": destination_id},
    )
    return rows[0]["n"]


# -- the connection test --------------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["operator", "reconciler", "admin"])
async def test_an_operator_a_reconciler_and_an_admin_test_a_connection_and_nothing_is_recorded(
    api, factory, acme, local_sftp_server, role
):
    destination_id = await on_partner(factory, acme, local_sftp_server)
    before = await recorded(factory, destination_id)
    switches = await switch_changes(factory, destination_id)

    r = await api.post(f"/destinations/{destination_id}/connection-tests", headers=getattr(acme, role))

    assert r.status_code == 200, r.text
    test = r.json()
    fingerprint = host_key_fingerprint(local_sftp_server.host_key_line)
    assert test["host_key"] == {
        "presented": " ".join(local_sftp_server.host_key_line.split()[:2]),
        "fingerprint": fingerprint,
        "pinned": True,
        "pinned_fingerprints": [fingerprint],
    }
    assert test["authentication"] == "accepted"
    assert test["remote_dir"]["listable"] is True and test["remote_dir"]["writable"] is True
    assert test["posix_rename"] is True and test["pinned_anything"] is False and test["error"] is None
    assert "(a temporary name was created and removed); posix-rename supported" in test["message"]
    assert await recorded(factory, destination_id) == before
    assert await switch_changes(factory, destination_id) == switches


async def test_a_viewer_may_not_test_a_connection(api, factory, acme, local_sftp_server):
    destination_id = await on_partner(factory, acme, local_sftp_server)

    r = await api.post(f"/destinations/{destination_id}/connection-tests", headers=acme.viewer)

    assert r.status_code == 403
    assert r.json()["detail"] == (
        "the viewer role may not test a destination's connection; that needs the admin or operator or "
        "reconciler role"
    )


async def test_a_server_whose_key_is_not_pinned_is_reported_and_nothing_is_pinned(
    api, factory, acme, local_sftp_server
):
    pinned = another_key()
    destination_id = await on_partner(factory, acme, local_sftp_server, host_key=pinned)
    before = await recorded(factory, destination_id)

    r = await api.post(f"/destinations/{destination_id}/connection-tests", headers=acme.admin)

    assert r.status_code == 200
    test = r.json()
    assert test["host_key"]["presented"] == " ".join(local_sftp_server.host_key_line.split()[:2])
    assert test["host_key"]["pinned"] is False
    assert test["host_key"]["pinned_fingerprints"] == [host_key_fingerprint(pinned)]
    assert (test["authentication"], test["error"]) == ("not_tried", "HostKeyNotPinned")
    assert "which is not pinned" in test["message"] and "pin-key" in test["message"]
    assert await recorded(factory, destination_id) == before  # still pins only what it pinned


async def test_another_tenants_destination_is_not_tested(api, factory, acme, globex, local_sftp_server):
    destination_id = await on_partner(factory, acme, local_sftp_server)

    r = await api.post(f"/destinations/{destination_id}/connection-tests", headers=globex.admin)

    assert r.status_code == 404


async def test_without_temporal_a_connection_test_is_unavailable(make_app, factory, acme, local_sftp_server):
    destination_id = await on_partner(factory, acme, local_sftp_server)
    async with client_for(make_app()) as no_temporal:
        r = await no_temporal.post(f"/destinations/{destination_id}/connection-tests", headers=acme.operator)

    assert r.status_code == 503 and "no Temporal client" in r.json()["detail"]


# -- pinning and removing keys -------------------------------------------------------------------------------


def key_changes(destination_id: uuid.UUID, fingerprint: str) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"/destinations/{destination_id}/host-keys", {"key": another_key(), "reason": "new key"}),
        (f"/destinations/{destination_id}/host-keys/removal", {"fingerprint": fingerprint, "reason": "old"}),
    ]


@pytest.mark.parametrize("role", ["operator", "reconciler", "viewer"])
@pytest.mark.parametrize("which", range(2))
async def test_only_an_admin_pins_or_removes_a_key_and_a_refusal_records_nothing(
    api, factory, acme, local_sftp_server, role, which
):
    destination_id = await on_partner(factory, acme, local_sftp_server)
    path, body = key_changes(destination_id, str(host_key_fingerprint(local_sftp_server.host_key_line)))[
        which
    ]
    before = await recorded(factory, destination_id)

    r = await api.post(path, json=body, headers={**getattr(acme, role), "If-Match": '"1"'})

    assert r.status_code == 403
    assert r.json()["detail"] == f"the {role} role may not manage destinations; that needs the admin role"
    assert await recorded(factory, destination_id) == before


async def test_an_admin_pins_a_key_beside_the_others_and_removes_the_old_one_each_a_version(
    api, factory, acme, local_sftp_server, database
):
    old = local_sftp_server.host_key_line
    destination_id = await on_partner(factory, acme, local_sftp_server)
    new = another_key()
    path = f"/destinations/{destination_id}/host-keys"

    missing = await api.post(path, json={"key": new, "reason": "rotation"}, headers=acme.admin)
    stale = await api.post(
        path, json={"key": new, "reason": "rotation"}, headers={**acme.admin, "If-Match": '"7"'}
    )
    secret = await api.post(
        path,
        json={"key": "ssh-ed25519 -----BEGIN OPENSSH PRIVATE KEY-----", "reason": "oops"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    asked = await api.post(
        path,
        json={"key": f"[sftp.partner.example]:22 {new} partner@2026", "reason": "rotation announced"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    # trusting a new key takes two admins (issue #26.3): asked, then another admin approves, and it is made
    pinned = await approve(api, asked, await another(database, acme, "admin"))

    assert (missing.status_code, stale.status_code, secret.status_code) == (428, 412, 422)
    assert "PRIVATE" not in secret.text
    assert asked.json()["approval"]["parameters"]["changes"]["host_keys"][-1] == new
    assert pinned.status_code == 200, pinned.text
    assert pinned.headers["ETag"] == '"2"' and pinned.json()["delivery_changed"] is True
    shown = pinned.json()["destination"]
    assert [k["key"] for k in shown["pinned_host_keys"]] == [old, new]  # the new one as "<type> <base64>"
    assert [k["fingerprint"] for k in shown["pinned_host_keys"]] == [
        host_key_fingerprint(old),
        host_key_fingerprint(new),
    ]
    again = await api.post(
        path, json={"key": new, "reason": "twice"}, headers={**acme.admin, "If-Match": '"2"'}
    )
    assert again.status_code == 200 and again.json()["changed_fields"] == []  # already pinned: nothing new

    removal = f"/destinations/{destination_id}/host-keys/removal"
    unknown = await api.post(
        removal,
        json={"fingerprint": "SHA256:nothingPinnedHasThis", "reason": "x"},
        headers={**acme.admin, "If-Match": '"2"'},
    )
    removed = await api.post(
        removal,
        json={"fingerprint": host_key_fingerprint(old), "reason": "the partner retired its old key"},
        headers={**acme.admin, "If-Match": '"2"'},
    )
    last = await api.post(
        removal,
        json={"fingerprint": host_key_fingerprint(new), "reason": "x"},
        headers={**acme.admin, "If-Match": '"3"'},
    )

    assert unknown.status_code == 404
    assert removed.status_code == 200 and removed.headers["ETag"] == '"3"'
    assert [k["key"] for k in removed.json()["destination"]["pinned_host_keys"]] == [new]
    assert last.status_code == 422 and "at least one pinned host key" in last.json()["detail"]
    versions = (await api.get(f"/destinations/{destination_id}", headers=acme.viewer)).json()["versions"]
    assert [(v["version"], v["reason"]) for v in versions] == [
        (3, "the partner retired its old key"),
        (2, "rotation announced"),
    ]


# -- the command line -----------------------------------------------------------------------------------------


async def starter_on(
    dev_env: WorkflowEnvironment, database, queue: str, *args: str, tenant, principal: str
) -> tuple[int, str, str]:
    env = {
        **os.environ,
        "EXPORTS_DATABASE_URL": database.app_url,
        "EXPORTS_PRINCIPAL": principal,
        "EXPORTS_TENANT": str(tenant),
        "EXPORTS_TEMPORAL_ADDRESS": dev_env.client.service_client.config.target_host,
        "EXPORTS_TASK_QUEUE": queue,
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(ROOT / "starter.py"),
        *args,
        env=env,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode or 0, out.decode(), err.decode()


@pytest.mark.slow  # starter.py processes, one per step: seconds
async def test_the_command_line_tests_pins_and_unpins_as_the_roles_allow(
    dev_env, database, factory, acme, local_sftp_server, queue, worker_host
):
    destination_id = await on_partner(factory, acme, local_sftp_server, host_key=another_key())
    new = local_sftp_server.host_key_line

    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "destination",
        "test",
        str(destination_id),
        tenant=acme.id,
        principal="sam.ops@acme",
    )
    assert code == 0, err
    assert "NOT pinned" in out and str(host_key_fingerprint(new)) in out
    assert "(a connection test pins nothing and records nothing)" in out

    code, out, _ = await starter_on(
        dev_env,
        database,
        queue,
        "destination",
        "pin-key",
        str(destination_id),
        "--key",
        new,
        "--version",
        "1",
        "--reason",
        "checked with the partner",
        tenant=acme.id,
        principal="sam.ops@acme",
    )
    assert code != 0 and "may not manage destinations" in out

    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "--json",
        "destination",
        "pin-key",
        str(destination_id),
        "--key",
        new,
        "--version",
        "1",
        "--reason",
        "checked with the partner",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 0, err
    asked = json.loads(out)["approval"]  # trusting a new key takes a second admin (issue #26.3)
    assert asked["state"] == "pending"
    await another(database, acme, "admin", name="ann.admin@acme")
    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "--json",
        "approvals",
        "approve",
        asked["id"],
        tenant=acme.id,
        principal="ann.admin@acme",
    )
    assert code == 0, err
    assert json.loads(out)["destination"]["version"] == 2

    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "--json",
        "destination",
        "test",
        str(destination_id),
        tenant=acme.id,
        principal="vic.view@acme",
    )
    assert code != 0 and "may not test a destination's connection" in out + err

    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "--json",
        "destination",
        "test",
        str(destination_id),
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 0, err
    tested = json.loads(out)
    assert tested["host_key"]["pinned"] is True and tested["authentication"] == "accepted"

    old = (await recorded(factory, destination_id))["row"][0]["host_keys"][0]
    code, out, err = await starter_on(
        dev_env,
        database,
        queue,
        "destination",
        "unpin-key",
        str(destination_id),
        "--fingerprint",
        str(host_key_fingerprint(old)),
        "--version",
        "2",
        "--reason",
        "never served",
        tenant=acme.id,
        principal="ada.admin@acme",
    )
    assert code == 0, err
    assert (await recorded(factory, destination_id))["row"][0]["host_keys"] == [" ".join(new.split()[:2])]


# -- the session limit ----------------------------------------------------------------------------------------


async def test_an_admin_sets_the_session_limit_and_nothing_is_rebuilt(api, factory, acme, local_sftp_server):
    destination_id = await on_partner(factory, acme, local_sftp_server)
    path = f"/destinations/{destination_id}"

    limited = await api.patch(
        path,
        json={"max_sessions": 2, "reason": "the partner allows 2"},
        headers={**acme.admin, "If-Match": '"1"'},
    )
    by_operator = await api.patch(
        path, json={"max_sessions": 5, "reason": "x"}, headers={**acme.operator, "If-Match": '"2"'}
    )
    cleared = await api.patch(
        path,
        json={"max_sessions": None, "reason": "no limit any more"},
        headers={**acme.admin, "If-Match": '"2"'},
    )

    assert limited.status_code == 200 and limited.json()["delivery_changed"] is False
    shown = limited.json()["destination"]
    assert (shown["max_sessions"], shown["sessions_in_use"], shown["delivery_version"]) == (2, 0, 1)
    assert by_operator.status_code == 403
    assert cleared.status_code == 200 and cleared.json()["destination"]["max_sessions"] is None
    created_with_keys = await api.post(
        "/destinations",
        json={
            "name": "p",
            "host": "h.example",
            "username": "u",
            "host_key": another_key(),
            "host_keys": [another_key()],
            "credential_ref": "/k",
            "remote_dir": "/in",
        },
        headers={**acme.admin, "Idempotency-Key": str(uuid.uuid4())},
    )
    assert created_with_keys.status_code == 422 and "pin more keys once it exists" in created_with_keys.text
