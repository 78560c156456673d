"""What the partner receives: the CSV's shape, its compression and its OpenPGP layer (issue #24, item 5).

A destination's format is one value, read from its row (``Destination.file_format``). The builder streams
``COPY`` into CSV of this shape, then gzip, then OpenPGP, and the final name's suffix says which layers the
file has, so the name is still a function of the delivery key and the destination's row alone.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

ContactColumn = Literal["email", "first_name", "last_name"]
"""A column of ``contacts`` a partner may receive (migration 0020 checks the same list)."""

CONTACT_COLUMNS: tuple[ContactColumn, ...] = ("email", "first_name", "last_name")

Delimiter = Literal[",", ";", "|", "\t"]
Compression = Literal["none", "gzip"]

ARMORED_PUBLIC_KEY = "-----BEGIN PGP PUBLIC KEY BLOCK-----"


class FileFormat(BaseModel):
    """The file a destination receives.

    ``header`` (a first line naming the columns), ``delimiter`` and ``columns`` (which contact columns, in
    which order) shape the CSV; ``compression`` is ``none`` or ``gzip``. ``recipient_keys`` are the
    partner's OpenPGP public keys, ASCII-armored (public keys are not secrets): with any, the file is
    encrypted to every one of them. ``signing_key_ref`` is a reference to the tenant's signing key, never
    the key: the path of its secret key file on the worker host, resolved there when a file is built (as an
    SFTP destination's ``credential_ref``). Either makes the file an OpenPGP message.
    """

    # A validation error never repeats what was given: a "public key" may be a secret one pasted by mistake.
    model_config = ConfigDict(frozen=True, hide_input_in_errors=True)

    header: bool = True
    delimiter: Delimiter = ","
    columns: tuple[ContactColumn, ...] = CONTACT_COLUMNS
    compression: Compression = "none"
    recipient_keys: tuple[str, ...] = Field(default=(), repr=False)
    signing_key_ref: str | None = Field(default=None, repr=False)

    @field_validator("columns")
    @classmethod
    def _distinct_columns(cls, value: tuple[ContactColumn, ...]) -> tuple[ContactColumn, ...]:
        if not value:
            raise ValueError("a file needs at least one column")
        if len(set(value)) != len(value):
            raise ValueError("a column appears twice")
        return value

    @field_validator("recipient_keys")
    @classmethod
    def _armored_public_keys(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for key in value:
            # Never a secret key by mistake, and never echo what was given (it may be one).
            if not key.lstrip().startswith(ARMORED_PUBLIC_KEY) or "PRIVATE KEY" in key:
                raise ValueError("a recipient key must be an ASCII-armored OpenPGP public key block")
        return value

    @property
    def encrypted(self) -> bool:
        """Encrypted to the partner's keys."""
        return bool(self.recipient_keys)

    @property
    def signed(self) -> bool:
        """Signed with the tenant's key."""
        return self.signing_key_ref is not None

    @property
    def openpgp(self) -> bool:
        """The file is an OpenPGP message (encrypted, signed, or both)."""
        return self.encrypted or self.signed

    @property
    def plain(self) -> bool:
        """The file is the CSV itself: what is hashed for the partner is what COPY wrote."""
        return self.compression == "none" and not self.openpgp

    @property
    def inner_suffix(self) -> str:
        """The suffix of the data inside the OpenPGP layer (the literal data's name)."""
        return ".csv.gz" if self.compression == "gzip" else ".csv"

    @property
    def suffix(self) -> str:
        """``.csv``, ``.csv.gz``, ``.csv.pgp`` or ``.csv.gz.pgp``."""
        return self.inner_suffix + (".pgp" if self.openpgp else "")

    def describe(self) -> dict[str, object]:
        """The format as evidence: its shape and layers, never the keys themselves or the reference."""
        return {
            "header": self.header,
            "delimiter": self.delimiter,
            "columns": list(self.columns),
            "compression": self.compression,
            "encrypted": self.encrypted,
            "signed": self.signed,
        }
