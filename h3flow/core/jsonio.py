"""Reading JSON the operator wrote: every failure is one line naming the file and the place."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from h3flow.core.errors import ConfigError


def format_validation_error(source: str, exc: ValidationError) -> str:
    """The first pydantic error as ``source: a.b[2].c: message`` (one line)."""
    err = exc.errors()[0]
    parts: list[str] = []
    for item in err["loc"]:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    where = "".join(parts) or "(top level)"
    msg = err["msg"].removeprefix("Value error, ")
    more = f" (+{len(exc.errors()) - 1} more)" if len(exc.errors()) > 1 else ""
    return f"{source}: {where}: {msg}{more}"


def load_json_file(path: Path) -> object:
    """Read JSON, turning every failure into a one-line ConfigError with line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
