"""Configuration from ``EXPORTS_`` environment variables, built in ``main()``, never at import time.

Every knob of the system is a field here, with its default and a description; the README's table of
settings is checked against this class by a test, so a new field is documented or the build fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal
from uuid import UUID

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Everything a worker, the starter or the API needs to know about its surroundings.

    Each field reads ``EXPORTS_<NAME>``; the defaults are the demo's.
    """

    model_config = SettingsConfigDict(env_prefix="EXPORTS_", extra="ignore")

    # -- where things are -------------------------------------------------------------------------------
    database_url: str | None = Field(
        default=None, description="PostgreSQL URL of a login that may SET ROLE to the exports_* roles"
    )
    temporal_address: str = Field(default="localhost:7233", description="Temporal frontend host:port")
    temporal_namespace: str = Field(default="default", description="Temporal namespace")
    temporal_ui_url: str = Field(
        default="http://localhost:8233", description="base URL of the Temporal Web UI, for links"
    )
    task_queue: str = Field(
        default="exports",
        description="the shared task queue; each worker also serves <task_queue>-<worker_id>",
    )
    worker_id: str | None = Field(
        default=None, description="this worker's ID (default: host name, PID and a random suffix)"
    )
    work_dir: Path = Field(
        default=Path("/tmp/fenced-exports"), description="where a worker builds its files (contact data)"
    )
    api_host: str = Field(default="127.0.0.1", description="address `starter.py serve` listens on")
    api_port: int = Field(default=8080, description="port `starter.py serve` listens on")

    # -- who acts on the command line -------------------------------------------------------------------
    tenant: UUID | None = Field(default=None, description="the tenant `starter.py` acts for (or --tenant)")
    principal: str | None = Field(
        default=None, description="who `starter.py` records as acting (or --as; default: $USER)"
    )
    approval_ttl_seconds: int = Field(
        default=3600,
        ge=1,
        le=7 * 24 * 3600,
        description="how long a two-person action waits for its second person before it expires",
    )

    # -- leases, recovery and the sweeper ---------------------------------------------------------------
    lease_seconds: float = Field(default=60.0, description="the lease a claim or renewal sets")
    renew_every_seconds: float = Field(default=20.0, description="how often a worker renews its lease")
    max_attempts: int = Field(
        default=3,
        description="attempt cap: recovery fails a job after this many, and a transient delivery failure is "
        "tried again only while the job has used fewer",
    )
    release_backoff_base_seconds: float = Field(
        default=5.0,
        gt=0,
        description="the wait after a job's first give-back for a failure; it doubles with each one after it",
    )
    release_backoff_cap_seconds: float = Field(
        default=300.0, gt=0, description="the longest wait after a give-back for a failure (before jitter)"
    )
    max_transient_releases: int = Field(
        default=6,
        ge=0,
        description="give-backs for a failure a job may take; the next one ends it Failed (AttemptsExhausted)",
    )
    delivery_retry_base_seconds: float = Field(
        default=30.0,
        gt=0,
        description="the wait before a delivery that failed for a transient cause (the partner down, a cut "
        "session, no space) is tried again; it doubles with each attempt the job used, within EXPORTS_MAX_ATTEMPTS",
    )
    delivery_retry_cap_seconds: float = Field(
        default=900.0, gt=0, description="the longest wait before a delivery is tried again (before jitter)"
    )
    window_rename_margin_seconds: float = Field(
        default=5.0,
        ge=0,
        lt=60,
        description="the rename fence requires a destination's delivery window still open this long after it"
        " (windows change on the minute, so under 60 s)",
    )
    recovery_every_seconds: float = Field(default=30.0, description="recovery Schedule interval")
    recovery_batch: int = Field(default=100, description="expired leases taken over per recovery batch")
    recovery_concurrency: int = Field(
        default=8,
        ge=1,
        description="partner listings one recovery batch makes at once (its slow step; other takeovers need no slot)",
    )
    recovery_observe_tries: int = Field(
        default=3, ge=1, description="listings of the partner recovery tries before it records 'not observed'"
    )
    recovery_heartbeat_seconds: float = Field(
        default=20.0,
        gt=0,
        description="heartbeat timeout of a recovery batch: a stalled worker's batch moves on",
    )
    recovery_recheck_minutes: float = Field(
        default=10.0,
        gt=0,
        description="how often recovery lists the partner of an OutcomeUnknown again, to settle it on evidence",
    )
    recovery_recheck_hours: float = Field(
        default=24.0,
        ge=0,
        description="for how long after it was recorded recovery re-checks an OutcomeUnknown (0: never)",
    )
    sweep_after_seconds: float = Field(
        default=30 * 60.0, description="a Queued job whose last wake-up is older than this is re-woken"
    )
    sweep_every_seconds: float = Field(default=5 * 60.0, description="sweeper Schedule interval")
    sweep_batch: int = Field(default=500, description="jobs re-woken per sweeper batch")

    # -- recurring exports (issue 25, item 1) ----------------------------------------------------------
    recurring_catchup_firings: int = Field(
        default=1,
        ge=0,
        description="missed firings of a recurring export run after an outage; later missed ones are recorded "
        "skipped (catch_up)",
    )
    recurring_late_after_seconds: float = Field(
        default=120.0,
        ge=1,
        description="a firing recorded later than this after its nominal time is a missed firing (database clock)",
    )
    recurring_catchup_window_seconds: float = Field(
        default=24 * 3600.0,
        ge=10,
        description="how far back a recurring export's Temporal Schedule fires missed times after an outage "
        "(its catchup_window); PostgreSQL then runs at most EXPORTS_RECURRING_CATCHUP_FIRINGS of them",
    )

    # -- the worker's activities ------------------------------------------------------------------------
    build_heartbeat_seconds: float = Field(
        default=5.0, description="heartbeat timeout of the build; a stop reaches it within 0.8x this"
    )
    deliver_heartbeat_seconds: float = Field(default=10.0, description="heartbeat timeout of the upload")
    schedule_to_start_seconds: float = Field(
        default=60.0, description="how long a host's own queue may hold an activity before it times out"
    )
    build_timeout_seconds: float = Field(default=2 * 3600.0, description="longest a build may run")
    deliver_timeout_seconds: float = Field(default=6 * 3600.0, description="longest an upload may run")
    max_concurrent_deliveries: int = Field(default=8, description="uploads one worker runs at once")
    max_concurrent_builds: int = Field(
        default=4, description="builds one worker runs at once, each on its own connection of the build pool"
    )
    shutdown_grace_seconds: float = Field(
        default=15.0, description="on SIGTERM, how long running activities get to reach their writes"
    )
    # -- a partner's session limit (issue 25, item 3) ----------------------------------------------------
    session_slot_wait_seconds: float = Field(
        default=300.0,
        ge=0,
        description="how long a built attempt waits for one of its partner's session slots before it gives "
        "its export back (not counted)",
    )
    session_slot_retry_seconds: float = Field(
        default=30.0,
        ge=0,
        description="after such a give-back, how long the export waits before the next claim",
    )
    session_takeover_hold_seconds: float = Field(
        default=120.0,
        ge=0,
        description="how long the session slot of an attempt recovery took over stays held, unless that attempt "
        "gives it back sooner: as long as the partner may keep a stalled client's connection (OpenSSH's "
        "LoginGraceTime is 120 s); 0: freed at the takeover",
    )
    session_hold_seconds: float = Field(
        default=180.0,
        ge=10,
        description="longest a session slot taken by recovery, a cleanup or a connection test is held when "
        "its holder never releases it",
    )

    # -- pools and the outbox dispatcher ----------------------------------------------------------------
    worker_pool_size: int = Field(default=10, description="connections of a worker's exports_worker pool")
    api_pool_size: int = Field(default=10, description="connections of the API's exports_api pool")
    dispatcher_batch: int = Field(default=50, description="outbox rows the dispatcher takes per pass")
    dispatcher_concurrency: int = Field(
        default=32, ge=1, description="workflow starts in flight in one dispatcher"
    )
    dispatcher_lease_seconds: float = Field(
        default=30.0,
        gt=12.0,
        description="publishing lease on a taken outbox batch (above the 10 s start timeout)",
    )
    dispatcher_poll_seconds: float = Field(
        default=2.0, description="dispatcher poll interval (it also wakes on NOTIFY)"
    )
    cancel_lock_timeout_seconds: float = Field(
        default=2.0, description="how long a cancellation waits for the job's row lock before Busy"
    )

    # -- the export list and its counts (issue 26, item 5) ---------------------------------------------
    list_query_timeout_ms: int = Field(
        default=250,
        ge=1,
        description="the bound on each read of the export list and its counts (console and GET /exports): a "
        "statement past it is canceled, and the page or the API says so",
    )
    list_exact_count_limit: int = Field(
        default=10_000,
        ge=0,
        description="counts the planner expects at most this many of are taken exactly (and stop past it); "
        "larger ones show the planner's estimate, labelled 'about'",
    )

    # -- outcome notifications: the webhook dispatcher (issue 26) -----------------------------------------
    webhooks_enabled: bool = Field(
        default=True, description="run the webhook dispatcher in this worker (events are written regardless)"
    )
    webhook_poll_seconds: float = Field(
        default=1.0, gt=0, description="how often the webhook dispatcher looks for new events and due retries"
    )
    webhook_batch: int = Field(
        default=50, ge=1, description="events fanned out, and attempts leased, per pass"
    )
    webhook_concurrency: int = Field(
        default=16, ge=1, description="webhook POSTs in flight in one dispatcher"
    )
    webhook_timeout_seconds: float = Field(
        default=10.0, gt=0, description="one POST to an endpoint, connect to last byte"
    )
    webhook_lease_seconds: float = Field(
        default=60.0, gt=0, description="a leased attempt's lease (above the POST's timeout)"
    )
    webhook_retry_base_seconds: float = Field(
        default=10.0, gt=0, description="first retry after a failed attempt; doubles per attempt, with jitter"
    )
    webhook_retry_cap_seconds: float = Field(default=3600.0, gt=0, description="longest wait between retries")
    webhook_retry_window_seconds: float = Field(
        default=86400.0, gt=0, description="how long a delivery is retried before it is given up (failed)"
    )
    webhook_max_endpoints: int = Field(
        default=20, ge=1, description="webhook endpoints one tenant may register"
    )

    # -- secure connections (Temporal TLS, mutual TLS, API key; SFTP key passphrase) ---------------------
    # PostgreSQL TLS needs no setting: libpq reads sslmode, sslrootcert, sslcert and sslkey from
    # EXPORTS_DATABASE_URL (or the PGSSLMODE/PGSSLROOTCERT environment), for every connection we open.
    temporal_tls: bool = Field(
        default=False,
        description="connect to Temporal over TLS, checking the server against the system's CAs; "
        "implied by any EXPORTS_TEMPORAL_TLS_* file or an API key",
    )
    temporal_tls_ca: Path | None = Field(
        default=None, description="PEM file of the CA(s) that sign the Temporal frontend's certificate"
    )
    temporal_tls_cert: Path | None = Field(
        default=None, description="PEM client certificate for mutual TLS (with EXPORTS_TEMPORAL_TLS_KEY)"
    )
    temporal_tls_key: Path | None = Field(
        default=None,
        description="unencrypted PEM private key of EXPORTS_TEMPORAL_TLS_CERT (keep it 0600)",
    )
    temporal_tls_server_name: str | None = Field(
        default=None,
        description="name the server's certificate must carry, and the TLS SNI, when it differs from the "
        "address's host",
    )
    temporal_api_key: SecretStr | None = Field(
        default=None,
        description="Temporal Cloud API key, sent as 'authorization: Bearer'; never logged "
        "(or use EXPORTS_TEMPORAL_API_KEY_FILE)",
    )
    temporal_api_key_file: Path | None = Field(
        default=None, description="file holding the Temporal API key (a mounted secret), instead of the value"
    )
    temporal_connect_timeout_seconds: float = Field(
        default=10.0, description="how long start-up waits for Temporal before giving up with an error"
    )
    sftp_key_passphrase: SecretStr | None = Field(
        default=None,
        description="passphrase of encrypted SFTP private keys (credential_ref files); never logged; "
        "or use EXPORTS_SFTP_KEY_PASSPHRASE_FILE",
    )
    sftp_key_passphrase_file: Path | None = Field(
        default=None,
        description="secrets file whose first line is the SFTP key passphrase (a mounted secret), "
        "instead of the value",
    )
    signing_key_passphrase: SecretStr | None = Field(
        default=None,
        description="passphrase of protected OpenPGP signing keys (pgp_signing_key_ref files); never logged; "
        "or use EXPORTS_SIGNING_KEY_PASSPHRASE_FILE",
    )
    signing_key_passphrase_file: Path | None = Field(
        default=None,
        description="secrets file whose first line is the signing key passphrase (a mounted secret), "
        "instead of the value",
    )

    # -- observability (issue 11) -----------------------------------------------------------------------
    log_format: Literal["text", "json", "auto"] = Field(
        default="text",
        description="log lines: readable text, one JSON object per line, or auto (JSON unless a terminal)",
    )
    log_level: str = Field(default="INFO", description="the root logger's level")
    trace_reads: bool = Field(
        default=False,
        description="with tracing on, a span for every read statement too (writes and SFTP steps always)",
    )
    metrics_host: str = Field(
        default="127.0.0.1",
        description="address of the worker's /metrics, /healthz and /readyz (0.0.0.0 for a remote Prometheus)",
    )
    metrics_port: int = Field(
        default=9464, description="port of the worker's /metrics, /healthz and /readyz (0: not served)"
    )
    temporal_metrics_port: int = Field(
        default=9465, description="port where the Temporal SDK serves its own worker metrics (0: off)"
    )
    metrics_tenant_labels: bool = Field(
        default=False,
        description="label transition, cancellation and Busy counters with the tenant ID (one series per tenant)",
    )
    metrics_db_gauges: bool = Field(
        default=True, description="serve the database gauges (jobs by status, ages, outbox) from this worker"
    )
    metrics_db_cache_seconds: float = Field(
        default=5.0, description="how long one answer of the database gauges query is reused by scrapes"
    )
