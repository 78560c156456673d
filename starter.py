"""The command line: migrate the database, create/edit/cancel/replace/reconcile/correct exports, ask about
them, serve the API and console, and run the demo.

The export commands talk to PostgreSQL through the same operations as the HTTP API (``EXPORTS_DATABASE_URL``
as a login that may ``SET ROLE`` to ``exports_api``, ``exports_reconciler`` for ``correct`` and
``exports_platform`` for ``pause --global`` / ``resume --global``); they
act for ``--tenant`` (or ``EXPORTS_TENANT``) as ``--as`` (or ``EXPORTS_PRINCIPAL``).

Exit codes: 0 success, 1 refusal (the answer was no, or not found), 75 retryable Busy (retry with the
same request ID), 2 usage. ``--json`` prints the answer's JSON body for scripts.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import getpass
import json
import logging
import sys
import uuid
from collections.abc import Awaitable, Callable
from datetime import date
from typing import Any

from pydantic import ValidationError

from domain.audit import AuditAction, SubjectKind
from domain.file_format import CONTACT_COLUMNS
from domain.manifest import MANIFEST_CHOICES
from service.outcomes import Kind
from service.permissions import ROLES
from settings import Settings

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_USAGE = 2
EXIT_BUSY = 75

# The one table from an operation's outcome to this process's exit code.
EXIT_CODES: dict[Kind, int] = {
    Kind.DONE: EXIT_OK,
    Kind.CREATED: EXIT_OK,
    Kind.ACCEPTED: EXIT_OK,
    Kind.MALFORMED: EXIT_REFUSED,
    Kind.FORBIDDEN: EXIT_REFUSED,
    Kind.NOT_FOUND: EXIT_REFUSED,
    Kind.REFUSED: EXIT_REFUSED,
    Kind.STALE: EXIT_REFUSED,
    Kind.PRECONDITION_REQUIRED: EXIT_USAGE,
    Kind.INVALID: EXIT_USAGE,
    Kind.BUSY: EXIT_BUSY,
    Kind.PARTIAL: EXIT_BUSY,
}


def exit_code_for(kind: Kind) -> int:
    """The process exit code for an operation's outcome (the one table; the API's is in api/routes.py)."""
    return EXIT_CODES[kind]


def _emit(args: argparse.Namespace, payload: dict[str, Any], text: str) -> None:
    if args.json:
        print(json.dumps(payload, default=str, indent=2))
    else:
        print(text)


def _fail_usage(message: str) -> int:
    print(f"starter.py: {message}", file=sys.stderr)
    return EXIT_USAGE


# -- migrate, token, seed-demo (an administrator's connection) ------------------------------------------


def cmd_migrate(args: argparse.Namespace, settings: Settings) -> int:
    """Apply every pending migration to ``EXPORTS_DATABASE_URL`` (idempotent)."""
    from db.migrate import migrate

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")
    applied = migrate(settings.database_url)
    _emit(
        args,
        {"applied": applied},
        f"applied {len(applied)} migration(s): {', '.join(applied)}" if applied else "already up to date",
    )
    return EXIT_OK


def cmd_token(args: argparse.Namespace, settings: Settings) -> int:
    """Mint an API token bound to a tenant, a principal and a role (only its SHA-256 is stored), or with
    ``--revoke`` revoke every token of the principal; recorded in the ledger as ``--as``'s action."""
    from service.audit import current_request_id
    from service.auth import mint_token

    url = args.database_url or settings.database_url
    if not url:
        return _fail_usage("give --database-url (an administrator's) or set EXPORTS_DATABASE_URL")
    from db.admin import PrincipalRefused, revoke_tokens

    if args.revoke:
        revoked = asyncio.run(
            revoke_tokens(
                url,
                tenant_id=args.tenant,
                principal=args.principal,
                revoked_by=args.administrator,
                request_id=current_request_id(),
            )
        )
        _emit(
            args,
            {"revoked": revoked, "tenant_id": args.tenant, "principal": args.principal},
            f"revoked {revoked} token(s) of {args.principal} (their console sessions ended with them)",
        )
        return EXIT_OK if revoked else EXIT_REFUSED
    try:
        token = asyncio.run(
            mint_token(
                url,
                tenant_id=args.tenant,
                principal=args.principal,
                role=args.role,
                minted_by=args.administrator,
                request_id=current_request_id(),
            )
        )
    except PrincipalRefused as exc:
        print(f"starter.py: no token minted: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    _emit(
        args,
        {"token": token, "tenant_id": args.tenant, "principal": args.principal, "role": args.role},
        f"{token}\n(shown once: only its SHA-256 is stored; use it as 'Authorization: Bearer <token>' "
        "or paste it into the console's sign-in)",
    )
    return EXIT_OK


def cmd_seed_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Seed a tenant, a destination and synthetic contacts, and mint an operator and a reconciler token."""
    from db.admin import seed_tenant
    from service.auth import mint_token

    url = args.database_url or settings.database_url
    if not url:
        return _fail_usage("give --database-url (an administrator's) or set EXPORTS_DATABASE_URL")

    async def seed() -> dict[str, Any]:
        seeded = await seed_tenant(
            url,
            tenant_name=args.tenant_name,
            destination_name=args.destination_name,
            destination={
                "host": args.sftp_host,
                "port": args.sftp_port,
                "username": args.sftp_user,
                "host_key": args.host_key,
                "credential_ref": args.credential_ref,
                "remote_dir": args.remote_dir,
                "temporary_files": args.temporary_files,
            },
            contacts=args.contacts,
        )
        operator = await mint_token(url, tenant_id=seeded.tenant_id, principal="sam.ops", role="operator")
        reconciler = await mint_token(
            url, tenant_id=seeded.tenant_id, principal="rita.recon", role="reconciler"
        )
        return {
            "tenant_id": seeded.tenant_id,
            "destination_id": seeded.destination_id,
            "list_name": seeded.list_name,
            "contacts": seeded.contacts,
            "operator_token": operator,
            "reconciler_token": reconciler,
        }

    out = asyncio.run(seed())
    _emit(args, out, "\n".join(f"{k}: {v}" for k, v in out.items()))
    return EXIT_OK


# -- the export operations ------------------------------------------------------------------------------


def _run_operation(
    args: argparse.Namespace,
    settings: Settings,
    call: Callable[[Any, Any], Awaitable[Any]],
    render: Callable[[Any], str] | None = None,
    *,
    role: str = "operator",
) -> int:
    """Run one operation for the caller named on the command line and print its answer."""
    from service.auth import Caller
    from service.exports import open_exports

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")
    if args.tenant is None:
        return _fail_usage("give --tenant or set EXPORTS_TENANT")
    caller = Caller(tenant_id=args.tenant, principal=args.principal, role=role)  # type: ignore[arg-type]

    async def go() -> Any:
        async with open_exports(settings) as ops:
            return await call(ops, caller)

    try:
        answer = asyncio.run(go())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        return _fail_usage(f"invalid input: {problems}")
    payload = {"outcome_kind": answer.kind.value, **answer.body}
    text = render(answer) if render and answer.ok else answer.text
    _emit(args, payload, text)
    return exit_code_for(answer.kind)


def cmd_create(args: argparse.Namespace, settings: Settings) -> int:
    """Create an export; ``--idempotency-key`` makes a retry return the first job."""
    from service.commands import CreateExport

    key = args.idempotency_key or f"cli-{uuid.uuid4()}"

    async def call(ops: Any, caller: Any) -> Any:
        body = CreateExport(destination_id=args.destination, list_name=args.list_name)
        return await ops.create(caller, body, key)

    def render(answer: Any) -> str:
        export = answer.body["export"]
        verb = "already created" if answer.body["replayed"] else "created"
        return (
            f"{verb} export {export['id']} ({export['status']}, v{export['version']}); idempotency key {key}"
        )

    return _run_operation(args, settings, call, render)


def cmd_edit(args: argparse.Namespace, settings: Settings) -> int:
    """Change a queued export's terms for the version you read."""
    from service.commands import EditTerms

    async def call(ops: Any, caller: Any) -> Any:
        body = EditTerms(destination_id=args.destination, list_name=args.list_name)
        return await ops.edit(caller, args.export, body, f'"{args.version}"')

    def render(answer: Any) -> str:
        export = answer.body["export"]
        return f"export {export['id']} now at version {export['version']}: list {export['list_name']!r}"

    return _run_operation(args, settings, call, render)


