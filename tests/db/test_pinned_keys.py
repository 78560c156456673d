"""Several pinned host keys and the worker's pause of a destination it must not trust (issue #24.4, migration
0029), on the real server.

- A destination pins one to ten keys (``host_keys``); ``host_key`` is always the first. Pinning or removing one
  is an admin's recorded edit, a change of delivery terms; the last key is never removed, none twice.
- The session limit (``max_sessions``) is no delivery term: changing it rebuilds nothing; its slots follow it.
- A version recorded before host_keys existed trusted its one host_key, whatever the row pins now.
- The worker pauses one destination, with "host key changed: ..." or "authentication refused: ..." only,
  through the function 0029 grants it: an enabled switch only (an earlier pause keeps its reason), never a
  resume, and not a destination an admin changed since the version the worker checked (both orders).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest

from db.errors import ConstraintRefused
from domain.audit import TWO_PERSON_DESTINATION_FIELDS
from domain.controls import SwitchScope
from tests.db.race import still_waiting

OLD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOldOldOldOldOldOldOldOldOldOldOldOldOldO"
NEW = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAINewNewNewNewNewNewNewNewNewNewNewNewNewN"
THIRD = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIThirdThirdThirdThirdThirdThirdThirdThird"


async def destination_row(factory, destination_id: uuid.UUID) -> dict[str, Any]:
    [row] = await factory.admin("SELECT * FROM destinations WHERE id = %(d)s", {"d": destination_id})
    return row


async def edit(factory, api_store, tenant_id, destination_id, **changes: Any):
    if set(changes) & TWO_PERSON_DESTINATION_FIELDS:
        # whom deliveries trust: another admin asked, ada.admin approved (0032, 0036)
        await factory.approve(
            tenant_id, "change_destination", destination_id, {"changes": changes}, approved_by="ada.admin"
        )
    return await api_store.edit_destination_if_version(
        tenant_id=tenant_id,
        destination_id=destination_id,
        expected_version=None,
        changes=changes,
        changed_by="ada.admin",
        changed_role="admin",
        reason="the partner rotates its key",
    )


async def test_a_destination_pins_its_one_key_and_host_key_is_always_the_first_of_its_keys(
    factory, api_store
):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)
    assert (await destination_row(factory, destination_id))["host_keys"] == [OLD]

    pinned = await edit(factory, api_store, tenant_id, destination_id, host_keys=[OLD, NEW])
    rotated = await edit(factory, api_store, tenant_id, destination_id, host_keys=[NEW])
    row = await destination_row(factory, destination_id)

    assert pinned.matched and pinned.delivery_changed and pinned.changed_fields == ["host_keys"]
    assert rotated.matched and rotated.delivery_changed
    assert sorted(rotated.changed_fields) == ["host_key", "host_keys"]
    assert (row["host_keys"], row["host_key"], row["version"], row["delivery_version"]) == ([NEW], NEW, 3, 3)

    alone = await edit(
        factory, api_store, tenant_id, destination_id, host_key=THIRD
    )  # an edit of host_key pins it alone
    assert alone.matched
    assert (await destination_row(factory, destination_id))["host_keys"] == [THIRD]


@pytest.mark.parametrize("keys", [[], [OLD, OLD], [OLD] * 11], ids=["none", "twice", "eleven"])
async def test_no_destination_pins_no_key_a_key_twice_or_more_than_ten(factory, api_store, keys):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)

    with pytest.raises(ConstraintRefused) as refused:
        await edit(factory, api_store, tenant_id, destination_id, host_keys=keys)

    assert refused.value.constraint == "ck_destinations_host_keys"
    row = await destination_row(factory, destination_id)
    assert (row["host_keys"], row["version"]) == ([OLD], 1)


async def test_the_session_limit_is_no_delivery_term_and_its_slots_follow_it(factory, api_store):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)

    limited = await edit(factory, api_store, tenant_id, destination_id, max_sessions=2)
    raised = await edit(factory, api_store, tenant_id, destination_id, max_sessions=3)

    assert limited.matched and not limited.delivery_changed and limited.changed_fields == ["max_sessions"]
    assert raised.matched and not raised.delivery_changed
    assert (await destination_row(factory, destination_id))["delivery_version"] == 1  # nothing to rebuild
    slots = await factory.admin(
        "SELECT slot FROM destination_session_slots WHERE destination_id = %(d)s ORDER BY slot",
        {"d": destination_id},
    )
    assert [s["slot"] for s in slots] == [1, 2, 3]
    with pytest.raises(ConstraintRefused) as refused:
        await edit(factory, api_store, tenant_id, destination_id, max_sessions=0)
    assert refused.value.constraint == "ck_destinations_max_sessions"


async def test_a_version_recorded_before_pinned_key_sets_trusts_its_one_host_key(
    factory, api_store, worker_store
):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)
    await edit(
        factory, api_store, tenant_id, destination_id, host_key=NEW
    )  # version 2 (its record keeps version 1's row)
    # As a record written before 0029 reads: no host_keys in it.
    await factory.admin(
        "UPDATE destination_versions SET before = before - 'host_keys' WHERE destination_id = %(d)s",
        {"d": destination_id},
    )

    then = await worker_store.load_destination(tenant_id, destination_id, 1)
    now = await worker_store.load_destination(tenant_id, destination_id, 2)

    assert (then.host_key, then.pinned_keys) == (OLD, (OLD,))
    assert now.pinned_keys == (NEW,)


# -- the worker's pause ---------------------------------------------------------------------------------------


REASON = "host key changed: presented SHA256:AAAAbbbbCCCCddddEEEEffffGGGGhhhhIIIIjjjjKKK"


async def switch(factory, destination_id) -> dict[str, Any]:
    """The destination's switch as the gate reads it: on and held by no pause (0032); its latest reason."""
    [row] = await factory.admin(
        "SELECT enabled AND NOT coalesce(held_until > clock_timestamp(), false) AS enabled, reason, changed_by"
        " FROM delivery_switches WHERE scope = 'destination' AND destination_id = %(d)s",
        {"d": destination_id},
    )
    return row


