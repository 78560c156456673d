"""The named statements themselves (STYLE: procrastinate's habit; 000 "Mapping checks"; 001 "Every writer").

Every statement in ``db/queries.sql`` loads, parses against the migrated schema, binds named parameters
only, and is run by the store (or a documented consumer); every write to ``export_jobs`` lives there and
is conditional; and the models the store reads rows into have exactly the columns the statements return.
"""

from __future__ import annotations

import re
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from db.builder import copy_statement
from db.queries import all_queries, q
from db.rows import (
    CancellationBatch,
    ClaimAnswer,
    CreatedDestination,
    CutoffAnswer,
    DestinationEdit,
    DestinationName,
    DestinationRecord,
    DestinationRetirement,
    DestinationVersion,
    LedgerAnswer,
    PreviewedExport,
    StopToSignal,
)
from domain.destination import Destination
from domain.file_format import FileFormat
from domain.models import (
    AttemptEvent,
    CancellationRequest,
    ExpiredLease,
    ExportJob,
    OutboxMessage,
    OwnershipState,
)

ROOT = Path(__file__).resolve().parents[2]
STORES = sorted((ROOT / "db" / "stores").glob("*.py"))
PRODUCTION_SOURCES = [
    path
    for pattern in (
        "*.py",
        "db/**/*.py",
        "activities/**/*.py",
        "workflows/**/*.py",
        "api/**/*.py",
        "partner/**/*.py",
        "domain/**/*.py",
        "rules/**/*.py",
        "runtime/**/*.py",
        "service/**/*.py",
        "observability/**/*.py",
    )
    for path in ROOT.glob(pattern)
]

# Statements run by code other than a store method (db/stores/), with where and why. All of them live in db/ too and
# none writes export_jobs.
DOCUMENTED_CONSUMERS: dict[str, str] = {
    "insert_api_token": "db/admin.py: an administrator's connection stores a token's hash",
    "insert_tenant": "db/admin.py: seeding, as an administrator",
    "insert_destination": "db/admin.py: seeding, as an administrator",
    "insert_generated_contacts": "db/admin.py: seeding, as an administrator",
    "seed_switch": "db/admin.py: a tenant or destination created enabled, as an administrator",
    "upsert_principal": "db/admin.py: granting a principal its role, as an administrator",
    "revoke_principal": "db/admin.py: revoking a principal, as an administrator",
    "revoke_api_tokens": "db/admin.py: revoking a principal's tokens, as an administrator",
    "record_destination_seeded": "db/admin.py: a seeded destination's version 1, as an administrator",
    "set_build_scope": "db/builder.py: the COPY's scope, on the builder's own connection",
    "copy_contacts": "db/builder.py: the COPY itself, read by libpq in a thread",
    "lock_migrations": "db/migrate.py: the migration runner, as the database owner",
    "unlock_migrations": "db/migrate.py: the migration runner",
    "create_migrations_table": "db/migrate.py: the migration runner",
    "applied_migrations": "db/migrate.py: the migration runner",
    "record_migration": "db/migrate.py: the migration runner",
    "role_exists": "db/migrate.py: creating the application login",
    "become_dispatcher": "db/notify.py: the dispatcher's dedicated LISTEN connection",
    "listen_outbox": "db/notify.py: the dispatcher's dedicated LISTEN connection",
    "ping_database": "db/pool.py: readiness (/readyz) asks the process's own pool",
    "configure_gauges_session": "db/gauges.py: the scrape-time gauges' own connection, its role and timeout",
    "read_database_gauges": "db/gauges.py: the scrape-time gauges (observability/db_gauges.py's collector)",
}

NAMES = sorted(all_queries())

# Statements composed with psycopg.sql before they run (identifiers and literals of a checked value, never a
# request's): checked as they are sent, for a representative value.
COMPOSED = {
    "copy_contacts": lambda: copy_statement(
        FileFormat(header=False, delimiter="\t", columns=("last_name", "email"))
    ).decode(),
}


def sent(name: str) -> str:
    """The text that goes to the server: the statement itself, or its composition."""
    return COMPOSED[name]() if name in COMPOSED else q(name)


def test_every_named_statement_loads_with_a_description():
    assert len(NAMES) >= 30
    for name, query in all_queries().items():
        assert query.description, f"{name} has no one-line description under its header"
        assert query.sql.strip(), f"{name} is empty"


# How the store runs a named statement: through one of its helpers, by name.
_RUNS = re.compile(
    r'(?:_rows|_row|_matched|_unless_lost|_fence|fetch|fetch_maybe|execute|send|_finish)\(\s*(?:conn,\s*)?"(\w+)"'
)


