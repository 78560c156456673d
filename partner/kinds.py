"""The registry of partner kinds: :func:`partner_for` picks a destination's :class:`Partner` by its
``kind``. The worker imports it and injects it; activities/ and rules/ never do (an import-linter
contract), so only this module knows which kinds exist."""

from __future__ import annotations

from domain.destination import Destination
from partner import sftp
from partner.protocol import Partner

_KINDS: dict[str, Partner] = {sftp.KIND: sftp.SftpPartner()}


class UnknownPartnerKind(ValueError):
    """A destination names a kind no module implements."""


def partner_for(destination: Destination) -> Partner:
    """The partner that serves ``destination``'s kind; raises :class:`UnknownPartnerKind` for none."""
    try:
        return _KINDS[destination.kind]
    except KeyError:
        raise UnknownPartnerKind(f"no partner implements destination kind {destination.kind!r}") from None
