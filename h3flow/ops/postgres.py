"""PostgreSQL for the cluster's Prefect server: the one-time ``initdb`` and a readiness probe.

``h3flow start`` runs Debian's PostgreSQL as a service like any other (see
:func:`h3flow.ops.services.postgres_spec`); before its first start, the service's setup
step runs this module on the API's host::

    <venv>/bin/python -m h3flow.ops.postgres --data DIR --user U --database DB \\
        (--password-file F | --password-env NAME) --os-user postgres

It makes the data directory once, atomically (``initdb`` into a temporary folder, the
database created in single-user mode, then a rename: a failed attempt leaves nothing
half-made), with scram-sha-256 password authentication for TCP clients. An existing
data directory is left alone. PostgreSQL refuses to run as root, so when this runs as
root the data directory belongs to ``--os-user`` and ``initdb`` runs as that user.

Before every start it also clears a lock left by a killed postmaster that nobody reaped
(:func:`release_dead_lock`): PostgreSQL itself replaces a lock whose process is gone, but
a zombie still "exists", and in a container whose PID 1 does not reap orphans it exists
until the container ends.

:func:`probe_postgres` is the health check: PostgreSQL's answer to a startup message
(protocol 3.0) is an authentication request once it accepts connections, an error
("the database system is starting up") before. No password is needed for that.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HBA_REMOTE = "\n# h3flow: the cluster's hosts, with the password\nhost all all 0.0.0.0/0 scram-sha-256\nhost all all ::/0 scram-sha-256\n"


class PostgresSetupError(Exception):
    """What went wrong preparing the data directory, in one line."""


def _tool(name: str) -> str:
    found = shutil.which(name)
    if found is None:
        raise PostgresSetupError(
            f"{name} not found on {os.environ.get('PATH', '')!r}: install Debian's postgresql "
            "(apt-get install postgresql), or set prefect.database.bin_dir in the host map"
        )
    return found


def _owner(os_user: str | None) -> tuple[int, int] | None:
    """(uid, gid) to run PostgreSQL as: ``os_user`` when we are root, else ourselves (None)."""
    if os.geteuid() != 0 or not os_user:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(os_user)
    except KeyError:
        raise PostgresSetupError(
            f"no system user {os_user!r} to run PostgreSQL as (it refuses root): install Debian's postgresql, "
            "or set prefect.database.os_user"
        ) from None
    return entry.pw_uid, entry.pw_gid


def _reachable_by(path: Path, owner: tuple[int, int] | None) -> None:
    """Every parent of the data directory must be traversable by the user PostgreSQL runs as."""
    if owner is None:
        return
    for parent in path.parents:
        mode = parent.stat().st_mode
        if parent.stat().st_uid != owner[0] and not mode & 0o001:
            raise PostgresSetupError(
                f"PostgreSQL runs as uid {owner[0]} but cannot enter {parent} (mode {oct(mode & 0o777)}): "
                "put the store root where other users may pass (chmod o+x)"
            )


def init_data_dir(data: Path, user: str, database: str, password: str, os_user: str | None) -> bool:
    """Make ``data`` once (True), or leave an existing one alone (False)."""
    if (data / "PG_VERSION").is_file():
        return False
    if data.exists() and any(data.iterdir()):
        raise PostgresSetupError(f"{data} exists and is not a PostgreSQL data directory: move it away")
    initdb, postgres = _tool("initdb"), _tool("postgres")
    owner = _owner(os_user)
    data.parent.mkdir(parents=True, exist_ok=True)
    _reachable_by(data, owner)
    staging = Path(tempfile.mkdtemp(prefix=f".{data.name}.init-", dir=data.parent))
    try:
        pwfile = staging / "pw"
        pwfile.write_text(password + "\n")
        pwfile.chmod(0o600)
        target = staging / "data"
        if owner:
            for path in (staging, pwfile):
                os.chown(path, *owner)
        _run(
            [initdb, "-D", str(target), "-U", user, f"--pwfile={pwfile}", "--auth-local=scram-sha-256",
             "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C.UTF-8"],
            "initdb", owner,
        )  # fmt: skip
        pwfile.unlink()
        with open(target / "pg_hba.conf", "a") as hba:
            hba.write(HBA_REMOTE)
        _run(
            [postgres, "--single", "-D", str(target), "-c", "unix_socket_directories=", "postgres"],
            "create the database",
            owner,
            stdin=f'CREATE DATABASE "{database}" OWNER "{user}";\n',
        )
        target.rename(data)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return True


def _pid_state(pid: int) -> str | None:
    """The kernel's one-letter state of ``pid`` (``Z`` for a zombie), or None when it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat.rsplit(")", 1)[1].split()[0]


