"""``h3flow preflight``: check every host and service before work starts.

Per host: SSH reachable with host keys checked; the venv's python, h3flow and torch
(with the CUDA / ROCm build the GPUs need); the GPUs visible and matching the host map;
free disk in the stores; each pool's ComfyUI holding every node and input the
templates use; the Turing patches; the model files; ``H3_MP_RETAIN_CPU_WEIGHTS=1`` for
the encoder; the Prefect API reachable *from* the host; a live worker on each pool;
each link's RTT and a 13 MB transfer; clock skew.

How: each host's facts are gathered once, in parallel (one SSH connection per host;
the h3flow agent in the host's venv reports python / torch / GPUs / disk / models /
the API as the host sees it, and runs the link probe), then judged by one small
function per check. A check is ✓, ! (works, with a warning), ✗ with the fix, or —
(skipped, with why: it does not apply to the host's role or engine, or the service is
not started yet). The embedded
default (a local.json with a work_dir) is checked the same way, without SSH.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from rich.console import Console
from rich.table import Table

import h3flow
from h3flow.config.models import LocalConfig, Pool, ResolvedHost, load_local_config
from h3flow.core.errors import H3FlowError
from h3flow.ops.services import (
    LocalRunner,
    Proc,
    ServiceSpec,
    WorkerHealth,
    check_health,
    secret_ref,
    service_specs,
)

Status = Literal["ok", "warn", "fail", "skip"]
PROBE_BYTES = 13_000_000  # an HD latent
MAX_SKEW_S = 2.0  # Prefect heartbeats and the dispatcher's 20 s staleness rule tolerate this much
CONNECT_TIMEOUT = 5.0
GIB = 1 << 30
MIN_FREE = {"h3": 20 * GIB, "reference": GIB // 4}  # latents, conditioning, MP4s, Prefect results
SYMBOL = {"ok": "[green]✓[/]", "warn": "[yellow]![/]", "fail": "[red]✗[/]", "skip": "[dim]—[/]"}


@dataclass(frozen=True)
class Check:
    """One line of the report. A failed check always says how to fix it."""

    host: str
    name: str
    status: Status
    detail: str
    fix: str = ""


def ok(host: str, name: str, detail: str) -> Check:
    return Check(host, name, "ok", detail)


def warn(host: str, name: str, detail: str) -> Check:
    """Works, but not as written: said once so the operator can make it explicit."""
    return Check(host, name, "warn", detail)


def fail(host: str, name: str, detail: str, fix: str) -> Check:
    return Check(host, name, "fail", detail, fix)


def skip(host: str, name: str, why: str) -> Check:
    return Check(host, name, "skip", why)


# --------------------------------------------------------------------------- what one host looks like
class LocalHost(LocalRunner):
    """This machine as a host of the embedded default: LocalRunner plus exec / agent, no SSH."""

    def __init__(self, host: ResolvedHost) -> None:
        super().__init__()
        self.host = host
        self.where = f"host {host.name} (this machine)"
        self.python = str(Path(host.venv) / "bin" / "python")

    def exec(self, argv: Sequence[str], *, stdin: str | None = None, timeout: float = 60.0) -> tuple[int, str, str]:
        try:
            done = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise H3FlowError(f"{self.where}: {argv[0]}: {exc}") from None
        return done.returncode, done.stdout, done.stderr

    def agent(self, op: str, request: dict[str, Any], *, timeout: float = 120.0) -> dict[str, Any]:
        from h3flow.ops.ssh import agent_answer

        try:
            code, out, err = self.exec(
                [self.python, "-m", "h3flow.ops.agent", op], stdin=json.dumps(request), timeout=timeout
            )
        except H3FlowError as exc:
            code, out, err = 127, "", str(exc)
        return agent_answer(op, code, out, err, self.where, self.python)

    def close(self) -> None:
        pass


@dataclass
class HostView:
    """Everything preflight learned about one host; the checks only read it."""

    config: LocalConfig
    host: ResolvedHost
    local: bool
    specs: list[ServiceSpec]
    reach: str = ""  # how SSH went (or why it failed)
    reachable: bool = False
    facts: dict[str, Any] | None = None
    facts_error: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)  # spec name -> process
    patches: list[Any] | str | None = None  # PatchReports, or why they could not be checked
    links: dict[str, dict[str, Any]] = field(default_factory=dict)  # target host -> probe result
    links_error: str = ""
    skew: tuple[float, float] | None = None  # (remote - here, ± uncertainty) seconds

    @property
    def name(self) -> str:
        return self.host.name

    @property
    def pools(self) -> list[Pool]:
        return [p for p in self.config.pools if p.host == self.name]

    def spec(self, name: str) -> ServiceSpec | None:
        return next((s for s in self.specs if s.name == name), None)

    def state(self, name: str) -> str:
        """running | stale | not started | unknown (no such service here)"""
        proc = self.procs.get(name)
        if proc is None:
            return "unknown"
        return "running" if proc.running else "stale" if proc.stale else "not started"


# --------------------------------------------------------------------------- gathering
def _vendor(host: ResolvedHost) -> str:
    return host.gpus[0].vendor if host.gpus else "cpu"


def _model_files(config: LocalConfig, host: ResolvedHost) -> list[str]:
    """The weight files this host's pools load (ComfyUI's models folder must hold them)."""
    model = config.model
    names: list[str] = []
    for pool in [p for p in config.pools if p.host == host.name]:
        if pool.role == "sample":
            names += [model.dit] + ([model.lora] if model.lora else [])
            if pool.encoder_pool == pool.name:
                names += [model.text_encoder, model.vae]
        else:
            names += [model.vae, model.audio_vae]
    return list(dict.fromkeys(names))


def _encoder_spec(view: HostView) -> ServiceSpec | None:
    """The process whose environment the encoder runs with: its ComfyUI, or (engine local) its worker."""
    for pool in view.pools:
        if pool.role == "sample" and pool.encoder_pool == pool.name:
            name = f"comfyui-{pool.name}" if view.config.engine == "comfy" else f"worker-{pool.work_pool}"
            return view.spec(name)
    return None


def _facts_request(view: HostView) -> dict[str, Any]:
    from h3flow.core.paths import SOURCE_DIR

    host, config = view.host, view.config
    encoder = _encoder_spec(view)
    database = view.spec("postgres")
    db = config.prefect.database
    return {
        "api_auth": list(secret_ref(config.prefect.auth)) if config.prefect.auth else None,
        "postgres_path": database.env["PATH"] if database else None,
        "postgres_os_user": db.os_user if database and db else None,
        "vendor": _vendor(host),
        "checkout": str(SOURCE_DIR),
        "disk": list(dict.fromkeys([host.storage.root, host.storage.outputs])),
        "models_dir": str(Path(host.comfy_dir) / "models") if host.comfy_dir else None,
        "models": _model_files(config, host) if config.model.kind == "h3" else [],
        "api_url": config.prefect.api_url,
        "environ_pidfiles": [encoder.pidfile] if encoder else [],
        "environ_keys": ["H3_MP_RETAIN_CPU_WEIGHTS"],
    }


def _clock(runner: Any) -> tuple[float, float] | None:
    begin = time.time()
    _code, out, _err = runner.exec(["date", "+%s.%N"], timeout=15.0)
    end = time.time()
    try:
        remote = float(out.strip())
    except ValueError:
        return None
    return remote - (begin + end) / 2, (end - begin) / 2


def _patch_request(view: HostView) -> dict[str, Any] | None:
    from h3flow.ops.patches import agent_request

    comfy, raylight = view.host.comfy_dir, view.host.raylight_dir
    return agent_request("check", comfy, raylight) if comfy or raylight else None


def _needs_patches(view: HostView) -> str | None:
    """Why the Turing patches do not apply here (None: they do)."""
    if view.config.engine != "comfy":
        return "engine local: no ComfyUI / Raylight to patch"
    if view.config.model.kind != "h3":
        return "the reference model does not run H3's code paths"
    if not any(g.arch.startswith("sm7") for g in view.host.gpus):
        return "no Turing (sm7x) GPU on this host"
    return None


def gather(view: HostView, runner: Any) -> None:
    """Fill ``view`` from the host: each step catches its own failure so the others still report."""
    try:
        if not view.local:
            runner.conn  # noqa: B018 - opens the connection (host key checked)
        view.reachable, view.reach = True, "this machine" if view.local else f"{runner.conn.host}:{runner.conn.port}"
    except H3FlowError as exc:
        view.reach = str(exc)
        return
    for spec in view.specs:
        try:
            view.procs[spec.name] = runner.inspect(spec)
        except H3FlowError:
            pass
    try:
        view.facts = runner.agent("facts", _facts_request(view), timeout=180.0)
    except H3FlowError as exc:
        view.facts_error = str(exc)
    if not view.local:
        try:
            view.skew = _clock(runner)
        except H3FlowError:
            view.skew = None
    request = _patch_request(view)
    if request is not None and _needs_patches(view) is None and view.facts is not None:
        from h3flow.ops.patches import reports_from

        try:
            view.patches = reports_from(runner.agent("patches", request, timeout=300.0))
        except H3FlowError as exc:
            view.patches = str(exc)


def probe_routes(config: LocalConfig, views: dict[str, HostView], host: str) -> list[dict[str, Any]]:
    """The routes to probe from ``host``: not same-host ones, and tcp only where the receiver runs."""
    out = []
    for route in config.routes:
        if route.source != host or route.method == "local":
            continue
        target = config.hosts[route.target]
        if route.method == "tcp" and views[route.target].state(f"receiver-{route.target}") != "running":
            continue
        out.append(
            {
                "target": route.target,
                "method": route.method,
                "address": route.address,
                "port": route.port,
                "rtt_port": route.port if route.method == "tcp" else target.port,
                "store_root": route.store_root,
                "ssh_alias": target.ssh_alias,
            }
        )
    return out


# --------------------------------------------------------------------------- the checks
def check_ssh(view: HostView) -> list[Check]:
    if view.local:
        return [skip(view.name, "ssh", "this machine (embedded default): no SSH")]
    if view.reachable:
        return [ok(view.name, "ssh", f"{view.host.ssh_alias} → {view.reach}, host key matches known_hosts")]
    fix = (
        "check the address / ssh alias (SSH config: $H3FLOW_SSH_CONFIG or ~/.ssh/config), that the host is up and "
        "sshd runs, and that its key is in known_hosts (ssh-keyscan, or one manual ssh)"
    )
    return [fail(view.name, "ssh", view.reach, fix)]


def check_venv(view: HostView) -> list[Check]:
    from h3flow.core.paths import SOURCE_DIR

    if view.facts is None:
        fix = f"create {view.host.venv} on {view.name} and pip install h3flow {h3flow.__version__} into it"
        return [fail(view.name, "venv", view.facts_error, fix)]
    facts = view.facts
    detail = f"python {facts['python']}, h3flow {facts['h3flow']} ({facts['executable']})"
    if facts["h3flow"] != h3flow.__version__:
        return [
            fail(
                view.name,
                "venv",
                f"{detail}; this machine has h3flow {h3flow.__version__}",
                f"install h3flow {h3flow.__version__} into {view.host.venv} on {view.name}",
            )
        ]
    if not facts["checkout"]:
        return [
            fail(
                view.name,
                "venv",
                f"{detail}; no h3flow checkout at {SOURCE_DIR} (the deployments' working dir)",
                f"put the h3flow source at {SOURCE_DIR} on {view.name} (git clone / rsync): flows run from there",
            )
        ]
    return [ok(view.name, "venv", f"{detail}, checkout at {SOURCE_DIR}")]


def _cuda_arch(arch: str) -> str:
    return f"sm_{arch[2:]}" if arch.startswith("sm") else arch


def check_torch(view: HostView) -> list[Check]:
    if view.facts is None:
        return [skip(view.name, "torch", "no venv (see venv)")]
    torch = view.facts["torch"]
    venv = view.host.venv
    if "error" in torch:
        return [fail(view.name, "torch", f"does not import: {torch['error']}", f"pip install torch into {venv}")]
    vendor = _vendor(view.host)
    build = f"CUDA {torch['cuda']}" if torch.get("cuda") else f"ROCm {torch['hip']}" if torch.get("hip") else "cpu"
    detail = f"torch {torch['version']} ({build} build)"
    if vendor == "cpu":
        return [ok(view.name, "torch", f"{detail}; cpu devices: fine for the reference model")]
    want = "CUDA" if vendor == "nvidia" else "ROCm"
    index = "cu126" if vendor == "nvidia" else "rocm6.3"
    if not torch.get("cuda" if vendor == "nvidia" else "hip"):
        return [
            fail(
                view.name,
                "torch",
                f"{detail}: the host's {vendor} GPUs need a {want} build",
                f"pip install torch --index-url https://download.pytorch.org/whl/{index} into {venv}",
            )
        ]
    if not torch.get("available"):
        why = torch.get("error_cuda") or "torch.cuda.is_available() is False"
        return [
            fail(
                view.name,
                "torch",
                f"{detail} sees no GPU: {why}",
                f"check the {vendor} driver on {view.name} ({'nvidia-smi' if vendor == 'nvidia' else 'rocm-smi'})",
            )
        ]
    archs = torch.get("arch_list") or []
    missing = sorted({g.arch for g in view.host.gpus if archs and _cuda_arch(g.arch) not in archs})
    if missing:
        return [
            fail(
                view.name,
                "torch",
                f"{detail} has no kernels for {', '.join(missing)} (built for {' '.join(archs)})",
                f"install a torch build that supports {', '.join(missing)} into {venv}",
            )
        ]
    return [ok(view.name, "torch", f"{detail}, {torch.get('devices', 0)} device(s) usable")]


def _same_model(listed: str, seen: str) -> bool:
    squash = lambda text: "".join(text.lower().split())  # noqa: E731
    return squash(listed) in squash(seen)


def check_gpus(view: HostView) -> list[Check]:
    gpus, name = view.host.gpus, view.name
    if all(g.vendor == "cpu" for g in gpus):
        if view.config.model.kind == "reference":
            return [ok(name, "gpus", f"cpu (reference model): {len(gpus)} cpu device(s), no GPU checks")]
        return [
            fail(
                name,
                "gpus",
                "the host map gives cpu devices but the model is MiniMax H3",
                "list the host's GPUs in the host map, or use model kind 'reference'",
            )
        ]
    if view.facts is None:
        return [skip(name, "gpus", "no venv (see venv)")]
    seen = view.facts.get("gpus") or {}
    tool = seen.get("tool", "nvidia-smi")
    if "error" in seen:
        vendor = "NVIDIA" if tool == "nvidia-smi" else "AMD"
        return [
            fail(
                name,
                "gpus",
                f"no {vendor} GPU visible on {name}: {seen['error']}",
                f"install the {vendor} driver ({tool}), or correct the host map's gpus for {name}",
            )
        ]
    visible = {g["index"]: g for g in seen.get("gpus", [])}
    problems = []
    for gpu in gpus:
        got = visible.get(gpu.index)
        if got is None:
            problems.append(f"GPU {gpu.index} ({gpu.model}) not visible")
            continue
        if not _same_model(gpu.model, got["name"]):
            problems.append(f"GPU {gpu.index} is {got['name']}, the host map says {gpu.model}")
        gib = got["memory_mb"] / 1024
        if gib and abs(gib - gpu.vram_gb) > 0.15 * gpu.vram_gb:
            problems.append(f"GPU {gpu.index} has {gib:.1f} GiB, the host map says {gpu.vram_gb:g} GB")
        if got.get("arch") and got["arch"] != gpu.arch:
            problems.append(f"GPU {gpu.index} is {got['arch']}, the host map says {gpu.arch}")
    shown = f"{tool}: " + ", ".join(f"{i}:{g['name']}" for i, g in sorted(visible.items()))
    if problems:
        return [
            fail(
                name,
                "gpus",
                "; ".join(problems) + f" ({shown})",
                f"correct the host map's gpus for {name} and rerun config-adapt, or fix the hardware / driver",
            )
        ]
    return [ok(name, "gpus", f"{len(gpus)} match the host map ({shown})")]


def check_disk(view: HostView) -> list[Check]:
    if view.facts is None:
        return [skip(view.name, "disk", "no venv (see venv)")]
    need = MIN_FREE[view.config.model.kind]
    parts, short = [], []
    for path, info in view.facts["disk"].items():
        if "error" in info:
            short.append(f"{path}: {info['error']}")
            continue
        parts.append(f"{path} {info['free'] / GIB:.1f} GiB free")
        if info["free"] < need:
            short.append(f"{path} has {info['free'] / GIB:.1f} GiB free")
    if short:
        return [
            fail(
                view.name,
                "disk",
                "; ".join(short) + f" (need ≥ {need / GIB:g} GiB)",
                f"free space on that disk on {view.name}, or point storage at a larger one in the host map",
            )
        ]
    return [ok(view.name, "disk", ", ".join(parts))]


def _stage_params(stage: str, reference: bool) -> dict[str, Any]:
    """Stand-in stage parameters: the check is about nodes and inputs, not these values."""
    size = {} if reference else {"width": 736, "height": 416, "length": 124}
    if stage == "encode":
        base = {"image": "h3flow/preflight.png", "prompt": "preflight", "out_path": "/tmp/preflight.safetensors"}
        return {**base, **({"spec": "sd", "frames": 124} if reference else size)}
    if stage == "sample":
        return {
            "cond_path": "/tmp/c.safetensors",
            "cond_sha256": "0" * 64,
            "seed": 1,
            "steps": 4,
            "out_path": "/tmp/l.h3latent",
            "meta": "{}",
            **size,
        }
    return {"latent_path": "/tmp/l.h3latent", "latent_sha256": "0" * 64, "out_path": "/tmp/v.mp4"}


def _comfy_fix(problems: Iterable[str], host: str) -> str:
    fixes: dict[str, None] = {}  # ordered, no repeats
    for line in problems:
        missing = "node type not installed" in line
        if "(H3" in line and "gives no default for" not in line:
            fixes[f"`h3flow nodes install --host {host}` (the h3flow node pack)"] = None
        if missing and ("(Ray" in line or "(XFuser" in line):
            fixes["install Raylight into custom_nodes"] = None
        if missing and "(MiniMax" in line:
            fixes["update ComfyUI to a version with the MiniMax H3 nodes"] = None
        if "gives no default for" in line:
            fixes[
                "set the named inputs in the templates (workflows/), or install the node versions they were written for"
            ] = None
        if "not among the options" in line:
            fixes["put the named model files into ComfyUI's models folders"] = None
    return "; ".join(fixes) or "make this ComfyUI match the templates in workflows/"


def template_problems(config: LocalConfig, pool: Pool, object_info: dict[str, Any]) -> tuple[list[str], list[str]]:
    """How the pool's templates fit ``object_info``: (problems, inputs filled from its defaults).

    Each line is named by its template. A required input a template does not set is
    filled from the server's default at run time (the ``comfy`` engine does the same),
    so it is a warning; one without a default, and everything :func:`validate_prompt`
    finds in the completed prompt, is a problem.
    """
    from h3flow.engines import comfy_params
    from h3flow.engines.comfy import ComfyEngine
    from h3flow.engines.workflows import complete_prompt, validate_prompt

    reference = config.model.kind == "reference"
    variant = "reference" if reference else "xtx" if pool.arch.startswith("gfx") else "production"
    engine = ComfyEngine(pool.comfy_url, reference=reference, variant=variant, params=comfy_params(config.model, pool))
    stages = (
        ["decode"] if pool.role == "decode" else (["encode"] if pool.encoder_pool == pool.name else []) + ["sample"]
    )
    problems: list[str] = []
    filled: list[str] = []
    for stage in stages:
        name = engine.template_name(stage)
        done = complete_prompt(engine.prompt_for(stage, _stage_params(stage, reference)), object_info, template=name)
        problems += done.unfillable + [
            f"{name}: {p}" for p in validate_prompt(done.prompt, object_info, missing_required=False)
        ]
        filled += [item.line(name) for item in done.filled]
    return problems, filled


def check_comfyui(view: HostView, fetch: Callable[[str], dict[str, Any]]) -> list[Check]:
    if view.config.engine != "comfy":
        return [skip(view.name, "comfyui", "engine local: the stages run in the workers, no ComfyUI")]
    checks = []
    for pool in view.pools:
        label = f"comfyui {pool.name}"
        state = view.state(f"comfyui-{pool.name}")
        if state == "not started":
            checks.append(skip(view.name, label, f"not started yet: `h3flow start` starts it at {pool.comfy_url}"))
            continue
        try:
            info = fetch(pool.comfy_url)
        except H3FlowError as exc:
            checks.append(
                fail(
                    view.name,
                    label,
                    f"{pool.comfy_url} does not answer: {exc}",
                    f"`h3flow start` (its log: `h3flow status --services`), or open port {pool.comfy_port}",
                )
            )
            continue
        problems, filled = template_problems(view.config, pool, info)
        if problems:
            more = f" (+{len(problems) - 4} more)" if len(problems) > 4 else ""
            checks.append(fail(view.name, label, "; ".join(problems[:4]) + more, _comfy_fix(problems, view.name)))
        elif filled:
            checks.append(warn(view.name, label, f"{pool.comfy_url}: " + "; ".join(filled)))
        else:
            checks.append(
                ok(view.name, label, f"{pool.comfy_url}: /object_info holds every node and input of its templates")
            )
    return checks


def check_patches(view: HostView) -> list[Check]:
    from h3flow.ops.patches import State

    why = _needs_patches(view)
    if why:
        return [skip(view.name, "patches", why)]
    if not view.host.comfy_dir and not view.host.raylight_dir:
        return [
            fail(
                view.name,
                "patches",
                "no comfy_dir / raylight_dir in the host map to check",
                "add comfy_dir (and raylight_dir on samplers) to the host map",
            )
        ]
    if view.patches is None:
        return [skip(view.name, "patches", "no venv (see venv)")]
    if isinstance(view.patches, str):
        return [fail(view.name, "patches", view.patches, f"`h3flow patches check --host {view.name}` for details")]
    bad = [r for r in view.patches if r.state is not State.APPLIED]
    if bad:
        fix = f"`h3flow patches apply --host {view.name}`"
        if any(r.state is State.CONFLICT for r in bad):
            fix = "the checkout is not the pinned upstream commit (patches/README.md): check it out, then " + fix
        return [fail(view.name, "patches", "; ".join(r.line() for r in bad), fix)]
    return [ok(view.name, "patches", "; ".join(f"{r.patch} applied" for r in view.patches))]


def check_models(view: HostView) -> list[Check]:
    if view.config.model.kind == "reference":
        return [skip(view.name, "models", "the reference model has no weight files")]
    if view.config.engine != "comfy":
        return [skip(view.name, "models", "engine local: no ComfyUI models folder")]
    if view.facts is None:
        return [skip(view.name, "models", "no venv (see venv)")]
    found = view.facts["models"]
    missing = [name for name, path in found.items() if path is None]
    folder = f"{view.host.comfy_dir}/models"
    if missing:
        return [
            fail(
                view.name,
                "models",
                f"not under {folder}: {', '.join(missing)}",
                f"download them into {folder}/ (text_encoders, diffusion_models, loras, vae)",
            )
        ]
    return [ok(view.name, "models", f"{len(found)} file(s) under {folder}")]


def check_retain(view: HostView) -> list[Check]:
    from h3flow.config.adapt import RETAIN_CPU_WEIGHTS

    spec = _encoder_spec(view)
    if spec is None:
        return [skip(view.name, "retain", "no encoder pool on this host")]
    live = (view.facts or {}).get("environ", {}).get(spec.pidfile) or {}
    if live.get("running"):
        value, where = live["env"].get(RETAIN_CPU_WEIGHTS), f"{spec.name} (pid {live['pid']})"
    else:
        value, where = spec.env.get(RETAIN_CPU_WEIGHTS), f"the environment `h3flow start` gives {spec.name}"
    if value != "1":
        return [
            fail(
                view.name,
                "retain",
                f"{RETAIN_CPU_WEIGHTS}={value or '(unset)'} in {where}",
                f'set "{RETAIN_CPU_WEIGHTS}": "1" in {view.name}\'s env in the host map, config-adapt, then '
                "`h3flow stop` + `h3flow start`",
            )
        ]
    return [ok(view.name, "retain", f"{RETAIN_CPU_WEIGHTS}=1 in {where}")]


def check_prefect_api(view: HostView, server_state: str) -> list[Check]:
    url = view.config.prefect.api_url
    if server_state == "not started":
        return [
            skip(view.name, "prefect api", f"the Prefect server is not started yet: `h3flow start` starts it ({url})")
        ]
    if view.facts is None:
        return [skip(view.name, "prefect api", "no venv (see venv)")]
    api = view.facts.get("api") or {}
    if api.get("ok"):
        return [ok(view.name, "prefect api", f"from {view.name}: {api['detail']}")]
    if "/admin/version" in str(api.get("detail")) or "secret" in str(api.get("detail")):
        return [
            fail(
                view.name,
                "prefect api",
                f"from {view.name}: {api.get('detail', '?')}",
                f"`h3flow start` copies the API credential ({view.config.prefect.auth}) to every host; "
                "the server must run with the same one",
            )
        ]
    return [
        fail(
            view.name,
            "prefect api",
            f"from {view.name}: {api.get('detail', '?')}",
            f"make {url} reachable from {view.name} (server bound to that address, firewall open)",
        )
    ]


def check_database(view: HostView) -> list[Check]:
    """PostgreSQL on the API's host: installed (before ``start``), accepting connections (after)."""
    spec = view.spec("postgres")
    if spec is None:
        return []
    state = view.state(spec.name)
    if state == "running":
        healthy, detail = check_health(spec.health)
        if healthy:
            return [ok(view.name, "postgresql", f"pid {view.procs[spec.name].pid}: {detail}")]
        return [fail(view.name, "postgresql", detail, f"see its log {spec.log}; `h3flow stop` + `h3flow start`")]
    if state == "stale":
        return [
            fail(
                view.name,
                "postgresql",
                f"PostgreSQL died (stale PID file {spec.pidfile})",
                f"`h3flow start` restarts it; its log: {spec.log}",
            )
        ]
    info = (view.facts or {}).get("postgres")
    if info is None:
        return [skip(view.name, "postgresql", "no venv (see venv)")]
    fix = "apt-get install postgresql (Debian), or set prefect.database.bin_dir in the host map"
    if not info.get("initdb") or not info.get("postgres"):
        return [fail(view.name, "postgresql", "initdb / postgres not found in /usr/lib/postgresql/*/bin", fix)]
    if info.get("os_user_missing"):
        return [
            fail(
                view.name,
                "postgresql",
                f"no system user {info['os_user_missing']!r} to run it as (start runs as root; PostgreSQL refuses root)",
                fix + "; or set prefect.database.os_user",
            )
        ]
    runs_as = f", runs as {info['os_user']}" if info.get("os_user") else ""
    return [
        ok(
            view.name,
            "postgresql",
            f"{info.get('version', '?')} at {Path(info['postgres']).parent}{runs_as}; not started yet",
        )
    ]


