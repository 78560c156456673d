"""The soak's auditor catches what it claims to catch: each invariant is broken on purpose, on crafted rows,
watch events and client answers, and the auditor names it. The partner watch attributes real renames on a
real directory (OpenSSH's link+unlink and posix_rename's rename) to the attempt in the temporary name."""

from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chaos.audit import AuditInput, Auditor
from chaos.client import HttpRecord
from chaos.driver import Answer, CancelRecord, ExportRecord
from chaos.stack import Exit
from domain.file_format import FileFormat
from encoding import open_file_writer
from testbed.gpg import GpgIdentity
from testbed.partner_watch import PartnerWatch, WatchEvent, final_writes
from tests.support.eventually import eventually_sync

NOW = datetime.now(UTC)


def make_auditor(tmp_path: Path, **overrides: Any) -> Auditor:
    fields: dict[str, Any] = {
        "admin_url": "postgresql://unused",
        "tenant_id": str(uuid.uuid4()),
        "upload_dir": tmp_path,
        "watch_events": [],
        "watch_problems": [],
        "records": [],
        "journal": [],
        "faults": [],
        "exits": [],
        "lists": {"tiny": 2},
        "marker": "zqmarker",
        "temporal_address": "127.0.0.1:1",
        "logs": {},
    }
    fields.update(overrides)
    auditor = Auditor(AuditInput(**fields))
    auditor.db_now = NOW.timestamp()
    auditor.list_sizes = {"tiny": 2}
    return auditor


def add_job(auditor: Auditor, status: str, *, key: str | None = None, **columns: Any) -> dict[str, Any]:
    job_id, attempt = uuid.uuid4(), uuid.uuid4()
    job: dict[str, Any] = {
        "id": job_id,
        "status": status,
        "attempt_id": attempt,
        "delivery_key": key or str(uuid.uuid4()),
        "failure_reason": None,
        "overwrite_agreement_ref": None,
        "stop_request_id": None,
        "cancellation_request_id": None,
        "claimed_by": "w1.1",
        "lease_expires_at": None,
        "woken_at": NOW,
        "sweep_count": 0,
        "expected_file_name": None,
        "expected_file_bytes": None,
        "expected_file_sha256": None,
        "list_name": "tiny",
        "version": 1,
        "replaces_job_id": None,
        "workflow_id": None,
        "fence_expected": False,
        "upload_fenced_at": None,
        "rename_fenced_at": None,
        "transient_releases": 0,
        **columns,
    }
    auditor.jobs[str(job_id)] = job
    return job


def add_event(auditor: Auditor, job: dict[str, Any], kind: str, detail: str = "", **columns: Any) -> None:
    events = auditor.events[str(job["id"])]
    event = {
        "id": len(events) + 1,
        "job_id": job["id"],
        "attempt_id": columns.pop("attempt_id", job["attempt_id"]),
        "kind": kind,
        "version": 1,
        "worker_id": "w1.1",
        "observed_by": None,
        "detail": detail,
        "recorded_at": NOW,
        **columns,
    }
    events.append(event)
    auditor.attempt_job[str(event["attempt_id"])] = str(job["id"])


def linked(name: str, attempt: uuid.UUID, inode: int, t: float = 1.0) -> list[WatchEvent]:
    """What OpenSSH's rename (link + unlink) of the attempt's temporary file looks like to the watch."""
    temp = f".partial-{attempt}-{name}"
    return [
        WatchEvent(t, "create", temp, inode=inode),
        WatchEvent(t + 0.1, "create", name, inode=inode),
        WatchEvent(t + 0.1, "delete", temp),
    ]


def invariants(auditor: Auditor) -> list[str]:
    return [v.invariant for v in auditor.result.violations]


def test_a_file_under_a_canceled_or_stopped_jobs_name_is_a_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    stopped = add_job(auditor, "Stopped")
    add_event(auditor, stopped, "Claimed")
    name = f"contacts-{stopped['delivery_key']}.csv"
    auditor.writes = final_writes(linked(name, stopped["attempt_id"], inode=11))
    auditor._partner_files()
    assert "file_under_stopped_name" in invariants(auditor)
    assert "write_without_cutoff_2" in invariants(auditor)  # it never passed cutoff 2 either


