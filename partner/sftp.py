"""The SFTP kind of partner: :class:`SftpPartner` implements :class:`partner.protocol.Partner` with the
paramiko code of :mod:`partner.delivery` and :mod:`partner.client`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any
from uuid import UUID

from domain.destination import Destination
from domain.manifest import ManifestFile
from partner import client, delivery
from partner import manifests as manifests_
from partner.protocol import (
    ConnectionReport,
    DeliveryHooks,
    DeliveryReport,
    FileToDeliver,
    Observation,
    OriginalFile,
    PartnerSession,
    SetAside,
)

KIND = "sftp"


class SftpPartner:
    """A destination reached over SFTP (paramiko), pinned host keys, publish by exclusive rename."""

    def open_session(self, destination: Destination) -> PartnerSession:
        """Connect, match the presented host key against every pinned one, log in, open the remote directory,
        keep it alive (:func:`partner.client.open_verified`); raises ``ConnectRefused``."""
        return client.open_verified(destination)

    def deliver(
        self,
        destination: Destination,
        file: FileToDeliver,
        attempt_id: UUID,
        *,
        original: OriginalFile | None,
        overwrite_agreed: bool,
        on_evidence: Callable[[dict[str, Any]], None],
        hooks: DeliveryHooks | None = None,
        session: PartnerSession | None = None,
    ) -> DeliveryReport:
        """One attempt's upload, classified (:func:`partner.delivery.deliver`), over ``session`` when given."""
        kept = session if isinstance(session, client.PartnerSession) else None
        if session is not None and kept is None:
            session.close()  # not one of ours: never used, never left open
        return delivery.deliver(
            destination,
            file,
            attempt_id,
            original=original,
            overwrite_agreed=overwrite_agreed,
            on_evidence=on_evidence,
            hooks=hooks,
            kept=kept,
        )

    def test_connection(self, destination: Destination) -> ConnectionReport:
        """The connection test without trust (:func:`partner.client.probe`)."""
        return client.probe(destination)

    def observe_final_name(self, destination: Destination, final_name: str) -> Observation:
        """The final name's listing and contract evidence (:func:`partner.delivery.observe_final_name`)."""
        return delivery.observe_final_name(destination, final_name)

    def set_aside_for_recovery(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> tuple[SetAside, Observation]:
        """Recovery's set-aside then listing (:func:`partner.delivery.set_aside_for_recovery`)."""
        return delivery.set_aside_for_recovery(destination, attempt_id, final_name)

    def remove_temporary_files(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> list[dict[str, Any]]:
        """The cleanup agreement's removal (:func:`partner.delivery.remove_temporary_files`)."""
        return delivery.remove_temporary_files(destination, attempt_id, final_name)

    def publish_manifests(
        self,
        destination: Destination,
        attempt_id: UUID,
        publisher_id: UUID,
        manifests: Sequence[ManifestFile],
        *,
        overwrite: bool,
    ) -> list[dict[str, Any]]:
        """Recovery's publication of the manifests (:func:`partner.manifests.publish_for_recovery`)."""
        return manifests_.publish_for_recovery(
            destination, attempt_id, publisher_id, manifests, overwrite=overwrite
        )
