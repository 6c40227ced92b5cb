"""The ``sftp`` transfer: SSH to the host's alias with fabric, upload, verify remotely, link.

For hosts where no receiver service runs. Host keys are always checked (paramiko's
``RejectPolicy`` against the ``known_hosts`` files the SSH config names; fabric itself
would accept any key), the upload is pipelined (no round trip per 32 KiB write), and the
object appears under its content address only after ``sha256sum`` on the remote host
agrees with ours; it is hard-linked into place (a rename that never replaces an
existing object). Every remote path is passed through :func:`shlex.quote`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import posixpath
import shlex
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3flow.core.errors import H3FlowError, IntegrityError, TransientError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import CHUNK
from h3flow.handoff.destination import Destination, local_size, os_reason
from h3flow.handoff.store import check_sha256, object_relpath

if TYPE_CHECKING:
    from fabric import Connection

WINDOW = 64 << 20  # paramiko's default 2 MiB window throttles a fast link
MAX_PACKET = 32 << 10  # the SSH channel packet size OpenSSH uses
WRITE_SIZE = MAX_PACKET - 128  # SFTP write + headers fit one packet (32 KiB writes take two)

# Started *before* the upload so the remote login shell's start-up (often ~0.1 s of
# .bashrc) overlaps the transfer; it waits for "go" on stdin, then checks and links.
# $1 temp file, $2 final object path, $3 expected SHA-256. Prints stored|have or a problem.
_FINISH = r"""
read -r go; if [ "$go" != go ]; then rm -f -- "$1"; echo aborted; exit 9; fi
got=$(sha256sum -b -- "$1" | cut -c1-64) || { rm -f -- "$1"; echo "cannot hash"; exit 4; }
if [ "$got" != "$3" ]; then rm -f -- "$1"; echo "mismatch $got"; exit 3; fi
sync -- "$1" 2>/dev/null
dir=$(dirname -- "$2")
mkdir -p -- "$dir" || { rm -f -- "$1"; echo "cannot create $dir"; exit 5; }
if ln -- "$1" "$2" 2>/dev/null; then r=stored; elif [ -f "$2" ]; then r=have
else rm -f -- "$1"; echo "cannot link $2"; exit 5; fi
rm -f -- "$1"
sync -- "$dir" 2>/dev/null
echo "$r"
"""


def sftp_send(ref: FileRef, dest: Destination, timeout: float = 60.0) -> FileRef:
    """Upload ``ref`` into ``dest``'s store over SFTP; return the verified remote object."""
    check_sha256(ref.sha256)
    size = local_size(ref)
    alias = dest.ssh_alias or dest.host
    root = _remote_root(dest.store_root)
    final = posixpath.join(root, object_relpath(ref.sha256))
    temp = posixpath.join(root, "latents", ".tmp", f"{ref.sha256[:16]}.{uuid.uuid4().hex[:12]}.part")
    where = f"host {dest.host} (ssh {alias})"
    conn = _connect(alias, dest.ssh_config, timeout, where)
    dropped: tuple[type[BaseException], ...] = (OSError, EOFError, *_ssh_errors())
    try:
        sent = _upload(conn, ref, size, final, temp, timeout)
        if sent is None:
            return FileRef(Path(final), ref.sha256, size)  # already there: same name, same bytes
        status, output = sent
    except dropped as exc:
        raise TransientError(f"sftp transfer of latent {ref.sha256[:12]} to {where} failed: {os_reason(exc)}") from None
    finally:
        conn.close()
    if status == 3:
        raise IntegrityError(
            f"{where} hashed the upload of {ref.sha256[:16]}... to {output.split()[-1][:16]}...: "
            f"corrupted in flight, nothing stored"
        )
    if status != 0 or output not in ("stored", "have"):
        raise H3FlowError(f"storing latent {ref.sha256[:12]} on {where} failed: {output[:200] or status}")
    return FileRef(Path(final), ref.sha256, size)