def test_a_final_name_written_twice_needs_an_overwrite_agreement(tmp_path: Path) -> None:
    for agreement, expected in ((None, True), ("agreement-7", False)):
        auditor = make_auditor(tmp_path)
        original = add_job(auditor, "OutcomeUnknown")
        replacement = add_job(
            auditor, "Completed", key=original["delivery_key"], overwrite_agreement_ref=agreement
        )
        for job in (original, replacement):
            add_event(auditor, job, "DeliveryAuthorized")
        name = f"contacts-{original['delivery_key']}.csv"
        auditor.writes = final_writes(
            linked(name, original["attempt_id"], inode=21)
            + linked(name, replacement["attempt_id"], inode=22, t=5)
        )
        auditor._partner_files()
        assert ("final_name_written_twice" in invariants(auditor)) is expected


def test_a_completed_job_needs_its_file_with_the_recorded_size_hash_and_rows(tmp_path: Path) -> None:
    good = b"email,first_name,last_name\na@x,A,B\nc@x,C,D\n"
    auditor = make_auditor(tmp_path)
    ok = add_job(
        auditor,
        "Completed",
        expected_file_bytes=len(good),
        expected_file_sha256=hashlib.sha256(good).digest(),
    )
    (tmp_path / f"contacts-{ok['delivery_key']}.csv").write_bytes(good)
    bad = add_job(
        auditor,
        "Completed",
        expected_file_bytes=len(good),
        expected_file_sha256=hashlib.sha256(good).digest(),
    )
    (tmp_path / f"contacts-{bad['delivery_key']}.csv").write_bytes(good[:-5])
    missing = add_job(auditor, "Completed", expected_file_bytes=1, expected_file_sha256=b"x")
    auditor._completed_files()
    flagged = {v.job_id for v in auditor.result.violations if v.invariant == "completed_file_mismatch"}
    assert flagged == {str(bad["id"]), str(missing["id"])}


def test_a_job_left_running_on_an_expired_lease_is_stranded_and_a_queued_one_without_a_wake_up_too(
    tmp_path: Path,
) -> None:
    auditor = make_auditor(tmp_path)
    expired = add_job(auditor, "Running", lease_expires_at=NOW - timedelta(seconds=30))
    add_event(auditor, expired, "Claimed")
    queued = add_job(auditor, "Queued", attempt_id=None)
    woken = add_job(auditor, "Queued", attempt_id=None)
    auditor.unpublished[str(woken["id"])] = 1
    auditor._stranded()
    by_job = {v.job_id: v.invariant for v in auditor.result.violations}
    assert by_job == {
        str(expired["id"]): "stranded",
        str(queued["id"]): "stranded",
        str(woken["id"]): "not_settled",
    }


def test_a_cancellation_answer_that_disagrees_with_what_was_recorded_is_a_violation(tmp_path: Path) -> None:
    job_id = str(uuid.uuid4())
    told_too_late = CancelRecord(str(uuid.uuid4()), job_id, "delivering", "Delivering")
    told_too_late.answers.append(Answer(1.0, 409, outcome="TooLate", replayed=False))
    wrong_status = CancelRecord(str(uuid.uuid4()), job_id, "building", "Running")
    wrong_status.answers.append(Answer(1.0, 200, outcome="StopRequested", replayed=False))
    auditor = make_auditor(tmp_path)
    auditor._check_cancel_answers(told_too_late, None)  # told TooLate, nothing recorded
    auditor._check_cancel_answers(wrong_status, {"outcome": "StopRequested"})
    details = [v.detail for v in auditor.result.violations]
    assert len(details) == 2
    assert "nothing is recorded" in details[0] and "HTTP 200 with outcome StopRequested" in details[1]


def test_a_stop_request_whose_attempt_still_passed_cutoff_2_is_a_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    request_id = uuid.uuid4()
    job = add_job(auditor, "Completed", stop_request_id=request_id)
    add_event(auditor, job, "DeliveryAuthorized", recorded_at=NOW + timedelta(seconds=1))
    auditor._check_request(
        {
            "id": request_id,
            "job_id": job["id"],
            "outcome": "StopRequested",
            "found_status": "Running",
            "found_attempt_id": job["attempt_id"],
            "found_delivery_authorized_at": None,
            "recorded_at": NOW,
            "requested_by": "chaos.client",
        }
    )
    assert invariants(auditor) == ["cancellation_inconsistent"]
    assert "passed cutoff 2 after the stop request" in auditor.result.violations[0].detail