def check_workers(view: HostView) -> list[Check]:
    checks = []
    for spec in [s for s in view.specs if s.kind == "worker"]:
        health = spec.health
        assert isinstance(health, WorkerHealth)
        label = f"worker {health.work_pool}"
        state = view.state(spec.name)
        if state == "not started":
            checks.append(skip(view.name, label, "not started yet: `h3flow start` starts it"))
            continue
        if state == "stale":
            checks.append(
                fail(
                    view.name,
                    label,
                    f"{spec.name} died (stale PID file {spec.pidfile})",
                    f"`h3flow start` restarts it; its log: {spec.log}",
                )
            )
            continue
        healthy, detail = check_health(health)
        if healthy:
            checks.append(ok(view.name, label, f"pid {view.procs[spec.name].pid}: {detail}"))
        else:
            checks.append(
                fail(
                    view.name,
                    label,
                    f"pid {view.procs[spec.name].pid} runs but {detail}",
                    f"see its log {spec.log}; `h3flow stop` + `h3flow start` restarts it",
                )
            )
    return checks or [skip(view.name, "workers", "no pool on this host")]


def check_links(view: HostView) -> list[Check]:
    routes = [r for r in view.config.routes if r.source == view.name]
    if not routes:
        return [skip(view.name, "link", "no sampler pool here (links are probed from the sampler side)")]
    checks = []
    for route in routes:
        label = f"link → {route.target}"
        if route.method == "local":
            checks.append(skip(view.name, label, "same host: latents are linked, not sent"))
            continue
        result = view.links.get(route.target)
        if view.links_error:
            checks.append(fail(view.name, label, view.links_error, "fix what it names, then rerun preflight"))
            continue
        if result is None:
            why = f"the receiver on {route.target} is not running yet: `h3flow start` starts it"
            checks.append(skip(view.name, label, why if route.method == "tcp" else "no venv (see venv)"))
            continue
        rtt = f"RTT {result['rtt_ms']:.2f} ms" if result.get("rtt_ms") is not None else "RTT unmeasured"
        if "error" in result:
            checks.append(
                fail(
                    view.name,
                    label,
                    f"{route.method}: {rtt}; {result['error']}",
                    "check the receiver / SSH access on the decoder host and the transfer secret "
                    "(`h3flow start` copies a file secret to every host)",
                )
            )
            continue
        expected = route.gbit_s * 125
        checks.append(
            ok(
                view.name,
                label,
                f"{route.method}: {rtt}; {PROBE_BYTES / 1e6:g} MB in "
                f"{result['seconds']:.2f} s = {result['mb_s']:.0f} MB/s "
                f"(the host map says {route.gbit_s:g} Gbit/s ≈ {expected:.0f} MB/s)",
            )
        )
    return checks


