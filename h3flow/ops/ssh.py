"""Remote hosts over SSH: a fabric connection with host keys checked, and :class:`SshRunner`.

:func:`remote` opens a connection to a host of local.json the way ``ssh ALIAS`` would:
the SSH config (``$H3FLOW_SSH_CONFIG``, else ``~/.ssh/config``) decides address, port,
user and key for the host's ``ssh_alias``; an alias the config does not know falls
back to the host map's ``address``, ``port`` and ``user``. Host keys are always
checked against the known_hosts files the config names (paramiko's ``RejectPolicy``;
fabric alone would accept any key).

:class:`SshRunner` is the :class:`~h3flow.ops.services.Runner` of one remote host, so
``start`` / ``stop`` / ``status --services`` run the same steps as ``--local``. Each
method is one remote command built from an argument list with :func:`shlex.join`
(nothing the operator typed reaches a remote shell unquoted): ``inspect`` is a short
``sh`` script over ``/proc`` (it runs every poll, so it avoids a Python start-up),
``spawn`` / ``stop`` / ``port_free`` ask the h3flow agent in the host's venv
(:mod:`h3flow.ops.agent`) to do exactly what ``LocalRunner`` does there, with the
request as JSON on stdin. Files (the transfer secret, local.json) go over SFTP,
written to a temporary name and renamed.
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import posixpath
import shlex
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from h3flow.config.models import LocalConfig, ResolvedHost, SecretSource
from h3flow.config.settings import settings
from h3flow.core.errors import ConfigError, H3FlowError, TransientError
from h3flow.ops.agent import parse_answer
from h3flow.ops.services import Proc, ServiceSpec

if TYPE_CHECKING:
    from fabric import Connection

SSH_CONFIG_ENV = "H3FLOW_SSH_CONFIG"
CONNECT_TIMEOUT = 10.0

# $1: the PID file. Prints what LocalRunner.inspect reads from /proc, one "key value" a line.
_INSPECT = r"""
[ -e "$1" ] || { echo none; exit 0; }
pid=$(head -n 1 -- "$1" | tr -dc 0-9)
[ -n "$pid" ] || { echo nopid; exit 0; }
echo "pid $pid"
stat=$(cat "/proc/$pid/stat" 2>/dev/null) || exit 0
echo "stat ${stat##*") "}"
echo "cmdline $(base64 -w 0 "/proc/$pid/cmdline" 2>/dev/null)"
echo "btime $(sed -n 's/^btime //p' /proc/stat)"
echo "hz $(getconf CLK_TCK)"
"""


def ssh_config_file() -> Path | None:
    """``$H3FLOW_SSH_CONFIG`` if set (it must exist), else ``~/.ssh/config`` if present."""
    value = settings().ssh_config
    if value:
        path = value.expanduser()
        if not path.is_file():
            raise ConfigError(f"{SSH_CONFIG_ENV}={value}: no such file")
        return path
    default = Path("~/.ssh/config").expanduser()
    return default if default.is_file() else None


def where(host: ResolvedHost) -> str:
    return f"host {host.name} (ssh {host.ssh_alias})"


def remote(host: ResolvedHost, *, ssh_config: Path | None = None, timeout: float = CONNECT_TIMEOUT) -> Connection:
    """An open fabric connection to ``host``, its host key checked against known_hosts."""
    from fabric import Config, Connection

    from h3flow.handoff.sftp import open_verified

    logging.getLogger("paramiko").addHandler(logging.NullHandler())  # its transport thread logs tracebacks
    path = ssh_config or ssh_config_file()
    config = Config(runtime_ssh_path=str(path)) if path else Config()
    known = config.base_ssh_config.lookup(host.ssh_alias)
    target = host.ssh_alias if known.get("hostname", host.ssh_alias) != host.ssh_alias else host.address
    entry = config.base_ssh_config.lookup(target)
    conn = Connection(
        target,
        user=None if "user" in entry else host.user,
        port=None if "port" in entry else host.port,
        config=config,
        connect_timeout=max(1, round(timeout)),
        connect_kwargs={"banner_timeout": timeout, "auth_timeout": timeout},
    )
    return open_verified(conn, where(host))


def spec_json(spec: ServiceSpec) -> dict[str, Any]:
    """What the agent needs of a spec to spawn or stop it (health stays here)."""
    return {
        "name": spec.name,
        "kind": spec.kind,
        "host": spec.host,
        "argv": list(spec.argv),
        "env": dict(spec.env),
        "cwd": spec.cwd,
        "log": spec.log,
        "pidfile": spec.pidfile,
        "stop_grace": spec.stop_grace,
        "stop_signal": int(spec.stop_signal),
        "secret_env": {name: list(ref) for name, ref in spec.secret_env.items()},  # where, never the value
        "user": spec.user,
        "setup": [list(command) for command in spec.setup],
    }


class SshRunner:
    """The :class:`~h3flow.ops.services.Runner` of one remote host (see the module docstring)."""

    def __init__(self, host: ResolvedHost, *, ssh_config: Path | None = None, timeout: float = CONNECT_TIMEOUT) -> None:
        self.host = host
        self.ssh_config = ssh_config
        self.timeout = timeout
        self._conn: Connection | None = None

    @property
    def where(self) -> str:
        return where(self.host)

    @property
    def conn(self) -> Connection:
        if self._conn is None:
            self._conn = remote(self.host, ssh_config=self.ssh_config, timeout=self.timeout)
        return self._conn

    @property
    def python(self) -> str:
        return posixpath.join(self.host.venv, "bin", "python")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    # -- remote commands
    def exec(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
        """Run ``argv`` on the host (quoted with shlex.join); returns (exit status, stdout, stderr).

        ``timeout`` bounds each wait for output or for the exit. A command that exits
        without reading its stdin is no error: its status and output still come back.
        """
        from paramiko import SSHException

        from h3flow.handoff.destination import os_reason

        try:
            channel = self.conn.client.get_transport().open_session(timeout=timeout)
            channel.settimeout(timeout)
            channel.exec_command(shlex.join(argv))
            if stdin is not None:
                with contextlib.suppress(OSError):  # it exited before reading (e.g. no such program)
                    channel.sendall(stdin.encode())
            channel.shutdown_write()
            err = bytearray()
            reader = threading.Thread(target=lambda: err.extend(channel.makefile_stderr("rb").read()), daemon=True)
            reader.start()
            out = channel.makefile("rb").read()
            reader.join(timeout)
            status = channel.recv_exit_status()
            channel.close()
        except TimeoutError:
            raise TransientError(f"{self.where}: `{argv[0]}` gave no sign of life for {timeout:g} s") from None
        except (SSHException, OSError, EOFError, AttributeError) as exc:  # AttributeError: no transport left
            self.close()
            raise TransientError(f"{self.where}: the ssh session failed: {os_reason(exc)}") from None
        return status, out.decode(errors="replace"), err.decode(errors="replace")

    def agent(self, op: str, request: dict[str, Any], *, timeout: float = 120.0) -> dict[str, Any]:
        """Ask the h3flow agent in the host's venv to do ``op`` (see :mod:`h3flow.ops.agent`)."""
        code, out, err = self.exec(
            [self.python, "-m", "h3flow.ops.agent", op], stdin=json.dumps(request), timeout=timeout
        )
        return agent_answer(op, code, out, err, self.where, self.python)

    # -- Runner
    def inspect(self, spec: ServiceSpec) -> Proc:
        code, out, err = self.exec(["sh", "-c", _INSPECT, "h3flow-inspect", spec.pidfile], timeout=30.0)
        if code != 0:
            raise H3FlowError(f"{self.where}: cannot inspect {spec.name}: {err.strip()[-200:]}")
        facts = {key: value for key, _, value in (line.partition(" ") for line in out.splitlines())}
        return proc_from(facts, spec.argv)

    def spawn(self, spec: ServiceSpec) -> Proc:
        answer = self.agent("spawn", spec_json(spec), timeout=300.0 if spec.setup else 60.0)  # initdb: seconds
        return Proc(int(answer["pid"]), True, answer.get("started"))

    def stop(self, spec: ServiceSpec, pid: int) -> bool:
        answer = self.agent("stop", {**spec_json(spec), "pid": pid}, timeout=spec.stop_grace + 60.0)
        return bool(answer["killed"])

    def forget(self, spec: ServiceSpec) -> None:
        self.exec(["rm", "-f", "--", spec.pidfile], timeout=30.0)

    def port_free(self, address: str, port: int) -> bool:
        return bool(self.agent("port_free", {"address": address, "port": port}, timeout=60.0)["free"])

    def tail(self, spec: ServiceSpec, lines: int = 12) -> list[str]:
        try:
            code, out, _err = self.exec(["tail", "-n", str(lines * 4), "--", spec.log], timeout=30.0)
        except H3FlowError:
            return []
        return [line for line in out.splitlines() if line.strip()][-lines:] if code == 0 else []

    def ensure_secret(self, secret: SecretSource, prefix: str = "") -> None:
        """A secret file, copied from this machine (one secret for all hosts; made here if missing)."""
        if secret.source != "file":
            return  # env: must be set in the host's environment; prefect-secret: read from the API
        from h3flow.config.secret import ensure_secret_file

        local = Path(str(secret.path)).expanduser()
        ensure_secret_file(local, prefix)
        self.put_bytes(str(secret.path), local.read_bytes(), 0o600)

    def sync_config(self, config_path: Path) -> None:
        """local.json at the same absolute path on the host: workers and deployments name it by that path."""
        path = Path(config_path).absolute()  # the path the deployments pass to the flows
        self.put_bytes(str(path), path.read_bytes(), 0o644)

    # -- files over SFTP
    def read_bytes(self, path: str) -> bytes | None:
        sftp = self.conn.sftp()
        try:
            with sftp.open(path, "rb") as handle:
                return bytes(handle.read())
        except FileNotFoundError:
            return None

    def put_bytes(self, path: str, data: bytes, mode: int) -> bool:
        """Write ``data`` to ``path`` on the host (temp file + rename, ``mode`` before any byte is
        written) unless it already holds exactly that; True when it wrote."""
        if self.read_bytes(path) == data:
            return False
        folder = posixpath.dirname(path)
        code, _out, err = self.exec(["mkdir", "-p", "--", folder], timeout=30.0)
        if code != 0:
            raise H3FlowError(f"{self.where}: cannot create {folder}: {err.strip()[-200:]}")
        sftp = self.conn.sftp()
        temp = posixpath.join(folder, f".{posixpath.basename(path)}.h3flow-{uuid.uuid4().hex[:12]}")
        try:
            with sftp.open(temp, "wb") as handle:
                handle.chmod(mode)
                handle.write(data)
            sftp.posix_rename(temp, path)
        except OSError as exc:
            with contextlib.suppress(OSError):
                sftp.remove(temp)
            raise H3FlowError(f"{self.where}: cannot write {path}: {exc.strerror or exc}") from None
        return True


