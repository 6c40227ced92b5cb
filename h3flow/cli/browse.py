"""``h3flow open RUN_ID [CLIP]``: the run's page in the Prefect UI, printed and (with a
display) opened in the browser.

Why a command: the UI's address of a run is a flow-run UUID nobody types, and after
``make demo`` a newcomer's next wish is to see the run there.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from h3flow.cli.base import RUN, ConfigOpt, app, config_file, config_flag, invocation, operator_command
from h3flow.core.errors import H3FlowError


def server_answers(api_url: str) -> bool:
    from h3flow.ops.services import HttpHealth, check_health

    return check_health(HttpHealth(api_url.rstrip("/") + "/health"))[0]


def run_pages(run_id: str, clip: str | None, config_path: Path) -> list[str]:
    """The UI pages of the run's latest batch flow run, or of the clip's flow runs (oldest first)."""
    from h3flow.cli.runs import read_run
    from h3flow.config.models import load_local_config
    from h3flow.pipeline.runs import run_flow_runs

    config = load_local_config(config_path)
    manifest = read_run(run_id, config_path)
    if clip is not None and clip not in manifest.clips:
        raise H3FlowError(f"run {run_id} has no clip {clip!r} (clips: {', '.join(manifest.clips)})")
    if not server_answers(config.prefect.api_url):
        how = "start --local" if config.work_dir else "start"
        raise H3FlowError(
            f"the Prefect server at {config.prefect.api_url} does not answer: "
            f"start the services with `{invocation()} {how}{config_flag(config_path)}`"
        )
    found = run_flow_runs(config, manifest)
    if clip is None:  # the batch run (the latest, after a resume), not the pool runners it started
        order = {flow_run: i for i, flow_run in enumerate(manifest.flow_run_ids)}
        runs = sorted((r for r in found if r.id in order), key=lambda r: order[r.id])[-1:]
    else:
        runs = [r for r in found if r.clip == clip]
    if not runs:
        what = f"clip {clip} of run {run_id}" if clip else f"run {run_id}"
        raise H3FlowError(f"{what} has no flow run in Prefect at {config.prefect.api_url} (not submitted yet?)")
    return [r.link for r in runs]


def can_show_a_browser() -> bool:
    """A graphical browser can open: macOS, or a display, and a terminal to come back to
    (never a text browser taking over the terminal, never from a script or a log)."""
    graphical = sys.platform == "darwin" or bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
    return graphical and sys.stdout.isatty()


@app.command("open", rich_help_panel=RUN)
@operator_command
def open_run(
    run_id: Annotated[str, typer.Argument(help="The run id.")],
    clip: Annotated[Optional[str], typer.Argument(help="A clip id: its flow runs' pages instead.")] = None,
    browser: Annotated[
        bool, typer.Option("--browser/--no-browser", help="Open the page in a browser when there is a display.")
    ] = True,
    config: ConfigOpt = None,
) -> None:
    """Print the run's page in the Prefect UI (or a clip's), and open it when there is a display."""
    pages = run_pages(run_id, clip, config_file(config))
    for page in pages:
        typer.echo(page)
    if browser and can_show_a_browser():
        import webbrowser

        if webbrowser.open(pages[-1], new=2):
            typer.echo("(opened in your browser)", err=True)
