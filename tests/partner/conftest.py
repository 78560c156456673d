"""The real SFTP servers for the partner tests (see tests/support/sftp.py)."""

from tests.support.sftp import (  # noqa: F401 - fixtures, found by pytest by name
    local_sftp_server,
    sftp_server,
    sftp_target,
    sshd_server,
    sshd_target,
)