def test_only_a_503_with_retry_after_is_an_allowed_5xx(tmp_path: Path) -> None:
    journal = [
        HttpRecord(1.0, "GET", "GET /exports", None, 500, None, 0.1),
        HttpRecord(
            2.0,
            "POST",
            "POST /exports/{id}/cancellations",
            "j",
            503,
            None,
            0.1,
            outcome="Busy",
            retry_after="2",
        ),
        HttpRecord(3.0, "GET", "GET /exports", None, None, "ConnectError", 0.1),  # no answer: not a 5xx
        HttpRecord(4.0, "GET", "GET /exports", None, 503, None, 0.1),  # 503 without Retry-After
    ]
    auditor = make_auditor(tmp_path, journal=journal)
    auditor._http_5xx()
    assert [v.evidence["status"] for v in auditor.result.violations] == [500, 503]


def test_a_duplicate_create_that_made_a_second_export_is_an_idempotency_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    job = add_job(auditor, "Completed")
    record = ExportRecord(index=0, role="original", list_name="tiny", job_id=str(job["id"]))
    record.creates.append(Answer(1.0, 201, job_id=str(job["id"])))
    record.duplicates.append(("sequential", Answer(2.0, 201, job_id=str(uuid.uuid4()))))
    auditor.inp.records.append(record)
    auditor._idempotency_and_edits()
    assert invariants(auditor) == ["idempotency"]


def test_the_watch_attributes_link_and_rename_publications_to_the_attempt_in_the_temporary_name(
    tmp_path: Path,
) -> None:
    watch = PartnerWatch(tmp_path).start()
    try:
        linked_attempt, renamed_attempt = uuid.uuid4(), uuid.uuid4()
        for attempt, final, how in (
            (linked_attempt, "contacts-a.csv", "link"),
            (renamed_attempt, "contacts-b.csv", "rename"),
        ):
            temp = tmp_path / f".partial-{attempt}-{final}"
            temp.write_bytes(b"email\n")
            if how == "link":  # OpenSSH's SSH_FXP_RENAME: link, then unlink
                os.link(temp, tmp_path / final)
                temp.unlink()
            else:  # posix-rename@openssh.com
                os.rename(temp, tmp_path / final)
        eventually_sync(lambda: len(final_writes(watch.snapshot())) >= 2, "both final writes seen", within=5)
    finally:
        watch.stop()
    writes = {w.name: (w.how, w.attempt_id) for w in final_writes(watch.snapshot())}
    assert writes == {
        "contacts-a.csv": ("link", linked_attempt),
        "contacts-b.csv": ("rename", renamed_attempt),
    }
    assert not watch.errors and not watch.overflowed


def test_a_claim_at_an_old_version_breaks_the_terms_but_an_edit_after_a_requeue_and_a_cancel_does_not(
    tmp_path: Path,
) -> None:
    from chaos.driver import EditRecord

    auditor = make_auditor(tmp_path)
    completed = add_job(auditor, "Completed", version=2, list_name="small")
    add_event(auditor, completed, "Claimed", version=1)  # claimed at the version before the edit
    canceled = add_job(auditor, "Canceled", version=2, list_name="small")
    add_event(auditor, canceled, "Claimed", version=1)  # requeued, then edited, then canceled: fine
    lost = add_job(
        auditor, "Canceled", version=2, list_name="small"
    )  # the edit committed, its answer was lost
    for job in (completed, canceled, lost):
        record = ExportRecord(index=0, role="original", list_name="tiny", job_id=str(job["id"]))
        status = None if job is lost else 200
        record.edits.append(EditRecord("ok", '"1"', "small", "Queued", status, 2 if status else None))
        auditor.inp.records.append(record)
    auditor._idempotency_and_edits()
    assert [(v.invariant, v.job_id) for v in auditor.result.violations] == [
        ("terms_edit", str(completed["id"]))
    ]


def test_an_upload_that_never_started_is_explained_by_its_workflow_history() -> None:
    from chaos.histories import delivery_fate as _delivery_fate

    drained = [
        "wf started",
        "10:00:01.000 deliver scheduled on exports-w1.1",
        "10:01:01.000 deliver timed out (type 2): x",
    ]
    late = [
        "wf started",
        "10:00:01.000 deliver started (attempt 1) by w1.1@own",
        "10:00:09.000 deliver completed finish=NotOwner",
    ]
    assert _delivery_fate(drained).startswith("deliver never started: ScheduleToStart timeout")
    assert _delivery_fate(late).startswith("deliver started after recovery had taken over")
    assert _delivery_fate(None) == "its workflow's history was not found"


