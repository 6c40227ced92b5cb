"""The content-addressed latent store: put, never rewrite, verify, gc, and its CLI."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.errors import H3FlowError, IntegrityError
from h3flow.core.fsutil import CHUNK, sha256_bytes, sha256_file
from h3flow.handoff.store import STALE_TEMP_SECONDS, LatentStore, object_relpath

runner = CliRunner()


def blob(tmp_path: Path, name: str, size: int = 3 * CHUNK + 123, seed: int = 1) -> tuple[Path, str]:
    """A file larger than one hashing chunk, with its SHA-256."""
    data = (bytes(range(256)) * (size // 256 + 1))[:size]
    data = bytes([seed]) + data[1:]
    path = tmp_path / name
    path.write_bytes(data)
    return path, sha256_bytes(data)


def test_put_file_copies_under_the_content_address(tmp_path: Path) -> None:
    src, sha = blob(tmp_path, "a.h3latent")
    store = LatentStore(tmp_path / "store")
    ref = store.put_file(src)
    assert ref.path == tmp_path / "store" / "latents" / sha[:2] / f"{sha}.h3latent"
    assert ref.sha256 == sha and ref.size == src.stat().st_size and sha256_file(ref.path) == sha
    assert store.has(sha) and src.exists()
    assert ref.path.stat().st_ino != src.stat().st_ino  # a copy, not a link
    assert list(store.tmp.iterdir()) == []  # no temp file left behind


def test_move_and_link_use_a_hard_link_on_the_same_filesystem(tmp_path: Path) -> None:
    src, _sha = blob(tmp_path, "a.h3latent")
    inode = src.stat().st_ino
    store = LatentStore(tmp_path / "store")
    assert store.put_file(src, link=True).path.stat().st_ino == inode and src.exists()
    other, other_sha = blob(tmp_path, "b.h3latent", seed=2)
    inode = other.stat().st_ino
    ref = store.put_file(other, move=True)
    assert ref.sha256 == other_sha and ref.path.stat().st_ino == inode and not other.exists()


def test_an_existing_object_is_never_rewritten(tmp_path: Path) -> None:
    src, _sha = blob(tmp_path, "a.h3latent")
    store = LatentStore(tmp_path / "store")
    first = store.put_file(src)
    before = first.path.stat()
    again = store.put_file(src)
    assert again.path == first.path
    after = first.path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)


def test_expected_hash_mismatch_stores_nothing(tmp_path: Path) -> None:
    src, sha = blob(tmp_path, "a.h3latent")
    store = LatentStore(tmp_path / "store")
    for kwargs in ({}, {"link": True}):
        with pytest.raises(IntegrityError, match=sha[:12]):
            store.put_file(src, expected_sha256="f" * 64, **kwargs)
    assert list(store) == [] and list(store.tmp.iterdir()) == []
    assert src.exists()


def test_content_addresses_only(tmp_path: Path) -> None:
    store = LatentStore(tmp_path / "store")
    for bad in ("../../etc/passwd", "A" * 64, "a" * 63, "g" * 64, "", "/" + "a" * 63):
        with pytest.raises(H3FlowError, match="SHA-256"):
            store.path_for(bad)
    assert object_relpath("ab" * 32) == f"latents/ab/{'ab' * 32}.h3latent"


def test_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    store = LatentStore(tmp_path / "store")
    for kwargs in ({}, {"link": True}, {"move": True}):
        with pytest.raises(H3FlowError, match="not found"):
            store.put_file(tmp_path / "nope.h3latent", **kwargs)


def test_verify_finds_damage_and_quarantine_allows_a_fresh_copy(tmp_path: Path) -> None:
    store = LatentStore(tmp_path / "store")
    good = store.put_file(blob(tmp_path, "a", seed=1)[0])
    bad = store.put_file(blob(tmp_path, "b", seed=2)[0])
    assert store.verify() == []
    with open(bad.path, "r+b") as handle:  # bit rot in the middle of the object
        handle.seek(CHUNK + 7)
        byte = handle.read(1)
        handle.seek(CHUNK + 7)
        handle.write(bytes([byte[0] ^ 0x40]))
    stray = store.objects / "zz" / "notes.txt"
    stray.parent.mkdir()
    stray.write_text("hello")
    damaged = store.verify()
    assert {(d.sha256, d.problem.split()[0]) for d in damaged} == {(bad.sha256, "bytes"), ("notes.txt", "not")}
    store.verify(quarantine=True)
    assert not bad.path.exists() and good.path.exists()
    assert len(list((tmp_path / "store" / "latents-damaged").iterdir())) == 2
    assert store.verify() == []
    assert store.put_file(blob(tmp_path, "b2", seed=2)[0]).sha256 == bad.sha256  # re-stored intact


def test_gc_removes_only_unreferenced_objects_and_stale_temps(tmp_path: Path) -> None:
    store = LatentStore(tmp_path / "store")
    keep = store.put_file(blob(tmp_path, "a", seed=1)[0])
    drop = store.put_file(blob(tmp_path, "b", seed=2)[0])
    stale, fresh = store.tmp / "put.stale.part", store.tmp / "put.fresh.part"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    old = time.time() - STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    assert store.gc({keep.sha256}, dry_run=True) == [drop.sha256] and drop.path.exists()
    assert store.gc({keep.sha256}) == [drop.sha256]
    assert keep.path.exists() and not drop.path.exists() and not drop.path.parent.exists()
    assert not stale.exists() and fresh.exists()  # a temp file may belong to a transfer in progress


def test_cli_store_verify_and_gc(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = LatentStore(root)
    keep = store.put_file(blob(tmp_path, "a", seed=1)[0])
    drop = store.put_file(blob(tmp_path, "b", seed=2)[0])
    ok = runner.invoke(app, ["store", "verify", "--store", str(root)])
    assert ok.exit_code == 0 and "ok 2 objects" in ok.output
    drop.path.write_bytes(b"damaged")
    bad = runner.invoke(app, ["store", "verify", "--store", str(root)])
    assert bad.exit_code == 2 and "1 of 2 objects" in bad.output and drop.sha256[:20] in bad.output
    refused = runner.invoke(app, ["store", "gc", "--store", str(root)])
    assert refused.exit_code == 2 and "--keep" in refused.output and drop.path.exists()
    manifest = tmp_path / "manifest.json"
    manifest.write_text(f'{{"clips": {{"c01": {{"latent": "{keep.sha256}"}}}}}}')
    gc = runner.invoke(app, ["store", "gc", "--store", str(root), "--keep-from", str(manifest)])
    assert gc.exit_code == 0 and f"removed {drop.sha256}" in gc.output
    assert keep.path.exists() and not drop.path.exists()
    missing = runner.invoke(app, ["store", "verify", "--store", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no latent store" in missing.output
