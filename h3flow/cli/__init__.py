"""The operator's command line, ``h3flow COMMAND``: one module per command group.

:mod:`.base` holds what they share; importing this package registers every group on
:data:`app` (the console entry point).
"""

from h3flow.cli import config, demo, latent, ops, plan, runs  # noqa: F401 - registers the commands
from h3flow.cli.base import app

__all__ = ["app"]