def agent_answer(op: str, code: int, out: str, err: str, where: str, python: str) -> dict[str, Any]:
    """The agent's JSON answer, or one H3FlowError that says what went wrong on the host."""
    answer = parse_answer(out)
    if answer is not None and "error" in answer:
        raise H3FlowError(f"{where}: {answer['error']}")
    if answer is not None and code == 0:
        return answer
    last = (err.strip() or out.strip()).splitlines()[-1:] or [f"exit status {code}"]
    if "No module named h3flow" in err or "No module named 'h3flow'" in err:
        raise H3FlowError(
            f"{where}: h3flow is not installed in {posixpath.dirname(posixpath.dirname(python))} "
            f"(pip install it there: the workers run from that venv)"
        )
    if code == 127 or ("No such file" in last[0] and python in last[0]):
        raise H3FlowError(f"{where}: no python at {python} (create the venv named in the host map)")
    raise H3FlowError(f"{where}: the h3flow agent failed ({op}): {last[0][-300:]}")


def proc_from(facts: dict[str, str], argv: Sequence[str]) -> Proc:
    """A :class:`Proc` from the inspect script's output, judged as ``LocalRunner.inspect`` judges."""
    if "none" in facts:
        return Proc(None, False)
    if "pid" not in facts:
        return Proc(None, False, stale=True)
    pid = int(facts["pid"])
    fields = facts.get("stat", "").split()
    if not fields or fields[0] in ("Z", "X") or not facts.get("cmdline"):
        return Proc(pid, False, stale=True)
    cmdline = base64.b64decode(facts["cmdline"]).rstrip(b"\0").split(b"\0")
    want = [arg.encode() for arg in argv]
    if cmdline[-len(want) :] != want:  # a script's shebang puts the interpreter first: compare the tail
        return Proc(pid, False, stale=True)
    started = None
    with contextlib.suppress(ValueError, IndexError, ZeroDivisionError):
        started = float(facts["btime"]) + int(fields[19]) / int(facts["hz"])
    return Proc(pid, True, started)


class SshRunners:
    """``runner_for`` over SSH: one :class:`SshRunner` (and connection) per host, opened on first use."""

    def __init__(
        self, config: LocalConfig, *, ssh_config: Path | None = None, timeout: float = CONNECT_TIMEOUT
    ) -> None:
        self.config = config
        self.ssh_config = ssh_config
        self.timeout = timeout
        self._runners: dict[str, SshRunner] = {}

    def __call__(self, host: str) -> SshRunner:
        if host not in self._runners:
            if host not in self.config.hosts:
                raise ConfigError(f"unknown host {host!r} (known: {', '.join(self.config.hosts)})")
            self._runners[host] = SshRunner(self.config.hosts[host], ssh_config=self.ssh_config, timeout=self.timeout)
        return self._runners[host]

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()

    def __enter__(self) -> SshRunners:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def connected(config: LocalConfig, host: str) -> Iterator[SshRunner]:
    """One host's runner for the length of a command."""
    with SshRunners(config) as runners:
        yield runners(host)