def check_clock(view: HostView) -> list[Check]:
    if view.local:
        return [skip(view.name, "clock", "this machine")]
    if view.skew is None:
        return [skip(view.name, "clock", "`date` gave no time")]
    skew, error = view.skew
    detail = f"{skew * 1000:+.0f} ms against this machine (±{error * 1000:.0f} ms)"
    if abs(skew) - error > MAX_SKEW_S:
        return [fail(view.name, "clock", detail, f"sync the clocks (chrony or systemd-timesyncd) on {view.name}")]
    return [ok(view.name, "clock", detail)]


def judge(view: HostView, server_state: str, fetch: Callable[[str], dict[str, Any]]) -> list[Check]:
    """All checks of one host, in the report's order."""
    checks = check_ssh(view)
    if not view.reachable:
        return [*checks, skip(view.name, "…", "the other checks need the host (see ssh)")]
    return [
        *checks, *check_venv(view), *check_torch(view), *check_gpus(view), *check_disk(view),
        *check_comfyui(view, fetch), *check_patches(view), *check_models(view), *check_retain(view),
        *check_database(view), *check_prefect_api(view, server_state), *check_workers(view), *check_links(view),
        *check_clock(view),
    ]  # fmt: skip


# --------------------------------------------------------------------------- the command
def fetch_object_info(url: str) -> dict[str, Any]:
    from h3flow.engines.comfy_client import ComfyClient

    with ComfyClient(url, timeout=20.0) as client:
        return client.object_info()