def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Request cancellation; after Busy, retry with the same ``--request-id`` (printed)."""
    from observability.metrics import CancellationSource
    from service.commands import CancelExport

    request_id = args.request_id or uuid.uuid4()

    async def call(ops: Any, caller: Any) -> Any:
        body = CancelExport(request_id=request_id, reason=args.reason)
        return await ops.cancel(caller, args.export, body, source=CancellationSource.CLI)

    def render(answer: Any) -> str:
        return f"{answer.body['message']}\n(outcome {answer.body['outcome']}, request {request_id})"

    code = _run_operation(args, settings, call, render)
    if code != EXIT_OK and not args.json:
        hint = f"retry with: --request-id {request_id}" if code == EXIT_BUSY else f"(request {request_id})"
        print(hint, file=sys.stderr)
    return code


def cmd_bulk_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel every live export of a destination (or of one list), each through its own request, under one
    batch ID; exit 75 when some were Busy: retry with the same ``--batch-id`` (printed)."""
    from observability.metrics import CancellationSource
    from service.commands import BulkCancel

    batch_id = args.batch_id or uuid.uuid4()

    async def call(ops: Any, caller: Any) -> Any:
        destination_id = args.destination
        if destination_id is None:
            names = await ops.destination_names(caller.tenant_id)
            matches = [d for d, name in names.items() if name == args.destination_name]
            if len(matches) != 1:
                from service.outcomes import Kind, refusal

                return refusal(
                    Kind.INVALID, f"--destination-name: no single destination {args.destination_name!r}"
                )
            destination_id = matches[0]
        if args.dry_run:
            return await ops.bulk_cancel_preview(caller, destination_id, args.list_name)
        body = BulkCancel(
            batch_id=batch_id,
            destination_id=destination_id,
            list_name=args.list_name,
            reason=args.reason,
            preview_token=args.preview,
        )
        return await ops.bulk_cancel(caller, body, source=CancellationSource.CLI)

    def render(answer: Any) -> str:
        if args.dry_run:
            s = answer.body["by_status"]
            text = (
                f"{answer.body['matching']} live exports match ({s['Queued']} queued, {s['Running']} running, "
                f"{s['Delivering']} delivering); nothing was recorded"
            )
            if answer.body["preview_token"]:
                text += f"\nto cancel exactly these: --preview {answer.body['preview_token']}"
            return text
        lines = [answer.body["message"], f"(batch {batch_id})"]
        lines += [f"  busy: export {b['export_id']} (request {b['request_id']})" for b in answer.body["busy"]]
        return "\n".join(lines)

    code = _run_operation(args, settings, call, render)
    if code == EXIT_BUSY and not args.json:
        print(f"retry with: --batch-id {batch_id}", file=sys.stderr)
    return code


def cmd_replace(args: argparse.Namespace, settings: Settings) -> int:
    """Create a replacement delivery of an export's original, for you, with a reason."""
    from service.commands import ReplaceExport

    async def call(ops: Any, caller: Any) -> Any:
        body = ReplaceExport(reason=args.reason, overwrite_agreement_ref=args.overwrite_agreement_ref)
        return await ops.replace(caller, args.export, body)

    def render(answer: Any) -> str:
        return f"created replacement {answer.body['export']['id']} of {answer.body['replaces_job_id']}"

    return _run_operation(args, settings, call, render)


def cmd_reconcile(args: argparse.Namespace, settings: Settings) -> int:
    """Resolve an OutcomeUnknown export to Completed or Failed from evidence (as a reconciler)."""
    from service.commands import ReconcileExport

    async def call(ops: Any, caller: Any) -> Any:
        body = ReconcileExport(
            resolution=args.resolution, evidence_summary=args.evidence, attempt_id=args.attempt
        )
        return await ops.reconcile(caller, args.export, body)

    def render(answer: Any) -> str:
        return f"export {answer.body['export']['id']} reconciled to {answer.body['export']['status']}"

    return _run_operation(args, settings, call, render, role="reconciler")


def cmd_correct(args: argparse.Namespace, settings: Settings) -> int:
    """Correct a recorded Completed/Failed once (needs the exports_reconciler role in the database)."""
    from service.commands import CorrectExport

    async def call(ops: Any, caller: Any) -> Any:
        body = CorrectExport(
            recorded_status=args.recorded,
            corrected_status=args.corrected,
            failure_reason=args.failure_reason,
            evidence_ref=args.evidence_ref,
            why=args.why,
            attempt_id=args.attempt,
        )
        return await ops.correct(caller, args.export, body)

    def render(answer: Any) -> str:
        export = answer.body["export"]
        code = f" ({export['failure_reason']})" if export["failure_reason"] else ""
        return f"export {export['id']} corrected to {export['status']}{code}"

    return _run_operation(args, settings, call, render, role="reconciler")


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    """Where an export is now, and what its latest cancellation request came to."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.status(caller, args.export)

    def render(answer: Any) -> str:
        export = answer.body["export"]
        lines = [
            f"export {export['id']}: {export['status']}"
            + (f" ({export['failure_reason']})" if export["failure_reason"] else ""),
            f"  {answer.body['status_line']}",
        ]
        if answer.body["message"]:
            lines.append(f"  console: {answer.body['message']}")
        lines.append(f"  Temporal: {answer.body['links']['workflows']}")
        return "\n".join(lines)

    return _run_operation(args, settings, call, render)


def cmd_timeline(args: argparse.Namespace, settings: Settings) -> int:
    """An export's timeline, in the shape of the seed's evidence block."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.status(caller, args.export)

    def render(answer: Any) -> str:
        rows = []
        for e in answer.body["timeline"]:
            rows.append(
                f"{e['label']:<11} {e['subject_short']:<18} {e['actor']:<28} {e['when']}  {e['detail']}"
            )
            rows += [f"{'':<60}{line}" for line in e["more"]]
        return "\n".join(rows)

    return _run_operation(args, settings, call, render)


