"""What the evidence of an export's delivery says, read for a person (issue 26 item 4): the attempt's events and
its row, in recorded order, each in a sentence: what cutoff 2 authorized, the baseline listing of the final
name, the upload and rename fences, what was sent, the rename, the read-back or acknowledgment, the verdict the
worker reached, recovery's listings and set-asides with their answers and verdicts, the listings a reconciler
asked for, and who reconciled or corrected it. Pure functions of recorded rows.

Only names, sizes, times, hashes, SFTP status codes and error type names are shown, as the evidence holds
them: never contact data or file contents (the evidence never carries any).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from db.rows import ListingRequestRow
from domain.models import AttemptEvent, EventKind, ExportJob, JobStatus
from rules.recovery import listing_request_observer, observed_by_recovery, observed_on_request
from service.views import short, stamp

# Who recorded a line of evidence.
Source = Literal["cutoff 2", "worker", "recovery", "reconciler", "row"]
# Which way a line points, for the page's colour and for people scanning it; never a decision.
Leaning = Literal["delivered", "not delivered", "unknown", "neutral"]


@dataclass(frozen=True)
class EvidenceLine:
    """One observation or record, read: its step, when and by whom, the sentence, and its facts."""

    step: str
    source: Source
    at: datetime | None
    by: str
    says: str
    facts: dict[str, str] = field(default_factory=dict)
    leaning: Leaning = "neutral"

    def as_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "source": self.source,
            "at": self.at.isoformat() if self.at else None,
            "by": self.by,
            "says": self.says,
            "facts": self.facts,
            "leaning": self.leaning,
        }


@dataclass(frozen=True)
class ListingAsked:
    """A reconciler's request for today's listing, and its answer once recovery gave one."""

    request: ListingRequestRow
    answer: EvidenceLine | None

    @property
    def waiting(self) -> bool:
        return self.answer is None and self.request.answerable

    def as_json(self) -> dict[str, Any]:
        return {
            "request_id": str(self.request.id),
            "requested_by": self.request.requested_by,
            "requested_at": self.request.requested_at.isoformat(),
            "waiting": self.waiting,
            "answer": self.answer.as_json() if self.answer else None,
        }


@dataclass(frozen=True)
class EvidenceReading:
    """An export's evidence, read: the key facts at a glance, then every line in recorded order."""

    attempt_id: UUID | None
    key_facts: list[tuple[str, str]]
    lines: list[EvidenceLine]
    listings: list[ListingAsked]

    def as_json(self) -> dict[str, Any]:
        return {
            "attempt_id": str(self.attempt_id) if self.attempt_id else None,
            "key_facts": [{"fact": k, "value": v} for k, v in self.key_facts],
            "evidence": [line.as_json() for line in self.lines],
            "listing_requests": [asked.as_json() for asked in self.listings],
        }


def when(at: datetime | None) -> str:
    """A recorded time with its date, as the evidence shows it: ``2026-11-14 14:02:07.412 UTC``."""
    return f"{stamp(at)} UTC" if at is not None else "an unrecorded time"


def _json(detail: str | None) -> dict[str, Any] | None:
    try:
        data = json.loads(detail or "")
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _bytes(n: Any) -> str:
    return f"{n:,} bytes" if isinstance(n, int) else "an unknown size"


def _hash(value: Any) -> str:
    return f"{value[:16]}…" if isinstance(value, str) and value else "not read"


def _expected_sha(job: ExportJob) -> str | None:
    return job.expected_file_sha256.hex() if job.expected_file_sha256 else None


