"""The sftp transfer against a real Debian sshd (tests/sshd.py): host keys checked,
remote hash verified, paths quoted, unreachable hosts named."""

from __future__ import annotations

import hashlib
import shlex
import socket
import subprocess
from pathlib import Path

import pytest
import torch
from sshd import SshServer
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.errors import H3FlowError, IntegrityError, TransientError
from h3flow.core.files import FileRef
from h3flow.handoff.destination import Destination
from h3flow.handoff.format import H3Latent, save_latent
from h3flow.handoff.sftp import _FINISH
from h3flow.handoff.store import LatentStore
from h3flow.handoff.transfer import send

pytestmark = pytest.mark.sshd
runner = CliRunner()


@pytest.fixture(scope="module")
def latent(tmp_path_factory: pytest.TempPathFactory) -> FileRef:
    path = tmp_path_factory.mktemp("sftp-latent") / "clip.h3latent"
    gen = torch.Generator().manual_seed(11)
    sha = save_latent(
        path,
        H3Latent(
            torch.randn(1, 24, 7, 26, 46, generator=gen), torch.randn(1, 32, 2, 207, generator=gen), {"clip_id": "c07"}
        ),
    )
    return FileRef(path, sha, path.stat().st_size)


def sftp_dest(sshd: SshServer, store: Path, alias: str | None = None) -> Destination:
    return Destination("sftp", "decoder", "", 0, alias or sshd.alias, store, None, sshd.config)


def no_temp_left(store: Path) -> bool:
    tmp = store / "latents" / ".tmp"
    return not tmp.exists() or list(tmp.iterdir()) == []


def test_upload_is_verified_remotely_and_skipped_when_present(sshd: SshServer, latent: FileRef, tmp_path: Path) -> None:
    store = tmp_path / "decoder store 'b'"  # a space and quotes: every remote path is quoted
    remote = send(latent, sftp_dest(sshd, store))
    assert remote.path == LatentStore(store).path_for(latent.sha256) and remote.size == latent.size
    assert hashlib.sha256(remote.path.read_bytes()).hexdigest() == latent.sha256
    assert no_temp_left(store)
    inode = remote.path.stat().st_ino
    assert send(latent, sftp_dest(sshd, store)) == remote
    assert remote.path.stat().st_ino == inode  # not uploaded again


def test_a_local_file_that_changed_is_not_stored(sshd: SshServer, latent: FileRef, tmp_path: Path) -> None:
    store = tmp_path / "store"
    liar = FileRef(latent.path, "0" * 64, latent.size)
    with pytest.raises(IntegrityError, match="local latent"):
        send(liar, sftp_dest(sshd, store))
    assert list(LatentStore(store)) == [] and no_temp_left(store)


def test_remote_finisher_rejects_bytes_that_do_not_match(sshd: SshServer, tmp_path: Path) -> None:
    """The remote half of the check, run by the real sshd: a mismatch exits 3 and removes the upload."""
    temp = tmp_path / "upload.part"
    temp.write_bytes(b"bytes that were damaged in flight")
    final = tmp_path / "latents" / "ab" / ("ab" * 32 + ".h3latent")
    args = " ".join(shlex.quote(str(a)) for a in (temp, final, "ab" * 32))
    done = subprocess.run(
        sshd.ssh_argv(f"sh -c {shlex.quote(_FINISH)} h3flow-finish {args}"),
        input="go\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout.split() == ["mismatch", hashlib.sha256(b"bytes that were damaged in flight").hexdigest()]
    assert not temp.exists() and not final.exists()


def test_unreachable_sshd_is_a_clear_error_naming_the_host(sshd: SshServer, latent: FileRef, tmp_path: Path) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    alias = sshd.add_alias("h3-dead", port=closed)
    with pytest.raises(TransientError, match=rf"host decoder \(ssh h3-dead\).*127.0.0.1:{closed}.*refused"):
        send(latent, sftp_dest(sshd, tmp_path / "store", alias))


def test_unknown_or_changed_host_keys_are_refused(sshd: SshServer, latent: FileRef, tmp_path: Path) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    stranger = sshd.add_alias("h3-stranger", known_hosts=empty)
    with pytest.raises(H3FlowError, match=r"decoder.*not in known_hosts") as caught:
        send(latent, sftp_dest(sshd, tmp_path / "store", stranger))
    assert not isinstance(caught.value, TransientError)
    forged = tmp_path / "forged_known_hosts"
    other_key = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    key = " ".join(other_key.with_suffix(".pub").read_text().split()[:2])
    forged.write_text(f"[{sshd.host}]:{sshd.port} {key}\n")
    impostor = sshd.add_alias("h3-impostor", known_hosts=forged)
    with pytest.raises(H3FlowError, match=r"does not match known_hosts"):
        send(latent, sftp_dest(sshd, tmp_path / "store", impostor))
    assert not (tmp_path / "store").exists()


def test_cli_transfer_over_sftp(sshd: SshServer, latent: FileRef, tmp_path: Path) -> None:
    store = tmp_path / "store"
    result = runner.invoke(
        app,
        [
            "transfer",
            str(latent.path),
            "--to",
            "decoder",
            "--method",
            "sftp",
            "--ssh-alias",
            sshd.alias,
            "--ssh-config",
            str(sshd.config),
            "--store-root",
            str(store),
        ],
    )
    assert result.exit_code == 0, result.output
    assert "verified" in result.output and latent.sha256 in result.output.replace("\n", "")
    assert LatentStore(store).has(latent.sha256)