def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    """The tenant's exports, newest first."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.list(caller, args.limit)

    def render(answer: Any) -> str:
        return "\n".join(
            f"{e['id']}  {e['status']:<15} {e['list_name']:<20} {e['created_at']}"
            for e in answer.body["exports"]
        )

    return _run_operation(args, settings, call, render)


# -- destinations (an admin's) ------------------------------------------------------------------------


# The delimiters a destination's CSV may use, as the command line names them (a tab is hard to type).
_DELIMITERS = {"comma": ",", "semicolon": ";", "pipe": "|", "tab": "\t"}


def _destination_fields(args: argparse.Namespace) -> dict[str, Any]:
    """The contract fields given on the command line (those left out are not in the dict)."""
    fields = {
        "name": args.name,
        "host": args.host,
        "port": args.port,
        "username": args.username,
        "host_key": args.host_key,
        "credential_ref": args.credential_ref,
        "remote_dir": args.remote_dir,
        "hash_evidence": args.hash_evidence,
        "ack_suffix": args.ack_suffix,
        "max_write_request": args.max_write_request,
        "temporary_files": args.temporary_files,
        "name_and_size_identify": args.name_and_size_identify,
        "contract_starts_on": args.contract_starts_on,
        "contract_ends_on": args.contract_ends_on,
        "intake_time_zone": args.intake_time_zone,
        "intake_hours": args.intake_hours,
        "blackout_dates": args.blackout_dates,
        "max_sessions": args.max_sessions,
        "manifest": args.manifest,
        # what the partner receives (issue #24.5)
        "csv_header": args.csv_header,
        "csv_delimiter": _DELIMITERS.get(args.csv_delimiter, args.csv_delimiter),
        "csv_columns": args.csv_columns,
        "compression": args.compression,
        "pgp_signing_key_ref": args.pgp_signing_key_ref,
    }
    given = {k: v for k, v in fields.items() if v is not None}
    if getattr(args, "pgp_recipient_keys", None):
        given["pgp_recipient_keys"] = args.pgp_recipient_keys
    if getattr(args, "no_pgp_recipient_keys", False):
        given["pgp_recipient_keys"] = []
    if getattr(args, "no_pgp_signing_key", False):
        given["pgp_signing_key_ref"] = None
    if getattr(args, "clear_ack_suffix", False):
        given["ack_suffix"] = None
    if getattr(args, "open_ended", False):
        given["contract_ends_on"] = None
    if getattr(args, "any_hour", False):
        given["intake_hours"] = None
    if getattr(args, "no_blackout_dates", False):
        given["blackout_dates"] = []
    if getattr(args, "no_session_limit", False):
        given["max_sessions"] = None
    return given


def _render_connection_test(answer: Any) -> str:
    t = answer.body
    key = t["host_key"]
    lines = [t["message"]]
    if t["connected"]:
        lines += [
            f"  host key presented   {key['presented']}",
            f"  fingerprint          {key['fingerprint']} ({'pinned' if key['pinned'] else 'NOT pinned'})",
            f"  pinned               {', '.join(key['pinned_fingerprints']) or '-'}",
            f"  authentication       {t['authentication']}",
            f"  remote_dir           {t['remote_dir']['path']}: listable {t['remote_dir']['listable']},"
            f" writable {t['remote_dir']['writable']}",
            f"  posix-rename         {t['posix_rename']}",
            f"  write limit          {t['max_write_length'] or '-'}",
        ]
    lines.append("  (a connection test pins nothing and records nothing)")
    return "\n".join(lines)


def _render_destination(answer: Any) -> str:
    d = answer.body["destination"]
    lines = [
        f"destination {d['id']} {d['name']}: version {d['version']}"
        + (f", retired on {str(d['retired_at'])[:10]} by {d['retired_by']}" if d.get("retired_at") else "")
        + f"; deliveries {d['deliveries']}",
    ]
    shown = {k: v for k, v in d.items() if k not in {"id", "name", "version", "links", "deliveries"}}
    if "pgp_recipient_keys" in d:  # by fingerprint, as gpg computes it: never the armored block
        shown["pgp_recipient_keys"] = (
            ", ".join(k["fingerprint"] or "(a key gpg cannot use)" for k in d["pgp_recipient_keys"]) or "none"
        )
    if "csv_delimiter" in d:
        shown["csv_delimiter"] = {v: k for k, v in _DELIMITERS.items()}.get(
            d["csv_delimiter"], d["csv_delimiter"]
        )
    if isinstance(d.get("csv_columns"), list):
        shown["csv_columns"] = ",".join(d["csv_columns"])
    if d.get("paused_because"):
        shown["deliveries"] = f"paused: {d['paused_because']}"
    lines += [f"  {k:<24} {'-' if v is None else v}" for k, v in shown.items()]
    for v in answer.body.get("versions", []):
        lines.append(
            f"  v{v['version']:<4} {v['change']:<8} {v['changed_at'][:19]}  by {v['changed_by']} ({v['changed_role']}):"
            f" {v['reason']}"
            + ("  [delivery terms]" if v["delivery_changed"] and v["change"] != "created" else "")
        )
        lines += [f"         {c['field']}: {c['before']} -> {c['after']}" for c in v["changes"]]
    return "\n".join(lines)


def cmd_destination(args: argparse.Namespace, settings: Settings) -> int:
    """Create, show, edit, test, pin a host key of, or retire a destination of the tenant (changes as an admin,
    each a recorded version; a connection test as an operator, reconciler or admin, run on a worker)."""
    from service.connection_tests import ConnectionTests
    from service.destinations import (
        CreateDestination,
        Destinations,
        EditDestination,
        PinHostKey,
        RetireDestination,
        UnpinHostKey,
    )
    from service.outcomes import refusal
    from service.signals import TemporalStopSignaller

    key = getattr(args, "idempotency_key", None) or f"cli-{uuid.uuid4()}"

    async def call(ops: Any, caller: Any) -> Any:
        signaller = ops.signaller
        tests = (
            ConnectionTests(signaller.connected_client, settings.task_queue)
            if isinstance(signaller, TemporalStopSignaller)
            else None
        )
        destinations = Destinations(ops.store, tests)
        # The principal named on the command line acts with the role the tenant gave it: only an admin's
        # changes go through, as over the API.
        caller = await destinations.caller(caller.tenant_id, caller.principal)
        if caller is None:
            return refusal(
                Kind.FORBIDDEN,
                f"{args.principal} is not a principal of this tenant (or was revoked): "
                "destinations are read by its principals and changed by its admins",
            )
        match args.action:
            case "add":
                body = CreateDestination(**_destination_fields(args), reason=args.reason or "created")
                return await destinations.create(caller, body, key)
            case "show":
                return await destinations.show(caller, args.destination)
            case "edit":
                edit = EditDestination(**_destination_fields(args), reason=args.reason)
                return await destinations.edit(caller, args.destination, edit, f'"{args.version}"')
            case "test":
                return await destinations.test_connection(caller, args.destination)
            case "pin-key":
                pin = PinHostKey(key=args.key, reason=args.reason)
                return await destinations.pin_key(caller, args.destination, pin, f'"{args.version}"')
            case "unpin-key":
                unpin = UnpinHostKey(fingerprint=args.fingerprint, reason=args.reason)
                return await destinations.unpin_key(caller, args.destination, unpin, f'"{args.version}"')
            case _:
                return await destinations.retire(
                    caller, args.destination, RetireDestination(reason=args.reason)
                )

    def render(answer: Any) -> str:
        if args.action == "show":
            return _render_destination(answer)
        if args.action == "test":
            return _render_connection_test(answer)
        text = str(answer.body["message"])
        if args.action == "add":
            text += f"\n(destination {answer.body['destination']['id']}; idempotency key {key})"
        return text

    return _run_operation(args, settings, call, render, role="admin")


# -- delivery switches ----------------------------------------------------------------------------------


def _switch_request(args: argparse.Namespace) -> Any:
    from service.switches import RESUME_REQUEST, SWITCH_REQUEST

    resume = args.command == "resume"
    adapter = RESUME_REQUEST if resume else SWITCH_REQUEST
    body: dict[str, Any] = {"scope": "tenant", "reason": args.reason}
    if args.global_scope:
        body["scope"] = "global"
    elif args.destination is not None:
        body.update(scope="destination", destination_id=args.destination)
    if resume and args.pause is not None:
        body["pause_id"] = args.pause
    if not resume and args.until is not None:
        body["expires_at"] = args.until
    return adapter.validate_python(body)


def _run_switches(
    args: argparse.Namespace,
    settings: Settings,
    call: Callable[[Any], Awaitable[Any]],
    render: Callable[[Any], str] | None = None,
    *,
    platform: bool = False,
) -> int:
    """Run one switch operation over an ``exports_api`` pool (with ``platform``, and an ``exports_platform``
    pool for the global switch) and print its answer."""
    from service.switches import open_switches

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")

    async def go() -> Any:
        async with open_switches(settings, platform=platform) as ops:
            return await call(ops)

    answer = asyncio.run(go())
    text = render(answer) if render and answer.ok else answer.text
    _emit(args, {"outcome_kind": answer.kind.value, **answer.body}, text)
    return exit_code_for(answer.kind)


def _switch_change(args: argparse.Namespace, settings: Settings, *, resume: bool) -> int:
    from service.switches import Operator

    try:
        request = _switch_request(args)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        return _fail_usage(f"invalid input: {problems}")
    if not args.global_scope and args.tenant is None:
        return _fail_usage("give --tenant (or set EXPORTS_TENANT), or --global")

    async def call(ops: Any) -> Any:
        # the role the named principal holds in the tenant, if it is one (a two-person release is asked as it)
        role = "operator"
        if args.tenant is not None:
            principal = await ops.store.find_principal(args.tenant, args.principal)
            if principal is not None and principal.revoked_at is None:
                role = principal.role
        operator = Operator(principal=args.principal, tenant_id=args.tenant, platform=True, role=role)
        return await (ops.resume if resume else ops.pause)(operator, request)

    # The global switch is the platform's role's (exports_platform); the API's role may not change it.
    return _run_switches(args, settings, call, platform=args.global_scope)


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause deliveries (the tenant's, one destination's, or --global) with a reason; takes effect at once."""
    return _switch_change(args, settings, resume=False)


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume deliveries in a scope and wake its queued exports."""
    return _switch_change(args, settings, resume=True)


def cmd_switches(args: argparse.Namespace, settings: Settings) -> int:
    """The delivery switches (global, the tenant's, each destination's) and their latest changes."""

    async def call(ops: Any) -> Any:
        return await ops.view(args.tenant)

    def render(answer: Any) -> str:
        lines = []
        for s in answer.body["switches"]:
            name = s["scope"] if s["scope"] != "destination" else f"destination {s['destination_name']}"
            since = f" since {s['changed_at']} by {s['changed_by']}: {s['reason']}" if s["changed_at"] else ""
            lines.append(f"{name:<32} {s['state']:<14}{since}")
        if answer.body.get("pauses"):
            lines.append("active pauses (a resume releases your own; --pause ID names another's):")
        for p in answer.body.get("pauses", []):
            where = p["destination_id"] or p["tenant_id"] or "every tenant"
            until = f" until {p['expires_at']}" if p["expires_at"] else ""
            kind = " [host key changed]" if p["kind"] == "host_key" else ""
            lines.append(
                f"  {p['id']}  {p['scope']:<12} {where}  by {p['owner']}{kind}: {p['reason']}{until}"
            )
        if answer.body["history"]:
            lines.append("latest changes:")
        for c in answer.body["history"]:
            what = "resumed" if c["enabled"] else "paused"
            target = c["destination_id"] or c["tenant_id"] or "every tenant"
            lines.append(
                f"  {c['changed_at']}  {what:<8} {c['scope']:<12} {target}  by {c['changed_by']}: {c['reason']}"
            )
        return "\n".join(lines)

    return _run_switches(args, settings, call, render)


# -- recurring exports ------------------------------------------------------------------------------------


def _run_recurring(
    args: argparse.Namespace,
    settings: Settings,
    call: Callable[[Any, Any], Awaitable[Any]],
    render: Callable[[Any], str] | None = None,
) -> int:
    """Run one recurring-export operation as ``--as``, with the role that principal holds in the tenant
    (the admin role manages recurring exports), and print its answer. The Schedule is synced through
    Temporal at ``EXPORTS_TEMPORAL_ADDRESS``; if it does not answer, the answer says the Schedule is pending."""
    from service.auth import Caller
    from service.exports import open_exports
    from service.outcomes import Kind, refusal
    from service.recurring import RecurringExports
    from service.recurring_schedules import ScheduleSync
    from service.signals import TemporalStopSignaller

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")
    if args.tenant is None:
        return _fail_usage("give --tenant or set EXPORTS_TENANT")

    async def go() -> Any:
        async with open_exports(settings, reconciler=False) as ops:
            principal = await ops.store.find_principal(args.tenant, args.principal)
            if principal is None or principal.revoked_at is not None:
                return refusal(
                    Kind.FORBIDDEN, f"{args.principal} is not a principal of this tenant, or is revoked"
                )
            caller = Caller(tenant_id=args.tenant, principal=args.principal, role=principal.role)  # type: ignore[arg-type]
            sync = ScheduleSync(
                TemporalStopSignaller(settings).connected_client,
                task_queue=settings.task_queue,
                catchup_window_seconds=settings.recurring_catchup_window_seconds,
            )
            return await call(RecurringExports(ops.store, sync), caller)

    try:
        answer = asyncio.run(go())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        return _fail_usage(f"invalid input: {problems}")
    text = render(answer) if render and answer.ok else answer.text
    _emit(args, {"outcome_kind": answer.kind.value, **answer.body}, text)
    return exit_code_for(answer.kind)


def _recurring_line(r: dict[str, Any]) -> str:
    return f"{r['id']}  {r['state']:<8} {r['list_name']:<20} {r['when']}"


def cmd_recurring_add(args: argparse.Namespace, settings: Settings) -> int:
    """Define a recurring export: a list to a destination on a cron expression or an interval."""
    from service.recurring import DefineRecurringExport

    async def call(ops: Any, caller: Any) -> Any:
        body = DefineRecurringExport(
            destination_id=args.destination,
            list_name=args.list_name,
            cron=args.cron,
            interval_seconds=args.every,
            time_zone=args.time_zone,
            starts_at=args.starts_at,
            ends_at=args.ends_at,
        )
        return await ops.create(caller, body)

    def render(answer: Any) -> str:
        return f"{answer.body['message']}\n(schedule {answer.body['recurring_export']['schedule_id']}: {answer.body['schedule']})"

    return _run_recurring(args, settings, call, render)


def cmd_recurring_list(args: argparse.Namespace, settings: Settings) -> int:
    """The tenant's recurring exports."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.list(caller, include_deleted=args.all)

    def render(answer: Any) -> str:
        return (
            "\n".join(_recurring_line(r) for r in answer.body["recurring_exports"]) or "no recurring exports"
        )

    return _run_recurring(args, settings, call, render)


