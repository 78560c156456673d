"""The real SFTP servers for the partner tests come from ``tests/fix_sftp.py`` (a plugin of tests/conftest.py)."""
