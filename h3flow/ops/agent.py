"""What h3flow runs on a host over SSH: ``<venv>/bin/python -m h3flow.ops.agent OP``.

The request is one JSON object on stdin, the answer one JSON line on stdout (after
:data:`MARK`, so stray prints of imported libraries cannot be mistaken for it). Why an
agent instead of long shell one-liners: the remote side then runs the *same* code as
``--local`` (``LocalRunner.spawn``/``stop``, ``patches.check_trees``,
``install_node_pack``, the handoff's ``send``), no user text ever reaches a remote
shell (it travels as JSON on stdin), and the venv it runs in is the one the workers
use, so checking it is checking them. The remote venv must hold the same h3flow
(``preflight`` checks the version).

Ops: ``spawn``, ``stop``, ``port_free`` (the runner's), ``facts`` (what preflight
checks), ``link_probe`` (RTT + a 13 MB transfer to each decoder), ``patches``,
``nodes_install``, ``inventory`` (which latents and MP4s the host's store holds, verified
by SHA-256, for ``resume``). An :class:`~h3flow.core.errors.H3FlowError` becomes ``{"error": ...}``.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from h3flow.core.errors import H3FlowError
from h3flow.core.paths import ENTRYPOINTS

MARK = "H3FLOW-AGENT "
Request = dict[str, Any]


# --------------------------------------------------------------------------- the runner's ops
def _spec(req: Request) -> Any:
    from h3flow.ops.services import HttpHealth, ServiceSpec

    return ServiceSpec(
        name=req["name"],
        kind=req.get("kind", "worker"),
        host=req.get("host", ""),
        argv=tuple(req["argv"]),
        env=req["env"],
        cwd=req["cwd"],
        log=req["log"],
        pidfile=req["pidfile"],
        health=HttpHealth(""),
        stop_grace=float(req.get("stop_grace", 15.0)),
        stop_signal=int(req.get("stop_signal", 15)),
        secret_env={name: (ref[0], ref[1]) for name, ref in req.get("secret_env", {}).items()},
        user=req.get("user"),
        setup=tuple(tuple(command) for command in req.get("setup", [])),
    )


def op_spawn(req: Request) -> dict[str, Any]:
    from h3flow.ops.services import LocalRunner

    proc = LocalRunner().spawn(_spec(req))
    return {"pid": proc.pid, "started": proc.started}


def op_stop(req: Request) -> dict[str, Any]:
    from h3flow.ops.services import LocalRunner

    return {"killed": LocalRunner().stop(_spec(req), int(req["pid"]))}


def op_port_free(req: Request) -> dict[str, Any]:
    from h3flow.ops.services import LocalRunner

    return {"free": LocalRunner().port_free(req["address"], int(req["port"]))}


# --------------------------------------------------------------------------- facts for preflight
def _torch() -> dict[str, Any]:
    try:
        import torch
    except Exception as exc:  # noqa: BLE001 - any import failure is the fact
        return {"error": f"{type(exc).__name__}: {exc}"}
    info: dict[str, Any] = {
        "version": torch.__version__,
        "cuda": torch.version.cuda,
        "hip": getattr(torch.version, "hip", None),
    }
    try:
        info["available"] = bool(torch.cuda.is_available())
        info["devices"] = torch.cuda.device_count() if info["available"] else 0
        info["arch_list"] = list(torch.cuda.get_arch_list()) if info["cuda"] or info["hip"] else []
    except Exception as exc:  # noqa: BLE001 - a broken driver is the fact
        info["available"], info["devices"], info["error_cuda"] = False, 0, str(exc)
    return info


def _run(argv: list[str], timeout: float = 20.0) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]} not found"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} timed out after {timeout:g} s"
    return done.returncode, (done.stdout if done.returncode == 0 else (done.stderr or done.stdout)).strip()


def _nvidia_gpus() -> dict[str, Any]:
    base = "--format=csv,noheader,nounits"
    code, out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total,compute_cap", base])
    if code != 0 and code != 127:  # drivers before 510 have no compute_cap column
        code, out = _run(["nvidia-smi", "--query-gpu=index,name,memory.total", base])
    if code != 0:
        return {"error": out or f"nvidia-smi exited {code}", "tool": "nvidia-smi"}
    gpus = []
    for line in out.splitlines():
        cols = [c.strip() for c in line.split(",")]
        if len(cols) >= 3 and cols[0].isdigit():
            cap = cols[3] if len(cols) > 3 and cols[3].replace(".", "").isdigit() else None
            arch = f"sm{cap.replace('.', '')}" if cap else None
            gpus.append({"index": int(cols[0]), "name": cols[1], "memory_mb": float(cols[2] or 0), "arch": arch})
    return {"gpus": gpus, "tool": "nvidia-smi"}


def _amd_gpus() -> dict[str, Any]:
    code, out = _run(["rocm-smi", "--showproductname", "--showmeminfo", "vram", "--json"])
    if code != 0:
        return {"error": out or f"rocm-smi exited {code}", "tool": "rocm-smi"}
    try:
        cards = json.loads(out)
    except ValueError:
        return {"error": f"rocm-smi printed no JSON: {out[:120]}", "tool": "rocm-smi"}
    gpus: list[dict[str, Any]] = []
    for key, card in sorted(cards.items()):
        if not key.startswith("card") or not isinstance(card, dict):
            continue
        lower = {k.lower(): v for k, v in card.items()}
        name = next((str(v) for k, v in lower.items() if k in ("card series", "card model", "marketing name")), "?")
        vram = next((float(v) for k, v in lower.items() if "vram total memory" in k and str(v).isdigit()), 0.0)
        arch = next((str(v) for k, v in lower.items() if "gfx version" in k), None)
        gpus.append(
            {
                "index": int(key[4:]) if key[4:].isdigit() else len(gpus),
                "name": name,
                "memory_mb": vram / 2**20,
                "arch": arch,
            }
        )
    return {"gpus": gpus, "tool": "rocm-smi"}


def _free_bytes(path: str) -> dict[str, Any]:
    """Free bytes where ``path`` is (or will be: its nearest existing parent)."""
    probe = Path(path).expanduser()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return {"free": shutil.disk_usage(probe).free, "at": str(probe)}
    except OSError as exc:
        return {"error": exc.strerror or str(exc)}


def _find_models(models_dir: str | None, names: list[str]) -> dict[str, str | None]:
    found: dict[str, str | None] = dict.fromkeys(names)
    if not models_dir or not Path(models_dir).expanduser().is_dir():
        return found
    for folder, _dirs, files in os.walk(Path(models_dir).expanduser(), followlinks=True):
        for name in set(files) & set(names):
            found[name] = found[name] or str(Path(folder) / name)
    return found


def _api(url: str | None, auth: list[str] | None = None) -> dict[str, Any] | None:
    """The API as this host sees it: ``/health``, then (a cluster API with a credential) one
    authenticated call with the credential as this host holds it (the copy ``start`` made)."""
    if not url:
        return None
    import urllib.request

    health = url.rstrip("/") + "/health"
    try:
        with urllib.request.urlopen(health, timeout=3) as reply:
            body = reply.read(64).decode(errors="replace").strip()
    except Exception as exc:  # noqa: BLE001 - the failure is the fact
        reason = getattr(exc, "reason", None) or exc
        return {"ok": False, "detail": f"{health}: {reason}"}
    answer = {"ok": body == "true", "detail": f"{health} → {body[:40]}"}
    if auth and answer["ok"]:
        from h3flow.config.secret import basic_auth_header
        from h3flow.ops.services import read_secret

        version = url.rstrip("/") + "/admin/version"
        try:
            request = urllib.request.Request(version, headers=basic_auth_header(read_secret((auth[0], auth[1]))))
            with urllib.request.urlopen(request, timeout=3):
                pass
            answer["detail"] += "; the credential is accepted"
        except H3FlowError as exc:
            answer.update(ok=False, detail=f"{answer['detail']}; {exc}")
        except Exception as exc:  # noqa: BLE001 - a 401 is the fact
            answer.update(ok=False, detail=f"{answer['detail']}; {version}: {exc}")
    return answer


def _postgres(path: str | None, os_user: str | None) -> dict[str, Any] | None:
    """Where PostgreSQL's programs are on this host's PATH for them, their version, and the
    system user it would run as (it refuses root)."""
    if path is None:
        return None
    found = {tool: shutil.which(tool, path=path) for tool in ("initdb", "postgres")}
    info: dict[str, Any] = {**found, "root": os.geteuid() == 0}
    if found["postgres"]:
        info["version"] = _run([str(found["postgres"]), "--version"])[1]
    if info["root"] and os_user:
        import pwd

        try:
            pwd.getpwnam(os_user)
            info["os_user"] = os_user
        except KeyError:
            info["os_user_missing"] = os_user
    return info


def _environ(pidfile: str | None, keys: list[str]) -> dict[str, Any] | None:
    """Some variables of the live process a PID file names (what it really runs with)."""
    if not pidfile:
        return None
    try:
        pid = int(Path(pidfile).read_text().split()[0])
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except (OSError, ValueError, IndexError):
        return {"running": False}
    env = dict(item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {"running": True, "pid": pid, "env": {k: env.get(k.encode(), b"").decode() or None for k in keys}}


def op_facts(req: Request) -> dict[str, Any]:
    import h3flow

    vendor = req.get("vendor", "cpu")
    checkout = req.get("checkout")
    return {
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "h3flow": h3flow.__version__,
        "checkout": bool(checkout and all((Path(checkout) / e.split(":")[0]).is_file() for e in ENTRYPOINTS.values())),
        "torch": _torch(),
        "gpus": _nvidia_gpus() if vendor == "nvidia" else _amd_gpus() if vendor == "amd" else None,
        "disk": {path: _free_bytes(path) for path in req.get("disk", [])},
        "models": _find_models(req.get("models_dir"), list(req.get("models", []))),
        "api": _api(req.get("api_url"), req.get("api_auth")),
        "postgres": _postgres(req.get("postgres_path"), req.get("postgres_os_user")),
        "environ": {pf: _environ(pf, list(req.get("environ_keys", []))) for pf in req.get("environ_pidfiles", [])},
        "time": time.time(),
    }


# --------------------------------------------------------------------------- link probe
def _rtt_ms(address: str, port: int, rounds: int) -> float | None:
    """Median TCP connect time: one SYN / SYN-ACK round trip (a refused port answers too)."""
    times = []
    for _ in range(rounds):
        begin = time.perf_counter()
        try:
            with socket.create_connection((address, port), timeout=2.0):
                pass
        except ConnectionRefusedError:
            pass
        except OSError:
            continue
        times.append((time.perf_counter() - begin) * 1000)
    return statistics.median(times) if times else None


def op_link_probe(req: Request) -> dict[str, Any]:
    """For each route: its RTT and one transfer of ``size`` random bytes through the
    route's method into the decoder's store, verified there by SHA-256 like a latent."""
    from h3flow.config.models import SecretSource
    from h3flow.config.secret import load_secret
    from h3flow.core.files import FileRef
    from h3flow.core.fsutil import sha256_file
    from h3flow.handoff.destination import Destination
    from h3flow.handoff.transfer import send

    size = int(req.get("size", 13_000_000))
    tmp_dir = Path(req["tmp_dir"])
    tmp_dir.mkdir(parents=True, exist_ok=True)
    results = []
    for route in req["routes"]:
        out: dict[str, Any] = {"target": route["target"]}
        out["rtt_ms"] = _rtt_ms(route["address"], int(route["rtt_port"]), int(req.get("rounds", 5)))
        path = tmp_dir / f"probe-{os.getpid()}-{route['target']}.bin"
        try:
            path.write_bytes(os.urandom(size))
            ref = FileRef(path, sha256_file(path), size)
            secret = load_secret(SecretSource.model_validate(req["secret"])) if route["method"] == "tcp" else None
            dest = Destination(
                method=route["method"],
                host=route["target"],
                address=route["address"],
                port=int(route["port"]),
                ssh_alias=route.get("ssh_alias"),
                store_root=Path(route["store_root"]),
                secret=secret,
            )
            begin = time.perf_counter()
            send(ref, dest, timeout=30.0)
            seconds = time.perf_counter() - begin
            out.update(sha256=ref.sha256, seconds=seconds, mb_s=size / 1e6 / seconds)
        except H3FlowError as exc:
            out["error"] = str(exc)
        finally:
            path.unlink(missing_ok=True)
        results.append(out)
    return {"routes": results}


# --------------------------------------------------------------------------- patches, node pack
def op_patches(req: Request) -> dict[str, Any]:
    """Check or apply the controller's patch files (sent in the request) in this host's checkouts."""
    from h3flow.ops import patches

    with tempfile.TemporaryDirectory(prefix="h3flow-patches-") as tmp:
        for name, text in req["patches"].items():
            (Path(tmp) / Path(name).name).write_text(text, encoding="utf-8")
        dirs = [Path(d).expanduser() if d else None for d in (req.get("comfy_dir"), req.get("raylight_dir"))]
        run = patches.check_trees if req["action"] == "check" else patches.apply_trees
        reports = run(dirs[0], dirs[1], patches_dir=Path(tmp))
    return {
        "reports": [
            {"patch": r.patch, "tree": str(r.tree), "state": r.state.value, "problem": r.problem, "changed": r.changed}
            for r in reports
        ]
    }


def op_nodes_install(req: Request) -> dict[str, Any]:
    """Install the node pack sent in the request (``{relpath: base64}``) into a ComfyUI here."""
    from h3flow.ops.comfy_install import PACK_NAME, install_node_pack

    with tempfile.TemporaryDirectory(prefix="h3flow-pack-") as tmp:
        source = Path(tmp) / PACK_NAME
        for rel, data in req["files"].items():
            dest = source / rel
            if source.resolve() not in dest.resolve().parents:
                raise H3FlowError(f"node pack file {rel!r} is outside the pack")
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(base64.b64decode(data))
        comfy_dir = Path(req["comfy_dir"]).expanduser()
        status = install_node_pack(comfy_dir, source=source)
    return {"status": status, "target": str(comfy_dir / "custom_nodes" / PACK_NAME)}


# --------------------------------------------------------------------------- what a host's store holds
def op_inventory(req: Request) -> dict[str, Any]:
    """Which of the given latents (by SHA-256) this host's store holds, and which of the given
    MP4s (path + expected SHA-256) its outputs hold, each verified by re-hashing it here.

    Request: ``{"store_root", "outputs_root", "latents": [sha], "outputs": [{"path", "sha256"}],
    "repair": bool}``. Answer: :meth:`h3flow.handoff.inventory.HostFiles.to_json` (verdicts
    ``ok`` / ``missing`` / ``damaged``; with ``repair``, damaged files are moved aside and
    named in ``repaired``). Only paths under ``outputs_root`` are looked at.
    """
    from h3flow.handoff.inventory import check_host_files

    found = check_host_files(
        Path(req["store_root"]),
        list(req.get("latents", [])),
        [(item["path"], item["sha256"]) for item in req.get("outputs", [])],
        repair=bool(req.get("repair", False)),
        outputs_root=Path(req["outputs_root"]),
    )
    return found.to_json()


# --------------------------------------------------------------------------- run state, batch images
def op_manifest(req: Request) -> dict[str, Any]:
    """A run's manifest from this host's runs_dir (the dispatcher's host writes it): ``{"manifest": {...}}``."""
    from h3flow.pipeline.manifest import load_manifest

    return {"manifest": load_manifest(req["runs_dir"], req["run_id"]).model_dump(mode="json")}


def op_runs(req: Request) -> dict[str, Any]:
    """The runs under this host's runs_dir, newest first (``h3flow runs`` from another machine)."""
    from h3flow.pipeline.runs import list_runs_in

    return {"runs": [r.to_json() for r in list_runs_in(Path(req["runs_dir"]), req.get("limit"))]}


def op_stage_inputs(req: Request) -> dict[str, Any]:
    """Store the batch's images sent in the request (``{sha256: {"suffix", "data": base64}}``)
    in this host's input store under their content address; bytes that do not hash to
    their name are refused. Answer: ``{"stored": [path, ...]}``."""
    from h3flow.handoff.inputs import put_input
    from h3flow.handoff.store import check_sha256

    stored = []
    with tempfile.TemporaryDirectory(prefix="h3flow-inputs-") as tmp:
        for sha, item in req["images"].items():
            suffix = str(item["suffix"])
            if not suffix.startswith(".") or "/" in suffix or len(suffix) > 8:
                raise H3FlowError(f"image suffix {suffix!r} is not a file suffix")
            source = Path(tmp) / f"{check_sha256(sha)}{suffix}"
            source.write_bytes(base64.b64decode(item["data"]))
            stored.append(str(put_input(Path(req["store_root"]), source, sha)))
    return {"stored": stored}


OPS: dict[str, Callable[[Request], dict[str, Any]]] = {
    "inventory": op_inventory,
    "manifest": op_manifest,
    "runs": op_runs,
    "stage_inputs": op_stage_inputs,
    "spawn": op_spawn,
    "stop": op_stop,
    "port_free": op_port_free,
    "facts": op_facts,
    "link_probe": op_link_probe,
    "patches": op_patches,
    "nodes_install": op_nodes_install,
}


def parse_answer(stdout: str) -> dict[str, Any] | None:
    """The agent's answer in its output (the last marked line), or None."""
    for line in reversed(stdout.splitlines()):
        if line.startswith(MARK):
            return dict(json.loads(line[len(MARK) :]))
    return None


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in OPS:
        print(f"usage: python -m h3flow.ops.agent {{{','.join(OPS)}}} < request.json", file=sys.stderr)
        return 64
    try:
        request = json.loads(sys.stdin.read() or "{}")
        answer = OPS[args[0]](request)
    except H3FlowError as exc:
        answer, code = {"error": str(exc)}, 2
    else:
        code = 0
    sys.stdout.write(MARK + json.dumps(answer) + "\n")
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
