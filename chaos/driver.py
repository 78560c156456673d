"""The soak's clients: each planned export is created through the HTTP API and then edited, duplicated,
cancelled at its planned point and replaced as its plan says, the way a careful client would (the same
Idempotency-Key or cancellation request ID on every retry, Retry-After honoured).

Cancel points are timed from outside by watching the export's status on the status board: "building"
cancels once the export is seen Running, "delivering" once it is seen Delivering. What the client was
told is kept for the auditor, next to what it saw just before asking.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from chaos.client import TERMINAL, ApiClient, HttpRecord, StatusBoard
from chaos.plan import ExportPlan

REPLACEABLE_CODES = frozenset({"BuildFailed", "AttemptsExhausted", "NotDelivered"})
MAX_REPLACEMENTS = 2


@dataclass
class Answer:
    """One answer a client got (``status`` None: no answer, ``error`` says why)."""

    t: float
    status: int | None
    error: str | None = None
    outcome: str | None = None
    replayed: bool | None = None
    job_id: str | None = None
    body: dict[str, Any] = field(default_factory=dict)


@dataclass
class CancelRecord:
    """One cancellation request (one request ID) and every answer to its submissions."""

    request_id: str
    job_id: str
    point: str
    seen_before: str | None
    answers: list[Answer] = field(default_factory=list)

    @property
    def final(self) -> Answer | None:
        """The last answer the server gave, if any."""
        given = [a for a in self.answers if a.status is not None]
        return given[-1] if given else None


@dataclass
class EditRecord:
    kind: str
    if_match: str
    list_name: str
    seen_before: str | None
    status: int | None
    version: int | None = None


@dataclass
class ExportRecord:
    """What the client did for one export (an original, or a replacement the client created)."""

    index: int
    role: str  # "original" or "replacement"
    list_name: str
    plan: ExportPlan | None = None
    job_id: str | None = None
    replaces: str | None = None
    overwrite: bool = False
    creates: list[Answer] = field(default_factory=list)
    duplicates: list[tuple[str, Answer]] = field(default_factory=list)
    edits: list[EditRecord] = field(default_factory=list)
    cancels: list[CancelRecord] = field(default_factory=list)
    final_status: str | None = None
    final_failure: str | None = None
    notes: list[str] = field(default_factory=list)


class Driver:
    """Runs every planned export's client script against the API; ``records`` keeps what each did."""

    def __init__(
        self,
        api: ApiClient,
        board: StatusBoard,
        destination_id: str,
        exports: list[ExportPlan],
        *,
        t0: float,
        hard_deadline: float,
        encrypted_destination_id: str | None = None,
        approver: ApiClient | None = None,
    ) -> None:
        self.api = api
        # a second operator: a replacement with an overwrite agreement takes two people (issue #26)
        self.approver = approver
        self.board = board
        self.destination_id = destination_id
        self.encrypted_destination_id = encrypted_destination_id or destination_id
        self.exports = exports
        self.t0 = t0
        self.hard_deadline = hard_deadline
        self.records: list[ExportRecord] = []
        self.errors: list[str] = []

    async def run(self) -> None:
        await asyncio.gather(*(self._export_guarded(plan) for plan in self.exports))

    async def _export_guarded(self, plan: ExportPlan) -> None:
        try:
            await self._export(plan)
        except Exception as exc:  # noqa: BLE001 - one client's bug must not hide the others' results
            self.errors.append(f"export #{plan.index}: client script failed: {type(exc).__name__}: {exc}")

    # -- one export ---------------------------------------------------------------------------------

    async def _export(self, plan: ExportPlan) -> None:
        await asyncio.sleep(max(0.0, self.t0 + plan.at - time.monotonic()))
        record = ExportRecord(index=plan.index, role="original", list_name=plan.list_name, plan=plan)
        self.records.append(record)
        destination = self.encrypted_destination_id if plan.encrypted else self.destination_id
        body = {"destination_id": destination, "list_name": plan.list_name}

        if plan.duplicate == "concurrent":
            first, second = await asyncio.gather(
                self._create(body, plan.idempotency_key), self._create(body, plan.idempotency_key)
            )
            record.creates += first
            record.duplicates += [("concurrent", a) for a in second]
            record.job_id = _created_id(first) or _created_id(second)
        else:
            record.creates += await self._create(body, plan.idempotency_key)
            record.job_id = _created_id(record.creates)
        if record.job_id is None:
            record.notes.append("never created: no 200/201 answer before the deadline")
            return
        job_id = record.job_id
        self.board.watch(job_id)

        if plan.duplicate == "sequential":
            record.duplicates += [("sequential", a) for a in await self._create(body, plan.idempotency_key)]
        elif plan.duplicate == "conflict":
            other = {**body, "list_name": plan.edit_list if plan.edit_list != plan.list_name else "tiny"}
            record.duplicates += [
                ("conflict", a) for a in await self._create(other, plan.idempotency_key, once=True)
            ]

        if plan.edit in ("ok", "stale"):
            await self._edit(record, plan.edit, plan.edit_list)
        if plan.cancel != "none":
            await self._cancel_at(record, plan.cancel, plan.cancel_delay, plan.cancel_again)
        if plan.edit == "late":
            await self.board.wait_for(job_id, {"Running", "Delivering"}, self.hard_deadline)
            await self._edit(record, "late", plan.edit_list)

        await self._settle(record)
        original = record
        for _ in range(MAX_REPLACEMENTS):
            if not plan.replace or not _replaceable(original):
                break
            replacement = await self._replace(original, plan)
            if replacement is None:
                break
            await self._settle(replacement)
            original = replacement

    async def _settle(self, record: ExportRecord) -> None:
        assert record.job_id is not None
        status = await self.board.wait_for(record.job_id, TERMINAL, self.hard_deadline)
        record.final_status = status
        row = self.board.jobs.get(record.job_id) or {}
        record.final_failure = row.get("failure_reason")

    # -- requests -----------------------------------------------------------------------------------

    async def _create(self, body: dict[str, Any], key: str, *, once: bool = False) -> list[Answer]:
        """POST /exports with ``key``, retried with the same key until an answer that is not a 5xx."""
        answers: list[Answer] = []
        while time.monotonic() < self.hard_deadline:
            response, sent = await self.api.request(
                "POST", "POST /exports", "/exports", json=body, headers={"Idempotency-Key": key}
            )
            answer = _answer(response, sent)
            if response is not None and response.status_code in (200, 201):
                answer.job_id = response.json()["export"]["id"]
                answer.replayed = bool(response.json().get("replayed"))
            answers.append(answer)
            if response is not None and (response.status_code < 500 or once):
                break
            await asyncio.sleep(retry_after(response))
        return answers

    async def _edit(self, record: ExportRecord, kind: str, list_name: str) -> None:
        assert record.job_id is not None
        job_id = record.job_id
        if_match = '"0"'  # a version that never exists: stale
        if kind != "stale":
            read, _ = await self.api.request("GET", "GET /exports/{id}", f"/exports/{job_id}", job_id=job_id)
            if read is None or read.status_code != 200:
                record.notes.append(f"edit {kind}: could not read the version first")
                return
            if_match = read.headers.get("etag", '"1"')
        seen = self.board.status(job_id)
        for _ in range(3):
            response, _ = await self.api.request(
                "PATCH",
                "PATCH /exports/{id}",
                f"/exports/{job_id}",
                job_id=job_id,
                json={"list_name": list_name},
                headers={"If-Match": if_match},
            )
            version = None
            if response is not None and response.status_code == 200:
                version = response.json()["export"]["version"]
            record.edits.append(
                EditRecord(
                    kind, if_match, list_name, seen, response.status_code if response else None, version
                )
            )
            if response is not None and response.status_code < 500:
                return
            await asyncio.sleep(retry_after(response))

    async def _cancel_at(self, record: ExportRecord, point: str, delay: float, again: str) -> None:
        assert record.job_id is not None
        job_id = record.job_id
        match point:
            case "queued":
                await asyncio.sleep(delay)
            case "building":
                await self.board.wait_for(job_id, {"Running", "Delivering"}, self.hard_deadline)
            case "delivering":
                await self.board.wait_for(job_id, {"Delivering"}, self.hard_deadline)
            case "after_end":
                await self.board.wait_for(job_id, TERMINAL, self.hard_deadline)
        first = await self._cancel(record, point, str(uuid.uuid4()))
        if again == "retry_same":
            await self._cancel(record, "again:retry_same", first.request_id)
        elif again == "second":
            await asyncio.sleep(0.3)
            await self._cancel(record, "again:second", str(uuid.uuid4()))

    async def _cancel(self, record: ExportRecord, point: str, request_id: str) -> CancelRecord:
        """One cancellation request, resubmitted with the same ID after no answer or a 5xx."""
        assert record.job_id is not None
        job_id = record.job_id
        cancel = CancelRecord(request_id, job_id, point, self.board.status(job_id))
        record.cancels.append(cancel)
        while time.monotonic() < self.hard_deadline:
            response, sent = await self.api.request(
                "POST",
                "POST /exports/{id}/cancellations",
                f"/exports/{job_id}/cancellations",
                job_id=job_id,
                json={"request_id": request_id, "reason": f"chaos: {point}"},
            )
            answer = _answer(response, sent)
            cancel.answers.append(answer)
            if response is not None and response.status_code < 500:
                break
            await asyncio.sleep(retry_after(response))
        return cancel

    async def _replace(self, original: ExportRecord, plan: ExportPlan) -> ExportRecord | None:
        assert original.job_id is not None
        replacement = ExportRecord(
            index=plan.index,
            role="replacement",
            list_name=original.list_name,
            replaces=original.job_id,
            overwrite=plan.overwrite,
        )
        body: dict[str, Any] = {"reason": f"chaos: replace after {original.final_status}"}
        if plan.overwrite:
            body["overwrite_agreement_ref"] = f"chaos-agreement-{plan.index}"
        for _ in range(5):
            response, sent = await self.api.request(
                "POST",
                "POST /exports/{id}/replacements",
                f"/exports/{original.job_id}/replacements",
                job_id=original.job_id,
                json=body,
            )
            answer = _answer(response, sent)
            replacement.creates.append(answer)
            if response is not None and response.status_code == 202 and self.approver is not None:
                # asked, waiting for a second person: the second operator approves, and it is created then
                response = await self._approve(response.json()["approval"]["id"], original.job_id)
                if response is not None and response.status_code < 500:
                    replacement.creates.append(_answer(response, sent))
            if response is not None and response.status_code == 201:
                replacement.job_id = response.json()["export"]["id"]
                break
            if response is not None and response.status_code < 500:
                # A retry after a lost answer finds its own replacement live: look it up on the board.
                replacement.job_id = self._replacement_on_board(original.job_id)
                break
            await asyncio.sleep(retry_after(response))
        if replacement.job_id is None:
            replacement.notes.append("no replacement created")
            self.records.append(replacement)
            return None
        self.board.watch(replacement.job_id)
        self.records.append(replacement)
        return replacement

    async def _approve(self, approval_id: str, original_id: str) -> Any:
        """The second operator's approval of a waiting replacement: its answer (201 with the replacement), or
        None when none came (a retry then finds the replacement on the board, or asks again)."""
        assert self.approver is not None
        for _ in range(5):
            response, _sent = await self.approver.request(
                "POST",
                "POST /approvals/{id}/approval",
                f"/approvals/{approval_id}/approval",
                job_id=original_id,
                json={"reason": "chaos: a second operator agrees"},
            )
            if response is not None and response.status_code < 500:
                return response
            await asyncio.sleep(retry_after(response))
        return None

    def _replacement_on_board(self, original_id: str) -> str | None:
        for job_id, row in self.board.jobs.items():
            if row.get("replaces_job_id") == original_id and row.get("status") not in TERMINAL:
                return job_id
        return None


def _answer(response: Any, last: HttpRecord) -> Answer:
    if response is None:
        return Answer(last.t, None, error=last.error)
    body: dict[str, Any] = {}
    try:
        parsed = response.json()
        body = parsed if isinstance(parsed, dict) else {}
    except ValueError:
        pass
    return Answer(
        last.t,
        response.status_code,
        outcome=body.get("outcome"),
        replayed=body.get("replayed"),
        body={k: v for k, v in body.items() if k not in ("timeline", "export", "message")},
    )


def _created_id(answers: list[Answer]) -> str | None:
    for answer in answers:
        if answer.job_id:
            return answer.job_id
    return None


def retry_after(response: Any) -> float:
    """Seconds to wait before a retry: the answer's Retry-After (0.2-5 s), 1 s without one."""
    if response is None:
        return 1.0
    try:
        return min(5.0, max(0.2, float(response.headers.get("retry-after", "1"))))
    except ValueError:
        return 1.0


def _replaceable(record: ExportRecord) -> bool:
    return record.final_status == "OutcomeUnknown" or (
        record.final_status == "Failed" and record.final_failure in REPLACEABLE_CODES
    )