def preflight(
    config: LocalConfig,
    config_path: Path,
    *,
    fetch: Callable[[str], dict[str, Any]] = fetch_object_info,
    timeout: float = CONNECT_TIMEOUT,
) -> list[Check]:
    """Every check of every host (hosts gathered in parallel, reported in local.json's order)."""
    from h3flow.ops.ssh import SshRunner

    local = bool(config.work_dir)
    specs = service_specs(config, config_path)
    views = {
        name: HostView(config, host, local, [s for s in specs if s.host == name]) for name, host in config.hosts.items()
    }
    runners = {name: LocalHost(h) if local else SshRunner(h, timeout=timeout) for name, h in config.hosts.items()}
    try:
        with ThreadPoolExecutor(max_workers=len(views)) as pool:  # services and facts first: links need receivers
            list(pool.map(lambda v: gather(v, runners[v.name]), views.values()))
            routes = {name: probe_routes(config, views, name) for name in views}
            list(pool.map(lambda v: _probe_links(v, runners[v.name], routes[v.name]), views.values()))
        _remove_probe_objects(config, views, runners)
    finally:
        for runner in runners.values():
            runner.close()
    server = next((s for s in specs if s.kind == "prefect-server"), None)
    server_state = views[server.host].state(server.name) if server else "external"
    return [check for view in views.values() for check in judge(view, server_state, fetch)]


