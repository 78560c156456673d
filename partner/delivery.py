"""The irreversible half of an export: put the file on the partner's SFTP server, by evidence.

One call of :func:`deliver` is one attempt's upload, never repeated: over the session the attempt opened and
verified before cutoff 2 (or, when that one died meanwhile, a new one, whose host key is checked against the
pinned ones again); list the final name (the baseline, recorded before anything is uploaded); apply the
occupied-name rules; upload under a temporary name that carries the attempt ID, opened exclusively;
rename with the form that fails when the final name exists (``posix_rename`` only for a replacement
with a recorded overwrite agreement); read back what the server and the contract can confirm; and
classify (:mod:`rules.delivery`). Every observation goes to ``on_evidence`` as it is made
(:mod:`partner.evidence`). Blocking: run it with ``asyncio.to_thread``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import paramiko
from paramiko.sftp import SFTP_NO_SUCH_FILE

from domain.destination import Destination
from domain.evidence import (
    Ack,
    DeliveryReport,
    FileToDeliver,
    Observation,
    OriginalFile,
    SetAside,
    set_aside_name_for,
    temp_name_for,
)
from domain.models import DeliveryOutcome, FailureCode
from observability.tracing import SftpStep, set_attributes, sftp_span
from partner import manifests
from partner.client import (
    ConnectRefused,
    PartnerSession,
    SftpStatusError,
    read_sha256,
    read_small,
    session,
    stat_or_none,
    upload_exclusive,
)
from partner.evidence import EvidenceLog, error_code
from partner.protocol import DeliveryHooks
from rules import delivery as classifier
from rules.delivery import completed, failed, unknown

__all__ = [
    "DeliveryHooks",
    "DeliveryReport",
    "FileToDeliver",
    "Observation",
    "OriginalFile",
    "SetAside",
    "deliver",
    "observe_final_name",
    "remove_temporary_files",
    "set_aside",
    "set_aside_for_recovery",
]

log = logging.getLogger("fenced.partner")

_ACK_POLL_SECONDS = 0.1
CONNECT_TRIES = 3  # sessions a delivery tries to open before Failed NotDelivered (nothing is sent before one)
CONNECT_RETRY_SECONDS = 1.0  # the pause before the next, times the tries so far
RETRIED_CONNECT_CODES = frozenset({"Unreachable", "HandshakeFailed", "LinkLost"})
READ_BACK_TRIES = 3  # new sessions asked for the read-back a confirmed rename's cut read-back left
READ_BACK_RETRY_SECONDS = 0.5  # the pause before each, times the tries so far


class _NothingSentYet(Exception):
    """The session was lost before anything was uploaded (at the baseline listing): try a new one."""


def deliver(
    destination: Destination,
    file: FileToDeliver,
    attempt_id: UUID,
    *,
    original: OriginalFile | None,
    overwrite_agreed: bool,
    on_evidence: Callable[[dict[str, Any]], None],
    hooks: DeliveryHooks | None = None,
    ack_wait: float = 30.0,
    connect_timeout: float = 15.0,
    io_timeout: float = 60.0,
    kept: PartnerSession | None = None,
) -> DeliveryReport:
    """Upload ``file`` for ``attempt_id`` and classify what happened; never raises for a delivery problem.

    ``original`` is the original job's expected file when this job is a replacement (``None`` for an
    original); ``overwrite_agreed`` is true only when the replacement's ``overwrite_agreement_ref`` is
    set. ``ack_wait`` bounds the wait for the partner's acknowledgment under an ``ack_file`` contract.
    ``kept`` is the session the attempt opened and verified before cutoff 2: the upload goes over it, and
    this call closes it; one that died meanwhile is recorded and a new session is opened (its host key
    checked again: a key that matches none now sends nothing and ends Failed NotDelivered).
    The report's ``evidence`` repeats every dict given to ``on_evidence``, the final ``outcome`` last.
    """
    run = _Delivery(
        destination=destination,
        file=file,
        attempt_id=attempt_id,
        original=original,
        overwrite_agreed=overwrite_agreed,
        evidence=EvidenceLog(attempt_id, destination.id, on_evidence),
        hooks=hooks or DeliveryHooks(),
        ack_wait=ack_wait,
    )
    # Two budgets: connects not answered, and sessions lost before the baseline listing answered. Nothing
    # is uploaded before the baseline, so each is just a new session; a partner link that flaps twice in a
    # few seconds (the soak's cuts) spends one of each, not three of one.
    unanswered = lost = 0
    try:
        while True:
            try:
                if kept is not None:
                    opened, kept = kept, None
                    with contextlib.closing(opened):
                        if opened.alive():
                            run.connected(opened, kept=True)
                            report = run.deliver_over(opened)
                            break
                        # It died while cutoff 2 ran (a cut link, a server that dropped it): nothing was sent
                        # over it, so a new session, verified again, is as good.
                        run.evidence.record("connect", result="kept_session_lost")
                with session(destination, timeout=connect_timeout, io_timeout=io_timeout) as opened:
                    run.connected(opened)
                    report = run.deliver_over(opened)
                break
            except ConnectRefused as exc:
                # Only connect raises this: no session, nothing sent. A partner that did not answer this
                # once (a cut link, a restart) is asked again; a key or a login it refused is final.
                unanswered += 1
                if exc.code not in RETRIED_CONNECT_CODES or unanswered == CONNECT_TRIES:
                    raise
                run.evidence.record("connect", result="retry", **error_code(exc))
                time.sleep(CONNECT_RETRY_SECONDS * unanswered)
            except _NothingSentYet:
                # The session was lost before the baseline listing answered: nothing was uploaded, so a new
                # session is as good as the first, as when the connect itself was not answered.
                lost += 1
                if lost == CONNECT_TRIES:
                    report = run._end(
                        failed(
                            FailureCode.NOT_DELIVERED,
                            f"the session was lost at the baseline listing {CONNECT_TRIES} times; "
                            "nothing was uploaded",
                        )
                    )
                    break
                time.sleep(CONNECT_RETRY_SECONDS * lost)
    except ConnectRefused as exc:
        presented = {"presented": exc.presented} if exc.presented else {}
        run.evidence.record("connect", result="refused", **error_code(exc), **presented)
        why = exc.code if not exc.presented else f"{exc.code}: presented {exc.presented}"
        report = failed(FailureCode.NOT_DELIVERED, f"no SFTP session opened ({why}); nothing was sent")
    except Exception as exc:  # closing the session failed after the outcome was known, or a bug
        report = run.report or unknown(f"delivery ended unexpectedly ({type(exc).__name__})")
        run.evidence.record("interrupted", phase=run.phase, rename_sent=run.rename_sent, **error_code(exc))
    if run.interrupted_before_rename is not None and not run.rename_sent:
        report = run.confirm_never_renamed(connect_timeout, io_timeout)
    elif run.read_back_cut:
        report = run.read_back_again(connect_timeout, io_timeout, READ_BACK_TRIES)
    elif run.rename_unanswered:
        report = run.settle_lost_rename(connect_timeout, io_timeout, READ_BACK_TRIES)
    run.evidence.record(
        "outcome",
        outcome=report.outcome.value,
        failure_code=report.failure_code.value if report.failure_code else None,
        summary=report.summary,
        rename_sent=run.rename_sent,  # False: this attempt never sent a rename, so never wrote the final name
    )
    log.info(
        "delivery classified",
        extra={
            "attempt_id": str(attempt_id),
            "destination_id": str(destination.id),
            "outcome": report.outcome.value,
            "failure_code": report.failure_code.value if report.failure_code else None,
        },
    )
    return report.model_copy(update={"evidence": list(run.evidence.records)})


def observe_final_name(
    destination: Destination, final_name: str, *, connect_timeout: float = 15.0, io_timeout: float = 60.0
) -> Observation:
    """What the partner's server shows under ``final_name`` now, as its contract allows (for recovery).

    Lists the name; reads the file back for its SHA-256 under a ``read_back`` contract; reads the
    acknowledgment under an ``ack_file`` contract. Raises :class:`partner.client.ConnectRefused` or the
    SFTP error when the server cannot be asked.
    """
    with (
        sftp_span(SftpStep.OBSERVE),
        session(destination, timeout=connect_timeout, io_timeout=io_timeout) as opened,
    ):
        return observe(opened.sftp, destination, final_name)


def remove_temporary_files(
    destination: Destination,
    attempt_id: UUID,
    final_name: str,
    *,
    connect_timeout: float = 15.0,
    io_timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Remove ``attempt_id``'s temporary and set-aside files for ``final_name``, under a cleanup agreement
    (``destination.temporary_files == "remove"``) and only once its export is recorded Failed: partial
    contact data the partner would otherwise keep. Nothing of them was published, and removing them can
    publish nothing; the final name is never touched. Returns one ``cleanup`` evidence dict per name
    (``removed``, ``absent``, or ``refused`` with its status); never raises: a partner that cannot be asked
    is one ``not_asked`` dict with the error's type, and the files stay, as without the agreement."""
    evidence = EvidenceLog(attempt_id, destination.id, lambda item: None)
    try:
        with (
            sftp_span(SftpStep.CLEANUP),
            session(destination, timeout=connect_timeout, io_timeout=io_timeout) as opened,
        ):
            for name in (temp_name_for(attempt_id, final_name), set_aside_name_for(attempt_id, final_name)):
                try:
                    opened.sftp.remove(destination.remote_path(name))
                except SftpStatusError as exc:
                    result = "absent" if exc.status == SFTP_NO_SUCH_FILE else "refused"
                    evidence.record("cleanup", name=name, result=result, status=exc.status)
                else:
                    evidence.record("cleanup", name=name, result="removed")
    except Exception as exc:  # no session, or cut on it: what was done so far is kept, then why it stopped
        log.info("temporary files of attempt %s not removed (%s)", attempt_id, type(exc).__name__)
        evidence.record("cleanup", result="not_asked", **error_code(exc))
    return evidence.records


