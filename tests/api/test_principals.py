"""Tokens authenticate principals (issue 9.1): a principal revoked by an administrator loses its API and
console access at once, and ``starter.py token`` refuses, with a clear line, to mint one for it."""

from __future__ import annotations

from db.admin import revoke_principal
from service.auth import mint_token
from tests.api.conftest import TenantKeys, client_for, sign_in
from tests.api.test_starter import starter


async def test_a_revoked_principal_loses_the_api_and_the_console_at_once(make_app, factory, database):
    tenant = await factory.tenant(principals=())
    destination = await factory.destination(tenant)
    token = await mint_token(database.admin_url, tenant_id=tenant, principal="kim.ops", role="operator")
    bearer = {"Authorization": f"Bearer {token}"}
    async with client_for(make_app()) as client:
        assert (await client.get("/exports", headers=bearer)).status_code == 200
        await sign_in(client, TenantKeys(tenant, destination, bearer, {}, "kim.ops", "", {}, {}))
        assert (await client.get("/console")).status_code == 200

        assert await revoke_principal(
            database.admin_url, tenant_id=tenant, name="kim.ops", revoked_by="lee.admin"
        )

        assert (await client.get("/exports", headers=bearer)).status_code == 401
        assert (await client.get("/switches", headers=bearer)).status_code == 401
        create = await client.post(
            "/exports",
            json={"destination_id": str(destination), "list_name": "main"},
            headers={**bearer, "Idempotency-Key": "k-1"},
        )
        assert create.status_code == 401
        assert (await client.get("/console")).status_code == 303  # the session's token no longer signs in


async def test_starter_token_refuses_a_revoked_principal_with_one_line(factory, database):
    tenant = await factory.tenant(principals=())
    await mint_token(database.admin_url, tenant_id=tenant, principal="kim.ops", role="operator")
    await revoke_principal(database.admin_url, tenant_id=tenant, name="kim.ops", revoked_by="lee.admin")

    code, out, err = await starter(
        database,
        "token",
        "--database-url",
        database.admin_url,
        "--tenant",
        str(tenant),
        "--principal",
        "kim.ops",
    )

    assert code == 1 and out == ""
    assert (
        err.strip()
        == "starter.py: no token minted: kim.ops is revoked or holds another role than operator in this tenant"
    )
