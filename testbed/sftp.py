"""Real SFTP servers for tests, benchmarks and the soak, and a TCP proxy to cut connections at a named point.

- an in-process asyncssh server (:class:`partner.local_server.LocalSftpServer`) on loopback, rooted
  in a temporary directory, with its own host key;
- a real OpenSSH ``sshd`` (Debian ``openssh-server``) on a free port, with its own config, host key,
  authorized key and a ``partner`` account, started and stopped by the tests (``shared/facts/sftp.md``);
- :class:`TcpProxy`, which sits between client and server and can cut the connection, or swallow
  the server's next answer and then cut, from a delivery hook: interruptions are real, not mocked.

The pytest fixtures over these live in ``tests/support/sftp.py``.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import pwd
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from domain.destination import Destination
from servers.ports import STARTUP_TIMEOUT, PortPicker, log_tail, pick_port, start_with_retries

SSHD = Path("/usr/sbin/sshd")
SSH_KEYGEN = shutil.which("ssh-keygen") or "/usr/bin/ssh-keygen"
PARTNER_USER = "partner"
_USER_LOCK = Path(tempfile.gettempdir()) / "fenced-exports-partner-user.lock"

ServerKind = Literal["asyncssh", "sshd"]


def sshd_available() -> bool:
    """A real sshd can be started here: the binary is installed and we may create its account (root)."""
    return SSHD.exists() and os.geteuid() == 0 and shutil.which("useradd") is not None


def _ensure_partner_user() -> pwd.struct_passwd:
    """Create the ``partner`` login account once per machine; safe when test runs race to do it."""
    with _USER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(PARTNER_USER)
        subprocess.run(["useradd", "-m", "-s", "/bin/sh", PARTNER_USER], check=True, capture_output=True)
        # A locked account ('!') is refused when UsePAM is off; '*' allows key logins only.
        subprocess.run(["usermod", "-p", "*", PARTNER_USER], check=True, capture_output=True)
        return pwd.getpwnam(PARTNER_USER)


@dataclass
class Sshd:
    """A private OpenSSH server for the ``partner`` account, in its own directory; ``stop()`` removes it."""

    work_dir: Path
    port: int
    host_key_line: str
    client_key_path: Path
    upload_dir: Path
    process: subprocess.Popen
    user: pwd.struct_passwd
    host: str = "127.0.0.1"
    max_sessions: int = 20
    client_alive_seconds: int = 0
    login_grace_seconds: int = 0
    host_key_path: Path | None = None

    def session_processes(self) -> list[int]:
        """The processes sshd runs for its open connections (every descendant of the listener), to pause
        one with SIGSTOP as a slow server would be; empty where there is no /proc."""
        parents: dict[int, int] = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:  # ended meanwhile
                continue
            parents[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        found, frontier = [], [self.process.pid]
        while frontier:
            children = [pid for pid, parent in parents.items() if parent in frontier]
            found += children
            frontier = children
        return found

    @classmethod
    def start(
        cls,
        *,
        max_sessions: int = 20,
        pick: PortPicker = pick_port,
        on_spawn: Callable[[subprocess.Popen[bytes]], None] | None = None,
        client_alive_seconds: int = 0,
        login_grace_seconds: int = 0,
    ) -> Sshd:
        """Generate keys and a config, start ``sshd -D -e``, and wait until it answers with its banner.

        Each try listens on a port from ``pick``; a try that fails (sshd exits, or no banner within the
        startup timeout) is stopped and tried again on a new port (:func:`servers.ports.start_with_retries`).
        ``on_spawn`` is called with the process right after each spawn (a test seam: it may kill it).
        ``client_alive_seconds`` (0: off) makes sshd drop a client that stops answering for about that long
        (``ClientAliveInterval`` 1 s, ``ClientAliveCountMax``), as partners drop a stalled client's session;
        ``login_grace_seconds`` (0: OpenSSH's 120 s) drops a connection not authenticated within that long
        (``LoginGraceTime``): a client stalled half-way through its handshake, which ClientAlive never asks.
        """
        user = _ensure_partner_user()
        work_dir = Path(tempfile.mkdtemp(prefix="fenced-sshd-"))
        work_dir.chmod(0o755)  # sshd reads the authorized keys as the partner user
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
        host_key = work_dir / "host_ed25519"
        client_key = work_dir / "client_ed25519"
        for key in (host_key, client_key):
            subprocess.run(
                [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(key)],
                check=True,
                capture_output=True,
            )
        authorized = work_dir / "authorized_keys"
        authorized.write_text(client_key.with_suffix(".pub").read_text())
        authorized.chmod(0o644)
        upload_dir = work_dir / "upload"
        upload_dir.mkdir()
        os.chown(upload_dir, user.pw_uid, user.pw_gid)
        host_key_line = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])

        def start_on(ports: PortPicker) -> Sshd:
            port = ports()
            config = work_dir / "sshd_config"
            config.write_text(
                _sshd_config(
                    port,
                    work_dir,
                    host_key,
                    authorized,
                    max_sessions,
                    client_alive_seconds,
                    login_grace_seconds,
                )
            )
            with (work_dir / "sshd.log").open("ab") as log:
                process = subprocess.Popen(
                    [str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
                )
            if on_spawn is not None:
                on_spawn(process)
            server = cls(
                work_dir=work_dir,
                port=port,
                host_key_line=host_key_line,
                client_key_path=client_key,
                upload_dir=upload_dir,
                process=process,
                user=user,
                max_sessions=max_sessions,
                client_alive_seconds=client_alive_seconds,
                login_grace_seconds=login_grace_seconds,
                host_key_path=host_key,
            )
            try:
                server._wait_for_banner()
            except BaseException:
                server._stop_process()
                raise
            return server

        try:
            return start_with_retries("OpenSSH sshd", start_on, pick=pick)
        except BaseException:
            shutil.rmtree(work_dir, ignore_errors=True)
            raise

    def _wait_for_banner(self, timeout: float = STARTUP_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(
                    f"sshd on port {self.port} exited with {self.process.returncode}: "
                    f"{log_tail(self.work_dir / 'sshd.log')}"
                )
            try:
                with socket.create_connection((self.host, self.port), timeout=1) as probe:
                    if probe.recv(8).startswith(b"SSH-"):
                        return
            except OSError:
                time.sleep(0.05)  # still starting: poll its port until it answers
        raise RuntimeError(
            f"sshd on port {self.port} did not answer within {timeout}s: {log_tail(self.work_dir / 'sshd.log')}"
        )

    def restart_with_new_host_key(self) -> str:
        """Stop sshd, give it a new host key, and start it again on the same port (a partner that rotated or
        reinstalled its server); returns the new key's line to pin. Sessions already open are sshd's own
        children and live on, as after a real restart."""
        self._stop_process()
        generation = len(list(self.work_dir.glob("host_ed25519*.pub")))
        host_key = self.work_dir / f"host_ed25519_{generation}"
        subprocess.run(
            [SSH_KEYGEN, "-q", "-t", "ed25519", "-N", "", "-C", "", "-f", str(host_key)],
            check=True,
            capture_output=True,
        )
        self.host_key_path = host_key
        self.host_key_line = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
        config = self.work_dir / "sshd_config"
        config.write_text(
            _sshd_config(
                self.port,
                self.work_dir,
                host_key,
                self.work_dir / "authorized_keys",
                self.max_sessions,
                self.client_alive_seconds,
                self.login_grace_seconds,
            )
        )
        with (self.work_dir / "sshd.log").open("ab") as log:
            self.process = subprocess.Popen(
                [str(SSHD), "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT
            )
        self._wait_for_banner()
        return self.host_key_line

    def make_upload_dir(self) -> Path:
        """A fresh directory the partner account owns, for one test."""
        path = self.upload_dir / uuid.uuid4().hex
        path.mkdir()
        os.chown(path, self.user.pw_uid, self.user.pw_gid)
        return path

    def stop(self) -> None:
        """Stop sshd (by its PID) and remove its directory."""
        self._stop_process()
        shutil.rmtree(self.work_dir, ignore_errors=True)

    def _stop_process(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def _sshd_config(
    port: int,
    work_dir: Path,
    host_key: Path,
    authorized: Path,
    max_sessions: int,
    client_alive_seconds: int = 0,
    login_grace_seconds: int = 0,
) -> str:
    alive = (
        ["ClientAliveInterval 1", f"ClientAliveCountMax {client_alive_seconds}"]
        if client_alive_seconds
        else []
    )
    if login_grace_seconds:
        alive.append(f"LoginGraceTime {login_grace_seconds}")
    return "\n".join(
        [
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {host_key}",
            f"PidFile {work_dir / 'sshd.pid'}",
            f"AuthorizedKeysFile {authorized}",
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin no",
            f"AllowUsers {PARTNER_USER}",
            f"MaxSessions {max_sessions}",
            "MaxStartups 100:30:200",
            *alive,
            "Subsystem sftp internal-sftp",
            "",
        ]
    )


class TcpProxy:
    """A loopback TCP proxy in front of a server; :meth:`cut` ends every connection through it at once.

    :meth:`cut_at_next_answer` lets the client's next request through, swallows the server's answer
    and then cuts: the request took effect on the server and the client never hears of it.
    :meth:`cut_before_next_request` drops the client's next request and cuts: the server never sees it.
    :meth:`cut_client_after_next_request` lets the next request through and resets only the client's
    side: the server keeps the connection and the request, and whatever it answers later goes nowhere
    (``late_answer`` is set when it does), as when the link to the client dies while the server is slow.
    :meth:`refuse_new_connections` closes each new connection as soon as it is accepted, until called with
    ``False``: a partner that answers nobody, while connections already open go on. ``accepted`` counts
    every connection that reached the proxy, refused or not. ``open_now`` and ``open_high_water`` are the
    partner's witness of concurrent sessions (issue #25.3): a connection counts from the moment the server
    accepted it until the server's side of it ended, as the server sees it.
    """

    def __init__(self, target_host: str, target_port: int, *, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.create_server(("127.0.0.1", port))  # port: listen again where one was
        self.port = self._listener.getsockname()[1]
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._swallow_answer = threading.Event()
        self._drop_request = threading.Event()
        self._orphan_after_request = threading.Event()
        self._refusing = threading.Event()
        self._orphans: set[socket.socket] = set()  # server sides whose client was cut
        self.cut_done = threading.Event()
        self.answer_swallowed = threading.Event()  # set before the cut that follows it
        self.request_dropped = threading.Event()  # set before the cut that follows it
        self.late_answer = threading.Event()  # a server side answered after its client was cut
        self.accepted = 0  # connections accepted (refused ones included): who tried to reach the partner
        self.open_now = 0  # connections the server holds open now
        self.open_high_water = 0  # the most it ever held at once
        threading.Thread(target=self._accept, name="tcp-proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.accepted += 1
            if self._refusing.is_set():
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._sockets += [client, server]
                self.open_now += 1
                self.open_high_water = max(self.open_high_water, self.open_now)
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump_from_server, args=(server, client), daemon=True).start()

    def _pump_from_server(self, server: socket.socket, client: socket.socket) -> None:
        try:
            self._pump(server, client, True)
        finally:
            with self._lock:  # the server's side of this connection ended: one session fewer at the partner
                self.open_now -= 1

    def reset_high_water(self) -> None:
        """Start the witness again from the connections open now."""
        with self._lock:
            self.open_high_water = self.open_now

    def _pump(self, source: socket.socket, sink: socket.socket, from_server: bool) -> None:
        try:
            while data := source.recv(1 << 16):
                if from_server and source in self._orphans:
                    self.late_answer.set()
                    continue
                if from_server and self._swallow_answer.is_set():
                    self._swallow_answer.clear()  # once: a new session afterwards goes through
                    self.answer_swallowed.set()
                    self.cut()
                    return
                if not from_server and self._drop_request.is_set():
                    self._drop_request.clear()
                    self.request_dropped.set()
                    self.cut()
                    return
                if not from_server and self._orphan_after_request.is_set():
                    self._orphan_after_request.clear()
                    sink.sendall(data)
                    self._orphans.add(sink)
                    self._reset(source)  # no FIN to the server: it only stops hearing from the client
                    return
                sink.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)

    def cut(self) -> None:
        """Reset every connection through the proxy now (both directions); new ones still work."""
        with self._lock:
            sockets, self._sockets = self._sockets, []
        for s in sockets:
            self._reset(s)
        self.cut_done.set()

    def _reset(self, s: socket.socket) -> None:
        with self._lock:
            if s in self._sockets:
                self._sockets.remove(s)
        with contextlib.suppress(OSError):
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset, no FIN
            s.shutdown(socket.SHUT_RDWR)
        s.close()

    def refuse_new_connections(self, refuse: bool = True) -> None:
        """From now on (until ``refuse_new_connections(False)``), close each new connection at once."""
        if refuse:
            self._refusing.set()
        else:
            self._refusing.clear()

    def cut_before_next_request(self) -> None:
        """From now on, the client's next bytes are dropped and the connection is cut."""
        self._drop_request.set()

    def cut_client_after_next_request(self) -> None:
        """From now on, the client's next bytes reach the server, then only the client's side is reset."""
        self._orphan_after_request.set()

    def cut_at_next_answer(self) -> None:
        """From now on, the first bytes the server sends are dropped and the connection is cut (once)."""
        self._swallow_answer.set()

    def stop_cutting(self) -> None:
        """Undo :meth:`cut_at_next_answer`: answers go through again."""
        self._swallow_answer.clear()

    def close(self) -> None:
        """Stop accepting and cut what is open."""
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread
        with contextlib.suppress(OSError):
            self._listener.close()
        self.cut()


@dataclass
class SftpTarget:
    """One test's (or one module's) place on one real server: an empty upload directory, reached through
    a proxy or directly (``host``, ``port``)."""

    kind: ServerKind
    host_key_line: str
    client_key_path: Path
    remote_dir: str  # the directory as the SFTP client names it
    local_dir: Path  # the same directory on this machine's disk, for set-up and assertions
    proxy: TcpProxy
    server_port: int
    username: str = PARTNER_USER
    extra: dict[str, Any] = field(default_factory=dict)
    host: str = "127.0.0.1"
    chrooted: bool = False  # the SFTP root is local_dir's parent, so a sibling is "/<name>"

    @property
    def port(self) -> int:
        """The server's own port (not the proxy's)."""
        return self.server_port

    @property
    def host_key(self) -> str:
        return self.host_key_line

    def sibling(self, name: str) -> tuple[str, Path]:
        """Another upload directory on the same server: (remote_dir, local_dir)."""
        assert self.chrooted, "siblings are made on the chrooted in-process server"
        local = self.local_dir.parent / name
        local.mkdir(exist_ok=True)
        return f"/{name}", local

    def destination(self, *, direct: bool = False, **contract: Any) -> Destination:
        """A destination pointing at this directory (through the proxy unless ``direct``)."""
        fields: dict[str, Any] = {
            "id": uuid.uuid4(),
            "tenant_id": uuid.uuid4(),
            "name": f"partner-{self.kind}",
            "host": "127.0.0.1",
            "port": self.server_port if direct else self.proxy.port,
            "username": self.username,
            "host_key": self.host_key_line,
            "credential_ref": str(self.client_key_path),
            "remote_dir": self.remote_dir,
            "max_write_request": 261120 if self.kind == "sshd" else 32768,
        }
        fields.update(contract)
        return Destination(**fields)

    def destination_row(self, **contract: Any) -> dict[str, Any]:
        """The columns for ``Factory.destination(tenant_id, **row)``, pointing through the proxy."""
        dest = self.destination(**contract)
        row = dest.model_dump(exclude={"id", "tenant_id"})
        if not row["host_keys"]:
            del row["host_keys"]  # none given: the one host_key is the one pinned
        return row

    def files(self) -> dict[str, bytes]:
        """Every file in the directory, by name (a listing taken on the server's own disk)."""
        return {p.name: p.read_bytes() for p in sorted(self.local_dir.iterdir()) if p.is_file()}

    def put(self, name: str, data: bytes) -> Path:
        """Create a file in the directory directly on the server's disk, as the partner's side would."""
        path = self.local_dir / name
        path.write_bytes(data)
        return path
