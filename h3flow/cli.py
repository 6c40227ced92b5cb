"""The operator's command line: ``h3flow COMMAND``.

Each command is a thin wrapper that imports its implementation lazily (so ``--help``
stays fast) and turns :class:`~h3flow.errors.H3FlowError` into a one-line message
with exit code 2.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console

from h3flow.errors import H3FlowError

F = TypeVar("F", bound=Callable[..., Any])

app = typer.Typer(
    name="h3flow",
    help="Run MiniMax H3 image-to-video over a home-lab GPU cluster, orchestrated by Prefect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
latent_app = typer.Typer(help="Inspect and verify .h3latent files.", no_args_is_help=True)
patches_app = typer.Typer(help="Check / apply the Turing patches to ComfyUI and Raylight.", no_args_is_help=True)
nodes_app = typer.Typer(help="Install the h3flow ComfyUI node pack.", no_args_is_help=True)
store_app = typer.Typer(help="The content-addressed latent store.", no_args_is_help=True)
app.add_typer(latent_app, name="latent")
app.add_typer(patches_app, name="patches")
app.add_typer(nodes_app, name="nodes")
app.add_typer(store_app, name="store")

err_console = Console(stderr=True, highlight=False)


def operator_command(func: F) -> F:
    """Print an H3FlowError as one line on stderr and exit with its code; no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except H3FlowError as exc:
            err_console.print(f"[bold red]error:[/] {exc}", soft_wrap=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            err_console.print("[bold red]error:[/] interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- config
@app.command("config-adapt")
@operator_command
def config_adapt(
    host_map: Annotated[Optional[Path], typer.Argument(help="host-map.json written by the operator.")] = None,
    output: Annotated[Path, typer.Option("-o", "--output", help="Where to write the resolved config.")] = Path("local.json"),
    topology: Annotated[Optional[str], typer.Option(help="Topology name (default: the host map's, else four_four_plus_one).")] = None,
    check: Annotated[bool, typer.Option("--check", help="Report drift against an existing local.json; write nothing.")] = False,
    local: Annotated[bool, typer.Option("--local", help="The embedded default: every host is this machine.")] = False,
    workdir: Annotated[Path, typer.Option(help="Work dir for --local (stores, logs, Prefect home).")] = Path(".h3flow"),
    base_port: Annotated[int, typer.Option(help="First port tried for --local services.")] = 14200,
    engine: Annotated[
        Optional[str], typer.Option(help="--local: run the stages in-process (local) or in one local ComfyUI per pool (comfy).")
    ] = None,
) -> None:
    """Step 2: validate host-map.json and resolve it into local.json."""
    from h3flow.config_cli import run_config_adapt

    run_config_adapt(host_map, output, topology, check, local, workdir, base_port, engine)


# --------------------------------------------------------------------------- plan
@app.command()
@operator_command
def plan(
    spec: Annotated[Optional[str], typer.Option(help="Plan --clips clips of this spec: sd | hd (default sd).")] = None,
    batch: Annotated[Optional[Path], typer.Option(help="Plan the clips of this batch file instead.")] = None,
    clips: Annotated[Optional[int], typer.Option(help="How many clips of --spec (default 6, the design's).")] = None,
    topology: Annotated[
        str, typer.Option(help="A topology (four_four_plus_one, 4+2+2+xtx), 'all' named ones, or 'search' every partition.")
    ] = "all",
    profile: Annotated[Optional[Path], typer.Option(help="Stage-time profile TOML (default: the shipped one).")] = None,
    threshold: Annotated[float, typer.Option(help="Extra hardware must add at least this share of clips/h.")] = 0.15,
    gantt: Annotated[Optional[Path], typer.Option(help="Write the recommended topology's Gantt chart here (PNG).")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the plan as JSON.")] = False,
    host_map: Annotated[Optional[Path], typer.Option("--host-map", help="The hardware, as a host-map.json.")] = None,
    config: Annotated[Optional[Path], typer.Option(help="The hardware, as a local.json (default: ./local.json).")] = None,
    policy: Annotated[str, typer.Option(help="best | earliest-finish | design (the design's round-robin).")] = "best",
) -> None:
    """Step 3: simulate topologies offline and recommend one (Gantt chart, lower bound)."""
    from h3flow.planner.command import run_plan

    run_plan(
        spec=spec, batch=batch, clips=clips, topology=topology, profile=profile, threshold=threshold,
        gantt=gantt, as_json=json_out, host_map=host_map, config=config, policy=policy,
    )


# --------------------------------------------------------------------------- latents
@latent_app.command("inspect")
@operator_command
def latent_inspect(
    file: Annotated[Path, typer.Argument(help="An .h3latent (or a ComfyUI .latent).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Shapes, dtype, metadata and SHA-256 of a latent file."""
    from h3flow.handoff.commands import inspect_latent

    inspect_latent(file, as_json)


@latent_app.command("verify")
@operator_command
def latent_verify(
    file: Annotated[Path, typer.Argument(help="An .h3latent (or a ComfyUI .latent).")],
    sha256: Annotated[Optional[str], typer.Option(help="The SHA-256 the file must have.")] = None,
) -> None:
    """Check a latent file's structure and (optionally) its SHA-256."""
    from h3flow.handoff.commands import verify_latent

    verify_latent(file, sha256)


@app.command()
@operator_command
def transfer(
    file: Annotated[Path, typer.Argument(help="The latent file to send.")],
    to: Annotated[str, typer.Option("--to", help="Destination host name.")],
    method: Annotated[str, typer.Option(help="tcp | sftp | local.")] = "tcp",
    address: Annotated[Optional[str], typer.Option(help="tcp: the receiver's address (default: the host name).")] = None,
    port: Annotated[Optional[int], typer.Option(help="tcp: the receiver's port.")] = None,
    store_root: Annotated[Optional[Path], typer.Option(help="The store root on the destination host.")] = None,
    ssh_alias: Annotated[Optional[str], typer.Option(help="sftp: SSH config alias (default: the host name).")] = None,
    ssh_config: Annotated[Optional[Path], typer.Option(help="sftp: SSH config file (default: ~/.ssh/config).")] = None,
    secret_env: Annotated[Optional[str], typer.Option(help="tcp: env variable holding the shared secret.")] = None,
    secret_file: Annotated[Optional[Path], typer.Option(help="tcp: file holding the shared secret.")] = None,
    attempts: Annotated[int, typer.Option(min=1, help="Tries for retryable failures.")] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds without progress before giving up.")] = 60.0,
) -> None:
    """Send a latent to another host's store, verified by SHA-256 (tcp | sftp | local)."""
    from h3flow.handoff.commands import transfer_file

    transfer_file(file, to, method=method, address=address, port=port, store_root=store_root,
                  ssh_alias=ssh_alias, ssh_config=ssh_config, secret_env=secret_env, secret_file=secret_file,
                  attempts=attempts, timeout=timeout)


@app.command()
@operator_command
def receiver(
    store: Annotated[Path, typer.Option(help="This host's store root.")],
    bind: Annotated[str, typer.Option(help="ADDR:PORT to listen on (port 0: any free port, printed).")],
    secret_env: Annotated[Optional[str], typer.Option(help="Env variable holding the shared secret.")] = None,
    secret_file: Annotated[Optional[Path], typer.Option(help="File holding the shared secret.")] = None,
    max_bytes: Annotated[int, typer.Option(min=1, help="Largest latent accepted.")] = 1 << 30,
    min_free: Annotated[int, typer.Option(min=0, help="Bytes to keep free on the store's disk.")] = 16 << 20,
) -> None:
    """Run the latent receiver service (tcp transfer) on a decoder host."""
    from h3flow.handoff.commands import run_receiver

    run_receiver(store, bind, secret_env, secret_file, max_bytes, min_free)


@store_app.command("verify")
@operator_command
def store_verify(
    store: Annotated[Path, typer.Option(help="The store root.")],
    quarantine: Annotated[bool, typer.Option(help="Move damaged objects aside so they can be sent again.")] = False,
) -> None:
    """Rehash every object in a store and report damage."""
    from h3flow.handoff.commands import verify_store

    verify_store(store, quarantine)


@store_app.command("gc")
@operator_command
def store_gc(
    store: Annotated[Path, typer.Option(help="The store root.")],
    keep: Annotated[Optional[list[str]], typer.Option(help="A referenced SHA-256 (repeatable).")] = None,
    keep_from: Annotated[Optional[list[Path]], typer.Option(help="A file whose SHA-256s are referenced, "
                                                                 "e.g. a run manifest (repeatable).")] = None,
    dry_run: Annotated[bool, typer.Option(help="Only list what would be removed.")] = False,
) -> None:
    """Remove store objects that no run references."""
    from h3flow.handoff.commands import gc_store

    gc_store(store, keep or [], keep_from or [], dry_run)


# --------------------------------------------------------------------------- pipeline
ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="local.json from config-adapt.")]


@app.command()
@operator_command
def deploy(
    config: ConfigOpt = Path("local.json"),
    yaml_only: Annotated[Optional[Path], typer.Option("--yaml-only", help="Only write prefect.yaml here; contact no server.")] = None,
    source_dir: Annotated[Optional[Path], typer.Option(help="Where h3flow's source lives on the workers' hosts.")] = None,
) -> None:
    """Create work pools, deployments, blocks and prefect.yaml from local.json."""
    from h3flow.runs_cli import console, deploy as do_deploy

    if yaml_only is not None:
        from h3flow.config import load_local_config
        from h3flow.deployments import SOURCE_DIR, write_prefect_yaml

        write_prefect_yaml(load_local_config(config), config, yaml_only, source_dir or SOURCE_DIR)
        console.print(f"[green]✓[/] wrote {yaml_only}")
        return
    for name in do_deploy(config):
        console.print(f"[green]✓[/] deployment {name}")


@app.command()
@operator_command
def run(
    batch: Annotated[Path, typer.Argument(help="Batch file (JSON): clips with prompt, image, spec, seed.")],
    background: Annotated[bool, typer.Option("--background", help="Print the run id and return at once.")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Step 6: submit a batch; prints the run id (then waits, unless --background)."""
    from h3flow.runs_cli import finish, start_run, wait as do_wait

    manifest = start_run(batch, config)
    typer.echo(manifest.run_id)
    if not background:
        raise typer.Exit(finish(do_wait(manifest.run_id, config)))


@app.command()
@operator_command
def wait(
    run_id: str,
    config: ConfigOpt = Path("local.json"),
    timeout: Annotated[Optional[float], typer.Option(help="Give up after this many seconds.")] = None,
) -> None:
    """Step 7: a progress bar until the run ends; exit 0 when every clip is delivered, 1 if some failed."""
    from h3flow.runs_cli import finish, wait as do_wait

    raise typer.Exit(finish(do_wait(run_id, config, timeout)))


@app.command()
@operator_command
def status(
    run_id: Annotated[Optional[str], typer.Argument(help="A run id (omit with --services).")] = None,
    services: Annotated[bool, typer.Option("--services", help="What runs on each host instead.")] = False,
    as_json: Annotated[bool, typer.Option("--json")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """A table of a run's clips x stages (--services: the services on each host)."""
    if services:
        from h3flow.ops.lifecycle import print_service_status

        print_service_status(config)
        return
    if run_id is None:
        raise H3FlowError("give a run id, or --services")
    from h3flow.runs_cli import as_json as dump, load_run, print_status

    manifest = load_run(run_id, config)
    if as_json:
        import json

        typer.echo(json.dumps(dump(manifest), indent=2))
    else:
        print_status(manifest)


@app.command()
@operator_command
def resume(
    run_id: str,
    background: Annotated[bool, typer.Option("--background")] = False,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Step 8: verify what exists and redo only the missing sampling / decoding."""
    from h3flow.runs_cli import finish, resume as do_resume, wait as do_wait

    manifest = do_resume(run_id, config)
    if manifest.state == "completed" or background:
        raise typer.Exit(0)
    raise typer.Exit(finish(do_wait(run_id, config)))


@app.command()
@operator_command
def calibrate(
    run_ids: Annotated[list[str], typer.Argument(help="Finished runs to learn stage times from.")],
    output: Annotated[Path, typer.Option("-o", "--output", help="The calibrated profile (TOML).")] = Path("profile.toml"),
    base: Annotated[Optional[Path], typer.Option(help="Profile to start from (default: the shipped one).")] = None,
    config: ConfigOpt = Path("local.json"),
) -> None:
    """Fit the planner's profile from the measured stage durations of runs (`plan --profile` reads it)."""
    from h3flow.calibrate import run_calibrate
    from h3flow.runs_cli import console

    for note in run_calibrate(run_ids, config, output, base):
        console.print(f"  {note}")
    console.print(f"[green]✓[/] wrote {output}")


@app.command()
@operator_command
def demo(
    keep: Annotated[bool, typer.Option("--keep", help="Leave the services running afterwards.")] = False,
    workdir: Annotated[
        Optional[Path], typer.Option(help="Where the stores, logs, runs and Prefect's database go (.h3flow, or .h3flow-comfy).")
    ] = None,
    base_port: Annotated[int, typer.Option(help="First port tried for the local services.")] = 14200,
    batch: Annotated[Optional[Path], typer.Option(help="Another batch file instead of the example.")] = None,
    engine: Annotated[str, typer.Option(help="local: stages in-process; comfy: in one local ComfyUI per pool.")] = "local",
) -> None:
    """The embedded default end to end: local Prefect server, 6 clips, reference model, real MP4s."""
    from h3flow.demo import DEMO_BATCH, default_workdir, run_demo

    raise typer.Exit(run_demo(workdir or default_workdir(engine), keep, base_port, batch or DEMO_BATCH, engine=engine))


# --------------------------------------------------------------------------- ComfyUI
@nodes_app.command("install")
@operator_command
def nodes_install(
    comfy_dir: Annotated[Optional[Path], typer.Option("--comfy-dir", help="A ComfyUI folder (or --base-directory); with --host, a path on that host.")] = None,
    host: Annotated[Optional[str], typer.Option("--host", help="A host of local.json (over SSH; its comfy_dir unless --comfy-dir).")] = None,
    link: Annotated[bool, typer.Option("--link", help="Symlink the pack instead of copying it (development).")] = False,
    config: Annotated[Path, typer.Option("--config", "-c", help="local.json (with --host).")] = Path("local.json"),
) -> None:
    """Install the h3flow node pack into a ComfyUI's custom_nodes (idempotent)."""
    if host is not None:
        if link:
            raise H3FlowError("--link makes a symlink to this checkout: it cannot reach another host; drop it with --host")
        from h3flow.ops.ssh import install_nodes_on_host

        status, target = install_nodes_on_host(config, host, str(comfy_dir) if comfy_dir else None)
        typer.echo(f"h3flow_nodes: {status} in {target} on {host}")
        return
    if comfy_dir is None:
        raise H3FlowError("give --comfy-dir DIR (or --host NAME)")
    from h3flow.comfy_env import PACK_NAME, install_node_pack

    status = install_node_pack(comfy_dir, link=link)
    typer.echo(f"{PACK_NAME}: {status} in {Path(comfy_dir) / 'custom_nodes' / PACK_NAME}")


# --------------------------------------------------------------------------- remote ops
@app.command()
@operator_command
def preflight(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    config: Annotated[Path, typer.Option("--config", "-c", help="The resolved config (local.json).")] = Path("local.json"),
) -> None:
    """Step 4: check every host and service before work starts (exit 1 on any ✗)."""
    from h3flow.ops.preflight import run_preflight

    raise typer.Exit(run_preflight(config, as_json))


@app.command("start")
@operator_command
def start(
    local: Annotated[bool, typer.Option("--local", help="The embedded default: every service on this machine.")] = False,
    config: Annotated[Path, typer.Option("--config", help="The resolved config (local.json).")] = Path("local.json"),
) -> None:
    """Step 5: start the server, ComfyUI, workers and receivers on every host, over SSH (--local: this machine)."""
    from h3flow.ops.lifecycle import run_start

    run_start(config, local)


@app.command("stop")
@operator_command
def stop(
    local: Annotated[bool, typer.Option("--local", help="The embedded default: every service on this machine.")] = False,
    config: Annotated[Path, typer.Option("--config", help="The resolved config (local.json).")] = Path("local.json"),
) -> None:
    """Stop what `start` started, by PID."""
    from h3flow.ops.lifecycle import run_stop

    run_stop(config, local)


ComfyDirOption = Annotated[Optional[Path], typer.Option(help="ComfyUI checkout (gets comfy-turing-lerp.patch).")]
RaylightDirOption = Annotated[
    Optional[Path], typer.Option(help="Raylight repository root (gets raylight-sm75-ulysses.patch).")
]
PatchHostOption = Annotated[
    Optional[str], typer.Option("--host", help="Do it on this host of local.json over SSH (dirs: paths there; default its comfy_dir / raylight_dir).")
]
PatchConfigOption = Annotated[Path, typer.Option("--config", "-c", help="local.json (with --host).")]


def _patch_reports(
    action: str, comfy_dir: Optional[Path], raylight_dir: Optional[Path], host: Optional[str], config: Path
) -> list:
    from h3flow.ops import patches

    if host is not None:
        return patches.run_on_host(host, action, comfy_dir, raylight_dir, config)
    run = patches.check_trees if action == "check" else patches.apply_trees
    return run(comfy_dir, raylight_dir)


@patches_app.command("check")
@operator_command
def patches_check(
    comfy_dir: ComfyDirOption = None,
    raylight_dir: RaylightDirOption = None,
    host: PatchHostOption = None,
    config: PatchConfigOption = Path("local.json"),
) -> None:
    """Report whether the patches are applied (reverse-check). Exit 0: all applied; 1: some not yet."""
    from h3flow.ops.patches import State

    reports = _patch_reports("check", comfy_dir, raylight_dir, host, config)
    for report in reports:
        if report.state is not State.CONFLICT:
            typer.echo(report.line())
    conflicts = [r for r in reports if r.state is State.CONFLICT]
    if conflicts:
        raise H3FlowError("; ".join(r.line() for r in conflicts))
    if any(r.state is State.NOT_APPLIED for r in reports):
        raise typer.Exit(1)


@patches_app.command("apply")
@operator_command
def patches_apply(
    comfy_dir: ComfyDirOption = None,
    raylight_dir: RaylightDirOption = None,
    host: PatchHostOption = None,
    config: PatchConfigOption = Path("local.json"),
) -> None:
    """Step 1: apply the patches (dry-runs all first; applied ones are left alone)."""
    for report in _patch_reports("apply", comfy_dir, raylight_dir, host, config):
        how = "applied now" if report.changed else "already applied, left alone"
        typer.echo(f"{report.patch} {how} in {report.tree}")


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