def cmd_recurring_show(args: argparse.Namespace, settings: Settings) -> int:
    """One recurring export and its latest firings: created export X, or skipped and why."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.show(caller, args.recurring_export, firings=args.firings)

    def render(answer: Any) -> str:
        lines = [_recurring_line(answer.body["recurring_export"])]
        exports = answer.body["exports"]
        lines.append(f"  exports created: {exports['total']} ({exports['live']} live)")
        for f in answer.body["firings"]:
            what = f"created {f['job_id']}" if f["outcome"] == "created" else f"skipped ({f['reason']})"
            lines.append(f"  {f['nominal_time']}  {what:<48} {f['message']}")
        return "\n".join(lines)

    return _run_recurring(args, settings, call, render)


def cmd_recurring_pause(args: argparse.Namespace, settings: Settings) -> int:
    """Pause a recurring export; the exports it created are untouched (the answer counts them)."""
    from service.recurring import PauseRecurringExport

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.pause(caller, args.recurring_export, PauseRecurringExport(reason=args.reason))

    return _run_recurring(args, settings, call, lambda a: a.body["message"])


def cmd_recurring_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a paused recurring export."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.resume(caller, args.recurring_export)

    return _run_recurring(args, settings, call, lambda a: a.body["message"])


def cmd_recurring_delete(args: argparse.Namespace, settings: Settings) -> int:
    """Delete a recurring export: its Schedule goes, its firings stay, its exports are untouched."""

    async def call(ops: Any, caller: Any) -> Any:
        return await ops.delete(caller, args.recurring_export)

    return _run_recurring(args, settings, call, lambda a: a.body["message"])


# -- principals, the ledger, approvals (issue #26) ---------------------------------------------------------


def cmd_principal(args: argparse.Namespace, settings: Settings) -> int:
    """Grant a principal of the tenant its role (``grant``) or revoke it (``revoke``), as an administrator
    (``--as``), recorded in the ledger of operator actions."""
    from db.admin import revoke_principal, upsert_principal
    from service.audit import current_request_id

    url = args.database_url or settings.database_url
    if not url:
        return _fail_usage("give --database-url (an administrator's) or set EXPORTS_DATABASE_URL")
    if args.tenant is None:
        return _fail_usage("give --tenant or set EXPORTS_TENANT")
    if args.principal_action == "grant":
        asyncio.run(
            upsert_principal(
                url,
                tenant_id=args.tenant,
                name=args.name,
                role=args.role,
                export_lists=args.lists,
                granted_by=args.principal,
                request_id=current_request_id(),
            )
        )
        _emit(args, {"name": args.name, "role": args.role}, f"{args.name} now holds the {args.role} role")
        return EXIT_OK
    revoked = asyncio.run(
        revoke_principal(
            url,
            tenant_id=args.tenant,
            name=args.name,
            revoked_by=args.principal,
            request_id=current_request_id(),
        )
    )
    _emit(
        args,
        {"name": args.name, "revoked": revoked},
        f"{args.name} revoked: its tokens stop working"
        if revoked
        else f"{args.name} was not a live principal",
    )
    return EXIT_OK if revoked else EXIT_REFUSED


def _run_as_principal(
    args: argparse.Namespace,
    settings: Settings,
    call: Callable[[Any, Any], Awaitable[Any]],
    render: Callable[[Any], str] | None = None,
) -> int:
    """Run one operation as ``--as`` with the role that principal holds in the tenant (the ledger and the
    two-person rule are about people: a name that is no live principal of the tenant may do nothing)."""
    from service.auth import Caller
    from service.exports import open_exports
    from service.outcomes import refusal

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")
    if args.tenant is None:
        return _fail_usage("give --tenant or set EXPORTS_TENANT")

    async def go() -> Any:
        async with open_exports(settings, approval_ttl_seconds=settings.approval_ttl_seconds) as ops:
            principal = await ops.store.find_principal(args.tenant, args.principal)
            if principal is None or principal.revoked_at is not None:
                return refusal(
                    Kind.FORBIDDEN, f"{args.principal} is not a principal of this tenant, or is revoked"
                )
            caller = Caller(tenant_id=args.tenant, principal=args.principal, role=principal.role)  # type: ignore[arg-type]
            return await call(ops, caller)

    try:
        answer = asyncio.run(go())
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'input'}: {e['msg']}" for e in exc.errors())
        return _fail_usage(f"invalid input: {problems}")
    if getattr(args, "jsonl", False) and answer.ok:
        return EXIT_OK  # the lines were printed as they were read
    text = render(answer) if render and answer.ok else answer.text
    _emit(args, {"outcome_kind": answer.kind.value, **answer.body}, text)
    return exit_code_for(answer.kind)


def cmd_audit(args: argparse.Namespace, settings: Settings) -> int:
    """The ledger of operator actions, newest first (admins and reconcilers): one page, or with ``--jsonl`` the
    whole filtered ledger as JSON Lines."""
    from service.audit import Audit, AuditFilter
    from service.outcomes import Answer

    where = AuditFilter(
        principal=args.by,
        action=args.action,
        subject_kind=args.subject_kind,
        subject_id=args.subject,
        since=args.since,
        until=args.until,
    )

    async def call(ops: Any, caller: Any) -> Any:
        audit = Audit(ops.store)
        if not args.jsonl:
            return await audit.page(
                caller.tenant_id, caller.role, where, limit=args.limit, before=args.before
            )
        refused = audit.refused(caller.role) or (
            None if audit.filter_problem(where) is None else _invalid_filter(audit.filter_problem(where))
        )
        if refused is not None:
            return refused
        async for line in audit.lines(caller.tenant_id, where):
            sys.stdout.write(line)
        return Answer(Kind.DONE, {})

    def render(answer: Any) -> str:
        rows = []
        for a in answer.body["actions"]:
            second = f" (asked by {a['requested_by']})" if a["requested_by"] else ""
            rows.append(
                f"{a['at'][:19]}  {a['principal']} ({a['role']}){second}  {a['action']} {a['subject_kind']} "
                f"{a['subject_id'] or ''}: {a['outcome']}" + (f" - {a['reason']}" if a["reason"] else "")
            )
        if answer.body["next"]:
            rows.append(f"(older: --before {answer.body['next']})")
        return "\n".join(rows) or "no actions recorded"

    return _run_as_principal(args, settings, call, render)


def _invalid_filter(problem: str | None) -> Any:
    from service.outcomes import refusal

    return refusal(Kind.INVALID, problem or "invalid filter")


def cmd_approvals(args: argparse.Namespace, settings: Settings) -> int:
    """Two-person actions: ``list`` (``--pending``), ``show``, ``approve`` (runs the action now, as you) and
    ``decline`` (it never runs), as ``--as`` with the role that principal holds."""

    async def call(ops: Any, caller: Any) -> Any:
        match args.approvals_action:
            case "list":
                return await ops.approvals.list(caller, pending_only=args.pending)
            case "show":
                return await ops.approvals.show(caller, args.approval)
            case "approve":
                return await ops.approvals.approve(caller, args.approval, args.reason)
            case _:
                return await ops.approvals.decline(caller, args.approval, args.reason)

    def render(answer: Any) -> str:
        listed = answer.body.get("approvals")
        if listed is None:
            approval = answer.body.get("approval")
            text = str(answer.body.get("message") or "")
            if approval is not None and not text:
                return _approval_line(approval)
            return text or json.dumps(answer.body, default=str)
        return "\n".join(_approval_line(a) for a in listed) or "nothing is waiting for a second person"

    return _run_as_principal(args, settings, call, render)


def _approval_line(a: dict[str, Any]) -> str:
    decided = f" by {a['decided_by']}" if a["decided_by"] else ""
    outcome = f" ({a['outcome']})" if a["outcome"] else ""
    return (
        f"{a['id']}  {a['state']}{decided}{outcome}  {a['action']} {a['subject_kind']} {a['subject_id']}  "
        f"asked by {a['requested_by']} at {a['requested_at'][:19]}, until {a['expires_at'][:19]}: {a['reason']}"
    )


# -- serve and demo -------------------------------------------------------------------------------------


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the HTTP API and console until Ctrl-C (logs, traces and metrics as the settings say)."""
    from api.server import serve
    from db.errors import StoreError
    from observability.setup import configure_process
    from observability.tracing import shutdown_tracing

    if not settings.database_url:
        return _fail_usage("EXPORTS_DATABASE_URL is not set")
    configure_process(settings, "api")
    try:
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(settings, args.host, args.port))
    except StoreError as exc:  # PostgreSQL never answered at start-up (retried, logged), or refused
        print(f"starter.py: EXPORTS_DATABASE_URL: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    finally:
        shutdown_tracing()  # flushes the spans still batched
    return EXIT_OK


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """Start everything on embedded defaults, run the incident's three timings and a plain delivery."""
    from demo import run_demo_cli

    return run_demo_cli(settings, keep=args.keep, contacts=args.contacts)


# -- the parser -----------------------------------------------------------------------------------------


def _uuid(value: str) -> uuid.UUID:
    try:
        return uuid.UUID(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a UUID: {value!r}") from None


def _aware(value: str) -> Any:
    from datetime import datetime

    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        raise argparse.ArgumentTypeError(f"give its UTC offset, e.g. {value}+00:00")
    return moment


def cmd_recurring_usage(args: argparse.Namespace, settings: Settings) -> int:  # pragma: no cover - argparse
    return _fail_usage("give an action: add, list, show, pause, resume, delete")


def _boolean(value: str) -> bool:
    if value.lower() not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"not true or false: {value!r}")
    return value.lower() == "true"


def _armored_key_file(path: str) -> str:
    """The text of a public key file (read here: the key itself is stored, a public key is not a secret)."""
    try:
        with open(path, encoding="ascii") as key:
            return key.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot read {path!r}: {exc.strerror}") from None
    except UnicodeDecodeError:  # never echo the bytes: they may be anything, a secret key too
        raise argparse.ArgumentTypeError(
            f"{path!r} is not an ASCII-armored key (gpg --armor --export)"
        ) from None


def _csv_columns(value: str) -> list[str]:
    """``email,first_name``: contact columns, each once (the service checks them again)."""
    columns = [c.strip() for c in value.split(",")]
    unknown = [c for c in columns if c not in CONTACT_COLUMNS]
    if unknown or not columns or len(set(columns)) != len(columns):
        raise argparse.ArgumentTypeError(
            f"give one to three of {','.join(CONTACT_COLUMNS)}, comma-separated, each once"
        )
    return columns


def _date(value: str) -> date:
    try:
        return date.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a date (YYYY-MM-DD): {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser with one subcommand per operation."""
    parser = argparse.ArgumentParser(
        prog="starter.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", action="store_true", help="print the answer as JSON")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Callable[..., int], help_text: str) -> argparse.ArgumentParser:
        sub = commands.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        sub.set_defaults(handler=handler)
        return sub

    def acting(sub: argparse.ArgumentParser, export: bool = True) -> None:
        sub.add_argument("--tenant", type=_uuid, help="tenant ID (default: EXPORTS_TENANT)")
        sub.add_argument(
            "--as", dest="principal", help="who is acting, recorded (default: EXPORTS_PRINCIPAL, else $USER)"
        )
        if export:
            sub.add_argument("export", type=_uuid, help="export ID")

    command("migrate", cmd_migrate, "apply migrations to EXPORTS_DATABASE_URL (idempotent)")

    sub = command("create", cmd_create, "create an export")
    acting(sub, export=False)
    sub.add_argument("--destination", type=_uuid, required=True)
    sub.add_argument("--list", dest="list_name", required=True)
    sub.add_argument("--idempotency-key", help="reuse on retry to get the first job back")

    sub = command("edit", cmd_edit, "change a queued export's terms")
    acting(sub)
    sub.add_argument("--version", type=int, required=True, help="the version you read")
    sub.add_argument("--destination", type=_uuid)
    sub.add_argument("--list", dest="list_name")

    sub = command("cancel", cmd_cancel, "request cancellation (exit 75 = Busy: retry with --request-id)")
    acting(sub)
    sub.add_argument("--request-id", type=_uuid, help="reuse after Busy; a new one per decision")
    sub.add_argument("--reason")

    sub = command(
        "bulk-cancel",
        cmd_bulk_cancel,
        "cancel every live export of a destination, or of one list (exit 75: some Busy, retry with --batch-id)",
    )
    acting(sub, export=False)
    where = sub.add_mutually_exclusive_group(required=True)
    where.add_argument("--destination", type=_uuid, help="destination ID")
    where.add_argument("--destination-name", help="destination name, e.g. partner-old")
    sub.add_argument("--list", dest="list_name", help="only this list (default: every list)")
    sub.add_argument("--reason", help="recorded with the batch and every request (required unless --dry-run)")
    sub.add_argument("--batch-id", type=_uuid, help="reuse to retry the Busy ones; nothing is recorded twice")
    sub.add_argument(
        "--dry-run",
        action="store_true",
        help="only count the live exports that match (prints a --preview token)",
    )
    sub.add_argument(
        "--preview",
        type=_uuid,
        help="the token a --dry-run printed: cancel exactly the exports it counted (default: those live now)",
    )

    sub = command("replace", cmd_replace, "create a replacement delivery of the original")
    acting(sub)
    sub.add_argument("--reason", required=True)
    sub.add_argument("--overwrite-agreement-ref")

    sub = command("reconcile", cmd_reconcile, "resolve an OutcomeUnknown from evidence")
    acting(sub)
    sub.add_argument("--resolution", choices=["Completed", "Failed"], required=True)
    sub.add_argument("--evidence", required=True, help="what the evidence shows")
    sub.add_argument("--attempt", type=_uuid, help="the attempt the evidence is about (default: current)")

    sub = command("correct", cmd_correct, "correct a recorded outcome once (reconcilers)")
    acting(sub)
    sub.add_argument("--from", dest="recorded", choices=["Completed", "Failed"], required=True)
    sub.add_argument("--to", dest="corrected", choices=["Completed", "Failed"], required=True)
    sub.add_argument("--failure-reason")
    sub.add_argument("--evidence-ref", required=True)
    sub.add_argument("--why", required=True)
    sub.add_argument("--attempt", type=_uuid)

    sub = command("status", cmd_status, "where an export is now")
    acting(sub)
    sub = command("timeline", cmd_timeline, "an export's timeline")
    acting(sub)
    sub = command("list", cmd_list, "the tenant's exports")
    acting(sub, export=False)
    sub.add_argument("--limit", type=int, default=50)

    destination = command(
        "destination",
        cmd_destination,
        "a tenant's destinations: add, show, edit, test, pin-key, unpin-key, retire (changes need an admin)",
    )
    actions = destination.add_subparsers(dest="action", required=True, metavar="ACTION")

    def destination_action(name: str, help_text: str) -> argparse.ArgumentParser:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        acting(sub, export=False)
        if name != "add":
            sub.add_argument("destination", type=_uuid, help="destination ID")
        return sub

    def contract_options(sub: argparse.ArgumentParser, *, required: bool) -> None:
        sub.add_argument("--name", required=required, help="the destination's name, e.g. partner-new")
        sub.add_argument("--host", required=required, help="the partner's SFTP host")
        sub.add_argument("--port", type=int, help="its SSH port (default 22)")
        sub.add_argument("--user", dest="username", required=required, help="the SFTP account")
        sub.add_argument(
            "--host-key", required=required, help="the server's public host key line to pin (ssh-keyscan)"
        )
        sub.add_argument(
            "--credential-ref",
            required=required,
            help="where the login key is on the worker host (a reference, never the key)",
        )
        sub.add_argument("--remote-dir", required=required, help="the directory files are delivered to")
        sub.add_argument("--hash-evidence", choices=["none", "read_back", "ack_file"])
        sub.add_argument(
            "--ack-suffix", help="with --hash-evidence ack_file: the partner's acknowledgment suffix"
        )
        sub.add_argument("--max-write-request", type=int, help="the largest SFTP write the server accepts")
        sub.add_argument("--temporary-files", choices=["keep", "remove"], help="the cleanup agreement")
        sub.add_argument(
            "--name-and-size-identify",
            type=_boolean,
            metavar="true|false",
            help="whether name and size identify a delivered file (the partner's contract)",
        )
        sub.add_argument(
            "--contract-starts-on", type=_date, help="first day of the contract (UTC, YYYY-MM-DD)"
        )
        sub.add_argument("--contract-ends-on", type=_date, help="last day of the contract (UTC, YYYY-MM-DD)")
        # the delivery window (issue #25.2): when the partner takes deliveries, in its time zone
        sub.add_argument(
            "--intake-time-zone", help="the partner's time zone (IANA, e.g. Europe/Berlin; default UTC)"
        )
        sub.add_argument(
            "--intake-hours",
            action="append",
            metavar="'DAYS HH:MM-HH:MM'",
            help="when the partner takes deliveries, e.g. 'Mon-Fri 08:00-18:00' (repeat for more; replaces all)",
        )
        sub.add_argument(
            "--blackout-date",
            dest="blackout_dates",
            action="append",
            type=_date,
            metavar="YYYY-MM-DD",
            help="a local date on which the partner takes nothing (repeat for more; replaces all)",
        )
        sub.add_argument(
            "--max-sessions",
            type=int,
            help="how many SFTP sessions the partner allows at once (held as slots across all workers)",
        )
        sub.add_argument(
            "--manifest",
            choices=MANIFEST_CHOICES,
            help="what is published beside each file after its rename: none, sha256 (a sidecar for "
            "sha256sum -c), json, or both (a delivery term: an edit during a build rebuilds the file)",
        )
        # What the partner receives (issue #24.5): each a delivery term, like the manifest.
        header = sub.add_mutually_exclusive_group()
        header.add_argument(
            "--csv-header",
            dest="csv_header",
            action="store_const",
            const=True,
            help="a first line naming the columns",
        )
        header.add_argument(
            "--no-csv-header", dest="csv_header", action="store_const", const=False, help="no header line"
        )
        sub.add_argument(
            "--csv-delimiter", choices=list(_DELIMITERS), help="the CSV's delimiter (default comma)"
        )
        sub.add_argument(
            "--csv-columns",
            type=_csv_columns,
            metavar="COLUMN[,COLUMN...]",
            help=f"the contact columns the partner receives, in order, each once: any of {','.join(CONTACT_COLUMNS)}",
        )
        sub.add_argument("--compression", choices=["none", "gzip"], help="gzip the file (.csv.gz) or not")
        sub.add_argument(
            "--pgp-recipient-key",
            dest="pgp_recipient_keys",
            action="append",
            type=_armored_key_file,
            metavar="FILE",
            help="a file holding the partner's ASCII-armored OpenPGP public key (gpg --armor --export): files are "
            "encrypted to it (repeat for more keys; an edit replaces them all, and takes a second admin)",
        )
        sub.add_argument(
            "--pgp-signing-key-ref",
            metavar="PATH",
            help="where the tenant's signing key is on the worker host (a reference, never the key; an edit "
            "takes a second admin)",
        )

    sub = destination_action("add", "create a destination (it starts paused: resume it once checked)")
    contract_options(sub, required=True)
    sub.add_argument("--reason", help="why (recorded with version 1)")
    sub.add_argument("--idempotency-key", help="reuse on retry to get the first destination back")
    destination_action(
        "show", "a destination: its settings (references shown as 'set'), versions and changes"
    )
    sub = destination_action("edit", "change a destination from the version you read, with a reason")
    sub.add_argument("--version", type=int, required=True, help="the version you read (show prints it)")
    contract_options(sub, required=False)
    sub.add_argument("--clear-ack-suffix", action="store_true", help="no acknowledgment suffix any more")
    sub.add_argument("--open-ended", action="store_true", help="the contract has no last day any more")
    sub.add_argument(
        "--any-hour", action="store_true", help="no intake hours any more: deliveries at any hour"
    )
    sub.add_argument("--no-blackout-dates", action="store_true", help="remove every blackout date")
    sub.add_argument(
        "--no-session-limit", action="store_true", help="the partner has no session limit any more"
    )
    sub.add_argument(
        "--no-pgp-recipient-keys",
        action="store_true",
        help="encrypt files no more (removes every partner key; takes a second admin)",
    )
    sub.add_argument(
        "--no-pgp-signing-key", action="store_true", help="sign files no more (takes a second admin)"
    )
    sub.add_argument("--reason", required=True, help="why (recorded with the change)")
    destination_action(
        "test",
        "test the connection on a worker: the host key presented and whether it is pinned, the login, the "
        "remote directory, posix-rename, the write limit (pins nothing)",
    )
    sub = destination_action(
        "pin-key", "trust one more host key (as ssh-keyscan prints it) once its fingerprint is checked"
    )
    sub.add_argument("--key", required=True, help="the public host key line, e.g. 'ssh-ed25519 AAAA...'")
    sub.add_argument("--version", type=int, required=True, help="the version you read (show prints it)")
    sub.add_argument("--reason", required=True, help="why (recorded with the change)")
    sub = destination_action("unpin-key", "stop trusting a pinned host key (never the last one)")
    sub.add_argument("--fingerprint", required=True, help="its fingerprint, SHA256:... (show prints them)")
    sub.add_argument("--version", type=int, required=True, help="the version you read (show prints it)")
    sub.add_argument("--reason", required=True, help="why (recorded with the change)")
    sub = destination_action("retire", "retire a destination (final): building exports stop at cutoff 2")
    sub.add_argument("--reason", required=True, help="why (recorded with the retirement)")

    def switch_scope(sub: argparse.ArgumentParser) -> None:
        acting(sub, export=False)
        where = sub.add_mutually_exclusive_group()
        where.add_argument("--destination", type=_uuid, help="one destination of the tenant")
        where.add_argument(
            "--global", dest="global_scope", action="store_true", help="every tenant (the platform's switch)"
        )
        sub.add_argument("--reason", required=True, help="why (recorded with who and when)")

    sub = command(
        "pause", cmd_pause, "pause deliveries (your own pause): the tenant's, --destination D's, or --global"
    )
    switch_scope(sub)
    sub.add_argument("--until", type=_aware, help="the pause lifts itself then (ISO 8601 with its offset)")
    sub = command(
        "resume",
        cmd_resume,
        "resume deliveries in a scope (your own pauses, or --pause ID: another's waits for a second person) "
        "and wake its queued exports",
    )
    switch_scope(sub)
    sub.add_argument("--pause", type=_uuid, help="the pause to release (starter.py switches lists them)")
    sub = command("switches", cmd_switches, "the delivery switches and their latest changes")
    acting(sub, export=False)

    recurring = command(
        "recurring", cmd_recurring_usage, "recurring exports: add, list, show, pause, resume, delete"
    )
    actions = recurring.add_subparsers(dest="recurring_command", required=True, metavar="ACTION")

    def recurring_action(name: str, handler: Callable[..., int], help_text: str, *, one: bool = True) -> Any:
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        sub.set_defaults(handler=handler)
        acting(sub, export=False)
        if one:
            sub.add_argument("recurring_export", type=_uuid, help="recurring export ID")
        return sub

    sub = recurring_action("add", cmd_recurring_add, "define a recurring export (admins)", one=False)
    sub.add_argument("--destination", type=_uuid, required=True)
    sub.add_argument("--list", dest="list_name", required=True)
    when = sub.add_mutually_exclusive_group(required=True)
    when.add_argument(
        "--cron", help="five fields, e.g. '0 2 * * *' (every day at 02:00), or @daily, @hourly, ..."
    )
    when.add_argument("--every", type=int, metavar="SECONDS", help="an interval, 60 to 31622400 seconds")
    sub.add_argument(
        "--time-zone", required=True, help="IANA name the cron expression is read in, e.g. Europe/Berlin"
    )
    sub.add_argument("--starts-at", type=_aware, help="no firing before this (ISO 8601 with its offset)")
    sub.add_argument("--ends-at", type=_aware, help="no firing after this (ISO 8601 with its offset)")
    sub = recurring_action("list", cmd_recurring_list, "the tenant's recurring exports", one=False)
    sub.add_argument("--all", action="store_true", help="deleted ones too")
    sub = recurring_action("show", cmd_recurring_show, "one recurring export and its latest firings")
    sub.add_argument("--firings", type=int, default=20, help="how many firings, newest first")
    sub = recurring_action("pause", cmd_recurring_pause, "pause one (the exports it created are untouched)")
    sub.add_argument("--reason", help="why (recorded, shown on the console)")
    recurring_action("resume", cmd_recurring_resume, "resume a paused one")
    recurring_action(
        "delete", cmd_recurring_delete, "delete one (its firings stay; its exports are untouched)"
    )

    sub = command("serve", cmd_serve, "serve the HTTP API and console")
    sub.add_argument("--host")
    sub.add_argument("--port", type=int)

    sub = command("demo", cmd_demo, "run the demo on embedded PostgreSQL, Temporal and SFTP")
    sub.add_argument("--keep", action="store_true", help="keep everything running until Ctrl-C")
    sub.add_argument("--contacts", type=int, default=50_000)

    sub = command(
        "token", cmd_token, "mint an API token, or --revoke a principal's (administrator's database URL)"
    )
    sub.add_argument("--database-url")
    sub.add_argument("--tenant", type=_uuid, required=True)
    sub.add_argument("--principal", required=True)
    sub.add_argument("--role", choices=list(ROLES), default="operator")
    sub.add_argument("--revoke", action="store_true", help="revoke every token of --principal instead")
    sub.add_argument(
        "--as",
        dest="administrator",
        default="administrator",
        help="the administrator minting or revoking, recorded in the ledger of operator actions",
    )

    principal = command(
        "principal", cmd_principal, "grant a principal its role, or revoke it (administrator's database URL)"
    )
    principal_actions = principal.add_subparsers(dest="principal_action", required=True, metavar="ACTION")
    for name, help_text in (
        ("grant", "make NAME a principal with --role (reinstated)"),
        ("revoke", "revoke NAME"),
    ):
        sub = principal_actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        sub.add_argument("--database-url")
        acting(sub, export=False)
        sub.add_argument("name", help="the principal")
        if name == "grant":
            sub.add_argument("--role", choices=list(ROLES), required=True)
            sub.add_argument("--list", dest="lists", action="append", help="only this list (repeatable)")

    sub = command("audit", cmd_audit, "the ledger of operator actions, newest first (admins and reconcilers)")
    acting(sub, export=False)
    sub.add_argument("--by", help="only this principal's actions")
    sub.add_argument("--action", choices=[a.value for a in AuditAction], help="only this action")
    sub.add_argument(
        "--subject-kind", choices=[k.value for k in SubjectKind], help="only this kind of subject"
    )
    sub.add_argument("--subject", help="only actions on this subject (an ID, or a principal's name)")
    sub.add_argument("--since", type=_aware, help="at or after this time (ISO 8601 with its offset)")
    sub.add_argument("--until", type=_aware, help="before this time (ISO 8601 with its offset)")
    sub.add_argument("--limit", type=int, default=50)
    sub.add_argument("--before", help="the cursor an earlier page printed")
    sub.add_argument("--jsonl", action="store_true", help="the whole filtered ledger as JSON Lines")

    approvals = command("approvals", cmd_approvals, "two-person actions: list, show, approve, decline")
    approval_actions = approvals.add_subparsers(dest="approvals_action", required=True, metavar="ACTION")
    for name, help_text in (
        ("list", "the tenant's approvals, newest first"),
        ("show", "one approval"),
        ("approve", "approve one as its second person: the action runs now, as yours"),
        ("decline", "decline one: it never runs"),
    ):
        sub = approval_actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="print JSON")
        acting(sub, export=False)
        if name == "list":
            sub.add_argument("--pending", action="store_true", help="only those still waiting")
        else:
            sub.add_argument("approval", type=_uuid, help="approval ID")
        if name in ("approve", "decline"):
            sub.add_argument("--reason", required=name == "decline", help="why (recorded)")

    sub = command("seed-demo", cmd_seed_demo, "seed a tenant, destination and contacts; mint tokens")
    sub.add_argument("--database-url")
    sub.add_argument("--tenant-name", default="acme")
    sub.add_argument("--destination-name", default="partner-old")
    sub.add_argument("--contacts", type=int, default=50_000)
    sub.add_argument("--sftp-host", default="127.0.0.1")
    sub.add_argument("--sftp-port", type=int, default=2222)
    sub.add_argument("--sftp-user", default="partner")
    sub.add_argument("--host-key", required=True, help="the partner's pinned host key line")
    sub.add_argument("--credential-ref", required=True, help="path of the private key on the worker host")
    sub.add_argument("--remote-dir", default="/")
    sub.add_argument(
        "--temporary-files",
        choices=["keep", "remove"],
        default="keep",
        help="the partner's cleanup agreement: 'remove' lets an attempt's temporary files be removed once its "
        "export is recorded Failed (default: keep them)",
    )
    return parser


# Long-running commands set up the process's logging, tracing and metrics from the settings themselves.
LONG_RUNNING = {"serve", "demo"}


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv``, build the settings and run one command; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command not in LONG_RUNNING:
        logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command == "bulk-cancel" and not args.dry_run and not args.reason:
        parser.error("--reason is required (it is recorded with the batch and every request)")
    if args.command in {"correct"} and args.failure_reason is not None:
        from domain.models import FailureCode

        if args.failure_reason not in {c.value for c in FailureCode}:
            parser.error(f"--failure-reason must be one of {', '.join(c.value for c in FailureCode)}")
    settings = Settings()
    from service.audit import new_request_id, set_request_id

    set_request_id(new_request_id("cli-"))  # this invocation's ID, recorded with any action it takes
    if "principal" in args and args.principal is None:
        args.principal = settings.principal or getpass.getuser() or "cli"
    if "tenant" in args and args.tenant is None and args.command != "token":
        args.tenant = settings.tenant
    from service.temporal import TemporalConnectError, connect_options

    try:
        if args.command == "serve":
            connect_options(settings)  # the Temporal TLS files and API key, checked before serving
        return args.handler(args, settings)
    except TemporalConnectError as exc:
        print(f"starter.py: {exc}", file=sys.stderr)  # one line naming the setting, no traceback
        return EXIT_USAGE


def _exit(code: int) -> None:
    """End the process with ``code``. A process that loaded Temporal's client bridge (a connection test, the stop
    signal of a cancel, the demo, serve) may have Rust threads left that crash the interpreter's finalization
    after the answer was printed ("Fatal Python error: PyGILState_Release ... finalizing", SIGABRT: temporalio
    sdk-python issue 300; the demo's onboarding met it about once in five runs of `destination test`), so its
    exit code would lie: such a process skips finalization once its logs and output are flushed."""
    if "temporalio.bridge.temporal_sdk_bridge" in sys.modules:
        import os

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    _exit(main())
