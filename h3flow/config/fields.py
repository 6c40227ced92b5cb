"""The checked field types of the config models: what a host map's text may be.

Each refuses, in one line naming the value (cut short), what the fault and hostile-input
runs found slipping through: an address that means every interface or carries options,
a relative or system path, a loader variable, a control character or lone surrogate.
The models (:mod:`h3flow.config.models`) use them; nothing here knows a model.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from typing import Annotated

from pydantic import AfterValidator

from h3flow.core.jsonio import shown

CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SURROGATE = re.compile("[\ud800-\udfff]")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# what decides which code a process loads or which programs it runs: never set per host
# through the config (services get PATH = the host's venv, then the system's)
LOADER_VARIABLES = (
    "PATH",
    "PYTHONPATH",
    "PYTHONHOME",
    "PYTHONSTARTUP",
    "PYTHONUSERBASE",
    "PYTHONEXECUTABLE",
    "PYTHONINSPECT",
    "PYTHONBREAKPOINT",
    "PYTHONPLATLIBDIR",
    "BASH_ENV",
    "ENV",
    "SHELLOPTS",
    "BASHOPTS",
    "IFS",
    "GCONV_PATH",
    "HOSTALIASES",
)
LOADER_PREFIXES = ("LD_", "DYLD_")
# a name ssh and the resolver take as a host: DNS labels, or an IP literal (checked below)
HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)
SSH_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,252}$")  # an ssh_config alias or a login: never an option
# the system's own trees: h3flow writes (stores, runs, secrets) nowhere under them, except
# in a folder of its own (/etc/h3flow/secrets is a fine home for the transfer secret)
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/sbin",
    "/sys",
    "/usr",
    "/var/lib",
)
OWN_TREES = ("/etc/h3flow", "/var/lib/h3flow")


def no_control(text: str) -> None:
    """Refuse a control character or a lone surrogate: they end up in file names, command lines and environments."""
    if found := CONTROL.search(text):
        raise ValueError(f"{shown(text)} contains a control character ({found.group()!r})")
    if found := SURROGATE.search(text):  # JSON's "\ud800": no file, command line or UTF-8 file can hold it
        raise ValueError(f"{shown(text)} contains a lone surrogate ({found.group()!r}), not text")


def _check_path(path: str) -> str:
    """An absolute path without ``..``: the same place on every host, whatever a process's
    working directory (a relative ``storage.root`` or ``runs_dir`` meant a different
    folder for each service, and ``../../etc`` a folder outside any of them)."""
    no_control(path)
    if not path.startswith("/"):
        raise ValueError(
            f"{shown(path)} is not an absolute path: write it from / (it must mean the same folder "
            "for every process on the host; ~ is not expanded)"
        )
    if ".." in path.split("/"):
        raise ValueError(f"{shown(path)} has a '..' component: write the folder it means")
    return path


def _inside(path: str, tree: str) -> bool:
    return path == tree or path.startswith(tree.rstrip("/") + "/")


def _check_writable_path(path: str) -> str:
    """:func:`_check_path`, and not the filesystem root, a system tree or an ssh folder:
    where h3flow writes (stores, outputs, runs, inbox, secrets)."""
    _check_path(path)
    clean = "/" + "/".join(p for p in path.split("/") if p not in ("", "."))
    if clean == "/":
        raise ValueError("'/' is the filesystem root: give a folder of h3flow's own")
    if ".ssh" in clean.split("/"):
        raise ValueError(f"{shown(path)} is inside an ssh folder: keep h3flow's files out of it")
    system = next((t for t in SYSTEM_TREES if _inside(clean, t)), None)
    if system and not any(_inside(clean, own) for own in OWN_TREES):
        raise ValueError(
            f"{shown(path)} is inside the system's {system}: h3flow writes only to folders of its own "
            f"(e.g. /srv/h3flow/..., or {' or '.join(OWN_TREES)})"
        )
    return path


def _check_address(address: str) -> str:
    """One host's own address: an IP literal in its usual form, or a host name; never the
    unspecified address (0.0.0.0 or ::, "every interface": a receiver bound there would
    listen on all of them), a broadcast or multicast group, or text with spaces or options."""
    no_control(address)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        ip = None
    if ip is None:
        if not HOST_NAME.match(address):
            raise ValueError(
                f"address {shown(address)} is neither an IP address nor a host name "
                "(letters, digits, '-' and '.'; no spaces or options)"
            )
        try:  # the resolver reads "0", "0x0" or "127.1" as IPv4: only the usual form is accepted
            packed = socket.inet_aton(address)
        except OSError:
            return address
        raise ValueError(
            f"address {shown(address)} is IPv4 {socket.inet_ntoa(packed)} in an unusual form: write that instead"
        )
    if ip.is_unspecified:
        raise ValueError(
            f"address {address} means every interface: give the host's own address on the link "
            "(its receiver and ComfyUI listen there only)"
        )
    if ip.is_multicast or (ip.version == 4 and ip == ipaddress.IPv4Address("255.255.255.255")):
        raise ValueError(f"address {address} is not one host's address (broadcast or multicast)")
    return address


def _check_ssh_name(name: str | None) -> str | None:
    if name is not None and not SSH_NAME.match(name):
        no_control(name)
        raise ValueError(
            f"{shown(name)} is not an ssh host alias or login (letters, digits, '.', '_' and '-', "
            "not starting with '-')"
        )
    return name


Address = Annotated[str, AfterValidator(_check_address)]
AbsPath = Annotated[str, AfterValidator(_check_path)]
WritablePath = Annotated[str, AfterValidator(_check_writable_path)]
SshName = Annotated[str | None, AfterValidator(_check_ssh_name)]
SshAlias = Annotated[str, AfterValidator(_check_ssh_name)]


def _check_env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.match(name):
            no_control(name)
            raise ValueError(
                f"env name {shown(name)} is not a variable name (letters, digits and _, not starting with a digit)"
            )
        if name in LOADER_VARIABLES or name.startswith(LOADER_PREFIXES):
            raise ValueError(
                f"env {name}: loader variables (PATH, PYTHON* paths, shell start-up files, LD_*, DYLD_*) would "
                "change the code or programs every h3flow process on the host runs; install into the host's "
                "venv instead"
            )
    return env


Env = Annotated[dict[str, str], AfterValidator(_check_env)]