def store_runs() -> set[str]:
    return {name for path in STORES for name in _RUNS.findall(path.read_text(encoding="utf-8"))}


@pytest.mark.parametrize("name", NAMES)
def test_every_named_statement_is_run_by_the_store_or_a_documented_consumer(name):
    if name in DOCUMENTED_CONSUMERS:
        consumer = ROOT / DOCUMENTED_CONSUMERS[name].split(":")[0]
        assert f'"{name}"' in consumer.read_text(encoding="utf-8"), f"{name} is not used by {consumer}"
        return
    assert name in store_runs(), f"statement {name} is run by no store method"


def test_every_statement_the_store_runs_exists():
    referenced = store_runs()
    assert len(referenced) >= 25, "the pattern no longer finds the store's statements"
    assert referenced <= set(NAMES), f"the store runs statements that do not exist: {referenced - set(NAMES)}"


@pytest.mark.parametrize("name", NAMES)
def test_statements_bind_named_parameters_only(name):
    text = sent(name)
    assert not re.search(r"%s|%b|%t|\$\d", text), f"{name} uses positional parameters"
    assert not re.search(r"\{\w*\}", text), f"{name} has a format placeholder"
    for placeholder in re.findall(r"%\(?", text):
        assert placeholder == "%(", f"{name}: a bare % outside a named parameter"


def prepare_and_describe(conn: psycopg.Connection, text: str) -> list[str]:
    """Parse and plan ``text`` on the server without running it; return the names of its result columns."""
    order: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    numbered = re.sub(r"%\((\w+)\)s", number, text)
    prepared = conn.pgconn.prepare(b"", numbered.encode())
    if prepared.status != psycopg.pq.ExecStatus.COMMAND_OK:
        pytest.fail(f"does not parse: {prepared.error_message.decode()}")
    described = conn.pgconn.describe_prepared(b"")
    return [described.fname(i).decode() for i in range(described.nfields)]


@pytest.fixture(scope="module")
def admin_conn(database):
    with psycopg.connect(database.admin_url, autocommit=True) as conn:
        yield conn


@pytest.mark.parametrize("name", NAMES)
def test_every_named_statement_parses_against_the_schema(admin_conn, name):
    prepare_and_describe(admin_conn, sent(name))


def test_a_composed_statement_puts_only_its_placeholders_in_the_text():
    # Every brace of the file's text is one of the composition's names: nothing else is formatted in.
    assert sorted(re.findall(r"\{(\w*)\}", q("copy_contacts"))) == ["columns", "delimiter", "header"]
    assert '"last_name", "email"' in sent("copy_contacts") and "HEADER false" in sent("copy_contacts")


def test_observability_holds_no_sql():
    # One SQL home: the collector and the readiness checks run named statements of db/ through db/ functions.
    package = ROOT / "observability"
    assert not list(package.glob("**/*.sql"))
    statement = re.compile(r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|WITH\s+\w+\s+AS)\b")
    offenders = [
        str(p.relative_to(ROOT)) for p in package.glob("**/*.py") if statement.search(p.read_text("utf-8"))
    ]
    assert offenders == []


# -- every write to export_jobs is in queries.sql, and conditional -----------------------------------


def test_only_the_job_store_writes_export_jobs():
    # 001 "Every writer": an architecture test that fails the build when code outside the job store writes
    # the job row. db/queries.sql is the one place; its statements are run by db/stores/.
    writes = re.compile(r"(UPDATE|INSERT\s+INTO|DELETE\s+FROM)\s+export_jobs\b", re.IGNORECASE)
    elsewhere = [
        *PRODUCTION_SOURCES,
        *(p for d in ("api", "activities", "workflows", "partner") for p in ROOT.glob(f"{d}/**/*.sql")),
    ]
    offenders = [str(p.relative_to(ROOT)) for p in elsewhere if writes.search(p.read_text(encoding="utf-8"))]
    assert offenders == []


def _update_clauses(text: str) -> list[tuple[str, str]]:
    """(SET list, WHERE clause) of every UPDATE export_jobs in a statement."""
    found = []
    for segment in text.split("UPDATE export_jobs")[1:]:
        body = segment.split("RETURNING")[0]
        set_part, _, where = body.partition("WHERE")
        found.append((set_part, where))
    return found