def _probe_links(view: HostView, runner: Any, routes: list[dict[str, Any]]) -> None:
    if not routes or not view.reachable or view.facts is None:
        return
    try:
        request = {
            "routes": routes,
            "secret": view.config.transfer.secret.model_dump(mode="json"),
            "size": PROBE_BYTES,
            "tmp_dir": str(Path(view.host.storage.root) / "tmp"),
        }
        answer = runner.agent("link_probe", request, timeout=300.0)
        view.links = {r["target"]: r for r in answer["routes"]}
    except H3FlowError as exc:
        view.links_error = str(exc)


def _remove_probe_objects(config: LocalConfig, views: dict[str, HostView], runners: dict[str, Any]) -> None:
    """The probe's random bytes are no latent: take them out of the decoders' stores again."""
    from h3flow.handoff.store import object_relpath

    for view in views.values():
        for target, result in view.links.items():
            if result.get("sha256") and views[target].reachable:
                path = str(Path(config.hosts[target].storage.root) / object_relpath(result["sha256"]))
                try:
                    runners[target].exec(["rm", "-f", "--", path], timeout=30.0)
                except H3FlowError:
                    pass


def render(checks: Sequence[Check]) -> Table:
    table = Table(title="preflight", title_justify="left")
    fixes = any(c.status == "fail" for c in checks)
    for column in ("host", "check", "", "detail", *(["fix"] if fixes else [])):
        table.add_column(column, overflow="fold")
    last = None
    for check in checks:
        cells = [check.host if check.host != last else "", check.name, SYMBOL[check.status], check.detail]
        table.add_row(*cells, *([check.fix] if fixes else []))
        last = check.host
    return table


def run_preflight(config_path: Path, as_json: bool, console: Console | None = None) -> int:
    """``h3flow preflight``: print the table (or JSON); 1 when any check failed."""
    config = load_local_config(config_path)
    checks = preflight(config, config_path)
    failed = [c for c in checks if c.status == "fail"]
    console = console or Console(highlight=False)
    if as_json:
        console.print_json(json.dumps({"ok": not failed, "checks": [asdict(c) for c in checks]}))
    else:
        console.print(render(checks))
        counts = {s: sum(1 for c in checks if c.status == s) for s in ("ok", "warn", "fail", "skip")}
        summary = f"{counts['ok']} ✓  {counts['warn']} !  {counts['fail']} ✗  {counts['skip']} —"
        console.print(f"[red]{summary}: fix the ✗ lines[/]" if failed else f"[green]{summary}: ready[/]")
    return 1 if failed else 0
