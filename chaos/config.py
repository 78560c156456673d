"""The soak's knobs: how many exports, which seed, which faults, and the short leases that let faults
resolve within a run."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

FAULT_KINDS: tuple[str, ...] = (
    "worker_kill",  # SIGKILL a worker, restart it
    "worker_pause",  # SIGSTOP a worker past its lease, then SIGCONT
    "worker_drain",  # SIGTERM a worker (graceful drain), restart it
    "pg_sever",  # cut every worker connection to PostgreSQL at the proxy (and refuse new ones briefly)
    "sftp_sever",  # cut every worker connection to the partner at the proxy (and refuse new ones briefly)
    "partner_outage",  # the partner is down for seconds (every connection refused): deliveries retry (#25.4)
    "pg_restart_immediate",  # pg_ctl stop -m immediate, start again
    "pg_restart_fast",  # pg_ctl stop -m fast, start again
    "temporal_restart",  # stop the dev server (SIGTERM or SIGKILL), start it on the same --db-filename
    "workflow_terminate",  # temporal workflow terminate of an open export workflow
    "workflow_cancel",  # temporal workflow cancel of an open export workflow
    "api_restart",  # SIGTERM the API process, start it again
)

# Contact lists the tenant has, with their sizes: a mix so builds and uploads take from milliseconds to
# about a second, and cancels land at every point.
LISTS: dict[str, int] = {"tiny": 20, "small": 400, "medium": 4_000, "large": 40_000, "huge": 150_000}
LIST_WEIGHTS: dict[str, float] = {"tiny": 0.2, "small": 0.3, "medium": 0.27, "large": 0.18, "huge": 0.05}


@dataclass(frozen=True)
class SoakConfig:
    """One soak run. ``duration`` is the load-and-fault phase (exports arrive and faults fire within it);
    ``settle`` bounds the wait for recovery afterwards."""

    exports: int = 300
    recurring: int = 3  # recurring exports defined through the API, firing every minute during the load
    seed: int = 1
    workers: int = 3
    duration: float | None = None  # default: derived from ``exports``
    settle: float = 180.0
    faults: tuple[str, ...] = FAULT_KINDS
    fault_every: float = 5.0  # mean seconds between faults
    report_json: Path | None = None
    run_dir: Path | None = None  # default: a fresh directory under /tmp, kept (logs), partner files removed
    keep: bool = False  # keep the partner's files and the databases' directories too
    temporary_files: str = "keep"  # the partner destination's cleanup agreement ('keep' or 'remove')
    # Every n-th export goes to a second destination of the same partner that receives gzip, encrypted to
    # the partner's key and signed with the tenant's (issue #24 item 5); 0: none. The auditor decrypts them.
    encrypted_every: int = 3
    # The main destination's delivery window (issue #25.2): its intake hours leave out one minute in every n
    # (UTC) from the start of the run, so claims, cutoff 2 and rename fences meet a closed window; 0: none. The
    # auditor checks that no rename happened outside it.
    window_closed_every: int = 4
    # The partner's limit of concurrent sessions on the main destination (issue #25.3; 0: none), held as slots
    # by every worker. Its proxy is the partner's witness: the auditor checks the most sessions the partner
    # ever held at once against it. The partner drops a client silent for ``partner_client_alive_seconds``
    # (a paused worker's session), as partners do, and sooner than a lease expires.
    session_limit: int = 2
    partner_client_alive_seconds: int = 2
    # ... and a connection not authenticated within this long (sshd's LoginGraceTime): a worker paused half-way
    # through its handshake, which ClientAlive never asks (the 2,000-export soak met one, 6 s past a takeover).
    partner_login_grace_seconds: int = 5
    # How long a slot recovery's takeover leaves held for the attempt it took over (0041): at least as long as
    # the partner keeps a stalled client's connection (the two settings above), or a session it still counts
    # could be joined by one more.
    session_takeover_hold_seconds: float = 8.0
    # The workers' settings (EXPORTS_*): short, so a lease lost to a fault is recovered within the run.
    lease_seconds: float = 6.0
    renew_every_seconds: float = 2.0
    recovery_every_seconds: float = 3.0
    sweep_after_seconds: float = 20.0
    sweep_every_seconds: float = 5.0
    shutdown_grace_seconds: float = 5.0
    max_attempts: int = 3
    # give-backs for failures (23.1): short waits, so a job given back after a fault settles within the run
    release_backoff_base_seconds: float = 1.0
    release_backoff_cap_seconds: float = 8.0
    # retries that wait (issue #25.4): short, so an export that met a partner outage is delivered within the run
    delivery_retry_base_seconds: float = 2.0
    delivery_retry_cap_seconds: float = 8.0
    max_transient_releases: int = 6
    lists: dict[str, int] = field(default_factory=lambda: dict(LISTS))
    verbose: bool = False

    @property
    def load_seconds(self) -> float:
        """The load-and-fault phase: given, or 20 s plus 0.4 s per export."""
        return self.duration if self.duration is not None else 20.0 + 0.4 * self.exports
