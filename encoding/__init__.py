"""What the partner receives, after ``COPY``: gzip and OpenPGP stages that hash as they write.

``open_file_writer`` takes a destination's ``FileFormat`` (``domain/``) and a path; the builder
(``db/builder.py``) feeds it the CSV that ``COPY`` shapes (header, delimiter, columns) and records what
``finish`` returns. OpenPGP is Debian's ``gpg`` in a subprocess fed by a pipe (``encoding.openpgp``: why,
by measurement). This package imports ``domain/`` and its libraries only (an import contract).
"""

from encoding.errors import EncodingError, EncodingStopped
from encoding.pipeline import EncodedFile, FileWriter, open_file_writer

__all__ = ["EncodedFile", "EncodingError", "EncodingStopped", "FileWriter", "open_file_writer"]
