"""send() dispatch: the local method, Destination options, secrets, retries and `h3flow transfer`."""

from __future__ import annotations

import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from h3flow.cli import app
from h3flow.core.errors import ConfigError, H3FlowError, IntegrityError
from h3flow.core.files import FileRef
from h3flow.handoff.tcp import Receiver
from h3flow.handoff.transfer import (
    Destination,
    destination_from_options,
    secret_from_options,
    send,
    send_with_retry,
)

SECRET = b"transfer-test-secret"
runner = CliRunner()


@pytest.fixture
def latent(tmp_path: Path) -> FileRef:
    path = tmp_path / "out" / "clip.h3latent"
    path.parent.mkdir()
    data = os.urandom(700_000)
    path.write_bytes(data)  # send() moves bytes; it does not parse them
    return FileRef(path, hashlib.sha256(data).hexdigest(), len(data))


def local_dest(store: Path) -> Destination:
    return Destination("local", "decoder", "", 0, None, store, None)


def test_local_same_filesystem_is_a_verified_hard_link(latent: FileRef, tmp_path: Path) -> None:
    remote = send(latent, local_dest(tmp_path / "store"))
    assert remote.path.stat().st_ino == latent.path.stat().st_ino
    assert remote.sha256 == latent.sha256 and remote.size == latent.size
    assert send(latent, local_dest(tmp_path / "store")) == remote  # already there


def test_local_other_filesystem_is_a_verified_copy(latent: FileRef) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir() or shm.stat().st_dev == latent.path.stat().st_dev:
        pytest.skip("needs /dev/shm on another filesystem than the temp dir")
    store = shm / f"h3flow-test-{os.getpid()}"
    try:
        remote = send(latent, local_dest(store))
        assert remote.path.stat().st_ino != latent.path.stat().st_ino
        assert hashlib.sha256(remote.path.read_bytes()).hexdigest() == latent.sha256
    finally:
        import shutil

        shutil.rmtree(store, ignore_errors=True)


def test_local_mismatch_stores_nothing(latent: FileRef, tmp_path: Path) -> None:
    with pytest.raises(IntegrityError):
        send(FileRef(latent.path, "e" * 64, latent.size), local_dest(tmp_path / "store"))
    assert not any((tmp_path / "store" / "latents").glob("*/*.h3latent"))


def test_destination_from_options_checks_what_each_method_needs(tmp_path: Path) -> None:
    tcp = destination_from_options("b-host", method="tcp", store_root=tmp_path, port=9410, secret=b"s")
    assert (tcp.address, tcp.port, tcp.ssh_alias) == ("b-host", 9410, None)
    assert "secret=set" in repr(tcp) and "b's'" not in repr(tcp)
    sftp = destination_from_options("b-host", method="sftp", store_root=tmp_path)
    assert sftp.ssh_alias == "b-host" and sftp.secret is None
    for kwargs, problem in (
        ({"method": "scp", "store_root": tmp_path}, "--method"),
        ({"method": "tcp", "store_root": None, "port": 1, "secret": b"s"}, "--store-root"),
        ({"method": "tcp", "store_root": tmp_path, "secret": b"s"}, "--port"),
        ({"method": "tcp", "store_root": tmp_path, "port": 9410}, "secret"),
        ({"method": "sftp", "store_root": tmp_path, "ssh_config": tmp_path / "nope"}, "ssh config"),
    ):
        with pytest.raises(ConfigError, match=problem):
            destination_from_options("b-host", **kwargs)  # type: ignore[arg-type]


def test_secret_from_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_TEST_SECRET", "from-env")
    assert secret_from_options("H3_TEST_SECRET") == b"from-env"
    secret_file = tmp_path / "secret"
    secret_file.write_text("from-file\n")
    secret_file.chmod(0o644)
    with pytest.raises(ConfigError, match=r"can be read by others \(mode 0644\): `chmod 600 "):
        secret_from_options(file=secret_file)  # a secret others can read is no secret (issue 23)
    secret_file.chmod(0o600)
    assert secret_from_options(file=secret_file) == b"from-file"
    assert secret_from_options() is None
    with pytest.raises(ConfigError, match="not both"):
        secret_from_options("H3_TEST_SECRET", secret_file)
    with pytest.raises(ConfigError, match="H3_UNSET"):
        secret_from_options("H3_UNSET")


def test_non_receivers_are_not_retried(latent: FileRef, tmp_path: Path) -> None:
    """A wrong port (something else answers) is the operator's to fix: one attempt, clear error."""
    accepted = []
    server = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            accepted.append(conn)
            conn.sendall(b"\x00\x00\x00\x05hello")

    threading.Thread(target=answer, daemon=True).start()
    dest = Destination("tcp", "decoder", "127.0.0.1", server.getsockname()[1], None, tmp_path, SECRET)
    try:
        with pytest.raises(H3FlowError, match=r"decoder.*does not speak h3flow-latent/1"):
            send_with_retry(latent, dest, attempts=3, backoff=0)
        assert len(accepted) == 1
    finally:
        server.close()


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with Receiver(tmp_path / "decoder", secret=SECRET, min_free=0) as running:
        yield running


def test_cli_transfer_over_tcp(latent: FileRef, receiver: Receiver, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("H3_CLI_SECRET", SECRET.decode())
    monkeypatch.setenv("H3_WRONG_SECRET", "nope")
    address, port = receiver.address
    base = [
        "transfer",
        str(latent.path),
        "--to",
        "decoder",
        "--address",
        address,
        "--port",
        str(port),
        "--store-root",
        str(receiver.store.root),
    ]
    ok = runner.invoke(app, [*base, "--secret-env", "H3_CLI_SECRET"])
    assert ok.exit_code == 0, ok.output
    assert "verified" in ok.output and receiver.store.has(latent.sha256)
    wrong = runner.invoke(app, [*base, "--secret-env", "H3_WRONG_SECRET"])
    assert wrong.exit_code == 2 and "refused authentication" in wrong.output
    assert wrong.output.startswith("error:") and "Traceback" not in wrong.output
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed = unused.getsockname()[1]
    down = runner.invoke(app, [*base[:7], str(closed), *base[8:], "--secret-env", "H3_CLI_SECRET", "--attempts", "1"])
    assert down.exit_code == 1 and "cannot connect to the latent receiver on decoder" in down.output


def test_cli_transfer_local(latent: FileRef, tmp_path: Path) -> None:
    result = runner.invoke(
        app,
        ["transfer", str(latent.path), "--to", "here", "--method", "local", "--store-root", str(tmp_path / "store")],
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "store" / "latents" / latent.sha256[:2] / f"{latent.sha256}.h3latent").exists()
