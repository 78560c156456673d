"""What each part of the instrumentation costs, end to end, in one run (``python -m bench.obs parts``).

Every round runs the same batch once under each configuration, in a shuffled (seeded) order: everything
off, everything on, and everything on but one part (``switching.ALL_PARTS``: metrics, the statement and
SFTP spans, each of the Temporal interceptor's three sides, the FastAPI middleware). A part's cost is
what turning it off saves from "everything on", batch against batch of the same round, in milliseconds of
this process's CPU per export: the median over the rounds with its 95 % bootstrap interval. The parts'
costs need not add up to "everything on" against "off": each is measured against the others being on.

Measured so here (40 x 200 contacts, 24 rounds, 2 vCPUs shared): everything on +4.0 ms of 61 an export
(1.065x CPU); the Temporal interceptor's worker sides most of it (its workflow side +1.6 ms, its activity
side +1.25), the statement and SFTP spans +1.4; its client side, the FastAPI middleware and metrics each
under 0.4 ms, within a run's resolution (their intervals include 0: about +-1.5 ms per part).
"""

from __future__ import annotations

import random
import statistics

from bench.obs.measures import median_interval
from bench.obs.overhead import open_bench
from bench.obs.switching import ALL_PARTS, PARTS

OFF, ALL = "off", "all"


def configurations() -> dict[str, frozenset[str]]:
    """Each configuration's name and the parts it turns on: off, all, and all but each part."""
    every = frozenset(ALL_PARTS)
    return {OFF: frozenset(), ALL: every, **{f"all but {part}": every - {part} for part in ALL_PARTS}}


async def parts(exports: int, contacts: int, rounds: int, partner: str = "asyncssh") -> dict[str, float]:
    """Run ``rounds`` rounds of every configuration; print and return each part's cost in CPU seconds per
    export (``"all"``: everything on against off)."""
    configs = configurations()
    walls: dict[str, list[float]] = {name: [] for name in configs}
    cpus: dict[str, list[float]] = {name: [] for name in configs}
    shuffle = random.Random(0).shuffle
    async with open_bench(contacts, partner) as bench:
        for _ in range(rounds):
            order = list(configs)
            shuffle(order)  # no configuration always runs first or after another
            for name in order:
                PARTS.clear()
                PARTS.update(configs[name])
                wall, cpu, _, _ = await bench.batch(
                    exports, "on" if configs[name] else "off", bool(configs[name])
                )
                walls[name].append(wall)
                cpus[name].append(cpu)
        kind = bench.partner
    PARTS.clear()
    PARTS.update(ALL_PARTS)
    print(
        f"parts: {exports} x {contacts} contacts per batch, {rounds} rounds of {len(configs)} configurations in "
        f"a shuffled order; partner: {kind}; CPU of this process per export with everything off "
        f"{statistics.median(cpus[OFF]) / exports * 1e3:.1f} ms"
    )
    print("configuration against off, the same round's batches (median of the rounds, 95 % interval):")
    for name in configs:
        if name == OFF:
            continue
        wall = [a / b for a, b in zip(walls[name], walls[OFF], strict=True)]
        cpu = [a / b for a, b in zip(cpus[name], cpus[OFF], strict=True)]
        (wl, wh), (cl, ch) = median_interval(wall), median_interval(cpu)
        print(
            f"  {name:26s} wall {statistics.median(wall):.3f}x ({wl:.3f}-{wh:.3f})  "
            f"CPU {statistics.median(cpu):.3f}x ({cl:.3f}-{ch:.3f})"
        )
    costs: dict[str, float] = {}
    print(
        "what each part costs: everything on less everything on but it, ms of CPU per export (95 % interval):"
    )
    for part in (ALL, *ALL_PARTS):
        without = OFF if part == ALL else f"all but {part}"
        saved = [(a - b) / exports for a, b in zip(cpus[ALL], cpus[without], strict=True)]
        low, high = median_interval(saved)
        costs[part] = statistics.median(saved)
        label = "everything, against off" if part == ALL else part
        print(f"  {label:26s} {costs[part] * 1e3:+6.2f} ms ({low * 1e3:+.2f} to {high * 1e3:+.2f})")
    return costs