async def history(factory, destination_id) -> list[dict[str, Any]]:
    return await factory.admin(
        "SELECT enabled, was_enabled, reason, changed_by FROM delivery_switch_changes"
        " WHERE destination_id = %(d)s ORDER BY id",
        {"d": destination_id},
    )


async def test_the_worker_pauses_a_destination_it_must_not_trust_once_with_its_reason(factory, worker_store):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)

    paused = await worker_store.pause_destination_for_partner(
        tenant_id, destination_id, 1, REASON, "worker w1"
    )
    again = await worker_store.pause_destination_for_partner(
        tenant_id, destination_id, 1, "authentication refused: partner at h:22", "worker w2"
    )

    assert (paused.was_enabled, paused.paused, paused.destination_changed) == (True, True, False)
    assert (again.was_enabled, again.paused) == (False, False)  # the first reason stands
    assert await switch(factory, destination_id) == {
        "enabled": False,
        "reason": REASON,
        "changed_by": "worker w1",
    }
    assert (await history(factory, destination_id))[-1] == {
        "enabled": False,
        "was_enabled": True,
        "reason": REASON,
        "changed_by": "worker w1",
    }
    # an owned pause of kind host_key: releasing it takes two people (0032's guard, 0036)
    assert await factory.admin(
        "SELECT kind, owner, reason, released_at FROM delivery_pauses WHERE destination_id = %(d)s",
        {"d": destination_id},
    ) == [{"kind": "host_key", "owner": "worker w1", "reason": REASON, "released_at": None}]


async def test_the_worker_pauses_only_for_a_partner_it_must_not_trust(factory, worker_store):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)

    with pytest.raises(ConstraintRefused) as refused:
        await worker_store.pause_destination_for_partner(
            tenant_id, destination_id, 1, "I felt like it", "worker w1"
        )

    assert refused.value.constraint == "ck_partner_pause_reason"
    assert (await switch(factory, destination_id))["enabled"] is True


