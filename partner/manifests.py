"""A manifest published last (issue #24.6): each manifest beside a data file already renamed into place.

Each manifest goes up as the data file did: written to a temporary name of its publisher's own
(:func:`domain.evidence.temp_name_for`, opened exclusively), then renamed to its final name with the rename that
never replaces a file (``posix_rename`` only where the data file's own rename overwrote under a recorded
agreement), on the session that renamed the data file. Each publication is one ``manifest`` observation:

- ``published``: this rename put it there;
- ``in_place``: the rename was refused because the name already holds exactly these bytes (an earlier
  publication whose evidence was lost, or the worker and recovery both at it): as good as published;
- ``conflict``: the name holds other bytes: never replaced, and the export is not Completed (a person looks);
- ``refused``: the server refused the write or the rename, and the name does not hold these bytes;
- ``interrupted``: the session was lost on the way (``error`` names the type): recovery tries again.

Only ``published`` and ``in_place`` count towards Completed (migration 0037's ``manifest_in_place``). A manifest is
never a reason to send the data file again: publication starts only once the data file's rename is confirmed.
Blocking (paramiko): run it on a thread.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

import paramiko

from domain.destination import Destination
from domain.evidence import temp_name_for
from domain.manifest import IN_PLACE_RESULTS, MANIFEST_OBSERVATION, ManifestFile
from observability.tracing import SftpStep, set_attributes, sftp_span
from partner.client import SftpStatusError, read_small, session
from partner.evidence import EvidenceLog, error_code

Record = Callable[..., dict[str, Any]]


def publish(
    sftp: paramiko.SFTPClient,
    destination: Destination,
    publisher_id: UUID,
    manifests: Sequence[ManifestFile],
    *,
    overwrite: bool,
    record: Record,
    before_rename: Callable[[ManifestFile], None] | None = None,
) -> bool:
    """Publish ``manifests`` in order on ``sftp``, recording one ``manifest`` observation each through ``record``
    (``EvidenceLog.record``'s signature); stops at the first that is not in place. True when every one is."""
    for manifest in manifests:
        result = _publish_one(sftp, destination, publisher_id, manifest, overwrite, before_rename)
        record(MANIFEST_OBSERVATION, **manifest.evidence(), **result)
        if result["result"] not in IN_PLACE_RESULTS:
            return False
    return True


def _publish_one(
    sftp: paramiko.SFTPClient,
    destination: Destination,
    publisher_id: UUID,
    manifest: ManifestFile,
    overwrite: bool,
    before_rename: Callable[[ManifestFile], None] | None,
) -> dict[str, Any]:
    temp_name = temp_name_for(publisher_id, manifest.name)
    temp = destination.remote_path(temp_name)
    final = destination.remote_path(manifest.name)
    form = "posix_rename" if overwrite else "rename"
    with sftp_span(SftpStep.MANIFEST) as span:
        try:
            with sftp.open(temp, "wx") as remote:
                remote.write(manifest.content)
            if before_rename is not None:
                before_rename(manifest)
            if overwrite:
                sftp.posix_rename(temp, final)
            else:
                # Fails when the name exists: a manifest already there is compared, never replaced.
                sftp.rename(temp, final)
        except SftpStatusError as exc:
            found = _found(sftp, final, manifest)
            if found != "in_place":
                set_attributes(span, status=found)
            with contextlib.suppress(Exception):  # our own temporary name: nothing published by it
                sftp.remove(temp)
            return {"result": found, "temp_name": temp_name, "form": form, "status": exc.status}
        except Exception as exc:  # the session was lost: recovery publishes on a new one
            set_attributes(span, status="interrupted")
            return {"result": "interrupted", "temp_name": temp_name, "form": form, **error_code(exc)}
        return {"result": "published", "temp_name": temp_name, "form": form}


def _found(sftp: paramiko.SFTPClient, final: str, manifest: ManifestFile) -> str:
    """What a refused write or rename leaves under the manifest's name: these bytes, others, or nothing."""
    try:
        held = read_small(sftp, final, limit=len(manifest.content) + 1)
    except Exception:  # noqa: BLE001 - unreadable is not "in place"
        return "refused"
    if held is None:
        return "refused"
    return "in_place" if held == manifest.content else "conflict"


def publish_for_recovery(
    destination: Destination,
    attempt_id: UUID,
    publisher_id: UUID,
    manifests: Sequence[ManifestFile],
    *,
    overwrite: bool,
    connect_timeout: float = 15.0,
    io_timeout: float = 60.0,
) -> list[dict[str, Any]]:
    """Recovery's publication of an attempt's manifests once its data file is proven in place, on a new
    session, under ``publisher_id``'s temporary names (recovery's own, never the attempt's: a paused worker may
    still be writing its own). The data file is never touched. Returns the ``manifest`` observations; never
    raises: a partner that cannot be asked is one ``interrupted`` observation with the error's type."""
    evidence = EvidenceLog(attempt_id, destination.id, lambda item: None)
    try:
        with session(destination, timeout=connect_timeout, io_timeout=io_timeout) as opened:
            publish(
                opened.sftp, destination, publisher_id, manifests, overwrite=overwrite, record=evidence.record
            )
    except Exception as exc:  # no session, or cut on it: what was done is kept, then why it stopped
        done = {item.get("name") for item in evidence.records}
        for manifest in manifests:
            if manifest.name not in done:
                evidence.record(
                    MANIFEST_OBSERVATION, **manifest.evidence(), result="interrupted", **error_code(exc)
                )
                break
    return evidence.records
