"""The ``tcp`` transfer: a small framed protocol between a sender and a receiver service.

Why not scp: the latent is already named by its SHA-256, so a purpose-built receiver can
refuse anything that is not a content address, skip a transfer it already has, hash
while it writes (no second pass over the file), and link the object into the store
only when the hash matches. The whole exchange is a handful of round trips plus the
bytes, which on the design's 10 GbE link is a few milliseconds.

Wire format: every message is a 4-byte big-endian length and a UTF-8 JSON object; the
only other thing on the wire is the raw body of a ``put``. ::

    receiver: {"proto": "h3flow-latent/1", "challenge": <hex>}
    sender:   {"op": "ping"}                                   -> {"ok": true, "pong": true}
    sender:   {"op": "auth", "challenge": <hex>, "mac": <hex>} -> {"ok": true, "mac": <hex>}
    sender:   {"op": "has", "sha256": <hex>}                   -> {"ok": true, "have": bool}
    sender:   {"op": "put", "sha256": <hex>, "size": N}        -> {"ok": true, "have": true}
                                                               |  {"ok": true, "send": true}
              <N raw bytes>                                    -> {"ok": true, "stored": true}
    any failure                                                -> {"ok": false, "kind": K, "error": ...}

Authentication is mutual HMAC-SHA256 over both fresh challenges, so neither side can
be replayed and the sender never streams a latent to an impostor. The bytes themselves
are not encrypted (a direct link between the lab's hosts); their integrity comes from
the content address. ``ping`` is the only request allowed before ``auth``: it is the
supervisor's health probe (:func:`probe`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import queue
import socket
import socketserver
import struct
import threading
import time
from pathlib import Path
from typing import Any, TypeGuard

from h3flow.core.errors import H3FlowError, IntegrityError, TransientError, one_line
from h3flow.core.files import FileRef
from h3flow.core.fsutil import CHUNK, sha256_file
from h3flow.handoff.destination import Destination, local_size, os_reason
from h3flow.handoff.store import LatentStore, check_sha256, object_relpath

PROTO = "h3flow-latent/1"
MAX_FRAME = 64 * 1024
DEFAULT_MAX_BYTES = 1 << 30  # an HD latent is ~13 MB; anything near 1 GiB is a mistake
HEADROOM = 16 << 20  # keep this much free on the store's filesystem
_BUFFERS = 6  # receive buffers of CHUNK bytes in flight between the receiving and hashing threads
_WRITEBACK = 4 << 20  # start the disk writeback every this many bytes
_CLIENT_TAG = b"h3flow-latent/1 client\0"
_SERVER_TAG = b"h3flow-latent/1 server\0"

log = logging.getLogger("h3flow.receiver")
_sync_file_range: Any = None  # libc's, loaded on first use (False where unavailable)


class CorruptedInFlight(IntegrityError, TransientError):
    """The receiver hashed different bytes than the sender sent: worth a retry."""


class ProtocolError(Exception):
    """The peer broke the framing (not an h3flow peer, or a damaged stream)."""


# --------------------------------------------------------------------------- framing
def send_frames(sock: socket.socket, *messages: dict[str, Any]) -> None:
    """Send messages in one write (pipelining saves round trips)."""
    out = bytearray()
    for message in messages:
        data = json.dumps(message, separators=(",", ":")).encode()
        out += struct.pack(">I", len(data)) + data
    sock.sendall(out)


def recv_frame(sock: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack(">I", _recv_exact(sock, 4))
    if length > MAX_FRAME:
        raise ProtocolError(f"frame of {length} bytes exceeds {MAX_FRAME}")
    try:
        message = json.loads(_recv_exact(sock, length))
    except ValueError:
        raise ProtocolError("frame is not JSON") from None
    if not isinstance(message, dict):
        raise ProtocolError("frame is not a JSON object")
    return message


def _recv_exact(sock: socket.socket, count: int) -> bytes:
    buf = bytearray(count)
    view = memoryview(buf)
    got = 0
    while got < count:
        n = sock.recv_into(view[got:])
        if n == 0:
            raise ConnectionError("connection closed by peer")
        got += n
    return bytes(buf)


def _mac(secret: bytes, tag: bytes, first: bytes, second: bytes) -> str:
    return hmac.new(secret, tag + first + second, hashlib.sha256).hexdigest()


def _mac_matches(claimed: Any, expected: str) -> bool:
    """Constant-time comparison that also survives a peer sending a non-string or non-ASCII MAC."""
    return isinstance(claimed, str) and hmac.compare_digest(claimed.encode(), expected.encode())


def _from_hex(value: Any, size: int) -> bytes | None:
    if not isinstance(value, str) or len(value) != 2 * size:
        return None
    try:
        return bytes.fromhex(value)
    except ValueError:
        return None


def _nodelay(sock: socket.socket) -> None:
    # Small request/response frames must not wait for Nagle + delayed ACK (~40 ms each).
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# --------------------------------------------------------------------------- receiver
class Receiver:
    """The receiver service: accepts authenticated ``put``s into one :class:`LatentStore`.

    Run it with :meth:`serve_forever` (the CLI's ``h3flow receiver``) or in the
    background with :meth:`start` / :meth:`stop` (tests, benchmarks).
    """

    def __init__(
        self,
        store_root: Path,
        host: str = "127.0.0.1",
        port: int = 0,
        *,
        secret: bytes,
        max_bytes: int = DEFAULT_MAX_BYTES,
        min_free: int = HEADROOM,
        idle_timeout: float = 60.0,
    ) -> None:
        if not secret:
            raise H3FlowError("the latent receiver needs a shared secret (--secret-env or --secret-file)")
        self.store = LatentStore(store_root)
        self.store.tmp.mkdir(parents=True, exist_ok=True)
        self.secret = secret
        self.max_bytes = max_bytes
        self.min_free = min_free
        self.idle_timeout = idle_timeout
        self._reserved = 0
        self._lock = threading.Lock()
        self._connections: set[socket.socket] = set()
        self._thread: threading.Thread | None = None
        try:
            self._server = _Server((host, port), self)
        except OSError as exc:
            raise H3FlowError(f"receiver cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        except (UnicodeError, ValueError) as exc:  # an address the resolver cannot even encode
            raise H3FlowError(f"receiver cannot listen on {host!r}: {exc}") from None
        bound = self.address[0]
        if ipaddress.ip_address(bound.split("%")[0]).is_unspecified:  # also "0" or a name that resolves to 0.0.0.0
            self._server.server_close()
            raise H3FlowError(
                f"receiver will not listen on every interface ({host!r} is {bound}): bind the decoder "
                "host's own address on the link"
            )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def serve_forever(self) -> None:
        try:
            self._server.serve_forever(poll_interval=0.05)
        finally:
            self._close()

    def start(self) -> Receiver:
        self._thread = threading.Thread(target=self.serve_forever, name="h3flow-receiver", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop accepting, cut open connections (their temp files are removed), wait for handlers."""
        self._server.shutdown()
        if self._thread is not None:
            self._thread.join()

    def request_stop(self) -> None:
        """Make :meth:`serve_forever` return soon; safe from a signal handler in its own thread."""
        threading.Thread(target=self._server.shutdown, daemon=True).start()

    def _close(self) -> None:
        with self._lock:
            for conn in list(self._connections):
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        self._server.server_close()

    def __enter__(self) -> Receiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- one connection
    def handle(self, sock: socket.socket, peer: str) -> None:
        sock.settimeout(self.idle_timeout)
        _nodelay(sock)
        challenge = os.urandom(32)
        send_frames(sock, {"proto": PROTO, "challenge": challenge.hex()})
        authenticated = False
        while True:
            try:
                msg = recv_frame(sock)
            except ConnectionError:
                return
            op = msg.get("op")
            if op == "ping":
                send_frames(sock, {"ok": True, "pong": True, "proto": PROTO})
            elif op == "auth":
                theirs = _from_hex(msg.get("challenge"), 32)
                if theirs is None or not _mac_matches(
                    msg.get("mac"), _mac(self.secret, _CLIENT_TAG, challenge, theirs)
                ):
                    log.warning("refused %s: authentication failed", peer)
                    self._refuse(sock, "auth", "authentication failed")
                    return
                authenticated = True
                send_frames(sock, {"ok": True, "mac": _mac(self.secret, _SERVER_TAG, theirs, challenge)})
            elif not authenticated:
                log.warning("refused %s: %r before authentication", peer, op)
                self._refuse(sock, "auth", "authenticate first")
                return
            elif op == "has":
                sha = msg.get("sha256")
                if not _is_sha(sha):
                    self._refuse(sock, "bad_request", "sha256 must be a lowercase hex SHA-256")
                    return
                send_frames(sock, {"ok": True, "have": self.store.has(sha)})
            elif op == "put":
                if not self._put(sock, msg, peer):
                    return
            else:
                self._refuse(sock, "bad_request", f"unknown op {str(op)[:40]!r}")
                return

    def _refuse(self, sock: socket.socket, kind: str, error: str) -> None:
        """Answer, then close without a reset: drain what the peer already pipelined."""
        with contextlib.suppress(OSError):
            send_frames(sock, {"ok": False, "kind": kind, "error": error})
            sock.shutdown(socket.SHUT_WR)
            sock.settimeout(1.0)
            drained = 0
            while drained < MAX_FRAME and (n := len(sock.recv(65536))):
                drained += n

    def _put(self, sock: socket.socket, msg: dict[str, Any], peer: str) -> bool:
        """One upload; returns whether the connection may carry another request."""
        sha, size = msg.get("sha256"), msg.get("size")
        if not _is_sha(sha) or not isinstance(size, int) or isinstance(size, bool) or size < 0:
            self._refuse(sock, "bad_request", "put needs a lowercase hex sha256 and a size")
            return False
        if size > self.max_bytes:
            log.warning("refused %s from %s: %d bytes > limit %d", sha[:12], peer, size, self.max_bytes)
            send_frames(
                sock,
                {
                    "ok": False,
                    "kind": "too_large",
                    "error": f"{size} bytes exceeds the receiver's limit of {self.max_bytes}",
                },
            )
            return True
        if self.store.has(sha):
            present = self.store.path_for(sha).stat().st_size
            if present == size:
                send_frames(sock, {"ok": True, "have": True})
            else:
                send_frames(
                    sock,
                    {
                        "ok": False,
                        "kind": "store_error",
                        "error": f"the stored object is {present} "
                        f"bytes, not {size}: damaged; run `h3flow store verify --quarantine` there",
                    },
                )
            return True
        with self._reservation(size) as free:
            if free is not None:
                log.warning(
                    "refused %s from %s: disk full (%d bytes free, %d kept)", sha[:12], peer, free, self.min_free
                )
                send_frames(
                    sock,
                    {
                        "ok": False,
                        "kind": "disk_full",
                        "error": room_needed(size, free, self.min_free),
                        "needed": size,
                        "free": free,
                        "reserve": self.min_free,
                    },
                )
                return True
            send_frames(sock, {"ok": True, "send": True})
            started = time.perf_counter()
            reply = self._receive_into_store(sock, sha, size, peer)
        # The temp file is gone before the answer leaves: a sender never sees a partial file.
        if reply is None:
            log.info(
                "stored %s (%d bytes) from %s in %.1f ms", sha[:12], size, peer, 1000 * (time.perf_counter() - started)
            )
            reply = {"ok": True, "stored": True}
        send_frames(sock, reply)
        return True

    def _receive_into_store(self, sock: socket.socket, sha: str, size: int, peer: str) -> dict[str, Any] | None:
        """Stream the body into a temp file and link it into the store; None on success,
        else the refusal to send back."""
        with self.store.temp_file(sha[:16]) as (handle, temp):
            actual, write_error = _receive_body(sock, handle.fileno(), size)
            if write_error is None and actual != sha:
                log.warning("rejected %s from %s: bytes hash to %s", sha[:12], peer, actual[:12])
                return {
                    "ok": False,
                    "kind": "integrity",
                    "got": actual,
                    "error": f"received bytes hash to {actual}, not {sha}",
                }
            try:
                if write_error is not None:
                    raise write_error
                os.fsync(handle.fileno())
                self.store.commit(temp, sha)
            except OSError as exc:
                log.warning("failed %s from %s: %s", sha[:12], peer, exc)
                kind = "disk_full" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else "store_error"
                return {"ok": False, "kind": kind, "error": f"writing the latent failed: {exc.strerror or exc}"}
        return None

    @contextlib.contextmanager
    def _reservation(self, size: int) -> Any:
        """Claim space for one upload, counting concurrent uploads; yields the free bytes if short."""
        with self._lock:
            free = self.store.free_bytes() - self._reserved
            short = free < size + self.min_free
            if not short:
                self._reserved += size
        try:
            yield max(free, 0) if short else None
        finally:
            if not short:
                with self._lock:
                    self._reserved -= size

    def _track(self, sock: socket.socket, add: bool) -> None:
        with self._lock:
            (self._connections.add if add else self._connections.discard)(sock)


def _receive_body(sock: socket.socket, fd: int, size: int) -> tuple[str, OSError | None]:
    """Read exactly ``size`` bytes into ``fd``; return their SHA-256 and any write error.

    Two threads: this one receives and writes (and starts the disk writeback early, so
    the final fsync has little left to wait for), a second one hashes the same buffers,
    so hashing overlaps the network and the disk. A write error (disk full) does not
    stop the reading: the rest of the body is drained and the sender gets a clear answer
    instead of a reset connection.
    """
    digest = hashlib.sha256()
    buffers = [memoryview(bytearray(min(CHUNK, size))) for _ in range(min(_BUFFERS, -(-size // CHUNK)))]
    free: queue.SimpleQueue[int] = queue.SimpleQueue()
    ready: queue.SimpleQueue[tuple[int, int] | None] = queue.SimpleQueue()
    for index in range(len(buffers)):
        free.put(index)

    def hash_buffers() -> None:
        while (item := ready.get()) is not None:
            digest.update(buffers[item[0]][: item[1]])
            free.put(item[0])

    hasher = threading.Thread(target=hash_buffers, name="h3flow-recv-hash", daemon=True)
    hasher.start()
    write_error: OSError | None = None
    offset = flushed = 0
    try:
        while offset < size:
            index = free.get()
            n = sock.recv_into(buffers[index], min(CHUNK, size - offset), socket.MSG_WAITALL)
            if n == 0:
                raise ConnectionError("sender closed the connection mid-stream")
            if write_error is None:
                try:
                    chunk = buffers[index][:n]
                    while chunk:
                        chunk = chunk[os.write(fd, chunk) :]
                except OSError as exc:
                    write_error = exc
            ready.put((index, n))
            offset += n
            if write_error is None and offset - flushed >= _WRITEBACK:
                _start_writeback(fd, flushed, offset - flushed)
                flushed = offset
    finally:
        ready.put(None)
        hasher.join()
    return digest.hexdigest(), write_error


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask Linux to start writing a range to disk now (sync_file_range, asynchronous),
    so the fsync at the end waits for the tail only. A no-op where unavailable."""
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = _load_sync_file_range()
    if _sync_file_range:
        _sync_file_range(fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE


def _load_sync_file_range() -> Any:
    import ctypes
    import ctypes.util

    try:
        func = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return False
    func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    func.restype = ctypes.c_int
    return func


def _is_sha(value: Any) -> TypeGuard[str]:
    try:
        check_sha256(value)
    except H3FlowError:
        return False
    return True


class _Handler(socketserver.BaseRequestHandler):
    server: _Server

    def handle(self) -> None:
        receiver = self.server.receiver
        receiver._track(self.request, True)
        try:
            receiver.handle(self.request, f"{self.client_address[0]}:{self.client_address[1]}")
        except (OSError, ProtocolError) as exc:  # a peer that vanished or spoke nonsense
            log.info("connection from %s ended: %s", self.client_address[0], exc)
        finally:
            receiver._track(self.request, False)


class _Server(socketserver.ThreadingTCPServer):
    allow_reuse_address = True
    daemon_threads = False
    block_on_close = True  # server_close() waits for handlers, so temp files are cleaned up

    def __init__(self, address: tuple[str, int], receiver: Receiver) -> None:
        self.address_family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
        self.receiver = receiver
        super().__init__(address, _Handler)


# --------------------------------------------------------------------------- sender
def probe(address: str, port: int, timeout: float = 2.0) -> bool:
    """True when an h3flow latent receiver answers ``ping`` at ``address:port``."""
    try:
        with socket.create_connection((address, port), timeout=timeout) as sock:
            _nodelay(sock)
            if recv_frame(sock).get("proto") != PROTO:
                return False
            send_frames(sock, {"op": "ping"})
            return recv_frame(sock).get("pong") is True
    except (OSError, ProtocolError, struct.error):
        return False


def tcp_send(ref: FileRef, dest: Destination, timeout: float = 60.0) -> FileRef:
    """Stream ``ref`` to the receiver named by ``dest``; return the verified remote object."""
    where = f"latent receiver on {dest.host} ({dest.address}:{dest.port})"
    if not dest.secret:
        raise H3FlowError(f"tcp transfer to {dest.host} needs the receiver's shared secret")
    check_sha256(ref.sha256)
    size = local_size(ref)
    try:
        sock = socket.create_connection((dest.address, dest.port), timeout=timeout)
    except OSError as exc:
        raise TransientError(f"cannot connect to the {where}: {os_reason(exc)}") from None
    try:
        with sock:
            _put(sock, ref, size, dest.secret, where)
    except H3FlowError:
        raise  # the receiver's answer, already explained (StoreFull is an OSError too)
    except (OSError, struct.error) as exc:
        raise TransientError(f"transfer of latent {ref.sha256[:12]} to the {where} failed: {os_reason(exc)}") from None
    except ProtocolError as exc:
        raise H3FlowError(f"the {where} does not speak {PROTO}: {exc}") from None
    return FileRef(Path(dest.store_root) / object_relpath(ref.sha256), ref.sha256, size)


def _put(sock: socket.socket, ref: FileRef, size: int, secret: bytes, where: str) -> None:
    _nodelay(sock)
    hello = recv_frame(sock)
    server_challenge = _from_hex(hello.get("challenge"), 32)
    if hello.get("proto") != PROTO or server_challenge is None:
        raise ProtocolError(f"unexpected greeting {str(hello)[:80]}")
    ours = os.urandom(32)
    send_frames(
        sock,
        {"op": "auth", "challenge": ours.hex(), "mac": _mac(secret, _CLIENT_TAG, server_challenge, ours)},
        {"op": "put", "sha256": ref.sha256, "size": size},
    )
    auth = recv_frame(sock)
    if not auth.get("ok"):
        raise H3FlowError(f"the {where} refused authentication ({auth.get('error')}): wrong shared secret?")
    if not _mac_matches(auth.get("mac"), _mac(secret, _SERVER_TAG, ours, server_challenge)):
        raise H3FlowError(f"the {where} did not prove the shared secret: not sending the latent")
    reply = recv_frame(sock)
    if reply.get("ok") and reply.get("have"):
        return
    if not reply.get("ok") or not reply.get("send"):
        raise _refusal(reply, where)
    sent_sha = _stream_file(sock, ref.path, size)
    final = recv_frame(sock)
    if sent_sha != ref.sha256:
        raise IntegrityError(
            f"local latent {ref.path} hashes to {sent_sha}, not {ref.sha256}: the {where} kept nothing"
        )
    if final.get("ok") and final.get("stored"):
        return
    if final.get("kind") == "integrity":
        raise CorruptedInFlight(
            f"the {where} received bytes hashing to {str(final.get('got'))[:16]}... "
            f"instead of {ref.sha256[:16]}...: corrupted in flight, nothing stored"
        )
    raise _refusal(final, where)


def _stream_file(sock: socket.socket, path: Path, size: int) -> str:
    """Send ``size`` bytes of ``path`` with sendfile (no copy through Python) while a
    second thread hashes the same file; return that hash."""
    result: dict[str, str | BaseException] = {}

    def hash_file() -> None:
        try:
            result["sha"] = sha256_file(path)
        except OSError as exc:
            result["error"] = exc

    hasher = threading.Thread(target=hash_file, name="h3flow-send-hash", daemon=True)
    hasher.start()
    try:
        with open(path, "rb") as handle:
            sent = sock.sendfile(handle, 0, size)
    finally:
        hasher.join()
    if "error" in result:
        raise H3FlowError(f"cannot read latent {path}: {result['error']}")
    if sent != size:
        raise IntegrityError(f"latent {path} shrank while it was being sent ({sent} of {size} bytes)")
    return str(result["sha"])


def _mib(size: int) -> str:
    return f"{size / 2**20:.1f} MiB"


def room_needed(size: int, free: int, reserve: int) -> str:
    """Why a store has no room, with every number: the latent, the receiver's free-space
    reserve (``--min-free``, 16 MiB by default) and what is free."""
    return (
        f"the latent needs {_mib(size)} and the receiver keeps {_mib(reserve)} free (--min-free), "
        f"but {_mib(free)} is free"
    )


class StoreFull(H3FlowError, OSError):
    """The decoder's store has no room for a latent: a ``resource`` failure (an OSError
    with ENOSPC, so the pipeline never retries it; like :class:`WriteError`), whose
    message names the receiver, the numbers and the fix."""

    def __init__(self, where: str, why: str) -> None:
        message = one_line(f"the {where} is out of space: {why}: free space there and `h3flow resume`")
        OSError.__init__(self, errno.ENOSPC, message)
        self.details = []
        self.where, self.why, self.message = where, why, message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> tuple[type[StoreFull], tuple[str, str]]:  # pickles (Prefect results) round-trip
        return StoreFull, (self.where, self.why)


def _refusal(reply: dict[str, Any], where: str) -> H3FlowError:
    kind, error = reply.get("kind", "error"), str(reply.get("error", "no reason given"))[:300]
    if kind == "auth":
        return H3FlowError(f"the {where} refused the request: {error} (wrong shared secret?)")
    if kind == "disk_full":
        numbers = [reply.get(k) for k in ("needed", "free", "reserve")]
        if all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
            return StoreFull(where, room_needed(*numbers))  # type: ignore[arg-type]
        return StoreFull(where, error)  # a receiver that ran out while writing (or an older one)
    return H3FlowError(f"the {where} refused the latent ({kind}): {error}")