def test_a_stop_on_a_job_still_running_at_the_audit_is_left_to_the_settle_checks(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    request_id = uuid.uuid4()
    running = add_job(auditor, "Running", stop_request_id=request_id)
    failed = add_job(auditor, "Failed", stop_request_id=request_id, failure_reason="BuildFailed")
    for job in (running, failed):
        auditor._check_request(
            {
                "id": request_id,
                "job_id": job["id"],
                "outcome": "StopRequested",
                "found_status": "Running",
                "found_attempt_id": job["attempt_id"],
                "found_delivery_authorized_at": None,
                "recorded_at": NOW,
                "requested_by": "chaos.client",
            }
        )
    assert [v.job_id for v in auditor.result.violations] == [
        str(failed["id"])
    ]  # a stopped job must end Stopped


def test_a_failed_row_needs_a_transition_that_ends_in_failed(tmp_path: Path) -> None:
    """Recovery proving NotDelivered from the fences ends the row Failed by a ResolvedByRecovery event;
    a Failed row whose attempt's last transition is its claim contradicts its events."""
    auditor = make_auditor(tmp_path)
    proven = add_job(auditor, "Failed", failure_reason="NotDelivered")
    add_event(auditor, proven, "Claimed")
    add_event(auditor, proven, "DeliveryAuthorized")
    add_event(
        auditor, proven, "ResolvedByRecovery", "Failed NotDelivered: the attempt never fenced its upload"
    )
    contradicted = add_job(auditor, "Failed", failure_reason="NotDelivered")
    add_event(auditor, contradicted, "Claimed")
    auditor._events_agree_with_status()
    assert [(v.invariant, v.job_id) for v in auditor.result.violations] == [
        ("events_contradict_status", str(contradicted["id"]))
    ]


def test_a_worker_that_exits_by_itself_is_a_violation(tmp_path: Path) -> None:
    crash = Exit(
        time.time(),
        "w1",
        1,
        "1.0 Traceback (most recent call last):\n2.0 ValueError: Address already in use\n",
    )
    auditor = make_auditor(tmp_path, exits=[crash])
    auditor._process_exits()
    assert invariants(auditor) == ["process_exited"]
    assert (
        "w1 exited by itself with code 1: ValueError: Address already in use"
        in auditor.result.violations[0].detail
    )
    quiet = make_auditor(tmp_path)
    quiet._process_exits()
    assert invariants(quiet) == []


def test_a_job_given_back_past_the_bound_or_disagreeing_with_its_row_is_a_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path, max_transient_releases=2)
    within = add_job(auditor, "Completed", transient_releases=2)
    for detail in (
        "transient: build interrupted: CopyFailed",
        "drain: worker draining",
        "workflow: workflow gone",
    ):
        add_event(auditor, within, "Released", detail)
    past = add_job(auditor, "Queued", transient_releases=3)
    for _ in range(3):
        add_event(auditor, past, "Released", "transient: build interrupted: CopyFailed")
    hidden = add_job(auditor, "Queued", transient_releases=0)
    add_event(auditor, hidden, "Released", "transient: cutoff 2 not decided: NotPermitted")
    gave_up_early = add_job(auditor, "Failed", failure_reason="AttemptsExhausted", transient_releases=1)
    add_event(auditor, gave_up_early, "Released", "transient: build interrupted: CopyFailed")
    add_event(
        auditor, gave_up_early, "AttemptsExhausted", "given back 1 time after failures (the limit); ..."
    )

    auditor._give_backs()

    assert sorted((v.invariant, v.job_id) for v in auditor.result.violations) == sorted(
        [
            ("released_past_the_bound", str(past["id"])),
            ("give_backs_disagree_with_the_row", str(hidden["id"])),
            ("give_back_bound_not_applied", str(gave_up_early["id"])),
        ]
    )
    assert auditor.result.counts["releases_by_cause"] == {"transient": 6, "drain": 1, "workflow": 1}


