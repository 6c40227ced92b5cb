"""The operator's command line: ``h3flow COMMAND``.

Each command is a thin wrapper that imports its implementation lazily (so ``--help``
stays fast) and turns :class:`~h3flow.errors.H3FlowError` into a one-line message
with exit code 2. Commands that are not built yet say which issue brings them.
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


def not_built(issue: int) -> None:
    raise H3FlowError(f"not built yet: this command arrives with issue {issue}")


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
) -> None:
    """Step 2: validate host-map.json and resolve it into local.json."""
    from h3flow.config_cli import run_config_adapt

    run_config_adapt(host_map, output, topology, check, local, workdir, base_port)


# --------------------------------------------------------------------------- plan (issue 3)
@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@operator_command
def plan() -> None:
    """Step 3: simulate topologies offline and recommend one (Gantt chart, lower bound)."""
    not_built(3)


# --------------------------------------------------------------------------- latents (issue 4)
@latent_app.command("inspect")
@operator_command
def latent_inspect(file: Path) -> None:
    """Shapes, dtype, metadata and SHA-256 of a latent file."""
    not_built(4)


@latent_app.command("verify")
@operator_command
def latent_verify(file: Path, sha256: Annotated[Optional[str], typer.Option()] = None) -> None:
    """Check a latent file's structure and (optionally) its SHA-256."""
    not_built(4)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@operator_command
def transfer() -> None:
    """Send a latent to another host's store, verified by SHA-256 (tcp | sftp | local)."""
    not_built(4)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@operator_command
def receiver() -> None:
    """Run the latent receiver service (tcp transfer) on a decoder host."""
    not_built(4)


@store_app.command("verify", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@operator_command
def store_verify() -> None:
    """Rehash every object in a store and report damage."""
    not_built(4)


@store_app.command("gc", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
@operator_command
def store_gc() -> None:
    """Remove store objects that no run references."""
    not_built(4)


# --------------------------------------------------------------------------- pipeline (issue 6)
def _stub(name: str, issue: int, doc: str, parent: typer.Typer = app) -> None:
    def command() -> None:
        not_built(issue)

    command.__doc__ = doc
    parent.command(name, context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(
        operator_command(command)
    )


_stub("deploy", 6, "Create work pools, deployments and prefect.yaml from local.json.")
_stub("run", 6, "Step 6: submit a batch (--background returns the run id at once).")
_stub("wait", 6, "Step 7: follow a run with a progress bar until its videos are out.")
_stub("status", 6, "A table of a run's clips x stages (--services: what runs on each host).")
_stub("resume", 6, "Step 8: redo only the missing sampling / decoding of an interrupted run.")
_stub("calibrate", 6, "Fit the planner's profile from the measured stage durations of runs.")
_stub("demo", 6, "The embedded default end to end: local server, 6 SD clips, real MP4s.")
# --------------------------------------------------------------------------- ComfyUI (issue 7)
_stub("install", 7, "Install the h3flow node pack into a ComfyUI (--comfy-dir or --host).", nodes_app)
# --------------------------------------------------------------------------- remote ops (issue 8)
_stub("preflight", 8, "Step 4: check every host and service before work starts.")
_stub("start", 8, "Step 5: start ComfyUI, workers and the receiver on every host (--local: this machine).")
_stub("stop", 8, "Stop what `start` started, by PID.")
_stub("check", 8, "Report whether the patches are applied (reverse-check).", patches_app)
_stub("apply", 8, "Step 1: apply the patches (checks first; applied ones are left alone).", patches_app)


def main() -> None:  # pragma: no cover - console entry point alias
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(app())
