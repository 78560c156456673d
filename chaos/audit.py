"""The auditor: after the faults stop and recovery settles, check the invariants from the database, from
the watch on the partner's directory (which the project never touches), from what the HTTP clients were
told, from the API's log and from every workflow history.

Each violation names its invariant, the job and what was seen. Facts that are not violations but tell
the lead where work goes to a person (OutcomeUnknown and why, Failed and why, processes that exited by
themselves) are gathered as findings.
"""

from __future__ import annotations

import asyncio
import gzip
import hashlib
import json
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row
from temporalio.client import Client

from chaos.apilog import group_tracebacks, parse_api_log
from chaos.client import HttpRecord
from chaos.driver import CancelRecord, ExportRecord
from chaos.faults import FaultRecord
from chaos.histories import connect, delivery_fate, job_of_workflow, open_export_jobs, recovery_run, timeline
from chaos.stack import PRINCIPAL, Exit
from chaos.textual import normalize
from chaos.webhooks import audit_webhooks
from domain.manifest import JSON_SUFFIX, SHA256_SUFFIX, manifest_names
from domain.recurring import firing_key
from testbed.gpg import GpgIdentity
from testbed.partner_watch import FinalWrite, WatchEvent, final_writes, parse_temp_name, temp_files_created
from testbed.webhook_receiver import Received

DRAIN_MARGIN_SECONDS = 10.0
SLOW_SETTLE_SECONDS = 20.0  # a job still moving this long after the faults stopped is listed
STALL_FACTOR = 5  # recovery not starting for this many intervals is reported as a stall
MAX_LISTED = 10
NEVER_DELIVERS = frozenset({"Canceled", "Stopped", "Rejected"})
OPEN = frozenset({"Queued", "Running", "Delivering"})
STATUS_FOR_OUTCOME = {
    "CanceledWhileQueued": 200,
    "AlreadyCanceled": 200,
    "StopRequested": 202,
    "StopAlreadyRequested": 202,
    "AlreadyEnded": 409,
    "TooLate": 409,
    "RequestIdReused": 400,
    "NotFound": 404,
    "Busy": 503,
}
RECORDED = frozenset(
    {
        "CanceledWhileQueued",
        "AlreadyCanceled",
        "StopRequested",
        "StopAlreadyRequested",
        "AlreadyEnded",
        "TooLate",
    }
)
TRANSITIONS = frozenset(
    {"Claimed", "DeliveryAuthorized", "Stopped", "Failed", "Finished", "RequeuedByRecovery",
     "StoppedByRecovery", "AttemptsExhausted", "ResolvedByRecovery", "Reconciled", "Corrected"}
)  # fmt: skip


@dataclass
class Violation:
    invariant: str
    job_id: str | None
    detail: str
    evidence: dict[str, Any] = field(default_factory=dict)


# How late the partner's watch may see a rename it reports (its thread reads inotify in batches).
WATCH_LATENCY_SECONDS = 1.0


@dataclass
class AuditInput:
    admin_url: str
    tenant_id: str
    upload_dir: Path
    watch_events: list[WatchEvent]
    watch_problems: list[str]
    records: list[ExportRecord]
    journal: list[HttpRecord]
    faults: list[FaultRecord]
    exits: list[Exit]
    lists: dict[str, int]
    marker: str
    temporal_address: str
    logs: dict[str, Path]
    load_ended_at: float = 0.0
    shutdown_grace_seconds: float = 15.0
    recovery_every_seconds: float = 30.0
    webhooks: list[Received] = field(default_factory=list)  # what the soak's receiver got
    webhook_endpoint_id: str | None = None  # the receiver's endpoint (None: no webhook check)
    max_transient_releases: int = 6  # the workers' EXPORTS_MAX_TRANSIENT_RELEASES
    # What each destination receives, by ID, when it is not the plain ".csv" (issue #24 item 5), and the
    # partner's key to decrypt it with (its own GNUPGHOME) and the tenant key's fingerprint it must be signed by.
    file_suffixes: dict[str, str] = field(default_factory=dict)
    partner_key: GpgIdentity | None = None
    signer_fingerprint: str | None = None
    # The main destination's session limit (issue #25.3; 0: none) and the most sessions the partner held at
    # once, from its own witness (the proxy in front of its sshd, which counts what the server holds open).
    session_limit: int = 0
    partner_sessions_high_water: int | None = None
    partner_sessions_timeline: list[tuple[float, int]] = field(default_factory=list)  # (unix time, open)


@dataclass
class AuditResult:
    violations: list[Violation] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)
    findings: dict[str, Any] = field(default_factory=dict)


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _hex(value: bytes | None) -> str | None:
    return value.hex() if value is not None else None


