"""The cleanup agreement's removal (``partner.delivery.remove_temporary_files``) against both real servers:
an attempt's temporary and set-aside files go, the final name and other attempts' files never do, and what
was found is evidence of names, codes and statuses only."""

from __future__ import annotations

import asyncio
import json
import uuid

from db.embedded import free_port
from domain.evidence import set_aside_name_for, temp_name_for
from partner.delivery import remove_temporary_files
from testbed.sftp import SftpTarget
from tests.partner.helpers import contact_bytes


async def test_only_the_attempts_temporary_and_set_aside_files_are_removed(sftp_target: SftpTarget):
    attempt, other = uuid.uuid4(), uuid.uuid4()
    final = f"contacts-{uuid.uuid4()}.csv"
    published, partial, others = contact_bytes(), contact_bytes(), contact_bytes()
    sftp_target.put(final, published)  # never touched, whoever wrote it
    sftp_target.put(temp_name_for(attempt, final), partial)
    sftp_target.put(temp_name_for(other, final), others)  # another attempt's file
    destination = sftp_target.destination(temporary_files="remove")

    records = await asyncio.to_thread(remove_temporary_files, destination, attempt, final)

    assert [(r["observation"], r["name"], r["result"]) for r in records] == [
        ("cleanup", temp_name_for(attempt, final), "removed"),
        ("cleanup", set_aside_name_for(attempt, final), "absent"),
    ]
    assert records[1]["status"] == 2  # SSH_FX_NO_SUCH_FILE
    assert all(r["attempt_id"] == str(attempt) for r in records)
    assert partial[:32].hex() not in json.dumps(records)
    assert sftp_target.files() == {final: published, temp_name_for(other, final): others}


async def test_a_set_aside_file_is_removed_and_a_second_removal_finds_nothing(sftp_target: SftpTarget):
    attempt = uuid.uuid4()
    final = f"contacts-{uuid.uuid4()}.csv"
    sftp_target.put(set_aside_name_for(attempt, final), contact_bytes())
    destination = sftp_target.destination(temporary_files="remove")

    first = await asyncio.to_thread(remove_temporary_files, destination, attempt, final)
    again = await asyncio.to_thread(remove_temporary_files, destination, attempt, final)

    assert [r["result"] for r in first] == ["absent", "removed"]
    assert [r["result"] for r in again] == ["absent", "absent"]
    assert sftp_target.files() == {}


async def test_a_partner_that_cannot_be_asked_is_one_not_asked_record_and_no_exception(
    sftp_target: SftpTarget,
):
    attempt = uuid.uuid4()
    final = f"contacts-{uuid.uuid4()}.csv"
    sftp_target.put(temp_name_for(attempt, final), contact_bytes())
    unreachable = sftp_target.destination(temporary_files="remove", port=free_port())

    records = await asyncio.to_thread(remove_temporary_files, unreachable, attempt, final)

    assert [(r["observation"], r["result"], r["error"]) for r in records] == [
        ("cleanup", "not_asked", "ConnectRefused")
    ]
    assert records[0]["code"] == "Unreachable"
    assert temp_name_for(attempt, final) in sftp_target.files()  # the file stays, as without the agreement
