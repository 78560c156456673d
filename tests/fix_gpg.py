"""OpenPGP identities for every test (a plugin of ``tests/conftest.py``): two partners and a tenant, each in
its own temporary GNUPGHOME with Debian's ``gpg``, generated for the session and never committed."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from testbed.gpg import GpgIdentity, gpg_available


@pytest.fixture(scope="session")
def gpg_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gpg")


def _identity(root: Path, user_id: str) -> Iterator[GpgIdentity]:
    from tests.conftest import require  # the plugin is loaded by tests/conftest.py itself

    require(gpg_available(), "Debian's gnupg (gpg)")
    identity = GpgIdentity.generate(user_id, root)
    yield identity
    identity.close()


@pytest.fixture(scope="session")
def partner_key(gpg_root: Path) -> Iterator[GpgIdentity]:
    """The partner's key pair: its public key goes on the destination, its home decrypts."""
    yield from _identity(gpg_root, "Partner A <files@partner-a.example>")


@pytest.fixture(scope="session")
def second_partner_key(gpg_root: Path) -> Iterator[GpgIdentity]:
    """A second recipient (the partner's other team, or its escrow key)."""
    yield from _identity(gpg_root, "Partner B <files@partner-b.example>")


@pytest.fixture(scope="session")
def tenant_key(
    gpg_root: Path, partner_key: GpgIdentity, second_partner_key: GpgIdentity
) -> Iterator[GpgIdentity]:
    """The tenant's signing key; both partners hold its public key to verify."""
    for identity in _identity(gpg_root, "Acme CRM exports <exports@acme.example>"):
        partner_key.import_public(identity)
        second_partner_key.import_public(identity)
        yield identity
