"""The partner seam: what activities and recovery ask of a destination's server, whatever its kind.

A :class:`Partner` opens and verifies a session (before cutoff 2, issue #24.4), delivers one attempt's file
over it (or over a new one), observes a final name, sets an attempt's temporary file aside, removes
temporaries, and tests a connection without trusting it (issue #24.3); the values it exchanges
(:class:`FileToDeliver`, :class:`OriginalFile`, :class:`DeliveryReport`, :class:`Observation`,
:class:`SetAside`, :class:`DeliveryHooks`, :class:`ConnectionReport`, :class:`PartnerSession`,
:class:`PartnerRefused`) live here and in :mod:`domain.evidence`, free of any transport library. Every method
blocks: run it on a thread. The worker picks a destination's partner with :func:`partner.kinds.partner_for`
and injects it, so activities/ and rules/ never import a kind's module.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from uuid import UUID

from domain.destination import Destination
from domain.evidence import (
    ConnectionReport,
    DeliveryReport,
    FileToDeliver,
    Observation,
    OriginalFile,
    SetAside,
)
from domain.manifest import ManifestFile

__all__ = [
    "TRUST_REFUSALS",
    "ConnectionReport",
    "DeliveryHooks",
    "DeliveryReport",
    "FileToDeliver",
    "Observation",
    "OriginalFile",
    "Partner",
    "PartnerFor",
    "PartnerRefused",
    "PartnerSession",
    "SetAside",
]

# Refusals that say this destination must not be used until a person looks: the server presented a host key
# none of the pinned ones match, or it refused our login. Before cutoff 2 they pause the destination.
TRUST_REFUSALS = frozenset({"HostKeyMismatch", "AuthRefused"})


class PartnerRefused(Exception):
    """No session was opened, so nothing was sent to the partner; ``code`` says why (``Unreachable``,
    ``HandshakeFailed``, ``HostKeyMismatch``, ``AuthRefused``, ``Credential*``, ...). ``presented`` is the
    ``SHA256:`` fingerprint of the host key the server presented, when it got that far: evidence, never key
    material beyond a public key's hash."""

    def __init__(self, code: str, detail: str = "", *, presented: str | None = None) -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.presented = presented


class PartnerSession(Protocol):
    """An open, verified session with a partner (its host key matched a pinned one, our login was accepted, the
    remote directory opened): what an attempt keeps from before cutoff 2 to its upload. Whoever holds it
    closes it."""

    @property
    def host_key_fingerprint(self) -> str:
        """The ``SHA256:`` fingerprint of the host key the server presented (one of the pinned ones)."""
        ...

    def alive(self) -> bool:
        """Whether the session still looks usable (its connection has not ended)."""
        ...

    def close(self) -> None:
        """Close it; never raises."""
        ...


@dataclass
class DeliveryHooks:
    """Named seams for tests; each runs in the delivering thread at its point, and may be ``None``."""

    after_listing: Callable[[], None] | None = None
    during_upload: Callable[[int], None] | None = None  # bytes sent so far, after each write
    before_rename: Callable[[], None] | None = None
    after_rename: Callable[[], None] | None = None
    # The rename fence: asked right before the rename request; the rename is sent only when it answers
    # True. False, or an exception, means this attempt may no longer publish: nothing is renamed.
    authorize_rename: Callable[[], bool] | None = None
    # A manifest's temporary file is written, its rename not yet sent (its final name is given; issue #24.6).
    before_manifest_rename: Callable[[str], None] | None = None


class Partner(Protocol):
    """One kind of partner server (today SFTP): what an attempt, recovery and a connection test ask of it."""

    def open_session(self, destination: Destination) -> PartnerSession:
        """Connect, check the host key the server presents against every pinned one, log in and open the
        remote directory; raises :class:`PartnerRefused` (nothing sent) when any step fails. The session is
        kept alive while it waits (the attempt opens it before cutoff 2 and uploads over it after)."""
        ...

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
        """Upload ``file`` for ``attempt_id`` and classify what happened; never raises for a delivery
        problem. Each observation goes to ``on_evidence`` as it is made. ``session``, when given, is the one
        opened and verified before cutoff 2: the upload uses it (and closes it); if it died meanwhile, a new
        one is opened and verified again."""
        ...

    def test_connection(self, destination: Destination) -> ConnectionReport:
        """What the server presents and allows, without trusting it: never pins a key, offers our login only
        to a server whose key is pinned, creates and removes one temporary name. Never raises."""
        ...

    def observe_final_name(self, destination: Destination, final_name: str) -> Observation:
        """What the server shows under ``final_name`` now, as the contract allows; raises when it cannot
        be asked."""
        ...

    def set_aside_for_recovery(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> tuple[SetAside, Observation]:
        """Move ``attempt_id``'s temporary file aside, then observe the final name; raises when the server
        cannot be asked."""
        ...

    def remove_temporary_files(
        self, destination: Destination, attempt_id: UUID, final_name: str
    ) -> list[dict[str, Any]]:
        """Remove ``attempt_id``'s temporary and set-aside files; one evidence dict per name, never raises."""
        ...

    def publish_manifests(
        self,
        destination: Destination,
        attempt_id: UUID,
        publisher_id: UUID,
        manifests: Sequence[ManifestFile],
        *,
        overwrite: bool,
    ) -> list[dict[str, Any]]:
        """Recovery's publication of ``attempt_id``'s manifests beside its data file, proven in place, under
        ``publisher_id``'s temporary names; one ``manifest`` evidence dict each, never raises, never touches
        the data file."""
        ...


PartnerFor = Callable[[Destination], Partner]
"""Picks the partner of a destination (by its ``kind``): what the worker injects into the activities."""
