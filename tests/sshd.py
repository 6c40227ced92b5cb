"""A real OpenSSH server for tests: Debian's ``sshd`` on a free loopback port.

Everything it needs is generated in a temp folder: a host key, a client key, an
``authorized_keys``, a ``known_hosts`` holding the host key, and an SSH client config
with a ``Host`` alias, so code under test connects exactly as it would to a lab host
(``ssh -F <config> <alias>``, or fabric/paramiko with that config) with host keys checked.

    server = start_sshd(tmp_path)          # or the ``sshd`` fixture in conftest.py
    subprocess.run(server.ssh_argv("true"), check=True)
    server.stop()

Needs the ``openssh-server`` package (``apt-get install -y openssh-server``).
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SSHD = "/usr/sbin/sshd"


def sshd_unavailable() -> str | None:
    """Why a real sshd cannot run here (None when it can)."""
    if not Path(SSHD).is_file():
        return f"{SSHD} not found: install Debian's openssh-server (apt-get install -y openssh-server)"
    if shutil.which("ssh-keygen") is None:
        return "ssh-keygen not found: install openssh-client"
    return None


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago (the caller retries if it is taken meanwhile)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@dataclass
class SshServer:
    """A running sshd and the client-side files that reach it."""

    root: Path
    host: str
    port: int
    alias: str
    user: str
    identity: Path  # client private key
    known_hosts: Path
    config: Path  # ssh client config with the Host alias
    host_key_line: str  # "ssh-ed25519 AAAA..." as it goes into known_hosts
    process: subprocess.Popen[bytes] = field(repr=False)

    def ssh_argv(self, *command: str, alias: str | None = None) -> list[str]:
        """``ssh`` with this server's config, e.g. ``subprocess.run(server.ssh_argv("true"))``."""
        return ["ssh", "-F", str(self.config), alias or self.alias, *command]

    def add_alias(
        self, alias: str, *, host: str | None = None, port: int | None = None, known_hosts: Path | None = None
    ) -> str:
        """Append another Host alias (e.g. one pointing at a closed port, or at an empty
        known_hosts) to the client config; returns the alias."""
        with open(self.config, "a") as handle:
            handle.write(
                _host_block(
                    alias,
                    host or self.host,
                    port or self.port,
                    self.user,
                    self.identity,
                    known_hosts or self.known_hosts,
                )
            )
        return alias

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_sshd(
    workdir: Path, *, alias: str = "h3test", host: str = "127.0.0.1", wrap: tuple[str, ...] = (), timeout: float = 15.0
) -> SshServer:
    """Generate keys and configs under ``workdir`` and start ``sshd -D`` on a free port.

    ``wrap`` prefixes the sshd command (e.g. ``("ip", "netns", "exec", "ns1")`` to run it
    in a network namespace; ``host`` is then that namespace's address).
    """
    reason = sshd_unavailable()
    if reason:
        raise RuntimeError(reason)
    root = Path(workdir)
    root.mkdir(parents=True, exist_ok=True)
    host_key, identity = root / "ssh_host_ed25519_key", root / "id_ed25519"
    for key in (host_key, identity):
        if not key.exists():
            subprocess.run(
                ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "h3flow-test", "-f", str(key)],
                check=True,
                capture_output=True,
            )
    authorized = root / "authorized_keys"
    authorized.write_text(identity.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    if os.geteuid() == 0:
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
    user = getpass.getuser()
    host_key_line = " ".join(host_key.with_suffix(".pub").read_text().split()[:2])
    last_error = ""
    for _ in range(5):  # a free port can be taken before sshd binds it: try another
        port = free_port(host) if not wrap else 20000 + int.from_bytes(os.urandom(2), "big") % 20000
        sshd_config = root / "sshd_config"
        sshd_config.write_text(_sshd_config(root, host, port, host_key, authorized))
        log = root / "sshd.log"
        with open(log, "wb") as log_file:  # sshd keeps its own copy of the descriptor
            process = subprocess.Popen(
                [*wrap, SSHD, "-D", "-e", "-f", str(sshd_config)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=log_file,
            )
        if _wait_for_banner(process, host, port, wrap, timeout):
            known_hosts = root / "known_hosts"
            bracketed = host if port == 22 else f"[{host}]:{port}"
            known_hosts.write_text(f"{bracketed} {host_key_line}\n")
            config = root / "ssh_config"
            config.write_text(_host_block(alias, host, port, user, identity, known_hosts))
            return SshServer(root, host, port, alias, user, identity, known_hosts, config, host_key_line, process)
        process.kill()
        process.wait()
        last_error = log.read_text(errors="replace").strip()
    raise RuntimeError(f"sshd did not start: {last_error[-500:]}")


def _sshd_config(root: Path, host: str, port: int, host_key: Path, authorized: Path) -> str:
    return f"""\
Port {port}
ListenAddress {host}
HostKey "{host_key}"
PidFile "{root / "sshd.pid"}"
AuthorizedKeysFile "{authorized}"
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
MaxStartups 64
LogLevel ERROR
"""


def _host_block(alias: str, host: str, port: int, user: str, identity: Path, known_hosts: Path) -> str:
    return f"""\
Host {alias}
    HostName {host}
    Port {port}
    User {user}
    IdentityFile "{identity}"
    IdentitiesOnly yes
    UserKnownHostsFile "{known_hosts}"
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 5

"""


def _wait_for_banner(
    process: subprocess.Popen[bytes], host: str, port: int, wrap: tuple[str, ...], timeout: float
) -> bool:
    """Poll until sshd greets with its SSH banner (or exits)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            return False
        try:
            with socket.create_connection((host, port), timeout=1.0) as sock:
                if sock.recv(64).startswith(b"SSH-2.0-"):
                    return True
        except OSError:
            pass
        time.sleep(0.02)  # polling interval while sshd starts
    return False