def read_listing(item: dict[str, Any], job: ExportJob) -> tuple[str, dict[str, str], Leaning]:
    """What one listing of the final name showed, against the file cutoff 2 expected: a sentence, its facts
    and which way it points (a size alone points, never proves: the rules decide)."""
    if item.get("error"):
        return f"no answer ({item['error']})", {"answer": str(item["error"])}, "unknown"
    if not item.get("present"):
        return "the final name is absent", {"present": "no"}, "neutral"
    facts = {"present": "yes", "size": _bytes(item.get("size"))}
    parts = [f"present, {_bytes(item.get('size'))}"]
    leaning: Leaning = "neutral"
    if job.expected_file_bytes is not None and isinstance(item.get("size"), int):
        same = item["size"] == job.expected_file_bytes
        parts.append("the expected size" if same else f"not the expected {job.expected_file_bytes:,}")
        leaning = "delivered" if same else "neutral"
    sha = item.get("sha256")
    expected = _expected_sha(job)
    if isinstance(sha, str) and expected:
        matches = sha == expected
        parts.append("its SHA-256 matches the expected file" if matches else "its SHA-256 differs")
        facts["sha256"] = _hash(sha)
        leaning = "delivered" if matches and leaning == "delivered" else "neutral"
    if item.get("mtime") is not None:
        facts["mtime"] = str(item["mtime"])
    if item.get("ack") is not None:
        facts["acknowledgment"] = "present"
    return ", ".join(parts), facts, leaning


def _worker_line(item: dict[str, Any], e: AttemptEvent, job: ExportJob) -> EvidenceLine:
    """One observation the attempt's worker made (``partner.evidence``'s kinds)."""
    kind = str(item.get("observation", ""))
    by = e.observed_by or ""
    at = e.recorded_at
    match kind:
        case "connect":
            result = item.get("result")
            if result == "ok":
                return EvidenceLine(
                    "session",
                    "worker",
                    at,
                    by,
                    "an SFTP session opened",
                    {"host key": str(item.get("host_key", "")), "cipher": str(item.get("cipher", ""))},
                )
            why = item.get("code") or item.get("error")
            return EvidenceLine(
                "session", "worker", at, by, f"connect {result} ({why})", leaning="not delivered"
            )
        case "baseline":
            if not item.get("present"):
                says = "before the upload the final name was absent"
            else:
                says = f"before the upload the final name already held a file: {read_listing(item, job)[0]}"
            return EvidenceLine("baseline listing", "worker", at, by, says, read_listing(item, job)[1])
        case "final_name_occupied":
            return EvidenceLine(
                "baseline listing",
                "worker",
                at,
                by,
                f"the final name was occupied: identified by {item.get('identified_by')}, "
                f"overwrite {'agreed' if item.get('overwrite') else 'not agreed'}",
            )
        case "upload":
            if item.get("result") == "ok":
                remote = item.get("remote_size")
                says = (
                    f"uploaded {_bytes(item.get('bytes_sent'))} to the temporary name; the server holds "
                    f"{_bytes(remote)}"
                )
                return EvidenceLine(
                    "upload",
                    "worker",
                    at,
                    by,
                    says,
                    {
                        "temporary name": str(item.get("temp_name", "")),
                        "sent": _bytes(item.get("bytes_sent")),
                    },
                )
            return EvidenceLine(
                "upload",
                "worker",
                at,
                by,
                f"the server refused the upload (status {item.get('status')}) after "
                f"{_bytes(item.get('bytes_sent'))}",
                leaning="not delivered",
            )
        case "rename":
            form = item.get("form", "rename")
            match item.get("result"):
                case "ok":
                    return EvidenceLine(
                        "rename",
                        "worker",
                        at,
                        by,
                        f"the server confirmed the {form} to the final name",
                        leaning="delivered",
                    )
                case "refused":
                    return EvidenceLine(
                        "rename",
                        "worker",
                        at,
                        by,
                        f"the server refused the {form} (status {item.get('status')})",
                    )
                case "not_authorized":
                    return EvidenceLine(
                        "rename",
                        "worker",
                        at,
                        by,
                        "the rename fence was refused: no rename was sent",
                        leaning="not delivered",
                    )
                case _:
                    return EvidenceLine(
                        "rename",
                        "worker",
                        at,
                        by,
                        f"the {form} was sent and its answer never came ({item.get('error')})",
                        leaning="unknown",
                    )
        case "read_back":
            says, facts, leaning = read_listing(item, job)
            return EvidenceLine(
                "read-back", "worker", at, by, f"read back the final name: {says}", facts, leaning
            )
        case "ack":
            tied = bool(item.get("tied"))
            if not item.get("present"):
                return EvidenceLine("acknowledgment", "worker", at, by, "no acknowledgment from the partner")
            return EvidenceLine(
                "acknowledgment",
                "worker",
                at,
                by,
                "the partner's acknowledgment is tied to this upload"
                if tied
                else "the partner's acknowledgment is not tied to this upload",
                leaning="delivered" if tied else "neutral",
            )
        case "fresh_listing":
            says, facts, leaning = read_listing(item, job)
            return EvidenceLine(
                "fresh listing", "worker", at, by, f"listed the final name again: {says}", facts, leaning
            )
        case "set_aside":
            return EvidenceLine(
                "set-aside",
                "worker",
                at,
                by,
                f"moving the temporary file to {item.get('set_aside_name')}: {item.get('result')}"
                + (f" (status {item['status']})" if item.get("status") is not None else ""),
                leaning="not delivered" if item.get("result") == "ok" else "neutral",
            )
        case "interrupted":
            sent = "after the rename was sent" if item.get("rename_sent") else "before any rename was sent"
            status = f", status {item['status']}" if item.get("status") is not None else ""
            return EvidenceLine(
                "interrupted",
                "worker",
                at,
                by,
                f"cut during {item.get('phase')} ({item.get('error')}{status}), {sent}",
                leaning="unknown" if item.get("rename_sent") else "neutral",
            )
        case "outcome":
            code = f" {item['failure_code']}" if item.get("failure_code") else ""
            return EvidenceLine(
                "worker's verdict",
                "worker",
                at,
                by,
                f"{item.get('outcome')}{code}: {item.get('summary')}",
                {"rename sent": "yes" if item.get("rename_sent") else "no"},
                _leaning_of(str(item.get("outcome", ""))),
            )
        case "cleanup":
            what = item.get("name") or "the temporary files"
            return EvidenceLine("cleanup", "worker", at, by, f"cleanup of {what}: {item.get('result')}")
        case "upload_fence":
            return EvidenceLine(
                "upload fence",
                "worker",
                at,
                by,
                f"the upload fence answered {item.get('result')}: nothing was sent",
            )
    return EvidenceLine(kind or "observation", "worker", at, by, "recorded an observation")


