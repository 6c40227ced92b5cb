"""Who listens on a port of this machine, from ``/proc``: so ``start`` can tell its own
service from another process that answers on the same port.

Why: two embedded defaults on one machine once shared a port block. One's Prefect
server could not bind, yet its health check passed against the other's server, and its
workers then ran the other's flows. A health check says *something* answers; only the
socket's owner says *who*. Linux only (``/proc/net/tcp*``, ``/proc/PID/fd``), and only
for this machine's network namespace: the SSH runner's hosts are not checked this way.
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

LISTEN = "0A"  # the TCP state column of /proc/net/tcp for a listening socket


@dataclass(frozen=True)
class Listener:
    """A process that holds a listening socket (``pid`` None: one this user cannot see)."""

    pid: int | None
    command: str = ""
    cwd: str = ""

    def describe(self) -> str:
        if self.pid is None:
            return "a process of another user"
        where = f", in {self.cwd}" if self.cwd else ""
        return f"pid {self.pid} ({self.command or '?'}{where})"


def _address(hex_address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """/proc/net/tcp's address column: 32-bit words in host (little-endian) byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def _matches(local: ipaddress.IPv4Address | ipaddress.IPv6Address, address: str) -> bool:
    """Does a socket bound to ``local`` take connections for ``address`` (itself, a wildcard, or v4-mapped)?"""
    if local.is_unspecified:
        return True
    try:
        want = ipaddress.ip_address(address)
    except ValueError:  # a host name: any listener on the port may be it
        return True
    mapped = local.ipv4_mapped if isinstance(local, ipaddress.IPv6Address) else None
    return want in (local, mapped)


def listening_inodes(address: str, port: int) -> set[int]:
    """The inodes of the sockets listening on ``address:port`` (or on a wildcard address)."""
    inodes: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN:
                continue
            local, _, hex_port = fields[1].partition(":")
            if int(hex_port, 16) == port and _matches(_address(local), address):
                inodes.add(int(fields[9]))
    return inodes


def _socket_inodes(pid: int) -> set[int]:
    """The socket inodes ``pid`` holds open (empty when it is gone or not ours to read)."""
    found: set[int] = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    found.add(int(target[8:-1]))
    return found


def _parents() -> dict[int, int]:
    table: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError, IndexError, ValueError):
                table[int(entry)] = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
    return table


def process_tree(pid: int) -> set[int]:
    """``pid`` and all its descendants (a Prefect server serves from a uvicorn child)."""
    parents = _parents()
    tree, todo = {pid}, [pid]
    while todo:
        parent = todo.pop()
        children = {child for child, ppid in parents.items() if ppid == parent and child not in tree}
        tree |= children
        todo.extend(children)
    return tree


def _describe(pid: int) -> Listener:
    command, cwd = "", ""
    with contextlib.suppress(OSError):
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().rstrip(b"\0").split(b"\0")
        command = " ".join(" ".join(a.decode(errors="replace").split()) for a in argv)  # one line
    with contextlib.suppress(OSError):
        cwd = os.readlink(f"/proc/{pid}/cwd")
    return Listener(pid, command, cwd)


def port_holders(address: str, port: int) -> list[Listener]:
    """Every process listening on ``address:port``; one ``Listener(None)`` stands for
    sockets whose owner this user cannot see."""
    inodes = listening_inodes(address, port)
    holders: list[Listener] = []
    seen: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and inodes - seen:
            held = _socket_inodes(int(entry)) & inodes
            if held:
                seen |= held
                holders.append(_describe(int(entry)))
    if inodes - seen:
        holders.append(Listener(None))
    return holders


def foreign_holder(address: str, port: int, pid: int) -> Listener | None:
    """Who listens on ``address:port`` instead of ``pid``'s process tree: None when that tree
    holds the socket (or nothing listens there yet); else the other process, described."""
    inodes = listening_inodes(address, port)
    if not inodes:
        return None
    if any(_socket_inodes(member) & inodes for member in process_tree(pid)):
        return None
    others = port_holders(address, port)
    return others[0] if others else Listener(None)
