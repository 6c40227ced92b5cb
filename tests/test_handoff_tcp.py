"""The tcp transfer over real loopback sockets, with a relay that drops, corrupts or holds
the stream, a real size-limited tmpfs for "disk full", and the real `h3flow receiver`."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import os
import pickle
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from h3flow.core.errors import H3FlowError, IntegrityError, TransientError
from h3flow.core.files import FileRef
from h3flow.core.specs import get_spec
from h3flow.handoff.destination import Destination
from h3flow.handoff.format import H3Latent, save_latent
from h3flow.handoff.store import LatentStore
from h3flow.handoff.tcp import CorruptedInFlight, Receiver, probe
from h3flow.handoff.transfer import send, send_with_retry
from h3flow.pipeline.results import FailureKind, classify

SECRET = b"correct horse battery staple 42"
SECRET_ENV = "H3FLOW_TEST_SECRET"
ROOT = Path(__file__).resolve().parents[1]


def wait_until(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)  # polling interval, not synchronisation


def make_latent(folder: Path, name: str, t: int, h: int, w: int, seed: int) -> FileRef:
    gen = torch.Generator().manual_seed(seed)
    latent = H3Latent(
        torch.randn(1, 24, t, h, w, generator=gen),
        torch.randn(1, 32, 2, 207, generator=gen),
        {"clip_id": name, "seed": str(seed), "created": "2026-01-01T00:00:00+00:00"},
    )
    path = folder / f"{name}.h3latent"
    sha = save_latent(path, latent)
    return FileRef(path, sha, path.stat().st_size)


@pytest.fixture(scope="module")
def latents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, FileRef]:
    folder = tmp_path_factory.mktemp("latents")
    sd = get_spec("sd")
    return {
        "sd": make_latent(folder, "sd", 37, sd.height // 16, sd.width // 16, 1),  # ~4.3 MB, the SD size
        "small": make_latent(folder, "small", 7, 26, 46, 2),  # ~0.85 MB
        "other": make_latent(folder, "other", 7, 26, 46, 3),
    }


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[Receiver]:
    with Receiver(tmp_path / "decoder-store", secret=SECRET, min_free=0) as running:
        yield running


def dest_for(address: tuple[str, int], store: Path, secret: bytes = SECRET) -> Destination:
    return Destination("tcp", "decoder", address[0], address[1], None, store, secret)


def store_is_empty(store: LatentStore) -> bool:
    """No object and no temp file: nothing partial is visible."""
    return list(store) == [] and (not store.tmp.exists() or list(store.tmp.iterdir()) == [])


# --------------------------------------------------------------------------- a faulty relay
class Relay:
    """A TCP relay in front of the receiver. The first ``times`` connections suffer
    ``fault`` once ``at`` client->receiver bytes have passed: ``cut`` closes both sides,
    ``flip`` inverts that byte, ``hold`` waits for :meth:`release`."""

    def __init__(self, target: tuple[str, int], fault: str | None = None, at: int = 0, times: int = 1) -> None:
        self.target, self.fault, self.at, self.times = target, fault, at, times
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = ("127.0.0.1", self.listener.getsockname()[1])
        self.upstream: list[int] = []  # client->receiver bytes per connection
        self.released = threading.Event()
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def close(self) -> None:
        self.released.set()
        for sock in [self.listener, *self.sockets]:
            with contextlib.suppress(OSError):
                sock.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.target)
            self.sockets += [client, server]
            fault = self.fault if len(self.upstream) < self.times else None
            self.upstream.append(0)
            index = len(self.upstream) - 1
            threading.Thread(target=self._pump, args=(client, server, fault, index), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, None, None), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, fault: str | None, index: int | None) -> None:
        done = 0
        try:
            while data := src.recv(65536):
                if fault and done <= self.at < done + len(data):
                    cut = self.at - done
                    if fault == "cut":
                        dst.sendall(data[:cut])
                        raise ConnectionAbortedError
                    if fault == "flip":
                        data = data[:cut] + bytes([data[cut] ^ 0xFF]) + data[cut + 1 :]
                    if fault == "hold":
                        dst.sendall(data[:cut])
                        self.released.wait(30)
                        data = data[cut:]
                dst.sendall(data)
                done += len(data)
                if index is not None:
                    self.upstream[index] = done
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            for sock in (src, dst):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


@pytest.fixture
def relay_factory() -> Iterator[Callable[..., Relay]]:
    made: list[Relay] = []

    def make(*args: object, **kwargs: object) -> Relay:
        made.append(Relay(*args, **kwargs))  # type: ignore[arg-type]
        return made[-1]

    yield make
    for relay in made:
        relay.close()


# --------------------------------------------------------------------------- a hand-written client
class RawClient:
    """Speaks the wire protocol from its description (not from h3flow's own code)."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock = socket.create_connection(address, timeout=10)
        self.hello = self.recv()

    def send(self, message: dict[str, object]) -> None:
        data = json.dumps(message).encode()
        self.sock.sendall(struct.pack(">I", len(data)) + data)

    def recv(self) -> dict[str, object]:
        head = self._exact(4)
        return json.loads(self._exact(struct.unpack(">I", head)[0]))

    def auth(self, secret: bytes) -> dict[str, object]:
        ours = os.urandom(32)
        theirs = bytes.fromhex(str(self.hello["challenge"]))
        mac = hmac.new(secret, b"h3flow-latent/1 client\0" + theirs + ours, hashlib.sha256).hexdigest()
        self.send({"op": "auth", "challenge": ours.hex(), "mac": mac})
        return self.recv()

    def closed_by_peer(self) -> bool:
        try:
            return self.sock.recv(1) == b""
        except ConnectionResetError:
            return True

    def _exact(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            chunk = self.sock.recv(count - len(data))
            if not chunk:
                raise ConnectionError("closed")
            data += chunk
        return data


# --------------------------------------------------------------------------- behaviour
def test_send_stores_the_verified_object_and_skips_what_it_has(
    receiver: Receiver, latents: dict[str, FileRef], relay_factory: Callable[..., Relay]
) -> None:
    ref = latents["sd"]
    store = receiver.store
    remote = send(ref, dest_for(receiver.address, store.root))
    assert remote.path == store.path_for(ref.sha256) and remote.size == ref.size
    assert hashlib.sha256(remote.path.read_bytes()).hexdigest() == ref.sha256
    assert store_is_empty(LatentStore(store.root)) is False and list(store.tmp.iterdir()) == []
    inode = remote.path.stat().st_ino
    relay = relay_factory(receiver.address)
    again = send(ref, dest_for(relay.address, store.root))
    assert again == remote and remote.path.stat().st_ino == inode
    assert 0 < relay.upstream[0] < 1000  # "already have it": the 4.3 MB body never crossed


def test_probe_answers_only_for_a_receiver(receiver: Receiver) -> None:
    assert probe(*receiver.address, timeout=2)
    with socket.create_server(("127.0.0.1", 0)) as other:  # something else listening

        def greet_wrongly() -> None:
            conn, _ = other.accept()
            conn.sendall(b"HTTP/1.1 400 Bad Request\r\n\r\n")
            conn.close()

        threading.Thread(target=greet_wrongly, daemon=True).start()
        assert not probe("127.0.0.1", other.getsockname()[1], timeout=2)
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        closed_port = unused.getsockname()[1]
    assert not probe("127.0.0.1", closed_port, timeout=1)


def test_wrong_secret_is_refused_and_nothing_written(receiver: Receiver, latents: dict[str, FileRef]) -> None:
    with pytest.raises(H3FlowError, match=r"decoder.*refused authentication") as caught:
        send(latents["small"], dest_for(receiver.address, receiver.store.root, secret=b"guess"))
    assert not isinstance(caught.value, TransientError)  # retrying will not fix a wrong secret
    assert store_is_empty(receiver.store)


def test_unauthenticated_or_forged_peers_get_nothing_written(receiver: Receiver) -> None:
    client = RawClient(receiver.address)
    client.send({"op": "ping"})
    assert client.recv()["pong"] is True  # the health probe needs no secret
    client.send({"op": "put", "sha256": "a" * 64, "size": 10})
    assert client.recv() == {"ok": False, "kind": "auth", "error": "authenticate first"}
    assert client.closed_by_peer()
    forged = RawClient(receiver.address)
    assert forged.auth(b"not the secret")["ok"] is False
    assert forged.closed_by_peer()
    assert store_is_empty(receiver.store)


def test_only_content_addresses_are_accepted(receiver: Receiver, tmp_path: Path) -> None:
    client = RawClient(receiver.address)
    assert client.auth(SECRET)["ok"] is True
    client.send({"op": "put", "sha256": "../../../escape", "size": 4})
    assert client.recv()["kind"] == "bad_request"
    assert store_is_empty(receiver.store) and not (tmp_path / "escape").exists()


def test_hash_mismatch_leaves_nothing(receiver: Receiver) -> None:
    client = RawClient(receiver.address)
    assert client.auth(SECRET)["ok"] is True
    body = os.urandom(300_000)
    client.send({"op": "put", "sha256": hashlib.sha256(b"something else").hexdigest(), "size": len(body)})
    assert client.recv() == {"ok": True, "send": True}
    client.sock.sendall(body)
    reply = client.recv()
    assert reply["ok"] is False and reply["kind"] == "integrity"
    assert reply["got"] == hashlib.sha256(body).hexdigest()
    assert store_is_empty(receiver.store)


def test_size_limit(tmp_path: Path, latents: dict[str, FileRef]) -> None:
    with Receiver(tmp_path / "store", secret=SECRET, max_bytes=1_000_000, min_free=0) as small:
        with pytest.raises(H3FlowError, match=r"decoder.*exceeds the receiver's limit of 1000000"):
            send(latents["sd"], dest_for(small.address, small.store.root))
        assert store_is_empty(small.store)
        assert send(latents["small"], dest_for(small.address, small.store.root)).sha256 == latents["small"].sha256


def test_a_local_file_that_changed_is_not_sent(receiver: Receiver, latents: dict[str, FileRef], tmp_path: Path) -> None:
    ref = latents["small"]
    liar = FileRef(ref.path, latents["other"].sha256, ref.size)  # same size, other content
    with pytest.raises(IntegrityError, match="local latent"):
        send(liar, dest_for(receiver.address, receiver.store.root))
    assert store_is_empty(receiver.store)
    with pytest.raises(IntegrityError, match="FileRef says"):
        send(FileRef(ref.path, ref.sha256, ref.size + 1), dest_for(receiver.address, receiver.store.root))


# --------------------------------------------------------------------------- faults
def test_connection_dropped_mid_stream_then_retry_succeeds(
    receiver: Receiver, latents: dict[str, FileRef], relay_factory: Callable[..., Relay]
) -> None:
    ref = latents["sd"]
    relay = relay_factory(receiver.address, fault="cut", at=1_500_000)
    dest = dest_for(relay.address, receiver.store.root)
    with pytest.raises(TransientError, match="decoder") as caught:
        send(ref, dest, timeout=10)
    assert not isinstance(caught.value, IntegrityError)
    wait_until(lambda: store_is_empty(receiver.store), what="the receiver to drop the partial upload")
    assert send(ref, dest).sha256 == ref.sha256  # the relay behaves now: the retry succeeds
    assert hashlib.sha256(receiver.store.path_for(ref.sha256).read_bytes()).hexdigest() == ref.sha256


def test_corruption_in_flight_is_detected_rejected_and_retried(
    receiver: Receiver, latents: dict[str, FileRef], relay_factory: Callable[..., Relay]
) -> None:
    ref = latents["sd"]
    relay = relay_factory(receiver.address, fault="flip", at=2_000_000)
    with pytest.raises(CorruptedInFlight, match="corrupted in flight") as caught:
        send(ref, dest_for(relay.address, receiver.store.root))
    assert isinstance(caught.value, IntegrityError) and isinstance(caught.value, TransientError)
    assert store_is_empty(receiver.store)
    retried = relay_factory(receiver.address, fault="flip", at=3_000_000)
    remote = send_with_retry(ref, dest_for(retried.address, receiver.store.root), attempts=2, backoff=0)
    assert len(retried.upstream) == 2  # one rejected attempt, one good one
    assert hashlib.sha256(remote.path.read_bytes()).hexdigest() == ref.sha256


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 3 MiB tmpfs: the decoder's store on a disk that fills up."""
    mount = tmp_path / "disk"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a size-limited tmpfs needs root")
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def test_decoder_disk_full(small_disk: Path, latents: dict[str, FileRef], relay_factory: Callable[..., Relay]) -> None:
    with Receiver(small_disk / "store", secret=SECRET, min_free=0) as rec:
        store = rec.store
        # 1. too big for the free space: refused before a byte is streamed
        with pytest.raises(H3FlowError, match=r"decoder.*out of space") as caught:
            send(latents["sd"], dest_for(rec.address, store.root))
        assert not isinstance(caught.value, TransientError)
        assert classify(caught.value) is FailureKind.RESOURCE
        assert store_is_empty(store)
        # 2. the disk fills up *during* the upload (another writer): ENOSPC mid-stream
        ref = latents["small"]
        relay = relay_factory(rec.address, fault="hold", at=300_000)
        outcome: dict[str, BaseException | FileRef] = {}

        def upload() -> None:
            try:
                outcome["result"] = send(ref, dest_for(relay.address, store.root), timeout=20)
            except BaseException as exc:
                outcome["result"] = exc

        sender = threading.Thread(target=upload)
        sender.start()
        wait_until(lambda: store.tmp.exists() and any(store.tmp.iterdir()), what="the upload to start")
        ballast = small_disk / "ballast"
        with open(ballast, "wb") as handle, contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * 65536)
        relay.release()
        sender.join(30)
        error = outcome["result"]
        assert isinstance(error, H3FlowError) and "No space left" in str(error) and "decoder" in str(error)
        assert classify(error) is FailureKind.RESOURCE  # full, not the operator's input (issue 23, point 5)
        assert store_is_empty(store)
        ballast.unlink()
        assert send(ref, dest_for(rec.address, store.root)).sha256 == ref.sha256


def start_receiver_process(store: Path, bind: str) -> tuple[subprocess.Popen[str], int]:
    env = {**os.environ, "H3FLOW_TEST_SECRET": SECRET.decode()}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "h3flow.cli",
            "receiver",
            "--store",
            str(store),
            "--bind",
            bind,
            "--secret-env",
            "H3FLOW_TEST_SECRET",
            "--min-free",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, proc.stderr.read() if proc.stderr else line
    return proc, int(line.split()[4].rsplit(":", 1)[1])


def stop_receiver_process(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=20)
    assert proc.returncode == 0, err
    assert "stopped" in out
    return err


def test_receiver_restarted_between_two_transfers(tmp_path: Path, latents: dict[str, FileRef]) -> None:
    """The real `h3flow receiver` process: stopped after one transfer, started again on the same port."""
    store = tmp_path / "store"
    proc, port = start_receiver_process(store, "127.0.0.1:0")
    dest = dest_for(("127.0.0.1", port), store)
    try:
        assert probe("127.0.0.1", port)
        first = send(latents["small"], dest)
    finally:
        log = stop_receiver_process(proc)
    assert f"stored {latents['small'].sha256[:12]}" in log
    with pytest.raises(TransientError, match=r"cannot connect to the latent receiver on decoder"):
        send(latents["other"], dest, timeout=2)
    proc, again = start_receiver_process(store, f"127.0.0.1:{port}")
    try:
        assert again == port
        wait_until(lambda: probe("127.0.0.1", port, timeout=1), what="the restarted receiver")
        second = send(latents["other"], dest)
        assert send(latents["small"], dest) == first  # still there, not sent again
    finally:
        stop_receiver_process(proc)
    for ref in (first, second):
        assert hashlib.sha256(ref.path.read_bytes()).hexdigest() == ref.sha256
    assert store_is_empty(LatentStore(store)) is False and list(LatentStore(store).tmp.iterdir()) == []


def test_a_damaged_object_is_reported_not_taken_for_the_latent(receiver: Receiver, latents: dict[str, FileRef]) -> None:
    ref = latents["small"]
    dest = dest_for(receiver.address, receiver.store.root)
    remote = send(ref, dest)
    with open(remote.path, "r+b") as handle:
        handle.truncate(ref.size // 2)
    with pytest.raises(H3FlowError, match=r"damaged.*store verify --quarantine"):
        send(ref, dest)
    receiver.store.verify(quarantine=True)
    assert send(ref, dest).size == ref.size
    assert hashlib.sha256(remote.path.read_bytes()).hexdigest() == ref.sha256


def test_a_store_short_of_its_reserve_is_a_resource_failure_that_says_so(
    tmp_path: Path, latents: dict[str, FileRef]
) -> None:
    """The disk has more free space than the latent needs, but not the receiver's reserve
    on top: the refusal is ``resource`` (never retried, never "your input") and names the
    reserve, so "0.8 MiB needed, 40 GiB free" is no longer a riddle (issue 23, point 5)."""
    store = tmp_path / "store"
    store.mkdir()
    reserve = shutil.disk_usage(store).free  # everything free is reserved: no latent fits
    ref = latents["small"]
    with Receiver(store, secret=SECRET, min_free=reserve) as rec:
        with pytest.raises(H3FlowError, match="out of space") as caught:
            send(ref, dest_for(rec.address, store))
        assert store_is_empty(rec.store)
    error = caught.value
    assert classify(error) is FailureKind.RESOURCE and not isinstance(error, TransientError)
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    text = str(error)
    assert text.startswith(f"the latent receiver on decoder ({rec.address[0]}:{rec.address[1]}) is out of space:")
    assert f"the latent needs {ref.size / 2**20:.1f} MiB" in text
    assert f"the receiver keeps {reserve / 2**20:.1f} MiB free (--min-free)" in text
    assert text.endswith("free space there and `h3flow resume`") and "\n" not in text
    again = pickle.loads(pickle.dumps(error))  # a Prefect result round trip keeps kind and message
    assert type(again) is type(error) and str(again) == text and classify(again) is FailureKind.RESOURCE


@pytest.mark.parametrize("bind", ["0.0.0.0", "::", "0"])
def test_the_receiver_never_listens_on_every_interface(tmp_path: Path, bind: str) -> None:
    """Whatever the config or the command line says (issue 23, point 3): 0.0.0.0, :: and
    the resolver's "0" are refused, and nothing is left listening."""
    with pytest.raises(H3FlowError, match="will not listen on every interface"):
        Receiver(tmp_path / "store", bind, 0, secret=SECRET)


def test_the_receiver_command_refuses_every_interface_in_one_line(tmp_path: Path) -> None:
    env = {**os.environ, SECRET_ENV: SECRET.decode()}
    store = str(tmp_path / "store")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "h3flow.cli",
            "receiver",
            "--store",
            store,
            "--bind",
            "0.0.0.0:0",
            "--secret-env",
            SECRET_ENV,
        ],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=60,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith("error: receiver will not listen on every interface")
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
