"""A content-addressed latent store, one per host: ``<root>/latents/<sha[:2]>/<sha>.h3latent``.

An object's name is the SHA-256 of its bytes, so "do we have it" is a stat and a
finished object is never rewritten. Objects enter only through a temporary file in
``<root>/latents/.tmp`` (same filesystem) that is hashed while written, fsynced, and
then hard-linked into place: ``link`` fails when the name exists, so two writers of
the same latent cannot clobber each other, and a crash leaves at most a stray temp file
(which ``gc`` removes), never a partial object.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import CHUNK, fsync_dir, sha256_file

SUFFIX = ".h3latent"
SHA256 = re.compile(r"^[0-9a-f]{64}$")
STALE_TEMP_SECONDS = 3600


def check_sha256(value: str) -> str:
    """``value`` if it is a lowercase hex SHA-256: the only names the store accepts (no paths)."""
    if not isinstance(value, str) or not SHA256.match(value):
        raise H3FlowError(f"not a SHA-256 content address: {str(value)[:80]!r}")
    return value


def object_relpath(sha256: str) -> str:
    """Where an object lives relative to a store root (POSIX form, also used for remote stores)."""
    check_sha256(sha256)
    return f"latents/{sha256[:2]}/{sha256}{SUFFIX}"


@dataclass(frozen=True)
class Damage:
    """An object whose bytes no longer match its name (or a file that is no object)."""

    sha256: str
    path: Path
    problem: str


class LatentStore:
    """The latent objects of one host, named by content."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.objects = self.root / "latents"
        self.tmp = self.objects / ".tmp"

    # ----------------------------------------------------------------- lookup
    def path_for(self, sha256: str) -> Path:
        return self.root / object_relpath(sha256)

    def has(self, sha256: str) -> bool:
        return self.path_for(sha256).is_file()

    def ref(self, sha256: str) -> FileRef:
        path = self.path_for(sha256)
        try:
            return FileRef(path, sha256, path.stat().st_size)
        except FileNotFoundError:
            raise H3FlowError(f"latent {sha256} is not in the store at {self.root}") from None

    def __iter__(self) -> Iterator[tuple[str, Path]]:
        """Every ``(name, path)`` in the shard folders; names may be invalid (see verify)."""
        if not self.objects.is_dir():
            return
        for shard in sorted(self.objects.iterdir()):
            if shard.name == self.tmp.name or not shard.is_dir():
                continue
            for path in sorted(shard.iterdir()):
                yield path.name.removesuffix(SUFFIX), path

    # ----------------------------------------------------------------- writing
    @contextlib.contextmanager
    def temp_file(self, label: str = "put") -> Iterator[tuple[IO[bytes], Path]]:
        """An unbuffered temp file on the store's filesystem, always removed on exit.

        :meth:`commit` hard-links it into place first, so a committed object survives.
        """
        self.tmp.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f"{label}.", suffix=".part", dir=self.tmp)
        path = Path(name)
        try:
            with os.fdopen(fd, "wb", buffering=0) as handle:
                yield handle, path
        finally:
            path.unlink(missing_ok=True)

    def commit(self, temp: Path, sha256: str) -> FileRef:
        """Hard-link a complete, fsynced temp file into place under its content address.

        An object that already exists is kept as is (same name = same bytes).
        """
        final = self.path_for(sha256)
        final.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):
            os.link(temp, final)
            fsync_dir(final.parent)
        return FileRef(final, sha256, final.stat().st_size)

    def put_file(
        self, src: Path, *, move: bool = False, link: bool = False, expected_sha256: str | None = None
    ) -> FileRef:
        """Add a file to the store; return its object.

        The bytes are hashed as they enter the store. ``move`` removes ``src`` afterwards;
        ``link`` (and ``move``) hard-link instead of copying when ``src`` is on the same
        filesystem. With ``expected_sha256`` a mismatch raises :class:`IntegrityError` and
        stores nothing. An existing object is never rewritten.
        """
        src = Path(src)
        if expected_sha256 is not None:
            check_sha256(expected_sha256)
            if self.has(expected_sha256):
                if move:
                    src.unlink(missing_ok=True)
                return self.ref(expected_sha256)
        ref: FileRef | None = self._put_linked(src, expected_sha256) if (move or link) else None
        if ref is None:
            with self.temp_file("local") as (handle, temp):
                sha = _copy_hashing(src, handle)
                _check_expected(src, sha, expected_sha256)
                ref = self.commit(temp, sha)
        if move:
            src.unlink(missing_ok=True)
        return ref

    def _put_linked(self, src: Path, expected_sha256: str | None) -> FileRef | None:
        """Hard-link ``src`` in (no copy); None when it lives on another filesystem."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        temp = self.tmp / f"link.{os.getpid()}.{time.monotonic_ns()}.part"
        try:
            os.link(src, temp)
        except FileNotFoundError:
            raise H3FlowError(f"latent file not found: {src}") from None
        except OSError as exc:
            if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK, errno.ENOTSUP):
                return None
            raise H3FlowError(f"cannot link {src} into the store: {exc.strerror or exc}") from None
        try:
            sha = sha256_file(temp)  # hash the linked inode itself: what the store will hold
            _check_expected(src, sha, expected_sha256)
            _fsync_path(temp)
            return self.commit(temp, sha)
        finally:
            temp.unlink(missing_ok=True)

    # ----------------------------------------------------------------- upkeep
    def verify(self, *, quarantine: bool = False) -> list[Damage]:
        """Rehash every object; return the damaged ones.

        With ``quarantine`` each damaged object is moved to ``<root>/latents-damaged/`` so
        the next transfer of that latent can store a good copy again.
        """
        damaged: list[Damage] = []
        for name, path in self:
            if not SHA256.match(name) or path.name != name + SUFFIX or path.parent.name != name[:2]:
                damaged.append(Damage(name, path, "not a store object name"))
                continue
            try:
                actual = sha256_file(path)
            except OSError as exc:
                damaged.append(Damage(name, path, f"unreadable: {exc.strerror or exc}"))
                continue
            if actual != name:
                damaged.append(Damage(name, path, f"bytes hash to {actual}"))
        if quarantine:
            for item in damaged:
                self.quarantine(item.path)
        return damaged

    def quarantine(self, path: Path) -> bool:
        """Move a damaged object to ``<root>/latents-damaged/`` (kept for a look, out of the
        store's way: the next transfer of that latent stores a good copy). True if moved."""
        jail = self.root / "latents-damaged"
        jail.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(path, jail / f"{Path(path).name}.{int(time.time())}")
        except OSError:
            return False
        return True

    def gc(self, referenced: set[str], *, dry_run: bool = False) -> list[str]:
        """Remove objects whose SHA-256 is not in ``referenced`` (and stale temp files).

        Returns the removed (or, with ``dry_run``, removable) object names.
        """
        doomed = [(name, path) for name, path in self if name not in referenced]
        if dry_run:
            return [name for name, _ in doomed]
        for _, path in doomed:
            path.unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                path.parent.rmdir()  # only succeeds once the shard is empty
        cutoff = time.time() - STALE_TEMP_SECONDS
        if self.tmp.is_dir():
            for temp in self.tmp.iterdir():
                with contextlib.suppress(OSError):
                    if temp.stat().st_mtime < cutoff:
                        temp.unlink()
        return [name for name, _ in doomed]

    def free_bytes(self) -> int:
        """Space left for new objects on the store's filesystem."""
        self.objects.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.objects).free


def _check_expected(src: Path, actual: str, expected: str | None) -> None:
    if expected is not None and actual != expected:
        raise IntegrityError(f"{src} has SHA-256 {actual}, expected {expected}")


def _copy_hashing(src: Path, handle: IO[bytes]) -> str:
    """Copy ``src`` into ``handle`` in chunks, hashing what is written; fsync; return the hash."""
    digest = hashlib.sha256()
    try:
        with open(src, "rb") as source:
            while block := source.read(CHUNK):
                digest.update(block)
                handle.write(block)
    except FileNotFoundError:
        raise H3FlowError(f"latent file not found: {src}") from None
    except OSError as exc:
        raise H3FlowError(f"cannot copy {src} into the store: {exc.strerror or exc}") from None
    handle.flush()
    os.fsync(handle.fileno())
    return digest.hexdigest()


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