def _leaning_of(outcome: str) -> Leaning:
    if outcome.startswith("Completed"):
        return "delivered"
    if outcome.startswith("Failed"):
        return "not delivered"
    if outcome.startswith("OutcomeUnknown"):
        return "unknown"
    return "neutral"


def _recovery_line(item: dict[str, Any], e: AttemptEvent, job: ExportJob) -> EvidenceLine:
    by = f"recovery run {_run(e.observed_by)}"
    kind = item.get("observation")
    if kind == "recovery_listing":
        says, facts, leaning = read_listing(item, job)
        return EvidenceLine(
            "recovery's listing",
            "recovery",
            e.recorded_at,
            by,
            f"listed the final name: {says}",
            facts,
            leaning,
        )
    if kind == "recovery_set_aside":
        if item.get("error"):
            return EvidenceLine(
                "recovery's set-aside",
                "recovery",
                e.recorded_at,
                by,
                f"could not move the temporary file aside ({item['error']})",
                leaning="unknown",
            )
        after = item.get("final_after") if isinstance(item.get("final_after"), dict) else {}
        final, _, _ = read_listing(after or {}, job)
        return EvidenceLine(
            "recovery's set-aside",
            "recovery",
            e.recorded_at,
            by,
            f"moving the temporary file to {item.get('set_aside_name')}: {item.get('result')}; "
            f"the final name then: {final}",
            leaning="not delivered" if item.get("moved") else "neutral",
        )
    if item.get("cleanup") == "skipped" or kind == "cleanup":
        what = item.get("name") or "the temporary files"
        result = item.get("result") or f"skipped ({item.get('why')})"
        return EvidenceLine("cleanup", "recovery", e.recorded_at, by, f"cleanup of {what}: {result}")
    return EvidenceLine(str(kind or "observation"), "recovery", e.recorded_at, by, "recorded an observation")


