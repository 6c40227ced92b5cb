"""Reading JSON the operator wrote: every failure is one line naming the file and the place."""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from h3flow.core.errors import ConfigError

MAX_DEPTH = 64  # no h3flow file nests deeper than ~6; Python's parser gives up near 1000


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "(top level)"


def validation_problems(exc: ValidationError) -> list[str]:
    """Every pydantic error as ``a.b[2].c: message``."""
    return [f"{_where(tuple(err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in exc.errors()]


def format_validation_error(source: str, exc: ValidationError) -> str:
    """The first pydantic error as ``source: a.b[2].c: message`` (one line)."""
    problems = validation_problems(exc)
    more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{source}: {problems[0]}{more}"


def json_depth(value: object) -> int:
    """How deeply ``value`` nests lists and objects (iteratively: no recursion to overflow)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                todo.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def load_json_file(path: Path) -> object:
    """Read JSON, turning every failure into a one-line ConfigError with line and column."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    too_deep = ConfigError(f"{path}: invalid JSON: nested more than {MAX_DEPTH} levels deep")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{path}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:
        raise too_deep from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise ConfigError(f"{path}: invalid JSON: {exc}") from None
    if json_depth(value) > MAX_DEPTH:
        raise too_deep
    return value
