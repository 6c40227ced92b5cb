"""Network namespaces that stand for hosts, each with its own address and its own sshd.

A small lab on one machine: a "switch" namespace holds a bridge; every host namespace
and this machine (the controller) plug into it with a veth pair, so they reach each
other by address exactly as hosts on one LAN do. Why a namespace for the switch: its
bridge then sees no firewall of this machine (Docker's FORWARD DROP would otherwise
drop bridged traffic where br_netfilter is loaded). A host is cut off by setting its
switch port down, and plugged in again by setting it up.

Each host also has a filesystem of its own: its sshd runs in a mount namespace of its
own (``unshare --mount``) where the lab folder (``/tmp/h3lab-<tag>``: the controller's
``ctl/`` with local.json and the secrets, the hosts' stores under ``srv/<host>``) is a
private bind mount of that host's backing folder. Everything started over SSH inherits
it, so a host sees only its own store, outputs, config copy and secrets; the controller
(this machine) sees only ``ctl/``. The backing folders (``/tmp/h3lab-<tag>.hosts/<host>``)
outlive every process, like a disk across a reboot; the tests read them as the lab's
god's-eye view (:meth:`Lab.seen_by`), the code under test never does. ``share`` makes
controller folders visible to a host at the same path (a mount, as NFS would).

The process table stays shared: ``ip netns identify PID`` says which namespace a
service runs in. Needs root, iproute2 and util-linux (unshare).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from sshd import SshServer, start_sshd


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


def netns_unavailable() -> str | None:
    """Why network namespaces cannot be made here (None when they can)."""
    if shutil.which("ip") is None:
        return "`ip` not found: install Debian's iproute2"
    if shutil.which("unshare") is None:
        return "`unshare` not found: install Debian's util-linux"
    if os.geteuid() != 0:
        return "network namespaces need root (CI runs the multi-host tier as root)"
    probe = f"h3probe{uuid.uuid4().hex[:6]}"
    made = ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    ip("netns", "del", probe, check=False)
    return None


@dataclass
class NsHost:
    name: str  # the host map's name
    ns: str  # its namespace
    address: str
    port: str  # its port (interface) on the switch
    sshd: SshServer | None = None

    @property
    def wrap(self) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.ns)


@dataclass
class Lab:
    tag: str
    subnet: str  # "10.A.B": hosts are .2, .3, ...; the controller is .1
    hosts: dict[str, NsHost] = field(default_factory=dict)

    @property
    def fs(self) -> Path:
        """The lab folder: the same path on every host, each seeing its own content."""
        return Path(f"/tmp/h3lab-{self.tag}")

    @property
    def ctl(self) -> Path:
        """The controller's folder (local.json, secrets, batches): hosts get copies over SSH."""
        return self.fs / "ctl"

    def store_root(self, name: str) -> Path:
        return self.fs / "srv" / name

    def backing(self, name: str) -> Path:
        return Path(f"/tmp/h3lab-{self.tag}.hosts") / name

    def seen_by(self, name: str, path: str | Path) -> Path:
        """Where a path as host ``name`` sees it lies on this machine (for the tests' own checks)."""
        return self.backing(name) / Path(path).relative_to(self.fs)

    @property
    def switch(self) -> str:
        return f"h3t{self.tag}-sw"

    @property
    def controller_if(self) -> str:
        return f"h3c{self.tag}"

    @property
    def controller(self) -> str:
        return f"{self.subnet}.1"

    def up(self, names: list[str]) -> None:
        for folder in (self.ctl, *(self.backing(name) for name in names)):
            folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.fs, self.backing(names[0]).parent, *(self.backing(name) for name in names)):
            folder.chmod(0o755)  # PostgreSQL (not root) must pass through to its data directory
        ip("netns", "add", self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        ip("link", "add", self.controller_if, "type", "veth", "peer", "name", "ctl", "netns", self.switch)
        ip("addr", "add", f"{self.controller}/24", "dev", self.controller_if)
        ip("link", "set", self.controller_if, "up")
        self._plug("ctl")
        for i, name in enumerate(names, start=2):
            host = NsHost(name, f"h3t{self.tag}-{name}", f"{self.subnet}.{i}", f"p{i}")
            ip("netns", "add", host.ns)
            ip("-n", host.ns, "link", "set", "lo", "up")
            ip("-n", host.ns, "link", "add", "eth0", "type", "veth", "peer", "name", host.port, "netns", self.switch)
            ip("-n", host.ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            ip("-n", host.ns, "link", "set", "eth0", "up")
            self._plug(host.port)
            self.hosts[name] = host

    def _plug(self, port: str) -> None:
        ip("-n", self.switch, "link", "set", port, "master", "br0")
        ip("-n", self.switch, "link", "set", port, "up")

    def private_fs(self, name: str, share: tuple[Path, ...] = ()) -> tuple[str, ...]:
        """The command prefix that gives host ``name`` its own mount namespace: the lab folder
        is its backing folder; each ``share`` folder of the controller is mounted in at its path."""
        script = 'b="$1"; f="$2"; shift 2; for s in $H3LAB_SHARE; do mkdir -p "$b${s#"$f"}" && ' \
            'mount --bind "$s" "$b${s#"$f"}" || exit 1; done; mount --rbind "$b" "$f" && exec "$@"'  # fmt: skip
        share_env = "H3LAB_SHARE=" + " ".join(str(p) for p in share)
        return (
            "env", share_env, "unshare", "--mount", "--propagation", "private", "--",
            "sh", "-c", script, "h3lab-fs", str(self.backing(name)), str(self.fs),
        )  # fmt: skip

    def start_sshd(self, root: Path, share: dict[str, tuple[Path, ...]] | None = None) -> Path:
        """One sshd per host namespace, in its own mount namespace; returns one SSH config
        with every host's alias. ``share``: controller folders a host sees (host -> folders)."""
        blocks = []
        for host in self.hosts.values():
            wrap = (*host.wrap, *self.private_fs(host.name, (share or {}).get(host.name, ())))
            host.sshd = start_sshd(root / host.name, alias=host.name, host=host.address, wrap=wrap)
            blocks.append(host.sshd.config.read_text())
        config = root / "ssh_config"
        config.write_text("".join(blocks))
        return config

    def cut(self, name: str) -> None:
        """Unplug a host from the switch: nothing reaches it, it reaches nothing."""
        ip("-n", self.switch, "link", "set", self.hosts[name].port, "down")

    def mend(self, name: str) -> None:
        ip("-n", self.switch, "link", "set", self.hosts[name].port, "up")

    def namespace_of(self, pid: int) -> str:
        return ip("netns", "identify", str(pid)).stdout.strip()

    def down(self) -> None:
        for host in self.hosts.values():
            if host.sshd is not None:
                host.sshd.stop()
            ip("netns", "del", host.ns, check=False)
        ip("link", "del", self.controller_if, check=False)
        ip("netns", "del", self.switch, check=False)
        shutil.rmtree(self.fs, ignore_errors=True)
        shutil.rmtree(self.backing("x").parent, ignore_errors=True)


def make_lab(names: list[str]) -> Lab:
    """A lab with a random tag and subnet (two test runs at once do not collide)."""
    raw = uuid.uuid4().bytes
    lab = Lab(tag=raw.hex()[:5], subnet=f"10.{200 + raw[2] % 50}.{raw[3]}")
    try:
        lab.up(names)
    except subprocess.CalledProcessError as exc:
        lab.down()
        raise RuntimeError(f"cannot build the namespace lab: {' '.join(exc.cmd)}: {exc.stderr.strip()}") from None
    return lab