def _run(observed_by: str | None) -> str:
    """A recovery run's ID, short: ``recovery:<workflow>/<run>`` shows its run's first characters."""
    run = (observed_by or "").partition(":")[2]
    return short(run.rpartition("/")[2]) if "/" in run else run


def _requested_line(item: dict[str, Any], e: AttemptEvent, job: ExportJob, who: str) -> EvidenceLine:
    says, facts, leaning = read_listing(item, job)
    if str(item.get("error", "")).startswith("not asked"):
        says, leaning = str(item["error"]), "neutral"
    if item.get("rules_read"):
        facts["recovery's rules read it as"] = f"{item['rules_read']}: {item.get('rules_summary', '')}"
    return EvidenceLine(
        "today's listing",
        "reconciler",
        e.recorded_at,
        f"asked by {who}, listed by recovery run {_run(str(item.get('answered_by', '')))}",
        f"listed the final name: {says}",
        facts,
        leaning,
    )


def _event_line(e: AttemptEvent, job: ExportJob) -> EvidenceLine | None:
    """A transition or fence of the attempt, read."""
    by = e.worker_id or e.observed_by or ""
    match e.kind:
        case EventKind.DELIVERY_AUTHORIZED:
            data = _json(e.detail) or {}
            name = data.get("file") or job.expected_file_name
            facts = {
                "file": str(name),
                "bytes": _bytes(data.get("bytes", job.expected_file_bytes)),
                "sha256": str(data.get("sha256") or _expected_sha(job) or "-"),
            }
            if data.get("rows") is not None or job.expected_file_rows is not None:
                facts["rows"] = f"{data.get('rows', job.expected_file_rows):,}"
            if e.destination_version is not None:
                facts["destination version"] = str(e.destination_version)
            return EvidenceLine(
                "what was sent",
                "cutoff 2",
                e.recorded_at,
                by,
                f"cutoff 2 authorized {name}: {facts['bytes']}, SHA-256 {_hash(facts['sha256'])}",
                facts,
            )
        case EventKind.UPLOAD_FENCED:
            return EvidenceLine(
                "upload fence",
                "row",
                e.recorded_at,
                by,
                f"upload fenced at {when(e.recorded_at)}: nothing was sent to the partner before this",
            )
        case EventKind.RENAME_FENCED:
            return EvidenceLine(
                "rename fence",
                "row",
                e.recorded_at,
                by,
                f"rename fenced at {when(e.recorded_at)}: the rename request was sent only after this",
                leaning="unknown",
            )
        case EventKind.FINISHED:
            return EvidenceLine(
                "recorded",
                "worker",
                e.recorded_at,
                by,
                f"the worker recorded {e.detail}",
                leaning=_leaning_of(e.detail or ""),
            )
        case EventKind.RESOLVED_BY_RECOVERY:
            return EvidenceLine(
                "recovery's verdict",
                "recovery",
                e.recorded_at,
                f"recovery run {_run(e.observed_by)}",
                f"recovery recorded {e.detail}",
                leaning=_leaning_of(e.detail or ""),
            )
        case EventKind.RECONCILED:
            who = (
                f"recovery run {_run(e.observed_by)}"
                if observed_by_recovery(e.observed_by)
                else f"{e.observed_by}"
            )
            return EvidenceLine(
                "reconciled",
                "reconciler",
                e.recorded_at,
                who,
                f"reconciled: {e.detail}",
                leaning=_leaning_of(e.detail or ""),
            )
        case EventKind.CORRECTED:
            return EvidenceLine("corrected", "reconciler", e.recorded_at, by, f"corrected: {e.detail}")
    return None