class Auditor:
    """One audit over one settled run; ``run`` returns the violations, counts and findings."""

    def __init__(self, inp: AuditInput) -> None:
        self.inp = inp
        self.result = AuditResult()
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.requests: list[dict[str, Any]] = []
        self.unpublished: dict[str, int] = {}
        self.list_sizes: dict[str, int] = {}
        self.writes: list[FinalWrite] = []
        self.temps: dict[str, list[WatchEvent]] = {}
        self.manifest_writes: list[FinalWrite] = []
        self.attempt_job: dict[str, str] = {}
        self.open_workflow_jobs: set[str] = set()
        self.db_now: float = 0.0
        self.webhook_deliveries: list[dict[str, Any]] = []
        self.firings: list[dict[str, Any]] = []  # recurring exports' firings
        self.recurring_keys: dict[str, list[str]] = defaultdict(
            list
        )  # a firing's key -> the exports under it

    def violate(self, invariant: str, job_id: str | None, detail: str, **evidence: Any) -> None:
        self.result.violations.append(Violation(invariant, job_id, detail, evidence))

    async def run(self) -> AuditResult:
        await asyncio.to_thread(self._load_database)
        # A manifest (issue #24.6) is published beside its file under a name of its own, by its own temporary
        # name (recovery's under an ID of its own): checked by _manifests, never counted as a data file's write.
        every = final_writes(self.inp.watch_events)
        self.writes = [w for w in every if not _is_manifest_name(w.name)]
        self.manifest_writes = [w for w in every if _is_manifest_name(w.name)]
        self.temps = {
            str(k): [e for e in v if not _is_manifest_name(e.name)]
            for k, v in temp_files_created(self.inp.watch_events).items()
            if any(not _is_manifest_name(e.name) for e in v)
        }
        client = await connect(self.inp.temporal_address)
        if client is not None:
            self.open_workflow_jobs = await open_export_jobs(client)
        steps = [
            self._watch_health,
            self._partner_files,
            self._renames_inside_windows,
            self._completed_files,
            self._manifests,
            self._stranded,
            self._cancellations,
            self._client_answers,
            self._idempotency_and_edits,
            self._recurring_firings,
            self._events_agree_with_status,
            self._http_5xx,
            self._outcomes,
            self._give_backs,
            self._retries,
            self._slow_to_settle,
            self._process_exits,
            self._drains,
            self._logs_free_of_contacts,
            self._webhooks,
            self._partner_sessions,
        ]
        for step in steps:
            try:
                step()
            except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others
                self.violate("audit_incomplete", None, f"{step.__name__} failed: {type(exc).__name__}: {exc}")
        try:
            await self._histories(client)
        except Exception as exc:  # noqa: BLE001 - reported as a gap in the audit
            self.violate("audit_incomplete", None, f"_histories failed: {type(exc).__name__}: {exc}")
        self.result.counts["violations_by_invariant"] = dict(
            Counter(v.invariant for v in self.result.violations).most_common()
        )
        return self.result

    # -- loading --------------------------------------------------------------------------------------

    def _load_database(self) -> None:
        with psycopg.connect(self.inp.admin_url, row_factory=dict_row) as conn:
            tenant = {"t": self.inp.tenant_id}
            for row in conn.execute("SELECT * FROM export_jobs WHERE tenant_id = %(t)s", tenant):
                self.jobs[str(row["id"])] = row
            for row in conn.execute(
                "SELECT e.* FROM export_attempt_events e JOIN export_jobs j ON j.id = e.job_id"
                " WHERE j.tenant_id = %(t)s ORDER BY e.id",
                tenant,
            ):
                self.events[str(row["job_id"])].append(row)
                self.attempt_job[str(row["attempt_id"])] = str(row["job_id"])
            self.requests = list(
                conn.execute(
                    "SELECT * FROM cancellation_requests WHERE tenant_id = %(t)s ORDER BY recorded_at", tenant
                )
            )
            for row in conn.execute(
                "SELECT job_id, count(*) AS n FROM outbox WHERE published_at IS NULL GROUP BY job_id"
            ):
                self.unpublished[str(row["job_id"])] = row["n"]
            for row in conn.execute(
                "SELECT list_name, count(*) AS n FROM contacts WHERE tenant_id = %(t)s GROUP BY list_name",
                tenant,
            ):
                self.list_sizes[row["list_name"]] = row["n"]
            # Sessions holding a transaction open (a stuck dispatcher keeps its outbox rows locked, and the
            # other dispatchers skip them): who, for how long, doing what.
            self.result.findings["open_transactions"] = [
                {k: (str(v) if k == "query" else v) for k, v in row.items()}
                for row in conn.execute(
                    "SELECT application_name, state, wait_event_type, wait_event,"
                    " round(extract(epoch FROM clock_timestamp() - xact_start)::numeric, 1)::float AS xact_seconds,"
                    " left(query, 160) AS query"
                    " FROM pg_stat_activity WHERE xact_start IS NOT NULL AND pid <> pg_backend_pid()"
                    " AND clock_timestamp() - xact_start > interval '5 seconds' ORDER BY xact_start"
                )
            ]
            self.result.findings["outbox_unpublished"] = {
                "rows": sum(self.unpublished.values()),
                "jobs": len(self.unpublished),
                "oldest_seconds": (
                    conn.execute(
                        "SELECT round(extract(epoch FROM clock_timestamp() - min(created_at))::numeric, 1)::float AS s"
                        " FROM outbox WHERE published_at IS NULL"
                    ).fetchone()
                    or {}
                ).get("s"),
            }
            if self.inp.webhook_endpoint_id is not None:
                self.webhook_deliveries = list(
                    conn.execute(
                        "SELECT id, state, attempts, last_error FROM webhook_deliveries WHERE endpoint_id = %(e)s",
                        {"e": self.inp.webhook_endpoint_id},
                    )
                )
            self.firings = list(
                conn.execute(
                    "SELECT * FROM recurring_export_firings WHERE tenant_id = %(t)s ORDER BY id", tenant
                )
            )
            for row in conn.execute(
                "SELECT key, job_id FROM idempotency_keys WHERE tenant_id = %(t)s AND key LIKE 'recurring-export-%%'",
                tenant,
            ):
                self.recurring_keys[row["key"]].append(str(row["job_id"]))
            now = conn.execute("SELECT clock_timestamp() AS now").fetchone()
            assert now is not None
            self.db_now = now["now"].timestamp()
        statuses = Counter(
            j["status"] + (f" ({j['failure_reason']})" if j["failure_reason"] else "")
            for j in self.jobs.values()
        )
        self.result.counts["final_states"] = dict(sorted(statuses.items(), key=lambda kv: -kv[1]))
        self.result.counts["jobs"] = len(self.jobs)
        self.result.counts["replacements"] = sum(1 for j in self.jobs.values() if j["replaces_job_id"])
        self.result.counts["attempts"] = sum(
            1 for evs in self.events.values() for e in evs if e["kind"] == "Claimed"
        )
        self.result.counts["cancellation_requests_recorded"] = len(self.requests)

    def _job_events(
        self, job_id: str, attempt_id: Any = None, kind: str | None = None
    ) -> list[dict[str, Any]]:
        return [
            e
            for e in self.events.get(job_id, [])
            if (attempt_id is None or str(e["attempt_id"]) == str(attempt_id))
            and (kind is None or e["kind"] == kind)
        ]

    def _attempt_evidence(self, job_id: str, attempt_id: Any) -> list[dict[str, Any]]:
        found = []
        for event in self._job_events(job_id, attempt_id, "DeliveryEvidence"):
            if (event["observed_by"] or "").startswith("recovery:"):
                continue
            try:
                detail = json.loads(event["detail"] or "{}")
            except ValueError:
                continue
            if isinstance(detail, dict):
                found.append(detail)
        return found

    # -- the partner's directory ------------------------------------------------------------------------

    def _watch_health(self) -> None:
        for problem in self.inp.watch_problems:
            self.violate("watch_incomplete", None, f"the partner watch is not complete: {problem}")

    def _jobs_by_final_name(self) -> dict[str, list[dict[str, Any]]]:
        by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for job in self.jobs.values():
            by_name[self._final_name(job)].append(job)
        return by_name

    def _final_name(self, job: dict[str, Any]) -> str:
        """The name the job's destination receives: its delivery key and its format's suffix."""
        suffix = self.inp.file_suffixes.get(str(job.get("destination_id")), ".csv")
        return f"contacts-{job['delivery_key']}{suffix}"

    def _partner_files(self) -> None:
        """No final name under a job that never delivers; none written twice without an agreement; every
        write by an attempt that passed cutoff 2 and was not recorded as not delivered."""
        by_name = self._jobs_by_final_name()
        writes_by_name: dict[str, list[FinalWrite]] = defaultdict(list)
        for write in self.writes:
            writes_by_name[write.name].append(write)
        self.result.counts["final_name_writes"] = len(self.writes)
        self.result.counts["final_name_writes_by"] = dict(Counter(w.how for w in self.writes))
        self.result.counts["final_name_writes_unattributed"] = sum(
            1 for w in self.writes if w.attempt_id is None
        )
        self.result.counts["temporary_files_created"] = sum(len(v) for v in self.temps.values())
        for name, writes in writes_by_name.items():
            jobs = by_name.get(name, [])
            if not jobs:
                self.violate("unknown_file", None, f"{name} appeared on the partner and names no job")
                continue
            for number, write in enumerate(writes):
                writer_job_id = self.attempt_job.get(str(write.attempt_id)) if write.attempt_id else None
                writer = self.jobs.get(writer_job_id) if writer_job_id else None
                evidence = {"name": name, "how": write.how, "attempt": str(write.attempt_id), "t": write.t}
                if writer is None:
                    # Not attributable: every job of this delivery key must be one that could deliver.
                    if all(j["status"] in NEVER_DELIVERS for j in jobs):
                        self.violate(
                            "file_under_stopped_name",
                            str(jobs[0]["id"]),
                            f"{name} was written ({write.how}) but every job with that name is "
                            + "/".join(sorted({j["status"] for j in jobs})),
                            **evidence,
                        )
                    continue
                wid = str(writer["id"])
                if writer["status"] in NEVER_DELIVERS:
                    self.violate(
                        "file_under_stopped_name",
                        wid,
                        f"attempt {write.attempt_id} wrote {name} ({write.how}) and the job is {writer['status']}",
                        **evidence,
                        events=self._summary(wid),
                    )
                if not self._job_events(wid, write.attempt_id, "DeliveryAuthorized"):
                    self.violate(
                        "write_without_cutoff_2",
                        wid,
                        f"attempt {write.attempt_id} wrote {name} without a DeliveryAuthorized event",
                        **evidence,
                        events=self._summary(wid),
                    )
                if str(writer["attempt_id"]) != str(write.attempt_id):
                    self.violate(
                        "write_by_superseded_attempt",
                        wid,
                        f"attempt {write.attempt_id} wrote {name}, but the job's attempt is {writer['attempt_id']}",
                        **evidence,
                        events=self._summary(wid),
                    )
                elif writer["status"] == "Failed":
                    self.violate(
                        "failed_but_written",
                        wid,
                        f"recorded Failed ({writer['failure_reason']}) but its attempt wrote {name}",
                        **evidence,
                        events=self._summary(wid),
                    )
                if number > 0 and writer["overwrite_agreement_ref"] is None:
                    self.violate(
                        "final_name_written_twice",
                        wid,
                        f"{name} written {len(writes)} times; write {number + 1} by attempt "
                        f"{write.attempt_id} without an overwrite agreement",
                        writes=[(w.t, str(w.attempt_id), w.how) for w in writes],
                    )

    def _renames_inside_windows(self) -> None:
        """No rename happened outside its destination's delivery window (issue #25.2): each final name the
        partner's watch saw appear, at the time the watch saw it (or up to ``WATCH_LATENCY_SECONDS`` before, the
        watch's own delay), fell inside the window of the destination of the job it names, read by the same
        SQL rule the claim, cutoff 2 and the rename fence use (the soak's windows do not change during a run)."""
        by_name = self._jobs_by_final_name()
        checked: list[tuple[FinalWrite, str]] = []
        for write in self.writes:
            job_id = self.attempt_job.get(str(write.attempt_id)) if write.attempt_id else None
            job = self.jobs.get(job_id) if job_id else None
            jobs = [job] if job is not None else by_name.get(write.name, [])
            if jobs:
                checked.append((write, str(jobs[0]["destination_id"])))
        self.result.counts["renames_checked_against_windows"] = len(checked)
        if not checked:
            return
        with psycopg.connect(self.inp.admin_url, row_factory=dict_row) as conn:
            rows = conn.execute(
                "SELECT w.i, delivery_window_open(d, to_timestamp(w.t))"
                " OR delivery_window_open(d, to_timestamp(w.t - %(slack)s)) AS inside,"
                " d.intake_hours IS NOT NULL OR cardinality(d.blackout_dates) > 0 AS windowed"
                " FROM unnest(%(d)s::uuid[], %(t)s::float8[]) WITH ORDINALITY AS w(destination_id, t, i)"
                " JOIN destinations d ON d.id = w.destination_id ORDER BY w.i",
                {
                    "d": [destination for _, destination in checked],
                    "t": [write.t for write, _ in checked],
                    "slack": WATCH_LATENCY_SECONDS,
                },
            ).fetchall()
        self.result.counts["renames_under_a_window"] = sum(1 for r in rows if r["windowed"])
        for r in rows:
            if not r["inside"]:
                write, _ = checked[r["i"] - 1]
                self.violate(
                    "rename_outside_window",
                    self.attempt_job.get(str(write.attempt_id)) if write.attempt_id else None,
                    f"{write.name} appeared at {datetime.fromtimestamp(write.t, UTC).isoformat()}, outside its"
                    " destination's delivery window",
                )

    def _completed_files(self) -> None:
        """Every Completed job's file is on the partner, by its attempt, with the recorded size, hash and
        the rows of the list its final terms name."""
        on_disk = {p.name: p for p in self.inp.upload_dir.iterdir() if p.is_file()}
        self.result.counts["partner_files"] = len(on_disk)
        left = [parsed for n in on_disk if (parsed := parse_temp_name(n)) is not None]
        self.result.counts["partner_temporary_files_left"] = len(left)
        # Left by an attempt whose job is recorded Failed for it: under a 'remove' agreement the worker or
        # recovery removes these, unless the removal itself met a fault (kept as cleanup evidence).
        failed_attempts = {
            str(j["attempt_id"]) for j in self.jobs.values() if j["status"] == "Failed" and j["attempt_id"]
        }
        self.result.counts["partner_temporary_files_left_by_failed"] = sum(
            1 for attempt, _ in left if str(attempt) in failed_attempts
        )
        last_writer: dict[str, FinalWrite] = {}
        for write in self.writes:
            last_writer[write.name] = write
        for job_id, job in self.jobs.items():
            if job["status"] != "Completed":
                continue
            name = job["expected_file_name"] or self._final_name(job)
            path = on_disk.get(name)
            if path is None:
                self.violate("completed_file_mismatch", job_id, f"Completed but {name} is not on the partner",
                             events=self._summary(job_id))  # fmt: skip
                continue
            data = path.read_bytes()
            problems = []
            if len(data) != job["expected_file_bytes"]:
                problems.append(f"size {len(data)} != recorded {job['expected_file_bytes']}")
            if hashlib.sha256(data).digest() != bytes(job["expected_file_sha256"] or b""):
                problems.append("SHA-256 differs from the recorded one")
            if name.endswith(".pgp"):
                data = self._decrypted(job_id, job, path, problems)
            rows = data.count(b"\n") - 1
            wanted = self.list_sizes.get(job["list_name"])
            if wanted is not None and rows != wanted:
                problems.append(f"{rows} rows, list {job['list_name']!r} (the job's terms) has {wanted}")
            writer = last_writer.get(name)
            if (
                writer is not None
                and writer.attempt_id is not None
                and str(writer.attempt_id) != str(job["attempt_id"])
            ):
                problems.append(
                    f"the file there was written by attempt {writer.attempt_id}, not {job['attempt_id']}"
                )
            if problems:
                self.violate(
                    "completed_file_mismatch", job_id, "; ".join(problems), events=self._summary(job_id)
                )

    def _manifests(self) -> None:
        """Every Completed export whose authorized version asks for a manifest has each one on the partner
        (issue #24.6), written once, saying the hash and size of the file there and in the evidence: the
        sidecar is ``sha256sum``'s own line, the JSON manifest names the file, its bytes, rows and hash. A
        manifest name written twice, or one with no Completed export under it, is a violation too."""
        on_disk = {p.name: p for p in self.inp.upload_dir.iterdir() if p.is_file()}
        checked = 0
        names: dict[str, str] = {}
        for job_id, job in self.jobs.items():
            wanted = manifest_names(job["expected_file_name"] or "", job.get("expected_manifest"))
            for name in wanted:
                names[name] = job_id
            if job["status"] != "Completed" or not wanted:
                continue
            name = job["expected_file_name"]
            expected = bytes(job["expected_file_sha256"] or b"").hex()
            data = on_disk.get(name)
            actual = hashlib.sha256(data.read_bytes()).hexdigest() if data is not None else None
            problems: list[str] = []
            for manifest in wanted:
                path = on_disk.get(manifest)
                if path is None:
                    problems.append(f"{manifest} is missing")
                    continue
                content = path.read_bytes()
                if manifest.endswith(SHA256_SUFFIX):
                    if content != f"{expected}  {name}\n".encode():
                        problems.append(f"{manifest} is not sha256sum's line for the recorded hash")
                else:
                    try:
                        said = json.loads(content)
                    except ValueError:
                        said = None
                    if not isinstance(said, dict) or (
                        said.get("file"),
                        said.get("sha256"),
                        said.get("bytes"),
                        said.get("rows"),
                        said.get("export_id"),
                    ) != (name, expected, job["expected_file_bytes"], job["expected_file_rows"], job_id):
                        problems.append(f"{manifest} does not say the recorded file, hash, size and rows")
            if actual is not None and actual != expected:
                problems.append("the file there does not hash to what its manifest says")
            checked += 1
            if problems:
                self.violate(
                    "completed_without_manifest", job_id, "; ".join(problems), events=self._summary(job_id)
                )
        self.result.counts["manifests_checked"] = checked
        self.result.counts["manifest_writes"] = len(self.manifest_writes)
        seen: Counter[str] = Counter(w.name for w in self.manifest_writes)
        for name, times in seen.items():
            owner = names.get(name)
            if owner is None:
                self.violate(
                    "unknown_file", None, f"{name} appeared on the partner and names no export's manifest"
                )
            elif times > 1 and self.jobs[owner]["overwrite_agreement_ref"] is None:
                self.violate("manifest_written_twice", owner, f"{name} written {times} times")

    def _decrypted(self, job_id: str, job: dict[str, Any], path: Path, problems: list[str]) -> bytes:
        """The partner's ``gpg --decrypt`` (and gunzip) of a Completed OpenPGP file, checked against the
        attempt's evidence: the plaintext's SHA-256 and size, the recipient, the signer. The CSV, or b""."""
        self.result.counts["encrypted_files_decrypted"] = self.result.counts.get(
            "encrypted_files_decrypted", 0
        )
        if self.inp.partner_key is None:
            problems.append("an OpenPGP file, and no partner key to decrypt it with")
            return b""
        authorized = self._job_events(job_id, job["attempt_id"], "DeliveryAuthorized")
        try:
            evidence = json.loads(authorized[-1]["detail"] or "") if authorized else {}
        except ValueError:
            evidence = {}
        if not isinstance(evidence, dict) or "plaintext" not in evidence:
            problems.append("no file evidence (plaintext hash) with the attempt's DeliveryAuthorized event")
            return b""
        decrypted = self.inp.partner_key.decrypt(path)
        if decrypted.returncode != 0:
            problems.append(f"the partner's gpg --decrypt failed (exit {decrypted.returncode})")
            return b""
        if self.inp.signer_fingerprint and not decrypted.has("VALIDSIG", self.inp.signer_fingerprint):
            problems.append("no valid signature by the tenant's key")
        try:
            csv = gzip.decompress(decrypted.data) if path.name.endswith(".gz.pgp") else decrypted.data
        except (OSError, EOFError):
            problems.append("the decrypted file is not gzip")
            return b""
        self.result.counts["encrypted_files_decrypted"] += 1
        if hashlib.sha256(csv).hexdigest() != evidence["plaintext"].get("sha256"):
            problems.append("the decrypted CSV's SHA-256 differs from the recorded plaintext hash")
        if len(csv) != evidence["plaintext"].get("bytes"):
            problems.append(
                f"the decrypted CSV has {len(csv)} bytes, recorded {evidence['plaintext'].get('bytes')}"
            )
        if self.inp.partner_key.fingerprint not in (evidence.get("recipients") or []):
            problems.append("the evidence does not name the partner's key as a recipient")
        return csv

    # -- stranded and unsettled jobs --------------------------------------------------------------------

    def _stranded(self) -> None:
        for job_id, job in self.jobs.items():
            status = job["status"]
            if status not in OPEN:
                continue
            if status == "Queued":
                live = self.unpublished.get(job_id, 0) > 0 or job_id in self.open_workflow_jobs
                woken_age = self.db_now - job["woken_at"].timestamp()
                if live:
                    self.violate(
                        "not_settled",
                        job_id,
                        f"still Queued after settling, with a live wake-up (woken {woken_age:.0f}s ago)",
                        unpublished=self.unpublished.get(job_id, 0),
                        open_workflow=job_id in self.open_workflow_jobs,
                        events=self._summary(job_id),
                    )
                else:
                    self.violate(
                        "stranded",
                        job_id,
                        f"Queued with no live wake-up (no unpublished outbox row, no open workflow); woken "
                        f"{woken_age:.0f}s ago, swept {job['sweep_count']} times",
                        events=self._summary(job_id),
                    )
                continue
            lease = _ts(job["lease_expires_at"])
            if lease is None or lease < self.db_now:
                self.violate(
                    "stranded",
                    job_id,
                    f"{status} holding an expired lease after settling "
                    f"({'none' if lease is None else f'{self.db_now - lease:.0f}s ago'}) by {job['claimed_by']}",
                    events=self._summary(job_id),
                )
            else:
                self.violate(
                    "not_settled",
                    job_id,
                    f"{status} with a current lease by {job['claimed_by']} after the settle bound",
                    events=self._summary(job_id),
                )

    # -- cancellations ----------------------------------------------------------------------------------

    def _cancellations(self) -> None:
        """Every recorded request's outcome agrees with what it found and with how the job ended."""
        outcomes = Counter((r["requested_by"] == "temporal", r["outcome"]) for r in self.requests)
        self.result.counts["cancellation_outcomes"] = {
            f"{'temporal' if t else 'api'} {o}": n for (t, o), n in sorted(outcomes.items())
        }
        for request in self.requests:
            self._check_request(request)
        # A Stopped job honoured a recorded stop request; a Canceled job names its request.
        by_id = {str(r["id"]): r for r in self.requests}
        for job_id, job in self.jobs.items():
            if job["status"] == "Stopped":
                stop = by_id.get(str(job["stop_request_id"])) if job["stop_request_id"] else None
                if stop is None or stop["outcome"] != "StopRequested":
                    self.violate("cancellation_inconsistent", job_id,
                                 "Stopped without a recorded StopRequested request naming it",
                                 events=self._summary(job_id))  # fmt: skip
            if job["status"] == "Canceled":
                cancel = (
                    by_id.get(str(job["cancellation_request_id"])) if job["cancellation_request_id"] else None
                )
                if cancel is None or cancel["outcome"] != "CanceledWhileQueued":
                    self.violate("cancellation_inconsistent", job_id,
                                 "Canceled without a recorded CanceledWhileQueued request naming it")  # fmt: skip

    def _check_request(self, request: dict[str, Any]) -> None:
        job_id = str(request["job_id"])
        job = self.jobs.get(job_id)
        if job is None:
            return
        outcome, found = request["outcome"], request["found_status"]
        rid = str(request["id"])
        recorded_at = request["recorded_at"].timestamp()
        problems: list[str] = []
        attempt = request["found_attempt_id"]
        expected_found = {
            "CanceledWhileQueued": {"Queued"},
            "AlreadyCanceled": {"Canceled"},
            "StopRequested": {"Running"},
            "StopAlreadyRequested": {"Running"},
            "AlreadyEnded": {"Rejected", "Stopped", "Failed"},
            "TooLate": {"Delivering", "Completed", "OutcomeUnknown"},
        }[outcome]
        if found not in expected_found:
            problems.append(f"{outcome} but it found {found}")
        match outcome:
            case "CanceledWhileQueued":
                if job["status"] != "Canceled" or str(job["cancellation_request_id"]) != rid:
                    problems.append(
                        f"the job ended {job['status']}, canceled by {job['cancellation_request_id']}"
                    )
                late_claims = [
                    e
                    for e in self._job_events(job_id, kind="Claimed")
                    if e["recorded_at"].timestamp() > recorded_at
                ]
                if late_claims:
                    problems.append(f"claimed after the cancellation ({len(late_claims)} claims)")
            case "AlreadyCanceled":
                if job["status"] != "Canceled" or str(job["cancellation_request_id"]) == rid:
                    problems.append(f"the job is {job['status']}")
            case "StopRequested" | "StopAlreadyRequested":
                # A job still Running has not ended yet (reported as not settled or stranded, not here).
                if job["status"] not in ("Stopped", "Running"):
                    problems.append(f"a stop was recorded while Running but the job ended {job['status']}")
                if outcome == "StopRequested" and str(job["stop_request_id"]) != rid:
                    problems.append(f"the job's stop request is {job['stop_request_id']}, not this one")
                if outcome == "StopAlreadyRequested" and (
                    job["stop_request_id"] is None or str(job["stop_request_id"]) == rid
                ):
                    problems.append("StopAlreadyRequested but no other stop request is on the job")
                if attempt is not None and self._job_events(job_id, attempt, "DeliveryAuthorized"):
                    problems.append(f"attempt {attempt} passed cutoff 2 after the stop request")
            case "AlreadyEnded":
                if job["status"] != found:
                    problems.append(f"found {found}, but the job is now {job['status']}")
            case "TooLate":
                authorized = [
                    e for e in self._job_events(job_id, attempt, "DeliveryAuthorized")
                    if e["recorded_at"].timestamp() <= recorded_at
                ]  # fmt: skip
                if not authorized or request["found_delivery_authorized_at"] is None:
                    problems.append("TooLate but no cutoff 2 of the attempt it found before the request")
                if job["status"] not in ("Completed", "Failed", "OutcomeUnknown", "Delivering"):
                    problems.append(f"TooLate but the job ended {job['status']}")
        if problems:
            self.violate(
                "cancellation_inconsistent",
                job_id,
                f"request {rid} by {request['requested_by']} ({outcome}): " + "; ".join(problems),
                found_status=found,
                events=self._summary(job_id),
            )

    def _client_answers(self) -> None:
        """What each client was told agrees with what was recorded, on every submission of its request."""
        recorded = {str(r["id"]): r for r in self.requests}
        sent: set[str] = set()
        by_point: dict[str, Counter[str]] = defaultdict(Counter)
        seen_before: dict[str, Counter[str]] = defaultdict(Counter)
        for record in self.inp.records:
            for cancel in record.cancels:
                sent.add(cancel.request_id)
                self._check_cancel_answers(cancel, recorded.get(cancel.request_id))
                final = cancel.final
                by_point[cancel.point][final.outcome or f"HTTP {final.status}" if final else "no answer"] += 1
                seen_before[cancel.point][cancel.seen_before or "unseen"] += 1
        for rid, request in recorded.items():
            if request["requested_by"] == PRINCIPAL and rid not in sent:
                self.violate("cancellation_inconsistent", str(request["job_id"]),
                             f"request {rid} is recorded for the client but the client never sent it")  # fmt: skip
        self.result.counts["cancel_outcomes_by_point"] = {p: dict(c) for p, c in sorted(by_point.items())}
        self.result.counts["status_seen_before_cancel"] = {p: dict(c) for p, c in sorted(seen_before.items())}

    def _check_cancel_answers(self, cancel: CancelRecord, row: dict[str, Any] | None) -> None:
        given = [a for a in cancel.answers if a.status is not None and a.status < 500]
        busy = [a for a in cancel.answers if a.status == 503]
        outcomes = {a.outcome for a in given}
        problems = []
        for answer in given:
            expected = STATUS_FOR_OUTCOME.get(answer.outcome or "")
            if expected != answer.status:
                problems.append(f"HTTP {answer.status} with outcome {answer.outcome}")
        if len(outcomes) > 1:
            problems.append(f"different outcomes for one request ID: {sorted(map(str, outcomes))}")
        told = given[-1].outcome if given else None
        if told in RECORDED:
            if row is None:
                problems.append(f"told {told} but nothing is recorded")
            elif row["outcome"] != told:
                problems.append(f"told {told}, recorded {row['outcome']}")
        elif row is not None and not given and busy:
            problems.append("recorded although every answer was Busy (503)")
        if cancel.point == "again:retry_same" and given and given[-1].replayed is not True:
            problems.append("a resubmitted request ID was not answered as a replay")
        if problems:
            self.violate(
                "cancellation_inconsistent",
                cancel.job_id,
                f"client request {cancel.request_id} ({cancel.point}, saw {cancel.seen_before}): "
                + "; ".join(problems),
                answers=[(a.status, a.outcome, a.replayed, a.error) for a in cancel.answers],
            )

    # -- creation, duplicates and edits -----------------------------------------------------------------

    def _idempotency_and_edits(self) -> None:
        edits = Counter()
        duplicates = Counter()
        for record in self.inp.records:
            if record.job_id is None or record.role != "original":
                continue
            job = self.jobs.get(record.job_id)
            for kind, answer in record.duplicates:
                duplicates[f"{kind} {answer.status}"] += 1
                if answer.status is None or answer.status >= 500:
                    continue
                if kind in ("sequential", "concurrent") and (
                    answer.status not in (200, 201) or answer.job_id != record.job_id
                ):
                    self.violate("idempotency", record.job_id,
                                 f"{kind} duplicate create answered {answer.status} with export {answer.job_id}")  # fmt: skip
                if kind == "conflict" and answer.status != 409:
                    self.violate("idempotency", record.job_id,
                                 f"same key, other body answered {answer.status} (expected 409)")  # fmt: skip
            created = [a for a in record.creates if a.status in (200, 201)]
            if record.plan is not None and record.plan.duplicate == "concurrent":
                both = created + [a for k, a in record.duplicates if a.status in (200, 201)]
                if sum(1 for a in both if a.status == 201) > 1:
                    self.violate(
                        "idempotency", record.job_id, "two concurrent creates with one key both answered 201"
                    )
            accepted = [e for e in record.edits if e.status == 200]
            for edit in record.edits:
                edits[f"{edit.kind} {edit.status}"] += 1
            if job is None:
                continue
            # An edit whose answer never came may have committed: its list is possible too.
            possible = {accepted[-1].list_name if accepted else record.list_name}
            possible |= {e.list_name for e in record.edits if e.status is None or e.status >= 500}
            if job["list_name"] not in possible:
                self.violate("terms_edit", record.job_id,
                             f"the job's list is {job['list_name']!r}; the client's edits allow {sorted(possible)}")  # fmt: skip
            # A job that left Queued through a claim was claimed at its last version (edits only while Queued);
            # a canceled or still queued one may have been edited after an earlier, requeued claim.
            claims = self._job_events(record.job_id, kind="Claimed")
            if (
                claims
                and job["status"] not in ("Queued", "Canceled", "Rejected")
                and claims[-1]["version"] != job["version"]
            ):
                self.violate("terms_edit", record.job_id,
                             f"last claim at version {claims[-1]['version']}, the job is at version {job['version']}")  # fmt: skip
            for edit in record.edits:
                if edit.kind == "stale" and edit.status not in (412, None) and edit.status < 500:
                    self.violate("terms_edit", record.job_id, f"a stale If-Match answered {edit.status}")
        self.result.counts["edits"] = dict(edits)
        self.result.counts["duplicate_creates"] = dict(duplicates)

    def _recurring_firings(self) -> None:
        """No firing created two exports: one firing row per recurring export and nominal time, each created
        one names an export that exists and whose idempotency key is that firing's (schedule ID @ nominal
        time), no key names two exports, no export is named by two firings, and every export made under a
        firing's key has its firing recorded (the export and its firing commit together)."""
        seen: set[tuple[str, str]] = set()
        by_job: Counter[str] = Counter()
        created_keys: set[str] = set()
        for firing in self.firings:
            recurring, nominal = str(firing["recurring_export_id"]), firing["nominal_time"]
            if (recurring, nominal.isoformat()) in seen:
                self.violate("recurring_firing", None, f"two firings recorded for {recurring} at {nominal}")
            seen.add((recurring, nominal.isoformat()))
            if firing["outcome"] != "created":
                continue
            job_id = str(firing["job_id"])
            by_job[job_id] += 1
            key = firing_key(firing["recurring_export_id"], nominal)
            created_keys.add(key)
            if job_id not in self.jobs:
                self.violate(
                    "recurring_firing", job_id, f"firing of {recurring} at {nominal} names no export"
                )
            if self.recurring_keys.get(key) != [job_id]:
                self.violate("recurring_firing", job_id,
                             f"firing key {key} names exports {self.recurring_keys.get(key)}, not {job_id}")  # fmt: skip
        for job_id, n in by_job.items():
            if n > 1:
                self.violate("recurring_firing", job_id, f"{n} firings created the same export")
        for key, jobs in self.recurring_keys.items():
            if len(jobs) > 1:
                self.violate("recurring_firing", jobs[0], f"key {key} names {len(jobs)} exports")
            if key not in created_keys:
                self.violate("recurring_firing", jobs[0], f"export made under {key} has no firing recorded")
        outcomes = Counter(f["outcome"] + (f" ({f['reason']})" if f["reason"] else "") for f in self.firings)
        self.result.counts["recurring_firings"] = dict(outcomes.most_common())
        self.result.counts["recurring_exports_created"] = sum(by_job.values())

    def _events_agree_with_status(self) -> None:
        """The row's status is the one its attempt's last transition event says."""
        for job_id, job in self.jobs.items():
            status = job["status"]
            attempt = job["attempt_id"]
            transitions = [e for e in self._job_events(job_id, attempt) if e["kind"] in TRANSITIONS]
            last = transitions[-1] if transitions else None
            detail = (last or {}).get("detail") or ""
            ok = True
            match status:
                case "Completed" | "OutcomeUnknown":
                    ok = bool(self._job_events(job_id, attempt, "DeliveryAuthorized")) and last is not None and (
                        last["kind"] in ("Finished", "ResolvedByRecovery", "Reconciled", "Corrected") and detail.startswith(status)
                    )  # fmt: skip
                case "Stopped":
                    ok = last is not None and last["kind"] in ("Stopped", "StoppedByRecovery")
                case "Failed":
                    ok = last is not None and (
                        last["kind"] in ("Failed", "Finished", "AttemptsExhausted", "Corrected")
                        # recovery proving NotDelivered from the fences (or a listing) after cutoff 2
                        or (
                            last["kind"] in ("ResolvedByRecovery", "Reconciled")
                            and detail.startswith("Failed")
                        )
                    )
                case "Queued":
                    ok = attempt is None
                case "Running":
                    ok = last is not None and last["kind"] == "Claimed"
                case "Delivering":
                    ok = last is not None and last["kind"] == "DeliveryAuthorized"
            if not ok:
                self.violate("events_contradict_status", job_id,
                             f"status {status} but the attempt's last transition is {last and last['kind']} {detail[:80]!r}",
                             events=self._summary(job_id))  # fmt: skip

    # -- the API's answers ------------------------------------------------------------------------------

    def _http_5xx(self) -> None:
        tracebacks = parse_api_log(self.inp.logs.get("api"))
        self.result.findings["api_tracebacks"] = group_tracebacks(tracebacks)
        by_route: dict[str, Counter[str]] = defaultdict(Counter)
        errors: Counter[str] = Counter()
        fivexx = []
        for rec in self.inp.journal:
            if rec.status is None:
                errors[f"{rec.route}: {rec.error}"] += 1
                continue
            by_route[rec.route][str(rec.status)] += 1
            if rec.status >= 500:
                fivexx.append(rec)
        self.result.counts["http_answers"] = {r: dict(c) for r, c in sorted(by_route.items())}
        self.result.counts["client_errors"] = dict(errors.most_common())
        answered_5xx = []
        for rec in fivexx:
            allowed = rec.status == 503 and rec.retry_after is not None
            # The traceback of this answer: same route, logged after the request began, the nearest.
            near = [
                tb for tb in tracebacks if 0 <= tb["t"] - rec.t < 35 and tb.get("route") in (None, rec.route)
            ]
            near.sort(key=lambda tb: (tb.get("route") is None, tb["t"] - rec.t))
            cause = near[0]["summary"] if near else None
            entry = {
                "t": round(rec.t, 3),
                "route": rec.route,
                "status": rec.status,
                "outcome": rec.outcome,
                "answer": rec.detail,
                "retry_after": rec.retry_after,
                "job_id": rec.job_id,
                "traceback": cause,
            }
            answered_5xx.append(entry)
            if not allowed:
                self.violate(
                    "http_5xx",
                    rec.job_id,
                    f"{rec.route} answered {rec.status}" + (f" ({cause})" if cause else ""),
                    **{k: v for k, v in entry.items() if k != "job_id"},
                )
        self.result.findings["http_5xx"] = answered_5xx
        self.result.counts["http_5xx_by_route"] = dict(
            Counter(f"{e['route']} {e['status']}" for e in answered_5xx)
        )

    # -- where work went to a person --------------------------------------------------------------------

    def _outcomes(self) -> None:
        unknown: dict[str, list[str]] = defaultdict(list)
        likely: dict[str, Counter[str]] = defaultdict(Counter)
        legit = {"rename sent, answer lost"}
        details: list[dict[str, Any]] = []
        for job_id, job in self.jobs.items():
            if job["status"] != "OutcomeUnknown":
                continue
            if job["fence_expected"] and job["rename_fenced_at"] is None:
                # The rename request is never sent without its fence: this attempt never wrote the final name,
                # and recovery settles such a row from its fences (23.2). Left unknown, a person waits for
                # what the row already proves.
                self.violate(
                    "outcome_unknown_proved_not_delivered",
                    job_id,
                    "OutcomeUnknown although the rename fence was never written (the rename was never sent)",
                    attempt_id=str(job["attempt_id"]),
                )
            cause, info = self._unknown_cause(job_id, job)
            info["rename_request_sent"] = job["rename_fenced_at"] is not None or not job["fence_expected"]
            unknown[cause].append(job_id)
            likely[cause][
                info["faults_near"][0].split(" ")[0] if info["faults_near"] else "no fault nearby"
            ] += 1
            details.append({"job_id": job_id, "cause": cause, **info})
        self.result.findings["outcome_unknown"] = {
            cause: {
                "count": len(ids),
                "expected": cause in legit,
                "likely_faults": dict(likely[cause].most_common()),
                "examples": ids[:5],
            }
            for cause, ids in sorted(unknown.items(), key=lambda kv: -len(kv[1]))
        }
        self.result.findings["outcome_unknown_jobs"] = details
        failed: dict[str, list[str]] = defaultdict(list)
        for job_id, job in self.jobs.items():
            if job["status"] != "Failed":
                continue
            last = [e for e in self._job_events(job_id, job["attempt_id"]) if e["kind"] in TRANSITIONS]
            detail = (last[-1]["detail"] or "") if last else ""
            failed[f"{job['failure_reason']}: {normalize(detail)}"].append(job_id)
        self.result.findings["failed"] = {
            cause: {"count": len(ids), "examples": ids[:5], "events": self._summary(ids[0])}
            for cause, ids in sorted(failed.items(), key=lambda kv: -len(kv[1]))
        }
        requeued = Counter()
        for job_id in self.jobs:
            for event in self._job_events(job_id):
                if event["kind"] in (
                    "RequeuedByRecovery",
                    "StoppedByRecovery",
                    "ResolvedByRecovery",
                    "AttemptsExhausted",
                ):
                    requeued[event["kind"]] += 1
        self.result.counts["recovery_takeovers"] = dict(requeued)

    def _give_backs(self) -> None:
        """No job is given back for failures more often than the bound (23.1), and one that reached it ended
        Failed (AttemptsExhausted) with the give-back's event; every give-back is counted by its cause."""
        bound = self.inp.max_transient_releases
        by_cause: Counter[str] = Counter()
        for job_id, job in self.jobs.items():
            released = [e for e in self._job_events(job_id) if e["kind"] == "Released"]
            causes = [(e["detail"] or "").split(":", 1)[0] for e in released]
            by_cause.update(causes)
            counted = sum(1 for c in causes if c in ("transient", "workflow"))
            if counted > bound or job["transient_releases"] > bound:
                self.violate(
                    "released_past_the_bound",
                    job_id,
                    f"given back {counted} times for failures (row says {job['transient_releases']}), bound {bound}",
                )
            if counted != job["transient_releases"]:
                self.violate(
                    "give_backs_disagree_with_the_row",
                    job_id,
                    f"{counted} Released events for failures, transient_releases {job['transient_releases']}",
                )
            gave_up = [
                e
                for e in self._job_events(job_id, job["attempt_id"], "AttemptsExhausted")
                if e["worker_id"] and (e["detail"] or "").startswith("given back")
            ]
            if gave_up and (job["status"], job["failure_reason"], counted) != (
                "Failed",
                "AttemptsExhausted",
                bound,
            ):
                self.violate(
                    "give_back_bound_not_applied",
                    job_id,
                    f"gave up after {counted} give-backs, bound {bound}, ended {job['status']} {job['failure_reason']}",
                )
        self.result.counts["releases_by_cause"] = dict(by_cause.most_common())
        self.result.counts["jobs_given_back_for_failures"] = sum(
            1 for job in self.jobs.values() if job["transient_releases"]
        )

    def _retries(self) -> None:
        """Every retried export was delivered at most once (issue #25.4), by the partner's own witness (the watch
        on its directory): the final name was written at most once by the job's attempts, never by an attempt
        that was sent back to be tried again, and no such attempt had fenced its rename (the row's proof that
        its rename was never sent). Retries are counted by cause."""
        writes_by_attempt: dict[str, list[FinalWrite]] = defaultdict(list)
        for write in self.writes:
            if write.attempt_id is not None:
                writes_by_attempt[str(write.attempt_id)].append(write)
        by_cause: Counter[str] = Counter()
        retried_jobs = delivered_after = 0
        for job_id, job in self.jobs.items():
            retries = self._job_events(job_id, kind="RetryScheduled")
            if not retries:
                continue
            retried_jobs += 1
            delivered_after += job["status"] == "Completed"
            by_cause.update((e["detail"] or "").split(":", 1)[0] for e in retries)
            attempts = {str(e["attempt_id"]) for e in self._job_events(job_id, kind="Claimed")}
            writes = [w for a in attempts for w in writes_by_attempt.get(a, [])]
            if len(writes) > 1:
                self.violate(
                    "retried_export_delivered_twice",
                    job_id,
                    f"{len(writes)} writes of {self._final_name(job)} by its attempts after {len(retries)} retries",
                    writes=[(w.t, str(w.attempt_id), w.how) for w in writes],
                    events=self._summary(job_id),
                )
            for event in retries:
                retried = str(event["attempt_id"])
                if writes_by_attempt.get(retried):
                    self.violate(
                        "retried_attempt_wrote_the_final_name",
                        job_id,
                        f"attempt {retried} was sent back to be tried again, but the partner saw it write "
                        f"{self._final_name(job)}",
                        events=self._summary(job_id),
                    )
                if self._job_events(job_id, retried, "RenameFenced"):
                    self.violate(
                        "retried_after_its_rename_fence",
                        job_id,
                        f"attempt {retried} was sent back to be tried again after its rename fence",
                        events=self._summary(job_id),
                    )
        self.result.counts["retries_by_cause"] = dict(by_cause.most_common())
        self.result.counts["exports_retried"] = retried_jobs
        self.result.counts["exports_delivered_after_a_retry"] = delivered_after

    def _unknown_cause(self, job_id: str, job: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        attempt = str(job["attempt_id"])
        evidence = self._attempt_evidence(job_id, attempt)
        kinds = [e.get("observation") for e in evidence]
        ending = [
            e for e in self._job_events(job_id, attempt) if e["kind"] in ("Finished", "ResolvedByRecovery")
        ]
        end = ending[-1] if ending else None
        wrote = [w for w in self.writes if str(w.attempt_id) == attempt]
        temp = attempt in self.temps
        interrupted = [e for e in evidence if e.get("observation") == "interrupted"]
        rename = [e for e in evidence if e.get("observation") == "rename"]
        authorized = self._job_events(job_id, attempt, "DeliveryAuthorized")
        t_auth = authorized[0]["recorded_at"].timestamp() if authorized else None
        t_end = end["recorded_at"].timestamp() if end else None
        info: dict[str, Any] = {
            "ended_by": f"{end['kind']} ({end['observed_by'] or end['worker_id']})" if end else None,
            "end_detail": (end["detail"] or "")[:200] if end else None,
            "evidence": kinds,
            "temp_file_created": temp,
            "final_name_written": bool(wrote),
            "worker": job["claimed_by"],
            "workflow_id": job["workflow_id"],
            "faults_near": self._faults_near(job, t_auth, t_end),
            "events": self._summary(job_id),
        }
        if wrote:
            file = self.inp.upload_dir / (job["expected_file_name"] or "")
            matches = file.is_file() and hashlib.sha256(file.read_bytes()).digest() == bytes(
                job["expected_file_sha256"] or b""
            )
            return ("delivered (the partner has this attempt's file" + (", matching" if matches else ", NOT matching")
                    + ") but recorded OutcomeUnknown"), info  # fmt: skip
        if (rename and rename[-1].get("result") == "no_answer") or any(
            i.get("rename_sent") for i in interrupted
        ):
            return "rename sent, answer lost", info
        after = [
            e for e in self._job_events(job_id, attempt, "DeliveryEvidence")
            if end is not None and e["id"] > end["id"] and not (e["observed_by"] or "").startswith("recovery:")
        ]  # fmt: skip
        if after:
            seen = ", ".join(sorted({_evidence_word(e) for e in after}))
            return (f"resolved by {end['kind'] if end else '?'} while the attempt was still alive; it went on "
                    f"to the partner afterwards ({seen})"), info  # fmt: skip
        connect = [e for e in evidence if e.get("observation") == "connect" and e.get("result") == "refused"]
        if connect:
            return "nothing sent (the SFTP connection was refused), yet OutcomeUnknown", info
        if interrupted:
            phase = interrupted[-1].get("phase")
            return f"interrupted before the rename request (phase {phase}); final name never written", info
        if temp:
            return (
                "upload started (temporary file on the partner), no evidence of how far; final name never written",
                info,
            )
        if not evidence:
            who = "recovery" if end is not None and end["kind"] == "ResolvedByRecovery" else "the worker"
            return f"upload never started (no evidence, nothing on the partner); resolved by {who}", info
        return f"other: {normalize(info['end_detail'] or '')}", info

    def _faults_near(self, job: dict[str, Any], t_from: float | None, t_to: float | None) -> list[str]:
        if t_from is None:
            return []
        t_to = t_to or t_from + 60
        slot = (job["claimed_by"] or "").split(".")[0]
        near = []
        for fault in self.inp.faults:
            if fault.ended < t_from - 2 or fault.started > t_to + 1:
                continue
            if fault.kind.startswith("worker_") and not fault.target.startswith(f"{slot}."):
                continue
            if fault.kind.startswith("workflow_") and fault.job_id != str(job["id"]):
                continue
            near.append(f"{fault.kind} {fault.target}".strip())
        # The faults on this attempt's own worker or workflow first: the likely cause.
        near.sort(key=lambda text: not text.startswith(("worker_", "workflow_")))
        return near

    def _process_exits(self) -> None:
        """A worker or the API that ends by itself, the soak's own signals aside, is a defect: each such
        exit is a violation (a crash loop once hid here as a finding while one worker did all the work)."""
        self.result.findings["unexpected_exits"] = [
            {"t": round(e.t, 3), "process": e.name, "code": e.code, "log_tail": e.log_tail[-1500:]}
            for e in self.inp.exits
        ]
        for e in self.inp.exits:
            lines = [ln.partition(" ")[2] for ln in e.log_tail.splitlines() if ln.strip()]
            self.violate(
                "process_exited",
                None,
                f"{e.name} exited by itself with code {e.code}: {(lines or [''])[-1][:200]}",
            )

    def _drains(self) -> None:
        """A worker told to stop (SIGTERM) exits within its shutdown grace and a margin."""
        limit = self.inp.shutdown_grace_seconds + DRAIN_MARGIN_SECONDS
        for fault in self.inp.faults:
            took = fault.extra.get("exit_seconds")
            if fault.kind == "worker_drain" and (took is None and not fault.ok or (took or 0) > limit):
                self.violate(
                    "drain_overran",
                    None,
                    f"{fault.target}: {fault.detail} (grace {self.inp.shutdown_grace_seconds:.0f}s)",
                )

    def _partner_sessions(self) -> None:
        """Concurrent sessions never exceeded the partner's limit, by the partner's own witness (issue #25.3)."""
        seen = self.inp.partner_sessions_high_water
        self.result.counts["partner_sessions_high_water"] = seen
        self.result.counts["partner_session_limit"] = self.inp.session_limit or None
        limit = self.inp.session_limit
        if not limit or seen is None or seen <= limit:
            return
        # Each stretch the witness spent over the limit, with the faults around it (what to read the logs for).
        stretches: list[tuple[float, float, int]] = []
        began: float | None = None
        peak = 0
        for at, open_now in self.inp.partner_sessions_timeline:
            if open_now > limit:
                began = at if began is None else began
                peak = max(peak, open_now)
            elif began is not None:
                stretches.append((began, at, peak))
                began, peak = None, 0
        for start, end, most in stretches or [(0.0, 0.0, seen)]:
            self.violate(
                "sessions_over_limit",
                None,
                f"the partner held {most} sessions at once for {end - start:.2f}s; its limit is {limit}",
                high_water=most,
                limit=limit,
                at=datetime.fromtimestamp(start).isoformat(timespec="milliseconds") if start else None,
                faults_before=self._faults_between(start - 15, end) if start else [],
            )

    def _logs_free_of_contacts(self) -> None:
        marker = self.inp.marker.encode()
        for name, path in self.inp.logs.items():
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if marker in data or b"contacts.invalid" in data:
                line = next(
                    (ln for ln in data.splitlines() if marker in ln or b"contacts.invalid" in ln), b""
                )
                self.violate("contact_data_in_logs", None, f"{name}'s log holds contact data",
                             line=line.decode(errors="replace")[:300])  # fmt: skip

    def _webhooks(self) -> None:
        """Outcome notifications (issue 26): one event per (export, outcome) and per lost cancellation after
        de-duplicating by event ID, none missing, every signature verified (chaos/webhooks.py)."""
        if self.inp.webhook_endpoint_id is None:
            return
        found, counts = audit_webhooks(
            jobs={k: v for k, v in self.jobs.items()},
            events=self.events,
            requests=self.requests,
            received=self.inp.webhooks,
            deliveries=self.webhook_deliveries,
            marker=self.inp.marker,
            firings=self.firings,
        )
        for finding in found:
            self.violate(finding.invariant, finding.job_id, finding.detail)
        self.result.counts["webhooks"] = counts

    async def _histories(self, client: Client | None) -> None:
        if client is None:
            self.violate(
                "contact_data_in_history", None, "could not connect to Temporal to read the histories"
            )
            return
        marker = self.inp.marker.encode()
        executions = []
        async for execution in client.list_workflows(""):
            executions.append(execution)
        statuses: Counter[str] = Counter()
        results: Counter[str] = Counter()
        checked = 0
        semaphore = asyncio.Semaphore(8)

        async def check(execution: Any) -> None:
            nonlocal checked
            async with semaphore:
                handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
                history = await handle.fetch_history()
            raw = b"".join(event.SerializeToString() for event in history.events)
            checked += 1
            status = execution.status.name if execution.status is not None else "?"
            statuses[f"{execution.workflow_type} {status}"] += 1
            if execution.workflow_type == "ExportWorkflow" and history.events:
                last = history.events[-1]
                if last.HasField("workflow_execution_completed_event_attributes"):
                    payloads = last.workflow_execution_completed_event_attributes.result.payloads
                    if payloads:
                        try:
                            results[json.loads(payloads[0].data).get("outcome", "?")] += 1
                        except ValueError:
                            pass
            if marker in raw or b"contacts.invalid" in raw:
                self.violate("contact_data_in_history", job_of_workflow(execution.id),
                             f"workflow {execution.id} run {execution.run_id} holds contact data")  # fmt: skip
            if execution.workflow_type == "RecoveryWorkflow":
                recovery_runs.append(recovery_run(execution, history))
            job = job_of_workflow(execution.id)
            if job in interesting:
                timelines[job].append((execution.id, timeline(history)))

        recovery_runs: list[dict[str, Any]] = []
        interesting = {d["job_id"]: d for d in self.result.findings.get("outcome_unknown_jobs", [])}
        timelines: dict[str, list[tuple[float, list[str]]]] = defaultdict(list)
        await asyncio.gather(*(check(e) for e in executions))
        self._recovery_runs(recovery_runs)
        for job, runs in timelines.items():
            # Each wake-up's workflow: which activities it scheduled, when they started and how they ended.
            interesting[job]["workflows"] = [lines for _, lines in sorted(runs, key=lambda r: r[1][0])]
            own = [lines for workflow_id, lines in runs if workflow_id == interesting[job].get("workflow_id")]
            interesting[job]["attempt_workflow"] = own[0] if own else None
        self._refine_unknown(interesting)
        self.result.counts["histories_checked"] = checked
        self.result.counts["workflows_by_status"] = dict(sorted(statuses.items()))
        self.result.counts["export_workflow_results"] = dict(results.most_common())

    def _refine_unknown(self, jobs: dict[str, dict[str, Any]]) -> None:
        """Split "upload never started" by what the attempt's own workflow history says happened to the
        delivery, and group the OutcomeUnknown jobs again."""
        for detail in jobs.values():
            if detail["cause"].startswith("upload never started"):
                fate = delivery_fate(detail.get("attempt_workflow"))
                detail["cause"] = f"upload never started: {fate}"
        grouped: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for detail in jobs.values():
            grouped[detail["cause"]].append(detail)
        legit = {"rename sent, answer lost"}
        self.result.findings["outcome_unknown"] = {
            cause: {
                "count": len(items),
                "expected": cause in legit,
                "likely_faults": dict(
                    Counter(
                        d["faults_near"][0].split(" ")[0] if d["faults_near"] else "no fault nearby"
                        for d in items
                    )
                ),
                "examples": [d["job_id"] for d in items[:5]],
            }
            for cause, items in sorted(grouped.items(), key=lambda kv: -len(kv[1]))
        }

    def _recovery_runs(self, runs: list[dict[str, Any]]) -> None:
        """Recovery must run every interval: the longest gap between runs, and runs that took long (with
        the activity timeouts and failures their histories show)."""
        runs.sort(key=lambda r: r["start"])
        gaps = [(b["start"] - a["start"], a, b) for a, b in zip(runs, runs[1:], strict=False)]
        longest = max(gaps, key=lambda g: g[0], default=None)
        interval = self.inp.recovery_every_seconds
        slow = [r for r in runs if (r["duration"] or 0) > 3 * interval]
        self.result.findings["recovery"] = {
            "runs": len(runs),
            "interval_seconds": interval,
            "longest_gap_seconds": round(longest[0], 1) if longest else None,
            "longest_gap_after_run": longest[1]["workflow_id"] if longest else None,
            "slow_runs": [
                {k: r[k] for k in ("workflow_id", "status", "duration", "problems")}
                for r in slow[:MAX_LISTED]
            ],
        }
        # Not a violation (no invariant breaks), but every lease that expires meanwhile waits it out.
        self.result.findings["recovery_stalls"] = [
            f"no recovery run started for {gap:.0f}s (interval {interval:.0f}s) after {a['workflow_id']}, which "
            f"took {a['duration'] or 0:.0f}s: {'; '.join(a['problems'][:3]) or 'no activity failure recorded'}; "
            f"faults meanwhile: {self._faults_between(a['start'], b['start']) or 'none'}"
            for gap, a, b in sorted(gaps, key=lambda g: -g[0])
            if gap > STALL_FACTOR * interval
        ][:MAX_LISTED]

    def _faults_between(self, t_from: float, t_to: float) -> list[str]:
        return [
            f"{f.kind} {f.target} at +{f.started - t_from:.0f}s"
            for f in self.inp.faults
            if f.started < t_to and f.ended > t_from - 1
        ]

    def _slow_to_settle(self) -> None:
        """Jobs whose last transition came long after the faults stopped: what held them."""
        limit = self.inp.load_ended_at + SLOW_SETTLE_SECONDS
        slow = []
        for job_id, job in self.jobs.items():
            transitions = [e for e in self.events.get(job_id, []) if e["kind"] in TRANSITIONS]
            if transitions and transitions[-1]["recorded_at"].timestamp() > limit:
                slow.append(
                    (transitions[-1]["recorded_at"].timestamp() - self.inp.load_ended_at, job_id, job)
                )
        slow.sort(key=lambda s: -s[0])
        self.result.findings["slow_to_settle"] = [
            {
                "job_id": job_id,
                "seconds_after_faults": round(late, 1),
                "status": job["status"],
                "events": self._summary(job_id),
            }
            for late, job_id, job in slow[:MAX_LISTED]
        ]
        self.result.counts["slow_to_settle"] = len(slow)

    def _summary(self, job_id: str) -> list[str]:
        """The job's events in order, short: kind, attempt prefix, who, detail."""
        lines = []
        for event in self.events.get(job_id, []):
            who = event["worker_id"] or event["observed_by"] or ""
            detail = event["detail"] or ""
            if event["kind"] == "DeliveryEvidence":
                try:
                    parsed = json.loads(detail)
                    detail = " ".join(f"{k}={v}" for k, v in parsed.items()
                                      if k in ("observation", "result", "phase", "rename_sent", "present", "error", "outcome"))  # fmt: skip
                except ValueError:
                    pass
            t = event["recorded_at"].strftime("%H:%M:%S.%f")[:-3]
            lines.append(
                f"{t} {event['kind']} a={str(event['attempt_id'])[:8]} {who} {detail[:160]}".rstrip()
            )
        return lines


def _evidence_word(event: dict[str, Any]) -> str:
    try:
        detail = json.loads(event["detail"] or "{}")
    except ValueError:
        return "?"
    words = [str(detail.get("observation", "?"))]
    for key in ("result", "phase", "outcome", "error"):
        if detail.get(key) is not None:
            words.append(str(detail[key]))
    return " ".join(words)


def _is_manifest_name(name: str) -> bool:
    """A manifest's name, or its temporary name (issue #24.6): beside a data file, never one."""
    return name.endswith((SHA256_SUFFIX, JSON_SUFFIX))