def _attached(shmid: int) -> int | None:
    """How many processes are attached to System V segment ``shmid`` (None: no such segment)."""
    try:
        rows = Path("/proc/sysvipc/shm").read_text().splitlines()[1:]
    except FileNotFoundError:
        return None
    for row in rows:
        fields = row.split()  # key shmid perms size cpid lpid nattch ...
        if int(fields[1]) == shmid:
            return int(fields[6])
    return None


def release_dead_lock(data: Path, wait: float = 30.0, poll: float = 0.2) -> bool:
    """Remove ``data/postmaster.pid`` when its postmaster is a zombie and no old backend is
    still attached to its shared memory (True); leave every other lock to PostgreSQL.

    Backends notice their postmaster's death and exit within a moment; this waits up to
    ``wait`` seconds for the last one, the same interlock PostgreSQL checks itself."""
    lock = data / "postmaster.pid"
    try:
        lines = lock.read_text().splitlines()
        pid = int(lines[0])
    except (FileNotFoundError, ValueError, IndexError):
        return False
    if _pid_state(pid) != "Z":
        return False  # alive (PostgreSQL refuses, rightly) or gone (PostgreSQL replaces the lock)
    shmid = int(lines[6].split()[1]) if len(lines) > 6 and len(lines[6].split()) == 2 else None
    deadline = time.monotonic() + wait
    while shmid is not None and (_attached(shmid) or 0) > 0:
        if time.monotonic() >= deadline:
            raise PostgresSetupError(
                f"the killed postmaster {pid}'s backends still hold its shared memory (segment {shmid}) "
                f"after {wait:.0f} s: end them (`ps -u postgres`), then start again"
            )
        time.sleep(poll)  # another process's exit, which sends us nothing to wait on: poll, with a deadline
    lock.unlink(missing_ok=True)
    return True


def _run(argv: list[str], what: str, owner: tuple[int, int] | None, stdin: str | None = None) -> None:
    uid, gid = owner or (None, None)
    done = subprocess.run(
        argv, input=stdin, capture_output=True, text=True, timeout=240, check=False, cwd="/", user=uid, group=gid
    )
    if done.returncode != 0 or "ERROR:" in done.stderr:
        lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
        error = next((line for line in lines if "ERROR" in line or "FATAL" in line), lines[-1] if lines else "")
        raise PostgresSetupError(f"{what} failed: {error.strip()[-300:] or f'exit status {done.returncode}'}")


def probe_postgres(address: str, port: int, user: str, database: str, timeout: float = 2.0) -> tuple[bool, str]:
    """(accepts connections, a short detail): the server's first answer to a startup message."""
    params = b"".join(k.encode() + b"\0" + v.encode() + b"\0" for k, v in (("user", user), ("database", database)))
    body = struct.pack("!I", 196608) + params + b"\0"  # protocol 3.0
    where = f"{address}:{port}"
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            sock.sendall(struct.pack("!I", len(body) + 4) + body)
            reply = sock.recv(1024)
    except OSError as exc:
        return False, f"no PostgreSQL answering on {where} ({exc.strerror or type(exc).__name__})"
    if reply[:1] == b"R":
        return True, f"accepts connections on {where}"
    if reply[:1] == b"E":
        fields = dict((f[:1], f[1:]) for f in reply[5:].split(b"\0") if f)
        return False, f"{where}: {fields.get(b'M', b'error').decode(errors='replace')}"
    return False, f"{where} does not speak PostgreSQL's protocol"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m h3flow.ops.postgres", description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--user", required=True)
    parser.add_argument("--database", required=True)
    secret = parser.add_mutually_exclusive_group(required=True)
    secret.add_argument("--password-file", type=Path)
    secret.add_argument("--password-env")
    parser.add_argument("--os-user")
    args = parser.parse_args(argv)
    try:
        if args.password_file is not None:
            password = args.password_file.read_text().strip()
        else:
            password = os.environ.get(args.password_env, "")
        if not password:
            raise PostgresSetupError(f"the database password ({args.password_file or args.password_env}) is empty")
        made = init_data_dir(args.data, args.user, args.database, password, args.os_user)
        if release_dead_lock(args.data):
            print(f"removed {args.data / 'postmaster.pid'}: its postmaster was killed (a zombie nobody reaped)")
    except (PostgresSetupError, OSError) as exc:
        print(f"postgres setup: {exc}", file=sys.stderr)
        return 2
    print(f"{'initialised' if made else 'kept'} {args.data}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
