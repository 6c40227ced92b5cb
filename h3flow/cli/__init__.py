"""The operator's command line, ``h3flow COMMAND``: one module per command group.

:mod:`.base` holds what they share; importing this package registers every group on
:data:`app` (the console entry point).
"""

import contextlib
import os
from pathlib import Path

from h3flow.config.settings import prefect_client_home

# before anything imports Prefect (which makes its home folder at import, one level only:
# a fresh machine without ~/.cache/h3flow got a UserWarning on every command): not ~/.prefect
os.environ.setdefault("PREFECT_HOME", str(prefect_client_home()))
with contextlib.suppress(OSError):
    Path(os.environ["PREFECT_HOME"]).mkdir(parents=True, exist_ok=True)
# h3flow's services never report to Prefect's telemetry (services.py): nor does its command
# line, whose first Prefect import in a terminal otherwise printed Prefect's notice on `status`
os.environ.setdefault("DO_NOT_TRACK", "1")

# the import order is the order of the help's panels and commands (see cli/base.py)
from h3flow.cli import demo, config, plan, ops, runs, browse, latent  # noqa: F401, I001 - registers the commands
from h3flow.cli.base import app

__all__ = ["app"]
