"""The seeded schedule of a soak: what each export's client does and when each fault fires.

Everything random is drawn here, from one ``random.Random(seed)``, before anything starts: the same seed
gives the same plan (its digest is printed), so a run can be repeated. What the running system does
with the plan depends on timing; the report says what actually happened.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import asdict, dataclass

from chaos.config import LIST_WEIGHTS, SoakConfig

CANCEL_POINTS = ("none", "immediate", "queued", "building", "delivering", "after_end")
_CANCEL_WEIGHTS = (0.42, 0.08, 0.1, 0.16, 0.14, 0.1)


@dataclass(frozen=True)
class ExportPlan:
    """One export's client script."""

    index: int
    at: float  # seconds into the load phase
    list_name: str
    idempotency_key: str
    cancel: str  # one of CANCEL_POINTS: when the client cancels, timed from outside by watching status
    cancel_delay: float  # for "queued": seconds after the create answer
    cancel_again: str  # "none", "retry_same" (same request ID: a replay) or "second" (a new request ID)
    edit: str  # "none", "ok" (If-Match the version read), "stale" (an old version), "late" (after the claim)
    edit_list: str
    duplicate: (
        str  # "none", "sequential", "concurrent" (same key and body), "conflict" (same key, other body)
    )
    replace: bool  # replace the export if it ends OutcomeUnknown or Failed (replaceable code)
    overwrite: bool  # the replacement carries an overwrite agreement
    encrypted: bool = False  # to the destination that receives .csv.gz.pgp (every n-th, drawn from nothing)


@dataclass(frozen=True)
class FaultPlan:
    """One fault: ``target`` is a worker slot for worker faults; ``pick`` chooses among what is open at
    the time for workflow faults; ``hold`` is how long a pause, cut or outage lasts."""

    index: int
    at: float
    kind: str
    target: int
    pick: float
    hold: float
    mode: str


@dataclass(frozen=True)
class Plan:
    seed: int
    exports: list[ExportPlan]
    faults: list[FaultPlan]

    def digest(self) -> str:
        """SHA-256 (first 16 hex digits) of the plan: equal for equal seeds and options."""
        text = json.dumps(asdict(self), sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _weighted(rng: random.Random, options: dict[str, float]) -> str:
    return rng.choices(list(options), weights=list(options.values()))[0]


def make_plan(config: SoakConfig) -> Plan:
    """The schedule for ``config`` (exports spread over the load phase, faults over it too)."""
    rng = random.Random(config.seed)
    load = config.load_seconds
    lists = {name: LIST_WEIGHTS.get(name, 0.1) for name in config.lists}
    arrival_end = max(1.0, load * 0.85)
    exports: list[ExportPlan] = []
    for index, at in enumerate(sorted(rng.uniform(0.0, arrival_end) for _ in range(config.exports))):
        list_name = _weighted(rng, lists)
        cancel = rng.choices(CANCEL_POINTS, weights=_CANCEL_WEIGHTS)[0]
        again = "none"
        if cancel != "none":
            again = rng.choices(("none", "retry_same", "second"), weights=(0.6, 0.25, 0.15))[0]
        edit = rng.choices(("none", "ok", "stale", "late"), weights=(0.75, 0.15, 0.05, 0.05))[0]
        edit_list = rng.choice([n for n in config.lists if n != list_name] or [list_name])
        duplicate = rng.choices(
            ("none", "sequential", "concurrent", "conflict"), weights=(0.8, 0.08, 0.08, 0.04)
        )[0]
        exports.append(
            ExportPlan(
                index=index,
                at=round(at, 3),
                list_name=list_name,
                idempotency_key=f"chaos-{config.seed}-{index}",
                cancel=cancel,
                cancel_delay=round(rng.uniform(0.0, 0.5), 3),
                cancel_again=again,
                edit=edit,
                edit_list=edit_list,
                duplicate=duplicate,
                replace=rng.random() < 0.85,
                overwrite=rng.random() < 0.3,
                encrypted=config.encrypted_every > 0 and index % config.encrypted_every == 0,
            )
        )

    kinds = list(config.faults)
    count = max(len(kinds), round(load / config.fault_every)) if kinds else 0
    sequence = kinds + [rng.choice(kinds) for _ in range(count - len(kinds))] if kinds else []
    rng.shuffle(sequence)
    window = (min(2.0, load / 4), max(load - 2.0, load * 0.9))
    times = sorted(rng.uniform(*window) for _ in sequence)
    faults = [
        FaultPlan(
            index=i,
            at=round(at, 3),
            kind=kind,
            target=rng.randrange(config.workers),
            pick=round(rng.random(), 6),
            hold=round(_hold(rng, kind, config), 3),
            mode=_mode(rng, kind),
        )
        for i, (at, kind) in enumerate(zip(times, sequence, strict=True))
    ]
    return Plan(seed=config.seed, exports=exports, faults=faults)


def _hold(rng: random.Random, kind: str, config: SoakConfig) -> float:
    lease = config.lease_seconds
    match kind:
        case "worker_pause":
            return lease * 1.3 + rng.uniform(0.0, lease)  # past the lease: recovery takes over meanwhile
        case "worker_kill" | "worker_drain":
            return rng.uniform(0.5, 3.0)  # down this long before the restart
        case "pg_sever" | "sftp_sever":
            return rng.uniform(0.0, 2.0)  # new connections refused this long after the cut
        case "partner_outage":
            # longer than a delivery's own connect tries (about 3 s), so the delivery fails and is retried
            return rng.uniform(5.0, 12.0)
        case "pg_restart_immediate" | "pg_restart_fast" | "temporal_restart" | "api_restart":
            return rng.uniform(0.3, 3.0)  # down this long
        case _:
            return 0.0


def _mode(rng: random.Random, kind: str) -> str:
    match kind:
        case "worker_kill" | "worker_pause" | "worker_drain":
            # Which worker: the planned slot, or the one holding an attempt that is building/delivering.
            return rng.choices(("planned", "building", "delivering"), weights=(0.3, 0.4, 0.3))[0]
        case "temporal_restart":
            return rng.choice(("term", "kill"))
        case "workflow_terminate" | "workflow_cancel":
            return rng.choices(("running", "delivering", "any"), weights=(0.5, 0.25, 0.25))[0]
        case _:
            return ""