@pytest.mark.parametrize("name", [n for n in NAMES if "UPDATE export_jobs" in q(n)])
def test_every_write_to_export_jobs_is_conditional(name):
    for set_part, where in _update_clauses(q(name)):
        assert where.strip(), f"{name}: an UPDATE of export_jobs without a WHERE clause"
        assert re.search(r"\b(j\.)?id\s*=", where), f"{name}: the UPDATE does not name its row"
        if re.search(r"\bstatus\s*=", set_part):
            # A status change repeats the state it moves from.
            assert re.search(r"\bstatus\s*(=|IN)", where), (
                f"{name}: status written without a status condition"
            )


@pytest.mark.parametrize("name", [n for n in NAMES if "INSERT INTO outbox" in q(n)])
def test_every_wake_up_also_sets_woken_at_on_the_database_clock(name):
    # The sweeper tells how long a job waited since its last wake-up only if every wake-up sets woken_at.
    text = q(name)
    if "UPDATE export_jobs" in text:
        assert re.search(r"woken_at\s*=\s*clock_timestamp\(\)", text), f"{name} wakes a job without woken_at"
    else:
        assert "INSERT INTO export_jobs" in text and "woken_at" in text, (
            f"{name} wakes a job it did not create"
        )


# -- mapping checks ---------------------------------------------------------------------------------


async def _columns(database, table: str) -> list[str]:
    async with await psycopg.AsyncConnection.connect(database.admin_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT column_name FROM information_schema.columns"
            " WHERE table_schema = 'public' AND table_name = %(t)s ORDER BY ordinal_position",
            {"t": table},
        )
        return [r[0] for r in await cur.fetchall()]


@pytest.mark.parametrize(
    ("table", "model"),
    [
        ("export_jobs", ExportJob),
        ("cancellation_requests", CancellationRequest),
        ("export_attempt_events", AttemptEvent),
    ],
)
async def test_model_fields_are_exactly_the_table_columns(database, table, model):
    # A new column fails here, not in the cancellation method that reads the row with SELECT *.
    assert list(model.model_fields) == await _columns(database, table)


_RETURNED_ROWS: list[tuple[str, type[BaseModel]]] = [
    ("cancel_and_record", LedgerAnswer),
    ("get_job", ExportJob),
    ("get_tenant_job", ExportJob),
    ("list_tenant_jobs", ExportJob),
    ("read_ownership", OwnershipState),
    ("find_expired_leases", ExpiredLease),
    ("job_events", AttemptEvent),
    ("tenant_job_events", AttemptEvent),
    ("job_cancellation_requests", CancellationRequest),
    ("find_cancellation_request", CancellationRequest),
    ("record_cancellation_batch", CancellationBatch),
    ("find_cancellation_batch", CancellationBatch),
    ("record_cancellation_preview", PreviewedExport),
    ("batch_requests_of_jobs", CancellationRequest),
    ("batch_stops_to_signal", StopToSignal),
    ("take_unpublished", OutboxMessage),
    ("claim_if_queued", ClaimAnswer),
    ("authorize_delivery_if_running", CutoffAnswer),
    ("load_destination", Destination),
    ("tenant_destinations", DestinationName),
    ("create_destination", CreatedDestination),
    ("edit_destination_if_version", DestinationEdit),
    ("retire_destination", DestinationRetirement),
    ("get_tenant_destination", DestinationRecord),
    ("destination_versions_of", DestinationVersion),
]


@pytest.mark.parametrize(("name", "model"), _RETURNED_ROWS)
def test_statement_returns_exactly_the_fields_of_its_model(admin_conn, name, model):
    # Described by the server, never executed.
    assert sorted(prepare_and_describe(admin_conn, q(name))) == sorted(model.model_fields)


# The terms a policy evaluates; the claim's version condition is useful only if every edit of them
# increments version (001 "Version is the version of the job's terms"; 000 "A changed request").
TERMS_COLUMNS = ("destination_id", "list_name")


@pytest.mark.parametrize("name", [n for n in NAMES if "UPDATE export_jobs" in q(n)])
def test_every_write_to_a_terms_column_increments_version(name):
    for set_part, _where in _update_clauses(q(name)):
        if any(re.search(rf"\b{column}\s*=", set_part) for column in TERMS_COLUMNS):
            assert re.search(r"\bversion\s*=\s*version\s*\+\s*1\b", set_part), (
                f"{name}: a terms column is written without incrementing version"
            )


def test_the_terms_edit_is_the_one_statement_that_writes_terms():
    writers = [
        n
        for n in NAMES
        if "UPDATE export_jobs" in q(n)
        and any(
            re.search(rf"\b{c}\s*=", set_part) for set_part, _ in _update_clauses(q(n)) for c in TERMS_COLUMNS
        )
    ]
    assert writers == ["edit_terms_if_queued"]