def observe(sftp: paramiko.SFTPClient, destination: Destination, final_name: str) -> Observation:
    """List ``final_name`` and read what the contract offers: a read-back hash, an acknowledgment."""
    path = destination.remote_path(final_name)
    attributes = stat_or_none(sftp, path)
    ack = _read_ack(sftp, destination, final_name)
    if attributes is None:
        return Observation(present=False, ack=ack)
    sha256 = None
    if destination.hash_evidence == "read_back":
        _, sha256 = read_sha256(sftp, path)
    return Observation(
        present=True,
        size=attributes.st_size,
        mtime=int(attributes.st_mtime) if attributes.st_mtime is not None else None,
        sha256=sha256,
        ack=ack,
    )


def _read_ack(sftp: paramiko.SFTPClient, destination: Destination, final_name: str) -> dict[str, Any] | None:
    if destination.hash_evidence != "ack_file" or not destination.ack_suffix:
        return None
    raw = read_small(sftp, destination.remote_path(final_name + destination.ack_suffix))
    if raw is None:
        return None
    ack = Ack.parse(raw)
    return ack.as_evidence() if ack is not None else {"format": "unrecognized", "bytes": len(raw)}


def set_aside(
    sftp: paramiko.SFTPClient, destination: Destination, attempt_id: UUID, final_name: str
) -> SetAside:
    """Move ``attempt_id``'s temporary file for ``final_name`` to its set-aside name, with the rename that
    never replaces a file. Rename is atomic on a server that publishes by rename, so of this move and a
    rename of the temporary name to the final name exactly one moves the file: once this one has, that
    rename can never publish it. Used by the worker after a lost rename answer, and by recovery."""
    name = set_aside_name_for(attempt_id, final_name)
    temp = destination.remote_path(temp_name_for(attempt_id, final_name))
    try:
        sftp.rename(temp, destination.remote_path(name))
    except SftpStatusError as exc:
        # Servers differ in the status: OpenSSH says no such file for a missing temporary file; asyncssh
        # first refuses an existing target (failure). What the two names hold says which case it is.
        found = stat_or_none(sftp, destination.remote_path(name))
        if found is not None and stat_or_none(sftp, temp) is None:
            return SetAside(name, "already_moved", status=exc.status, size=found.st_size)
        if found is None and exc.status == SFTP_NO_SUCH_FILE:
            return SetAside(name, "gone", status=exc.status)
        return SetAside(name, "refused", status=exc.status)
    return SetAside(name, "ok")


