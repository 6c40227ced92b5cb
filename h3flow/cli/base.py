"""What every command shares: the Typer apps, the error wrapper, the config lookup, output.

Each command is a thin wrapper that imports its implementation lazily (so ``--help``
stays fast) and turns :class:`~h3flow.core.errors.H3FlowError` into a one-line message
with exit code 2. Commands that read local.json find it with :func:`config_file`; tables
come from :func:`fold_table`, so no id, state or path is ever cut short.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
from collections.abc import Callable, Iterable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar, cast

import typer
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from h3flow.core.errors import ConfigError, H3FlowError

if TYPE_CHECKING:
    from h3flow.config.models import DatabaseKind, EngineName

F = TypeVar("F", bound=Callable[..., Any])

# The help lists commands in the operator's order: the panels below, each command in the
# order its module registers it (cli/__init__.py imports the modules in this order).
TRY_IT = "Try it"
SET_UP = "Set up (steps 1-3)"
BRING_UP = "Bring up the services (steps 4-5)"
RUN = "Run batches (steps 6-8)"
LATENTS = "Latents and stores"


def _no_type_for_flags() -> None:
    """Show no ``<bool>`` after a flag in the rich help.

    Typer 0.2x vendors click and prints each option's type in its rich help panel, flags
    included (``--json <bool>``): ``rich_utils._print_options_panel`` calls
    ``display_type_rich`` for every option, while the plain formatter
    (``TyperOption.get_help_record``) skips flags and counters. A flag takes no value, so
    it gets no type here either; a typer that already skips them is unaffected.
    """
    from typer.core import TyperOption

    shown = TyperOption.display_type_rich
    if getattr(shown, "_h3flow", False):
        return

    def display_type_rich(self: TyperOption, ctx: Any) -> str | None:
        return None if self.is_flag or self.count else shown(self, ctx)

    display_type_rich._h3flow = True  # type: ignore[attr-defined]
    TyperOption.display_type_rich = display_type_rich  # type: ignore[method-assign]


_no_type_for_flags()

app = typer.Typer(
    name="h3flow",
    help="Run MiniMax H3 image-to-video over a home-lab GPU cluster, orchestrated by Prefect.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
latent_app = typer.Typer(help="Inspect and verify .h3latent files.", no_args_is_help=True)
patches_app = typer.Typer(
    help="Step 1: check / apply the Turing patches to ComfyUI and Raylight.", no_args_is_help=True
)
nodes_app = typer.Typer(help="Step 1: install the h3flow ComfyUI node pack.", no_args_is_help=True)
store_app = typer.Typer(help="The content-addressed latent store.", no_args_is_help=True)


def h3flow_version() -> str:
    try:
        return version("h3flow")
    except PackageNotFoundError:  # running from a checkout that was never installed
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"h3flow {h3flow_version()}")
        raise typer.Exit(0)


@app.callback()
def main(
    show_version: Annotated[
        Optional[bool],
        typer.Option("--version", callback=_print_version, is_eager=True, help="Print h3flow's version and exit."),
    ] = None,
) -> None:
    """Run MiniMax H3 image-to-video over a home-lab GPU cluster, orchestrated by Prefect."""


err_console = Console(stderr=True, highlight=False)
console = Console(highlight=False)


def print_error(message: str, details: Iterable[str] = ()) -> None:
    """``error: message`` and one indented line per detail, printed verbatim (never as
    rich markup: a message may hold ``[a-z]`` or other brackets)."""
    err_console.print(Text.assemble(("error:", "bold red"), " ", message), soft_wrap=True)
    for line in details:
        err_console.print(Text(f"  {line}"), soft_wrap=True)


def operator_command(func: F) -> F:
    """Print an H3FlowError as one line (plus its details) on stderr and exit with its code; no traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except H3FlowError as exc:
            print_error(str(exc), exc.details)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            print_error("interrupted")
            raise typer.Exit(130) from None

    return wrapper  # type: ignore[return-value]


# --------------------------------------------------------------------------- the config
CONFIG_ENV = "H3FLOW_CONFIG"
CONFIG_FILES = (Path("local.json"), Path(".h3flow") / "local.json")  # ./local.json, then the demo's
CONFIG_HELP = f"local.json from config-adapt (default: ${CONFIG_ENV}, else ./local.json, else ./.h3flow/local.json)."

ConfigOpt = Annotated[Optional[Path], typer.Option("--config", "-c", help=CONFIG_HELP, show_default=False)]


