"""The operator's command line, ``h3flow COMMAND``: one module per command group.

:mod:`.base` holds what they share; importing this package registers every group on
:data:`app` (the console entry point).
"""

import os

from h3flow.config.settings import prefect_client_home

# before anything imports Prefect (which makes its home folder at import): not ~/.prefect
os.environ.setdefault("PREFECT_HOME", str(prefect_client_home()))

from h3flow.cli import config, demo, latent, ops, plan, runs  # noqa: F401 - registers the commands
from h3flow.cli.base import app

__all__ = ["app"]
