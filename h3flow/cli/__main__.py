"""``python -m h3flow.cli``: the same as the ``h3flow`` command."""

from h3flow.cli import app

app()
