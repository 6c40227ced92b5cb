"""Commands that act on the hosts: preflight, start / stop, the node pack, the patches."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from h3flow.cli.base import (
    BRING_UP,
    SET_UP,
    ConfigOpt,
    app,
    config_file,
    nodes_app,
    operator_command,
    patches_app,
)
from h3flow.core.errors import H3FlowError

app.add_typer(patches_app, name="patches", rich_help_panel=SET_UP)
app.add_typer(nodes_app, name="nodes", rich_help_panel=SET_UP)


@nodes_app.command("install")
@operator_command
def nodes_install(
    comfy_dir: Annotated[
        Optional[Path],
        typer.Option("--comfy-dir", help="A ComfyUI folder (or --base-directory); with --host, a path on that host."),
    ] = None,
    host: Annotated[
        Optional[str], typer.Option("--host", help="A host of local.json (over SSH; its comfy_dir unless --comfy-dir).")
    ] = None,
    link: Annotated[bool, typer.Option("--link", help="Symlink the pack instead of copying it (development).")] = False,
    config: ConfigOpt = None,
) -> None:
    """Install the h3flow node pack into a ComfyUI's custom_nodes (idempotent)."""
    if host is not None:
        if link:
            raise H3FlowError(
                "--link makes a symlink to this checkout: it cannot reach another host; drop it with --host"
            )
        from h3flow.ops.remote import install_nodes_on_host

        status, target = install_nodes_on_host(config_file(config), host, str(comfy_dir) if comfy_dir else None)
        typer.echo(f"h3flow_nodes: {status} in {target} on {host}")
        return
    if comfy_dir is None:
        raise H3FlowError("give --comfy-dir DIR (or --host NAME)")
    from h3flow.ops.comfy_install import PACK_NAME, install_node_pack

    status = install_node_pack(comfy_dir, link=link)
    typer.echo(f"{PACK_NAME}: {status} in {Path(comfy_dir) / 'custom_nodes' / PACK_NAME}")


@app.command(rich_help_panel=BRING_UP)
@operator_command
def preflight(
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
    config: ConfigOpt = None,
) -> None:
    """Step 4: check every host and service before work starts (exit 1 on any ✗)."""
    from h3flow.ops.preflight import run_preflight

    raise typer.Exit(run_preflight(config_file(config), as_json))


@app.command("start", rich_help_panel=BRING_UP)
@operator_command
def start(
    local: Annotated[
        bool, typer.Option("--local", help="The embedded default: every service on this machine.")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Step 5: start the server, ComfyUI, workers and receivers on every host, over SSH (--local: this machine)."""
    from h3flow.ops.lifecycle import run_start

    run_start(config_file(config), local)


@app.command("stop", rich_help_panel=BRING_UP)
@operator_command
def stop(
    local: Annotated[
        bool, typer.Option("--local", help="The embedded default: every service on this machine.")
    ] = False,
    config: ConfigOpt = None,
) -> None:
    """Stop what `start` started, by PID."""
    from h3flow.ops.lifecycle import run_stop

    run_stop(config_file(config), local)


ComfyDirOption = Annotated[Optional[Path], typer.Option(help="ComfyUI checkout (gets comfy-turing-lerp.patch).")]
RaylightDirOption = Annotated[
    Optional[Path], typer.Option(help="Raylight repository root (gets raylight-sm75-ulysses.patch).")
]
PatchHostOption = Annotated[
    Optional[str],
    typer.Option(
        "--host",
        help="Do it on this host of local.json over SSH (dirs: paths there; default its comfy_dir / raylight_dir).",
    ),
]


def _patch_reports(
    action: str, comfy_dir: Optional[Path], raylight_dir: Optional[Path], host: Optional[str], config: Optional[Path]
) -> list:
    from h3flow.ops import patches

    if host is not None:
        from h3flow.ops.remote import patches_on_host

        return patches_on_host(host, action, comfy_dir, raylight_dir, config_file(config))
    run = patches.check_trees if action == "check" else patches.apply_trees
    return run(comfy_dir, raylight_dir)


@patches_app.command("check")
@operator_command
def patches_check(
    comfy_dir: ComfyDirOption = None,
    raylight_dir: RaylightDirOption = None,
    host: PatchHostOption = None,
    config: ConfigOpt = None,
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
    config: ConfigOpt = None,
) -> None:
    """Step 1: apply the patches (dry-runs all first; applied ones are left alone)."""
    for report in _patch_reports("apply", comfy_dir, raylight_dir, host, config):
        how = "applied now" if report.changed else "already applied, left alone"
        typer.echo(f"{report.patch} {how} in {report.tree}")
