"""The operator's command line, ``h3flow COMMAND``: one module per command group.

:mod:`.base` holds what they share; importing this package registers every group on
:data:`app` (the console entry point).
"""

# the import order is the order of the help's panels and commands (see cli/base.py)
from h3flow.cli import demo, config, plan, ops, runs, latent  # noqa: F401, I001 - registers the commands
from h3flow.cli.base import app

__all__ = ["app"]
