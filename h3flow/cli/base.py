"""What every command shares: the Typer apps, the error wrapper, the config option.

Each command is a thin wrapper that imports its implementation lazily (so ``--help``
stays fast) and turns :class:`~h3flow.core.errors.H3FlowError` into a one-line message
with exit code 2.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console

from h3flow.core.errors import H3FlowError

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


ConfigOpt = Annotated[Path, typer.Option("--config", "-c", help="local.json from config-adapt.")]
console = Console(highlight=False)