def _delivery_events(events: Iterable[AttemptEvent], attempt_id: UUID) -> list[AttemptEvent]:
    return [e for e in events if e.attempt_id == attempt_id]


def read_evidence(
    job: ExportJob, events: list[AttemptEvent], requests: list[ListingRequestRow] | None = None
) -> EvidenceReading:
    """The evidence of ``job``'s current attempt, read in recorded order, with the listings reconcilers asked
    for (``requests``) matched to their answers (the events observed by ``reconciler-request:<id>``)."""
    requests = requests or []
    attempt_id = job.attempt_id
    if attempt_id is None:
        return EvidenceReading(None, [("delivery", "never authorized: nothing was sent")], [], [])
    asked_by = {listing_request_observer(r.id): r.requested_by for r in requests}
    lines: list[EvidenceLine] = []
    answers: dict[str, EvidenceLine] = {}
    for e in _delivery_events(events, attempt_id):
        if e.kind == EventKind.DELIVERY_EVIDENCE:
            item = _json(e.detail) or {}
            if observed_on_request(e.observed_by):
                line = _requested_line(item, e, job, asked_by.get(e.observed_by or "", "a reconciler"))
                answers[e.observed_by or ""] = line
            elif observed_by_recovery(e.observed_by):
                line = _recovery_line(item, e, job)
            else:
                line = _worker_line(item, e, job)
            lines.append(line)
        else:
            found = _event_line(e, job)
            if found is not None:
                lines.append(found)
    if job.upload_fenced_at is not None and job.rename_fenced_at is None and job.fence_expected:
        lines.append(
            EvidenceLine(
                "rename fence",
                "row",
                None,
                "",
                "no rename fence: the rename request was never sent, so this attempt never wrote the final name",
                leaning="not delivered",
            )
        )
    listings = [
        ListingAsked(r, answers.get(listing_request_observer(r.id)))
        for r in requests
        if r.attempt_id == attempt_id
    ]
    return EvidenceReading(attempt_id, key_facts(job, lines), lines, listings)


def key_facts(job: ExportJob, lines: list[EvidenceLine]) -> list[tuple[str, str]]:
    """The few facts a reconciler weighs first: what was sent, the baseline, the fences, the rename's answer,
    and the last listing of the final name (by whom and when)."""
    facts: list[tuple[str, str]] = []
    if job.expected_file_name:
        sha = _expected_sha(job)
        facts.append(
            (
                "what was sent",
                f"{job.expected_file_name}, {_bytes(job.expected_file_bytes)}, SHA-256 {sha or 'not recorded'}",
            )
        )
    baseline = next((line for line in lines if line.step == "baseline listing"), None)
    facts.append(("baseline", baseline.says if baseline else "no baseline listing recorded"))
    facts.append(
        (
            "upload fence",
            f"at {when(job.upload_fenced_at)}" if job.upload_fenced_at else "not written: nothing was sent",
        )
    )
    if job.rename_fenced_at:
        renamed = "written at " + when(job.rename_fenced_at) + ": the rename request may have been sent"
    elif job.upload_fenced_at and job.fence_expected:
        renamed = "not written: the rename request was never sent"
    else:
        renamed = "not written"
    facts.append(("rename fence", renamed))
    rename = [line for line in lines if line.step == "rename"]
    if rename:
        facts.append(("rename", rename[-1].says))
    listed = [
        line
        for line in lines
        if line.step in ("read-back", "fresh listing", "recovery's listing", "today's listing")
    ]
    if listed:
        last = listed[-1]
        facts.append(("last listing of the final name", f"{last.says} ({last.step}, {when(last.at)})"))
    if job.status == JobStatus.OUTCOME_UNKNOWN and job.outcome_unknown_at is not None:
        facts.append(("OutcomeUnknown since", when(job.outcome_unknown_at)))
    return facts