def _upload(conn: Connection, ref: FileRef, size: int, final: str, temp: str, timeout: float) -> tuple[int, str] | None:
    """Upload to ``temp`` and let the remote finisher verify and link it; None if the
    object was already there. Returns the finisher's exit status and output."""
    from paramiko import SFTPClient

    sftp = SFTPClient.from_transport(conn.transport, window_size=WINDOW, max_packet_size=MAX_PACKET)
    assert sftp is not None
    with sftp:
        sftp.get_channel().settimeout(timeout)
        try:
            present = sftp.stat(final).st_size
        except FileNotFoundError:
            present = None
        if present == size:
            return None
        if present is not None:
            raise H3FlowError(
                f"the store object {final} is {present} bytes, not {size}: damaged; "
                f"run `h3flow store verify --quarantine` on that host"
            )
        finisher = conn.transport.open_session(timeout=timeout)
        finisher.settimeout(timeout)
        args = " ".join(shlex.quote(a) for a in (temp, final, ref.sha256))
        finisher.exec_command(f"sh -c {shlex.quote(_FINISH)} h3flow-finish {args}")
        try:
            remote = _open_creating_dirs(sftp, temp)
            digest = hashlib.sha256()
            with open(ref.path, "rb") as source, remote:
                remote.set_pipelined(True)
                remote.MAX_REQUEST_SIZE = WRITE_SIZE  # one SFTP write = one SSH packet
                while block := source.read(CHUNK):
                    digest.update(block)
                    remote.write(block)
        except BaseException:
            with contextlib.suppress(Exception):
                finisher.sendall(b"abort\n")
                finisher.recv_exit_status()
            raise
    if digest.hexdigest() != ref.sha256:
        finisher.sendall(b"abort\n")
        finisher.recv_exit_status()
        raise IntegrityError(
            f"local latent {ref.path} hashes to {digest.hexdigest()}, not {ref.sha256}: nothing was stored"
        )
    finisher.sendall(b"go\n")
    finisher.shutdown_write()
    output = bytearray()
    while chunk := finisher.recv(4096):
        output += chunk
    return finisher.recv_exit_status(), output.decode(errors="replace").strip()


def _open_creating_dirs(sftp: Any, path: str) -> Any:
    """Open ``path`` for writing, creating its missing parent folders (first use of a store)."""
    try:
        return sftp.open(path, "wb")
    except FileNotFoundError:
        pass
    parts = posixpath.dirname(path).split("/")
    for i in range(1, len(parts) + 1):
        folder = "/".join(parts[:i])
        if folder and folder != ".":
            with contextlib.suppress(OSError):
                sftp.mkdir(folder)
    return sftp.open(path, "wb")


def _connect(alias: str, ssh_config: Path | None, timeout: float, where: str) -> Connection:
    """A fabric connection to ``alias`` with host keys enforced and paramiko tuned for bulk data."""
    from fabric import Config, Connection
    from paramiko import Transport

    config = Config(runtime_ssh_path=str(ssh_config)) if ssh_config else Config()
    factory = functools.partial(Transport, default_window_size=WINDOW, default_max_packet_size=MAX_PACKET)
    conn = Connection(
        alias,
        config=config,
        connect_timeout=max(1, round(timeout)),
        connect_kwargs={"transport_factory": factory, "banner_timeout": timeout, "auth_timeout": timeout},
    )
    return open_verified(conn, where)


def open_verified(conn: Any, where: str) -> Any:
    """Open a fabric Connection with host keys checked against known_hosts (never trusted on
    first use); every failure becomes one line naming ``where`` (transient ones retryable)."""
    from paramiko import AuthenticationException, BadHostKeyException, RejectPolicy, SSHException

    conn.client.set_missing_host_key_policy(RejectPolicy())
    for known_hosts in known_hosts_files(conn.ssh_config):
        if known_hosts.is_file():
            conn.client.get_host_keys().load(str(known_hosts))
    target = f"{conn.host}:{conn.port}"
    try:
        conn.open()
    except BadHostKeyException:
        raise H3FlowError(f"{where}: the host key of {target} does not match known_hosts (refusing)") from None
    except AuthenticationException as exc:
        raise H3FlowError(f"{where}: ssh authentication to {target} failed: {exc}") from None
    except (OSError, EOFError) as exc:
        raise TransientError(f"cannot reach {where} at {target}: {os_reason(exc)}") from None
    except SSHException as exc:
        if "known_hosts" in str(exc):
            raise H3FlowError(
                f"{where}: the host key of {target} is not in known_hosts (refusing); "
                f"add it with ssh-keyscan or a first manual ssh"
            ) from None
        raise TransientError(f"cannot open ssh to {where} at {target}: {exc}") from None
    return conn


def known_hosts_files(ssh_config: Any) -> list[Path]:
    """The known_hosts files the SSH config names (OpenSSH's defaults otherwise)."""
    files: list[Path] = []
    for key, default in (
        ("userknownhostsfile", "~/.ssh/known_hosts ~/.ssh/known_hosts2"),
        ("globalknownhostsfile", "/etc/ssh/ssh_known_hosts"),
    ):
        value = str(ssh_config.get(key, default))
        whole = Path(value).expanduser()  # paramiko has stripped quotes: "/a b/known_hosts" is one file
        names = [whole] if whole.is_file() else [Path(p).expanduser() for p in value.split() if p.lower() != "none"]
        files.extend(names)
    return files


def _remote_root(store_root: Path) -> str:
    """The store root as the remote side sees it; ``~/x`` means x under the login directory,
    where both the SFTP server and remote commands start."""
    root = str(store_root).replace("\\", "/")
    if root == "~":
        return "."
    return root[2:] if root.startswith("~/") else root


def _ssh_errors() -> tuple[type[BaseException], ...]:
    """What a dropped SSH session or a stuck remote command raises."""
    from invoke.exceptions import CommandTimedOut
    from paramiko import SSHException

    return (SSHException, CommandTimedOut)
