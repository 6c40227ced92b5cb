"""Reading JSON the operator wrote: every failure is one line naming the file and the place."""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from pydantic import ValidationError

from h3flow.core.errors import ConfigError, one_line

MAX_DEPTH = 64  # no h3flow file nests deeper than ~6; Python's parser gives up near 1000
MAX_BYTES = 256 << 20  # what any JSON file h3flow reads may weigh (a bound, not a budget)
SHOWN_PROBLEMS = 10  # an error lists this many problems (12 lines at most), then how many more there are


def shown(value: object, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters: an error names the value without echoing a megabyte."""
    text = repr(value)
    return text if len(text) <= limit else f"{text[: limit - 3]}..."


def _where(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            name = one_line(str(item))  # a key the operator wrote: one line, and not a megabyte of it
            parts.append(("." if parts else "") + (name if len(name) <= 60 else f"{name[:57]}..."))
    return "".join(parts) or "(top level)"


def validation_problems(exc: ValidationError) -> list[str]:
    """Every pydantic error as ``a.b[2].c: message``."""
    return [f"{_where(tuple(err['loc']))}: {err['msg'].removeprefix('Value error, ')}" for err in exc.errors()]


def capped_error(source: str, problems: Sequence[str], shown: int = SHOWN_PROBLEMS) -> ConfigError:
    """One error for ``problems``: a single one on its line; several as a count, the first
    ``shown`` one per line, then how many more (a 100k-clip batch with a typo in every clip
    is twelve lines, not 100k)."""
    if len(problems) == 1:
        return ConfigError(f"{source}: {problems[0]}")
    rest = len(problems) - shown
    if rest <= 0:
        return ConfigError(f"{source}: {len(problems)} problems:", details=problems)
    return ConfigError(
        f"{source}: {len(problems)} problems; the first {shown}:",
        details=[*problems[:shown], f"... and {rest} more"],
    )


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


def _read_at_most(handle: BinaryIO, limit: int) -> bytearray:
    """Up to ``limit`` bytes, in 1 MiB reads (``read(limit)`` would allocate ``limit`` at once)."""
    data = bytearray()
    while len(data) < limit and (block := handle.read(min(1 << 20, limit - len(data)))):
        data += block
    return data


def read_text_bounded(path: Path, max_bytes: int = MAX_BYTES) -> str:
    """A regular file's text, read only if it is at most ``max_bytes``.

    Opened without blocking and checked on the open descriptor (no race with a swap): a
    symlink to ``/dev/zero``, a FIFO or a socket is refused before a byte is read, and a
    file that grows past the bound is refused at the bound, never read whole.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{path}: is a directory, not a JSON file") from None
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise ConfigError(f"{path!s:.200}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError(f"{path}: is a directory, not a JSON file")
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"{path}: is not a regular file (a device, pipe or socket?)")
        if info.st_size > max_bytes:
            raise ConfigError(f"{path}: larger than {max_bytes >> 20} MiB: not a file h3flow reads")
        try:
            data = _read_at_most(handle, max_bytes + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise ConfigError(f"{path}: larger than {max_bytes >> 20} MiB: not a file h3flow reads")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def load_json_file(path: Path, max_bytes: int = MAX_BYTES) -> object:
    """Read JSON, turning every failure into a one-line ConfigError with line and column."""
    text = read_text_bounded(path, max_bytes)
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
