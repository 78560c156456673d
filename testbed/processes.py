"""Child processes for the soak and end-to-end tests: started, signalled and stopped by their own PID,
with every line they print written to a log file with the time it was read.

Lines are stamped by the parent as it reads them (``<unix time> <line>``), so a program's own log format
does not matter: uvicorn's tracebacks, ``worker.py``'s log lines and the Temporal server's banner all get
a time that can be set beside the parent's own records. A child is put in a session of its own (Ctrl-C
in the parent's terminal reaches only the parent) and, on Linux, is killed when the parent dies
(``PR_SET_PDEATHSIG``), so a soak that is itself killed leaves nothing running. Start children from the
event loop's thread: the death signal follows the thread that forked.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:  # pragma: no cover - runs in the forked child
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Child:
    """One child process with a stamped log; ``start`` may be called again after it ended (a restart)."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.log_path = log_path
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self._pump: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def running(self) -> bool:
        """Started and not yet exited (a stopped process counts as running)."""
        return self.process is not None and self.process.poll() is None

    def returncode(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def start(self) -> None:
        """Start the process (it must not be running) and its log pump."""
        if self.running():
            raise RuntimeError(f"{self.name} is already running (pid {self.pid})")
        self._release()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self.starts += 1
        self.process = subprocess.Popen(
            self.argv,
            env=self.env,
            cwd=self.cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # only prctl in the child
        )
        with self.log_path.open("ab") as log:
            log.write(f"{time.time():.3f} --- start #{self.starts} pid {self.process.pid}\n".encode())
        self._pump = threading.Thread(
            target=_pump, args=(self.process, self.log_path), name=f"log-{self.name}", daemon=True
        )
        self._pump.start()

    def _release(self) -> None:
        """Let the previous run's log pump finish and close its pipe (before a restart)."""
        if self._pump is not None:
            self._pump.join(timeout=5)
        if self.process is not None and self.process.stdout is not None and not self.running():
            self.process.stdout.close()

    def send(self, sig: int) -> bool:
        """Send ``sig`` to this child's PID; False when it is not running."""
        if not self.running():
            return False
        assert self.process is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.process.pid, sig)
            return True
        return False

    def wait(self, timeout: float) -> int | None:
        """Wait up to ``timeout`` seconds for the exit; returns the code, or None if still running."""
        if self.process is None:
            return None
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout: float = 10.0, sig: int = signal.SIGTERM) -> int | None:
        """``sig`` (after SIGCONT, in case it is stopped), then SIGKILL after ``timeout``; returns the code."""
        if not self.running():
            self._release()
            return self.returncode()
        self.send(signal.SIGCONT)
        self.send(sig)
        code = self.wait(timeout)
        if code is None:
            self.send(signal.SIGKILL)
            code = self.wait(10)
        self._release()
        return code

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log (stamped)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def log_contains(self, needle: str, since_start: bool = True) -> bool:
        """Whether the log holds ``needle`` (in the current run's part when ``since_start``)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return False
        if since_start:
            marker = f"--- start #{self.starts} "
            text = text[text.rfind(marker) :] if marker in text else text
        return needle in text


def _pump(process: subprocess.Popen[bytes], log_path: Path) -> None:
    assert process.stdout is not None
    with log_path.open("ab", buffering=0) as log:
        for line in iter(process.stdout.readline, b""):
            log.write(f"{time.time():.3f} ".encode() + line.rstrip(b"\n") + b"\n")
        code = process.wait()
        log.write(f"{time.time():.3f} --- exited with {code}\n".encode())
