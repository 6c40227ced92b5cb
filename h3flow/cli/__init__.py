"""The operator's command line, ``h3flow COMMAND``: one module per command group.

:mod:`.base` holds what they share; importing this package registers every group on
:data:`app` (the console entry point).
"""

import os

from h3flow.config.settings import prefect_client_home

# before anything imports Prefect (which makes its home folder at import): not ~/.prefect
os.environ.setdefault("PREFECT_HOME", str(prefect_client_home()))

# the import order is the order of the help's panels and commands (see cli/base.py)
from h3flow.cli import demo, config, plan, ops, runs, latent  # noqa: F401, I001 - registers the commands
from h3flow.cli.base import app

__all__ = ["app"]
