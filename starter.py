"""The command line: migrate the database, create/edit/cancel/replace/reconcile/correct exports, ask, serve, demo.

``python starter.py --help`` lists the commands. Exit codes: 0 success, 1 refusal, 75 retryable Busy, 2 usage.
"""

from __future__ import annotations

import argparse
import json
import sys

from settings import Settings

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_BUSY = 75


def _print(args: argparse.Namespace, payload: dict, text: str) -> None:
    if args.json:
        print(json.dumps(payload, default=str))
    else:
        print(text)


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply every pending migration to ``EXPORTS_DATABASE_URL`` (idempotent)."""
    from db.migrate import migrate

    if not settings.database_url:
        print("EXPORTS_DATABASE_URL is not set", file=sys.stderr)
        return EXIT_USAGE
    applied = migrate(settings.database_url)
    _print(
        args,
        {"applied": applied},
        f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied else "already up to date",
    )
    return EXIT_OK


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with one subcommand per operation."""
    parser = argparse.ArgumentParser(prog="starter.py", description=__doc__)
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    commands = parser.add_subparsers(dest="command", required=True)
    migrate = commands.add_parser("migrate", help="apply migrations to EXPORTS_DATABASE_URL")
    migrate.set_defaults(handler=cmd_migrate)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build the settings and run one command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    settings = Settings()
    return args.handler(args, settings)


if __name__ == "__main__":
    sys.exit(main())