def set_aside_for_recovery(
    destination: Destination,
    attempt_id: UUID,
    final_name: str,
    *,
    connect_timeout: float = 15.0,
    io_timeout: float = 60.0,
) -> tuple[SetAside, Observation]:
    """Recovery's move of an expired attempt's temporary file to its set-aside name, then what the final
    name shows, on one session. Raises like :func:`observe_final_name` when the server cannot be asked."""
    with session(destination, timeout=connect_timeout, io_timeout=io_timeout) as opened:
        with sftp_span(SftpStep.SET_ASIDE) as span:
            aside = set_aside(opened.sftp, destination, attempt_id, final_name)
            set_attributes(span, status=aside.status)
        with sftp_span(SftpStep.OBSERVE):
            after = observe(opened.sftp, destination, final_name)
    return aside, after


@dataclass
class _Delivery:
    """One attempt's delivery, step by step; ``phase`` and ``rename_sent`` say how far it got."""

    destination: Destination
    file: FileToDeliver
    attempt_id: UUID
    original: OriginalFile | None
    overwrite_agreed: bool
    evidence: EvidenceLog
    hooks: DeliveryHooks
    ack_wait: float
    phase: str = "connect"
    rename_sent: bool = False
    rename_unanswered: bool = False  # sent, and its answer never came
    report: DeliveryReport | None = None
    baseline: Observation | None = None
    interrupted_before_rename: int | None = None  # bytes sent when an upload was cut before its rename
    read_back_cut: bool = False  # the server confirmed the rename, then the read-back was cut
    overwrite: bool = False

    @property
    def final_path(self) -> str:
        return self.destination.remote_path(self.file.final_name)

    @property
    def temp_name(self) -> str:
        return temp_name_for(self.attempt_id, self.file.final_name)

    def connected(self, opened: PartnerSession, *, kept: bool = False) -> None:
        # ``kept``: the session opened and verified before cutoff 2 (a new one says "new").
        self.evidence.record(
            "connect",
            result="ok",
            host_key=opened.host_key_fingerprint,
            cipher=opened.cipher,
            session="verified before cutoff 2" if kept else "new",
        )

    def deliver_over(self, opened: PartnerSession) -> DeliveryReport:
        """The steps after connecting; each returns early with its classified report."""
        sftp = opened.sftp
        self.phase = "baseline"
        try:
            with sftp_span(SftpStep.LIST):
                baseline = observe(sftp, self.destination, self.file.final_name)
        except Exception as exc:
            self.evidence.record("interrupted", phase=self.phase, rename_sent=False, **error_code(exc))
            if not isinstance(exc, SftpStatusError):
                raise _NothingSentYet from exc  # the session was lost: deliver() opens another
            return self._end(  # the server answered, and refused: another session would hear the same
                failed(FailureCode.NOT_DELIVERED, "baseline listing refused; nothing was uploaded")
            )
        self.evidence.record("baseline", final_name=self.file.final_name, **baseline.as_evidence())
        self.baseline = baseline
        _call(self.hooks.after_listing)

        overwrite = False
        if baseline.present:
            decision = classifier.decide_occupied(
                baseline, self.original, self.destination, self.overwrite_agreed
            )
            self.evidence.record(
                "final_name_occupied",
                replacement=self.original is not None,
                identified_by=decision.identified_by,
                overwrite=decision.overwrite,
            )
            if decision.report is not None:
                return self._end(decision.report)
            overwrite = True

        with sftp_span(SftpStep.UPLOAD, bytes=self.file.size) as span:
            uploaded = self._upload(sftp, baseline)
            _ended(span, uploaded)
        if uploaded is not None:
            return self._end(uploaded)
        self.overwrite = overwrite  # before the rename: a lost answer is settled under the same rules
        with sftp_span(SftpStep.RENAME) as span:
            renamed = self._rename(sftp, baseline, overwrite)
            _ended(span, renamed)
        if renamed is not None:
            return self._end(renamed)
        with sftp_span(SftpStep.READ_BACK) as span:
            confirmed = self._read_back(sftp, overwrite)
            _ended(span, confirmed)
        return self._end(confirmed)

    def _upload(self, sftp: paramiko.SFTPClient, baseline: Observation) -> DeliveryReport | None:
        """Upload under the temporary name; a report when the attempt ends here, else ``None``."""
        self.phase = "upload"
        temp_path = self.destination.remote_path(self.temp_name)
        progress = {"sent": 0}

        def after_write(sent: int) -> None:
            progress["sent"] = sent
            _call(self.hooks.during_upload, sent)

        try:
            sent = upload_exclusive(
                sftp,
                self.file.path,
                temp_path,
                write_request=self.destination.max_write_request,
                after_write=after_write,
            )
            remote = stat_or_none(sftp, temp_path)
        except SftpStatusError as exc:
            self.evidence.record(
                "upload",
                result="refused",
                temp_name=self.temp_name,
                bytes_sent=progress["sent"],
                status=exc.status,
                # the partner said it has no room (a quota, a full disk): rules/retries.py tries again later
                **({"no_space": True} if exc.no_space else {}),
            )
            return self._refused_before_rename(f"upload refused (status {exc.status})", sftp, baseline)
        except Exception as exc:
            self.evidence.record(
                "interrupted",
                phase=self.phase,
                temp_name=self.temp_name,
                bytes_sent=progress["sent"],
                rename_sent=False,
                **error_code(exc),
            )
            # Settled after the session closes, by a fresh listing on a new one (confirm_never_renamed).
            self.interrupted_before_rename = progress["sent"]
            return unknown(f"upload interrupted after {progress['sent']} bytes; the rename was never sent")
        remote_size = remote.st_size if remote is not None else None
        self.evidence.record(
            "upload", result="ok", temp_name=self.temp_name, bytes_sent=sent, remote_size=remote_size
        )
        if remote_size != self.file.size:
            return self._refused_before_rename(
                f"upload incomplete (the temporary file holds {remote_size} of {self.file.size} bytes)",
                sftp,
                baseline,
            )
        return None

    def _rename(
        self, sftp: paramiko.SFTPClient, baseline: Observation, overwrite: bool
    ) -> DeliveryReport | None:
        """Publish the temporary file under the final name; a report when the attempt ends here."""
        self.phase = "rename"
        form = "posix_rename" if overwrite else "rename"
        temp_path = self.destination.remote_path(self.temp_name)
        if not self._rename_authorized():
            self.evidence.record("rename", form=form, result="not_authorized")
            return failed(
                FailureCode.NOT_DELIVERED,
                "the rename fence was refused: the rename was never sent, so this attempt never wrote the "
                "final name",
            )
        try:
            _call(self.hooks.before_rename)
            self.rename_sent = True
            if overwrite:
                sftp.posix_rename(temp_path, self.final_path)
            else:
                # Fails when the final name exists, so a file that appeared since the listing is never replaced.
                sftp.rename(temp_path, self.final_path)
        except SftpStatusError as exc:
            self.evidence.record("rename", form=form, result="refused", status=exc.status)
            return self._after_refusal(form, exc.status, sftp, baseline)
        except Exception as exc:
            self.evidence.record("rename", form=form, result="no_answer", **error_code(exc))
            # Settled after the session closes, on a new one (settle_lost_rename).
            self.rename_unanswered = True
            return unknown(f"{form} sent but its answer never came; the final name may have been written")
        self.evidence.record("rename", form=form, result="ok")
        _call(self.hooks.after_rename)
        return None

    def _rename_authorized(self) -> bool:
        """The rename fence, asked right before the rename: anything but a plain True means no rename."""
        if self.hooks.authorize_rename is None:
            return True
        try:
            return self.hooks.authorize_rename() is True
        except Exception as exc:
            self.evidence.record("interrupted", phase="rename_fence", rename_sent=False, **error_code(exc))
            return False

    def confirm_never_renamed(self, connect_timeout: float, io_timeout: float) -> DeliveryReport:
        """An upload cut before its rename fence (the session dropped): the rename request was never sent, so
        this attempt never wrote the final name, and the fences prove it (Failed NotDelivered,
        :func:`rules.delivery.never_renamed`). A fresh listing on a new session is still taken and kept as
        evidence: a change since the baseline is someone else's write, worth a person's look, not this
        attempt's; when none can be taken the proof stands alone."""
        self.phase = "fresh_listing"
        sent = self.interrupted_before_rename
        if self.baseline is None:
            return self._end(
                failed(FailureCode.NOT_DELIVERED, "interrupted before the baseline; nothing was sent")
            )
        fresh: Observation | None = None
        try:
            with (
                sftp_span(SftpStep.OBSERVE),
                session(self.destination, timeout=connect_timeout, io_timeout=io_timeout) as opened,
            ):
                fresh = observe(opened.sftp, self.destination, self.file.final_name)
        except Exception as exc:
            self.evidence.record("interrupted", phase=self.phase, rename_sent=False, **error_code(exc))
        else:
            self.evidence.record("fresh_listing", final_name=self.file.final_name, **fresh.as_evidence())
        return self._end(
            classifier.never_renamed(f"upload interrupted after {sent} bytes", self.baseline, fresh)
        )

    def read_back_again(self, connect_timeout: float, io_timeout: float, tries: int) -> DeliveryReport:
        """The server confirmed the rename, then the read-back was cut: the evidence is still there to be
        had, so read it back on a new session (a read, never a repeated upload) before leaving the
        outcome to a person. Each try is recorded; the last cut leaves OutcomeUnknown as before."""

        def read_back(sftp: paramiko.SFTPClient) -> DeliveryReport:
            with sftp_span(SftpStep.READ_BACK) as span:
                report = self._read_back(sftp, self.overwrite)
                _ended(span, report)
            return report

        report = self.report or unknown("renamed, but the read-back was interrupted")
        return self._on_new_sessions("read_back_again", read_back, report, connect_timeout, io_timeout, tries)

    def _on_new_sessions(
        self,
        phase: str,
        step: Callable[[paramiko.SFTPClient], DeliveryReport],
        report: DeliveryReport,
        connect_timeout: float,
        io_timeout: float,
        tries: int,
    ) -> DeliveryReport:
        """``step`` on a new session, up to ``tries`` times after a growing pause (the partner's, to come
        back): a try with no session, or cut on it, or whose read-back was cut, is recorded and tried again.
        The last report stands (``report`` when no try got one)."""
        for attempt in range(1, tries + 1):
            time.sleep(READ_BACK_RETRY_SECONDS * attempt)
            try:
                with session(self.destination, timeout=connect_timeout, io_timeout=io_timeout) as opened:
                    report = step(opened.sftp)
            except Exception as exc:  # no session, or cut on it: this try is one more interruption
                self.evidence.record("interrupted", phase=phase, rename_sent=True, **error_code(exc))
                continue
            if not self.read_back_cut:
                break
        return self._end(report)

    def settle_lost_rename(self, connect_timeout: float, io_timeout: float, tries: int) -> DeliveryReport:
        """The rename was sent and its answer lost: it may have published the file, or it may still wait in
        the old session to be carried out. Evidence settles it on a new session (a few tries, each
        recorded; the last failure leaves OutcomeUnknown as before), never a second upload:

        - the final name changed since the baseline: the rename published it, if the read-back shows this
          attempt's file under the contract's rules (Completed), else OutcomeUnknown;
        - the final name still matches the baseline: move the temporary file to a name of its own
          (``set_aside_name_for``). Rename is atomic on a server that publishes by rename, so of the lost
          rename and this one exactly one moves the file: once this one has, the lost one can never publish
          it (Failed NotDelivered, after a listing that still matches the baseline); if the temporary file
          is already gone, the lost rename has happened since the listing: read back.
        """
        report = self.report or unknown("rename sent but its answer never came")
        return self._on_new_sessions(
            "settle_rename", self._settle_rename, report, connect_timeout, io_timeout, tries
        )

    def _settle_rename(self, sftp: paramiko.SFTPClient) -> DeliveryReport:
        self.phase = "settle_rename"
        assert self.baseline is not None  # a rename is sent only after the baseline listing
        with sftp_span(SftpStep.OBSERVE):
            now = observe(sftp, self.destination, self.file.final_name)
        self.evidence.record("fresh_listing", final_name=self.file.final_name, **now.as_evidence())
        if not now.same_as(self.baseline):
            return self._read_back(sftp, self.overwrite)
        with sftp_span(SftpStep.SET_ASIDE) as span:
            aside = set_aside(sftp, self.destination, self.attempt_id, self.file.final_name)
            set_attributes(span, status=aside.status)
        for item in aside.evidence():
            self.evidence.record("set_aside", **item)
        if aside.result == "refused":
            return unknown(
                "rename sent but its answer never came, and the temporary file could not be moved "
                f"away (status {aside.status})"
            )
        if aside.result == "gone":
            # Gone since the listing, and not set aside by an earlier try whose answer was lost too: the
            # lost rename took it, so it published the file, and the read-back says whether.
            return self._read_back(sftp, self.overwrite)
        with sftp_span(SftpStep.OBSERVE):
            fresh = observe(sftp, self.destination, self.file.final_name)
        self.evidence.record("fresh_listing", final_name=self.file.final_name, **fresh.as_evidence())
        if not fresh.same_as(self.baseline):
            return unknown("the temporary file was moved away, but the final name changed since the baseline")
        return failed(
            FailureCode.NOT_DELIVERED,
            f"rename sent but its answer never came; on a new session the final name still matched the "
            f"baseline and the temporary file was moved to {aside.name}, so the lost rename can never "
            "publish it",
        )

    def _read_back(self, sftp: paramiko.SFTPClient, overwrite: bool) -> DeliveryReport:
        """Read back what the server and the contract can confirm, then classify."""
        self.phase = "read_back"
        try:
            after = observe(sftp, self.destination, self.file.final_name)
            self.evidence.record("read_back", final_name=self.file.final_name, **after.as_evidence())
            ack_tied = False
            if self.destination.hash_evidence == "ack_file":
                with sftp_span(SftpStep.ACK_WAIT):
                    after, ack_tied = self._await_ack(sftp, after)
        except Exception as exc:
            self.evidence.record("interrupted", phase=self.phase, rename_sent=True, **error_code(exc))
            self.read_back_cut = True
            return unknown("renamed, but the read-back was interrupted")
        self.read_back_cut = False
        report = classifier.confirm_delivery(
            after, self.file, self.destination, overwrite=overwrite, ack_tied=ack_tied
        )
        if report.outcome == DeliveryOutcome.COMPLETED and self.file.manifests:
            return self._publish_manifests(sftp, report, overwrite)
        return report

    def _publish_manifests(
        self, sftp: paramiko.SFTPClient, confirmed: DeliveryReport, overwrite: bool
    ) -> DeliveryReport:
        """The data file is in place by evidence: publish its manifests last, on this session, by the same
        temporary name and rename (:mod:`partner.manifests`). Completed only once every one is in place; else
        OutcomeUnknown, never a second upload: recovery publishes what is missing (or a person looks, when a
        name holds other bytes)."""
        self.phase = "manifest"
        before = self.hooks.before_manifest_rename
        placed = manifests.publish(
            sftp,
            self.destination,
            self.attempt_id,
            self.file.manifests,
            overwrite=overwrite,
            record=self.evidence.record,
            before_rename=(lambda manifest: before(manifest.name)) if before is not None else None,
        )
        if placed:
            return completed(f"{confirmed.summary}; manifest published last")
        return unknown(
            "the data file is in place by evidence, but its manifest is not (published by recovery)"
        )

    def _await_ack(self, sftp: paramiko.SFTPClient, after: Observation) -> tuple[Observation, bool]:
        """Wait up to ``ack_wait`` for the partner's acknowledgment of this upload; record what was seen."""
        deadline = time.monotonic() + self.ack_wait
        while True:
            ack = after.parsed_ack()
            tied = ack is not None and ack.acknowledges(
                self.file.final_name, self.file.size, self.file.sha256, self.temp_name
            )
            if tied or time.monotonic() >= deadline:
                self.evidence.record("ack", present=after.ack is not None, tied=tied, ack=after.ack)
                return after, tied
            time.sleep(
                _ACK_POLL_SECONDS
            )  # the partner writes its acknowledgment when it has processed the file
            after = after.model_copy(update={"ack": _read_ack(sftp, self.destination, self.file.final_name)})

    def _refused_before_rename(
        self, what: str, sftp: paramiko.SFTPClient, baseline: Observation
    ) -> DeliveryReport:
        """The server refused the upload to the temporary name (``what``), before the rename fence: the rename
        was never sent, so the fences prove NotDelivered whatever a fresh listing shows, and whether or not
        one can be taken on this session (a partner whose quota is full may drop it). The listing is taken
        all the same, as evidence (:func:`rules.delivery.never_renamed`)."""
        return classifier.never_renamed(what, baseline, self._fresh_listing(sftp))

    def _after_refusal(
        self, step: str, status: int | None, sftp: paramiko.SFTPClient, baseline: Observation
    ) -> DeliveryReport:
        """The server refused the rename ``step`` with the connection alive. The rename was sent, so only a
        fresh listing that still matches the baseline proves NotDelivered; a listing that shows a change, or
        none at all, leaves OutcomeUnknown."""
        fresh = self._fresh_listing(sftp)
        if fresh is None:
            return unknown(f"{step} refused and the fresh listing failed")
        return classifier.classify_refusal(step, status, baseline, fresh)

    def _fresh_listing(self, sftp: paramiko.SFTPClient) -> Observation | None:
        """List the final name again on this session and record it; ``None`` (recorded too) when it failed."""
        try:
            with sftp_span(SftpStep.OBSERVE):
                fresh = observe(sftp, self.destination, self.file.final_name)
        except Exception as exc:
            self.evidence.record(
                "interrupted", phase="fresh_listing", rename_sent=self.rename_sent, **error_code(exc)
            )
            return None
        self.evidence.record("fresh_listing", final_name=self.file.final_name, **fresh.as_evidence())
        return fresh

    def _end(self, report: DeliveryReport) -> DeliveryReport:
        self.report = report
        return report


def _ended(span: Any, report: DeliveryReport | None) -> None:
    """A step that ended the attempt says how, on its span (outcome and failure code only)."""
    if report is not None:
        set_attributes(
            span,
            outcome=report.outcome.value,
            failure_code=report.failure_code.value if report.failure_code else None,
        )


def _call(hook: Callable[..., None] | None, *args: Any) -> None:
    if hook is not None:
        hook(*args)