def local_choices(engine: str | None, database: str | None) -> tuple[EngineName | None, DatabaseKind | None]:
    """The embedded default's --engine and --database, checked: an unknown one is one line naming the choices."""
    from h3flow.config.models import DATABASES, ENGINES

    for flag, value, choices in (("engine", engine, ENGINES), ("database", database, DATABASES)):
        if value is not None and value not in choices:
            raise ConfigError(f"--{flag} {value!r}: choose one of {', '.join(choices)}")
    return cast("EngineName | None", engine), cast("DatabaseKind | None", database)


def find_config(given: Path | None) -> Path | None:
    """The config a command reads: ``--config``, else ``$H3FLOW_CONFIG``, else the first of
    ./local.json and ./.h3flow/local.json (what `make demo` writes) that exists; None if none."""
    if given is not None:
        return given
    from h3flow.config.settings import settings

    from_env = settings().config
    if from_env is not None:
        return from_env
    return next((path for path in CONFIG_FILES if path.is_file()), None)


def config_file(given: Path | None) -> Path:
    """:func:`find_config`, or a ConfigError that names every place it looked."""
    path = find_config(given)
    if path is None:
        raise ConfigError(
            f"no config found: tried --config (not given), ${CONFIG_ENV} (unset), "
            f"{', '.join(f'./{p}' for p in CONFIG_FILES)}; write one with `h3flow config-adapt` (or run `h3flow demo`)"
        )
    if not path.is_file():
        where = f"{path}" if given is not None else f"${CONFIG_ENV}={path}"
        what = "is a directory, not a local.json" if path.is_dir() else "no such file"
        raise ConfigError(f"{where}: {what} (run `h3flow config-adapt` first)")
    return path


# --------------------------------------------------------------------------- commands to print
def invocation() -> str:
    """How to type h3flow so that a command h3flow prints works as printed: ``h3flow`` when
    that name on PATH is this h3flow, else the path it was called by — relative to here
    when it is under here (``.venv/bin/h3flow`` after ``make demo``), else absolute."""
    import shutil

    called = _called_as()
    on_path = shutil.which("h3flow")
    with contextlib.suppress(OSError):
        if on_path and Path(on_path).samefile(called):
            return "h3flow"
    return shell_path(called)


def _called_as() -> Path:
    import sys

    called = Path(sys.argv[0])
    return called if called.name == "h3flow" else Path(sys.prefix) / "bin" / "h3flow"  # or python -m h3flow.cli


def shell_path(path: Path) -> str:
    """``path`` as a shell word: relative to the working directory when under it, quoted if need be."""
    import shlex

    absolute = Path(os.path.abspath(path))  # keeps symlinks: a linked .venv stays .venv
    try:
        shown = str(absolute.relative_to(Path.cwd()))
    except ValueError:
        shown = str(absolute)
    return shlex.quote(shown)


def config_flag(config_path: Path) -> str:
    """`` -c PATH`` when a command typed here would not find ``config_path`` by itself, else ""."""
    found = find_config(None)
    with contextlib.suppress(OSError):
        if found is not None and found.samefile(config_path):
            return ""
    return f" -c {shell_path(config_path)}"


def activate_hint() -> str | None:
    """How to put h3flow on PATH, when it is not (the venv's ``activate`` beside it)."""
    if invocation() == "h3flow":
        return None
    activate = _called_as().parent / "activate"
    return f"`source {shell_path(activate)}` puts h3flow on your PATH" if activate.is_file() else None


# --------------------------------------------------------------------------- output
def fold_table(*columns: str, title: str | None = None, right: Iterable[str] = ()) -> Table:
    """A table that never cuts a cell: long ids and paths fold onto the next line (rich's
    default ends them in "…", which made two clips look the same at 80 columns)."""
    table = Table(title=title, title_justify="left", header_style="bold", box=box.MINIMAL_HEAVY_HEAD, pad_edge=False)
    align_right = set(right)
    for column in columns:
        table.add_column(column, overflow="fold", justify="right" if column in align_right else "left")
    return table


def print_table(table: Table, short: Iterable[str] = ()) -> None:
    """Print ``table``; the ``short`` columns (states, times, counts) keep their width and
    the long ones fold; when something folds, a line between rows says where each ends."""
    keep = set(short)
    for column in table.columns:
        if column.header in keep:
            texts = [column.header, *column.cells]
            column.min_width = max(Text.from_markup(t).cell_len if isinstance(t, str) else t.cell_len for t in texts)  # type: ignore[union-attr]
    natural = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    table.show_lines = natural > console.width
    console.print(table)


def print_json(data: Any) -> None:
    """``--json``: indented, to stdout, never wrapped or styled."""
    typer.echo(json.dumps(data, indent=2, default=str))