def test_an_outcome_unknown_whose_fences_prove_it_never_renamed_is_a_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    sent = add_job(auditor, "OutcomeUnknown", fence_expected=True, upload_fenced_at=NOW, rename_fenced_at=NOW)
    never = add_job(
        auditor, "OutcomeUnknown", fence_expected=True, upload_fenced_at=NOW, rename_fenced_at=None
    )
    for job in (sent, never):
        add_event(auditor, job, "Claimed")
        add_event(auditor, job, "DeliveryAuthorized")
        add_event(auditor, job, "Finished", "OutcomeUnknown: the rename's answer was lost")

    auditor._outcomes()

    assert [(v.invariant, v.job_id) for v in auditor.result.violations] == [
        ("outcome_unknown_proved_not_delivered", str(never["id"]))
    ]
    sent_by_job = {
        d["job_id"]: d["rename_request_sent"] for d in auditor.result.findings["outcome_unknown_jobs"]
    }
    assert sent_by_job == {str(sent["id"]): True, str(never["id"]): False}


def test_a_completed_encrypted_file_is_decrypted_and_checked_against_the_recorded_plaintext(
    tmp_path: Path, partner_key: GpgIdentity, tenant_key: GpgIdentity
) -> None:
    # Issue #24 item 5: the partner's gpg --decrypt (and gunzip) must give the CSV whose hash the attempt
    # recorded, signed by the tenant's key; a file encrypted from other rows is a violation.
    good = b"email,first_name,last_name\na@x,A,B\nc@x,C,D\n"
    destination = str(uuid.uuid4())
    auditor = make_auditor(
        tmp_path,
        file_suffixes={destination: ".csv.gz.pgp"},
        partner_key=partner_key,
        signer_fingerprint=tenant_key.fingerprint,
    )
    fmt = FileFormat(
        compression="gzip",
        recipient_keys=(partner_key.public_key,),
        signing_key_ref=str(tenant_key.secret_key_file),
    )
    flagged_expected = set()
    for plaintext, recorded in ((good, good), (good[:-5], good)):
        job = add_job(auditor, "Completed", destination_id=destination)
        path = tmp_path / f"contacts-{job['delivery_key']}.csv.gz.pgp"
        writer = open_file_writer(path, fmt)
        writer.write(plaintext)
        encoded = writer.finish()
        job.update(expected_file_bytes=encoded.size, expected_file_sha256=encoded.sha256)
        evidence = {
            "plaintext": {"bytes": len(recorded), "sha256": hashlib.sha256(recorded).hexdigest()},
            "recipients": list(encoded.recipients),
        }
        add_event(auditor, job, "DeliveryAuthorized", json.dumps(evidence))
        if plaintext != recorded:
            flagged_expected.add(str(job["id"]))

    auditor._completed_files()

    flagged = {v.job_id for v in auditor.result.violations if v.invariant == "completed_file_mismatch"}
    assert flagged == flagged_expected
    assert auditor.result.counts["encrypted_files_decrypted"] == 2
    assert {name for job in auditor.jobs.values() for name in [auditor._final_name(job)]} == {
        p.name for p in tmp_path.glob("*.pgp")
    }


def firing(
    recurring_id: uuid.UUID, nominal: datetime, job: dict[str, Any] | None, reason: str | None = None
) -> dict:
    return {
        "recurring_export_id": recurring_id,
        "nominal_time": nominal,
        "outcome": "created" if job else "skipped",
        "reason": reason,
        "job_id": job["id"] if job else None,
    }


def test_a_recurring_firing_that_created_two_exports_is_a_violation(tmp_path: Path) -> None:
    from domain.recurring import firing_key

    auditor = make_auditor(tmp_path)
    recurring_id = uuid.uuid4()
    one, two = add_job(auditor, "Completed"), add_job(auditor, "Completed")
    auditor.firings = [
        firing(recurring_id, NOW, one),
        firing(recurring_id, NOW + timedelta(minutes=1), None, "overlap"),
    ]
    auditor.recurring_keys[firing_key(recurring_id, NOW)] = [str(one["id"])]
    auditor._recurring_firings()
    assert invariants(auditor) == []
    assert auditor.result.counts["recurring_firings"] == {"created": 1, "skipped (overlap)": 1}

    auditor.recurring_keys[firing_key(recurring_id, NOW)].append(str(two["id"]))  # a second export, same key
    auditor._recurring_firings()
    assert "recurring_firing" in invariants(auditor)

    auditor.result.violations.clear()
    auditor.recurring_keys.clear()
    auditor.recurring_keys[firing_key(recurring_id, NOW)] = [str(one["id"])]
    auditor.recurring_keys[firing_key(recurring_id, NOW + timedelta(hours=1))] = [str(two["id"])]  # no firing
    auditor._recurring_firings()
    assert invariants(auditor) == ["recurring_firing"]


