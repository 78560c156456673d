"""The one error of the encoding stages: a code and a detail made of codes, never data, keys or passphrases."""

from __future__ import annotations


class EncodingError(Exception):
    """Encoding the file failed; ``code`` names why (``RecipientKeyUnusable``, ``SigningKeyUnavailable``,
    ``SigningKeyTooOpen``, ``SigningKeyLocked``, ``GpgMissing``, ``OpenPgpFailed``, ``WriteFailed``, ...).

    The detail carries exit codes, GnuPG status keywords and OS error names only: no contact data, no key
    material, no passphrase and no user ID ever appears in it.
    """

    def __init__(self, code: str, detail: str = "") -> None:
        super().__init__(f"{code}: {detail}" if detail else code)
        self.code = code
        self.detail = detail


class EncodingStopped(Exception):
    """The caller asked the stages to stop (a cancelled build) while they waited."""
