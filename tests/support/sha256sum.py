"""The partner's own check of a ``.sha256`` sidecar: the real coreutils ``sha256sum -c``, run in the directory the
file landed in (issue #24.6)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def sha256sum_check(directory: Path, sidecar: str) -> subprocess.CompletedProcess[str]:
    """``sha256sum -c <sidecar>`` in ``directory``, as a partner runs it; its exit code and output."""
    binary = shutil.which("sha256sum")
    assert binary is not None, "coreutils' sha256sum is part of every Debian image"
    return subprocess.run([binary, "-c", sidecar], cwd=directory, capture_output=True, text=True, check=False)
