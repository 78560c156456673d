"""The scavenger: local export files (contact data) of attempts that ended are removed, live ones kept.

A worker killed mid-build or mid-upload leaves its private build directory behind; the row, not the
directory's age, says whether any attempt may still use it.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from db.builder import PRIVATE_DIR_PREFIX, build_dirs, gpg_homes, gpg_root_for, remove_gpg_home
from domain.models import JobStatus
from encoding.openpgp import GpgHome, import_signing_key
from runtime.scavenger import scavenge_export_files


def leftover(work_dir: Path, attempt_id: uuid.UUID) -> Path:
    d = work_dir / f"{PRIVATE_DIR_PREFIX}{attempt_id}-x1y2"
    d.mkdir(parents=True)
    (d / "contacts-key.csv").write_text("email,first_name,last_name\n")
    return d


async def test_a_running_or_delivering_attempts_files_are_kept(factory, worker_store, tmp_path):
    running, running_attempt = await factory.in_status(JobStatus.RUNNING)
    delivering, delivering_attempt = await factory.in_status(JobStatus.DELIVERING)
    kept = [leftover(tmp_path, running_attempt), leftover(tmp_path, delivering_attempt)]

    cleaned = await scavenge_export_files(tmp_path, worker_store.live_attempts)

    assert cleaned == []
    assert all(d.exists() for d in kept)


async def test_an_ended_or_taken_over_attempts_files_are_removed(
    factory, worker_store, recovery_store, tmp_path
):
    _, stopped_attempt = await factory.in_status(JobStatus.STOPPED)
    _, unknown_attempt = await factory.in_status(JobStatus.OUTCOME_UNKNOWN)
    requeued, requeued_attempt = await factory.running()
    await factory.expire_lease(requeued.id)
    assert await recovery_store.requeue_expired_attempt(requeued.id, requeued_attempt, 3, "recovery-test")
    never_claimed = uuid.uuid4()
    gone = [
        leftover(tmp_path, a) for a in (stopped_attempt, unknown_attempt, requeued_attempt, never_claimed)
    ]

    cleaned = await scavenge_export_files(tmp_path, worker_store.live_attempts)

    assert set(cleaned) == {stopped_attempt, unknown_attempt, requeued_attempt, never_claimed}
    assert not any(d.exists() for d in gone)
    assert build_dirs(tmp_path) == {}


async def test_other_files_in_the_work_dir_are_never_touched(worker_store, tmp_path):
    (tmp_path / "build-not-a-uuid").mkdir()
    (tmp_path / "notes.txt").write_text("keep me")
    (tmp_path / "other").mkdir()

    assert await scavenge_export_files(tmp_path, worker_store.live_attempts) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["build-not-a-uuid", "notes.txt", "other"]


async def test_a_missing_work_dir_is_nothing_to_do(worker_store, tmp_path):
    assert await scavenge_export_files(tmp_path / "absent", worker_store.live_attempts) == []


def agents_of(home: Path) -> list[int]:
    """gpg-agent processes serving ``home``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if argv and argv[0].endswith(b"gpg-agent") and str(home).encode() in argv:
                found.append(int(entry.name))
    return found


async def test_a_killed_builds_gnupg_home_with_the_signing_key_goes_with_its_attempt(
    factory, worker_store, tmp_path, tenant_key
):
    # Issue #24 item 5: a worker killed while signing leaves the tenant's imported secret key in the file's
    # private GnuPG home, and its agent running; the row decides, as for the build directory.
    _, ended_attempt = await factory.in_status(JobStatus.STOPPED)
    _, live_attempt = await factory.in_status(JobStatus.RUNNING)
    homes = {}
    for attempt in (ended_attempt, live_attempt):
        home = GpgHome.create(gpg_root_for(tmp_path), str(attempt))
        import_signing_key(home, str(tenant_key.secret_key_file))
        homes[attempt] = home.path
    assert gpg_homes(tmp_path) == {ended_attempt: [homes[ended_attempt]], live_attempt: [homes[live_attempt]]}
    assert agents_of(homes[ended_attempt])

    cleaned = await scavenge_export_files(tmp_path, worker_store.live_attempts)

    assert cleaned == [ended_attempt]
    assert not homes[ended_attempt].exists() and agents_of(homes[ended_attempt]) == []
    assert (homes[live_attempt] / "private-keys-v1.d").exists()
    remove_gpg_home(homes[live_attempt])