async def test_no_pause_for_a_destination_an_admin_changed_since_the_version_checked(
    factory, api_store, worker_store
):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)
    await edit(
        factory, api_store, tenant_id, destination_id, host_keys=[OLD, NEW]
    )  # the admin pinned the new key

    answer = await worker_store.pause_destination_for_partner(
        tenant_id, destination_id, 1, REASON, "worker w1"
    )

    assert (answer.paused, answer.destination_changed) == (False, True)
    assert (await switch(factory, destination_id))["enabled"] is True


def edit_params(tenant_id, destination_id, **changes: Any) -> dict[str, Any]:
    import json

    return {
        "tenant_id": tenant_id,
        "destination_id": destination_id,
        "expected_version": None,
        "changes": json.dumps(changes),
        "changed_by": "ada.admin",
        "changed_role": "admin",
        "reason": "pinned the partner's new key",
    }


async def test_a_pause_waits_for_an_admins_pin_in_progress_then_pauses_nothing(factory, kit):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)
    await factory.approve(
        tenant_id,
        "change_destination",
        destination_id,
        {"changes": {"host_keys": [OLD, NEW]}},
        approved_by="ada.admin",
    )
    pinning = await kit.hold("exports_api")
    await pinning.run(
        "edit_destination_if_version", edit_params(tenant_id, destination_id, host_keys=[OLD, NEW])
    )

    worker = await kit.solo("exports_worker")
    pausing = asyncio.create_task(
        worker.store.pause_destination_for_partner(tenant_id, destination_id, 1, REASON, "worker w1")
    )
    await kit.wait_until_blocked_by(worker.pid, pinning.pid)
    await still_waiting(pausing)
    await pinning.commit()

    answer = await pausing
    assert (answer.paused, answer.destination_changed) == (False, True)
    assert (await switch(factory, destination_id))["enabled"] is True


async def test_an_admins_pin_waits_for_a_pause_in_progress_and_the_pause_stands(factory, kit, api_store):
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id, host_key=OLD)
    pausing = await kit.hold("exports_worker")
    [paused] = await pausing.run(
        "pause_destination_for_partner",
        {
            "tenant_id": tenant_id,
            "destination_id": destination_id,
            "version": 1,
            "reason": REASON,
            "changed_by": "worker w1",
        },
    )
    assert paused["paused"] is True

    admin = await kit.solo("exports_api")
    pinning = asyncio.create_task(edit(factory, admin.store, tenant_id, destination_id, host_keys=[OLD, NEW]))
    await kit.wait_until_blocked_by(admin.pid, pausing.pid)
    await still_waiting(pinning)
    await pausing.commit()

    assert (await pinning).matched
    assert (await switch(factory, destination_id))["enabled"] is False  # resumed by an operator, not by a pin


async def test_the_workers_pause_is_released_only_with_a_second_persons_approval(
    factory, worker_store, api_store
):
    # 0036: the worker's pause is an owned pause of kind host_key, so one operator's resume leaves it paused;
    # 0029's turned the switch off, and any resume turned it on again.
    tenant_id = await factory.tenant()
    destination_id = await factory.destination(tenant_id)
    assert (
        await worker_store.pause_destination_for_partner(tenant_id, destination_id, 1, REASON, "worker w1")
    ).paused
    [pause] = await factory.admin(
        "SELECT id FROM delivery_pauses WHERE destination_id = %(d)s AND released_at IS NULL",
        {"d": destination_id},
    )
    resume = {
        "scope": SwitchScope.DESTINATION,
        "tenant_id": tenant_id,
        "destination_id": destination_id,
        "enabled": True,
        "reason": "pinned the new key",
        "changed_by": "sam.ops",
    }

    alone = await api_store.set_delivery_switch(**resume)
    named = await api_store.set_delivery_switch(**resume, pause_ids=[pause["id"]])
    assert (alone.enabled, alone.pause_ids, named.enabled, named.pause_ids) == (False, [], False, [])
    assert (await switch(factory, destination_id))["enabled"] is False

    await factory.approve(tenant_id, "resume_pause", pause["id"], {}, approved_by="sam.ops")
    released = await api_store.set_delivery_switch(**resume, pause_ids=[pause["id"]])
    assert (released.enabled, released.pause_ids) == (True, [pause["id"]])
    assert (await switch(factory, destination_id))["enabled"] is True