def test_a_completed_export_whose_manifest_is_missing_or_wrong_is_a_violation(tmp_path: Path) -> None:
    # Issue #24.6: a destination that asks for a manifest has it beside every Completed file, saying that file.
    auditor = make_auditor(tmp_path)
    data = b"-----BEGIN PGP MESSAGE-----\nnot really\n"
    digest = hashlib.sha256(data).digest()
    jobs = {}
    for case in ("in_place", "missing", "wrong"):
        name = f"contacts-{case}.csv.gz.pgp"
        (tmp_path / name).write_bytes(data)
        job = add_job(
            auditor,
            "Completed",
            expected_file_name=name,
            expected_file_bytes=len(data),
            expected_file_sha256=digest,
            expected_file_rows=2,
            expected_manifest="sha256",
        )
        jobs[case] = str(job["id"])
        if case != "missing":
            hexed = digest.hex() if case == "in_place" else "0" * 64
            (tmp_path / f"{name}.sha256").write_text(f"{hexed}  {name}\n")

    auditor._manifests()

    flagged = {v.job_id for v in auditor.result.violations if v.invariant == "completed_without_manifest"}
    assert flagged == {jobs["missing"], jobs["wrong"]}
    assert auditor.result.counts["manifests_checked"] == 3


def test_a_manifest_name_written_twice_is_a_violation(tmp_path: Path) -> None:
    auditor = make_auditor(tmp_path)
    job = add_job(auditor, "OutcomeUnknown", expected_file_name="contacts-k.csv", expected_manifest="json")
    events = [
        WatchEvent(1.0, "create", "contacts-k.csv.manifest.json", inode=7, size=10),
        WatchEvent(2.0, "create", "contacts-k.csv.manifest.json", inode=8, size=10),
    ]
    auditor.manifest_writes = final_writes(events)

    auditor._manifests()

    assert [(v.invariant, v.job_id) for v in auditor.result.violations] == [
        ("manifest_written_twice", str(job["id"]))
    ]


def test_a_retried_export_delivered_more_than_once_by_the_partners_witness_is_a_violation(
    tmp_path: Path,
) -> None:
    auditor = make_auditor(tmp_path)
    # Delivered once, by the attempt after the retry: fine.
    once = add_job(auditor, "Completed")
    first = uuid.uuid4()
    add_event(auditor, once, "Claimed", attempt_id=first)
    add_event(auditor, once, "RetryScheduled", "connect_refused: no SFTP session opened", attempt_id=first)
    add_event(auditor, once, "Claimed")
    # Written by the attempt that was retried, and again by the next one.
    twice = add_job(auditor, "Completed")
    retried = uuid.uuid4()
    add_event(auditor, twice, "Claimed", attempt_id=retried)
    add_event(auditor, twice, "RenameFenced", attempt_id=retried)
    add_event(auditor, twice, "RetryScheduled", "session_cut: upload interrupted", attempt_id=retried)
    add_event(auditor, twice, "Claimed")
    auditor.writes = final_writes(
        linked(f"contacts-{once['delivery_key']}.csv", once["attempt_id"], inode=31)
        + linked(f"contacts-{twice['delivery_key']}.csv", retried, inode=32, t=2)
        + linked(f"contacts-{twice['delivery_key']}.csv", twice["attempt_id"], inode=33, t=4)
    )

    auditor._retries()

    assert sorted((v.invariant, v.job_id) for v in auditor.result.violations) == sorted(
        [
            ("retried_export_delivered_twice", str(twice["id"])),
            ("retried_attempt_wrote_the_final_name", str(twice["id"])),
            ("retried_after_its_rename_fence", str(twice["id"])),
        ]
    )
    assert auditor.result.counts["retries_by_cause"] == {"connect_refused": 1, "session_cut": 1}
    assert auditor.result.counts["exports_delivered_after_a_retry"] == 2
