"""Ports that no outgoing connection can take, and the retry loop every server start goes through.

A port picked by binding port 0 lands in the kernel's ephemeral range, where any outgoing connection may
take it between the pick and the server's bind (issue 22: a Temporal server "did not start" on such a
port). :func:`pick_port` picks below that range instead, at random, and checks that it can be bound on
loopback right before it returns. :func:`start_with_retries` (and :func:`astart_with_retries` for
coroutines) runs one start attempt per try, each with new ports, and raises :class:`ServerStartError`
with one line naming the kind, the tries and the server's last output when every try failed.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

PortPicker = Callable[[], int]

EPHEMERAL_FALLBACK = (32768, 60999)  # Linux's default net.ipv4.ip_local_port_range
LOWEST_PORT = 20000
# Ports the project serves by default (PostgreSQL, Temporal frontend and UI, metrics, API): never picked.
WELL_KNOWN = frozenset({5432, 7233, 8233, 9464, 9465, 8000, 8080})
TRIES = 4
STARTUP_TIMEOUT = 60.0  # seconds: a loaded 2-core machine starts a server in seconds, an idle one in 0.5

_log = logging.getLogger(__name__)
_random = random.SystemRandom()


class ServerStartError(RuntimeError):
    """A server did not start in any of its tries; the message is one line with its last output."""


def ephemeral_range(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> tuple[int, int]:
    """The kernel's ephemeral port range (first, last), or Linux's default where it cannot be read."""
    try:
        first, last = (int(part) for part in path.read_text().split())
    except (OSError, ValueError):
        return EPHEMERAL_FALLBACK
    return first, last


def bindable(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a TCP listener could bind ``host:port`` right now."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def pick_port(preferred: int | None = None, *, host: str = "127.0.0.1") -> int:
    """A port to listen on: ``preferred`` when it can be bound, else a random bindable one below the
    ephemeral range (from 20000 up to its start), never one of the project's well-known ports."""
    if preferred and bindable(preferred, host):
        return preferred
    first_ephemeral = ephemeral_range()[0]
    low = LOWEST_PORT if first_ephemeral > LOWEST_PORT + 1000 else 1024
    for _ in range(500):
        port = _random.randrange(low, first_ephemeral)
        if port not in WELL_KNOWN and bindable(port, host):
            return port
    raise ServerStartError(f"no bindable port on {host} between {low} and {first_ephemeral}")


def one_line(text: str, lines: int = 3, width: int = 400) -> str:
    """The last non-empty ``lines`` lines of ``text`` joined with `` | ``, cut to ``width`` characters."""
    kept = [line.strip() for line in text.splitlines() if line.strip()][-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= width else "..." + joined[-width:]


def log_tail(path: Path, lines: int = 3) -> str:
    """The last lines of a server's log file as one line (empty when there is none)."""
    try:
        return one_line(path.read_text(errors="replace"), lines)
    except OSError:
        return ""


def _give_up(kind: str, tries: int, last: BaseException | None) -> ServerStartError:
    why = one_line(str(last)) if last is not None else "no try ran"
    name = type(last).__name__ if last is not None else ""
    return ServerStartError(f"{kind} did not start in {tries} tries; last: {name}: {why}")


def _tried(kind: str, attempt: int, tries: int, exc: BaseException) -> None:
    _log.warning(
        "%s: start %d of %d failed (%s: %s)", kind, attempt, tries, type(exc).__name__, one_line(str(exc))
    )


def start_with_retries(
    kind: str, start: Callable[[PortPicker], T], *, tries: int = TRIES, pick: PortPicker = pick_port
) -> T:
    """Run ``start(pick)`` up to ``tries`` times (each try picks its own ports through ``pick``) and return
    the first result; ``start`` must clean up what it started before it raises."""
    last: Exception | None = None
    for attempt in range(1, tries + 1):
        try:
            return start(pick)
        except Exception as exc:  # noqa: BLE001 - any failure to start is worth a try on new ports
            last = exc
            _tried(kind, attempt, tries, exc)
            time.sleep(0.2 * attempt)
    raise _give_up(kind, tries, last) from last


async def astart_with_retries(
    kind: str,
    start: Callable[[PortPicker], Awaitable[T]],
    *,
    tries: int = TRIES,
    pick: PortPicker = pick_port,
) -> T:
    """:func:`start_with_retries` for a coroutine start."""
    last: Exception | None = None
    for attempt in range(1, tries + 1):
        try:
            return await start(pick)
        except Exception as exc:  # noqa: BLE001 - any failure to start is worth a try on new ports
            last = exc
            _tried(kind, attempt, tries, exc)
            await asyncio.sleep(0.2 * attempt)
    raise _give_up(kind, tries, last) from last
