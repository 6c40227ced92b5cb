"""Latent transfer benchmark: tcp / sftp / local against a raw socket copy of the same bytes.

    .venv/bin/python bench/transfer.py [--repeat 11] [--no-netns]

For an SD-sized (~4.3 MB) and an HD-sized (~13 MB) latent it prints, per method, the
median wall time of one complete transfer *including verification* (connect, auth,
stream, SHA-256 on both ends, fsync, link into the store), its MB/s, and the ratio of
the raw copy's time to the method's (1.0 = as fast as the wire allows). The raw copy is
connect + sendfile + one-byte acknowledgement to a sink that discards the bytes: the
physical limit of the path, measured in the same run, interleaved with the method's
runs so machine load hits both alike. "raw+disk" is the same copy written to a file and
fsynced on arrival: what any durable receiver pays for the store's disk; "tcp-ram" is
the receiver with its store on tmpfs (/dev/shm): the protocol's cost without the disk.

Paths: loopback (receiver and sshd in separate processes on 127.0.0.1) and, when this
runs as root with network namespaces, a veth pair into a namespace shaped to 10 Gbit/s
(tc tbf) with 0.15 ms one-way delay (tc netem) where the kernel has netem; the design's
10 GbE link. Goals: tcp >= 0.70 of raw; under 30 ms per latent on the shaped link.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the real-sshd helper

import torch

from h3flow.core.files import FileRef
from h3flow.core.specs import frames_for_seconds, get_spec
from h3flow.handoff.destination import Destination
from h3flow.handoff.format import H3Latent, save_latent
from h3flow.handoff.store import LatentStore
from h3flow.handoff.transfer import send

SECRET = b"bench-secret-0123456789abcdef"
MEMORY_DISK = "/dev/shm"  # tmpfs: fsync costs nothing there
DELAY_MS = 0.15
RATE = "10gbit"

# A raw sink: accept, read to EOF (discarding, or into an fsynced file), answer one byte.
SINK = r"""
import os, socket, sys
host, mode, folder = sys.argv[1], sys.argv[2], sys.argv[3]
srv = socket.socket(socket.AF_INET); srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((host, 0)); srv.listen(8); print(srv.getsockname()[1], flush=True)
buf = memoryview(bytearray(1 << 20))
while True:
    conn, _ = srv.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    fd = os.open(os.path.join(folder, "sink.bin"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC) if mode == "disk" else None
    while n := conn.recv_into(buf):
        if fd is not None:
            os.write(fd, buf[:n])
    if fd is not None:
        os.fsync(fd); os.close(fd)
    conn.sendall(b"k"); conn.close()
"""


def make_latent(folder: Path, spec_name: str) -> FileRef:
    """A 5-second latent of the spec's real shape (float32, random: incompressible)."""
    spec = get_spec(spec_name)
    frames = frames_for_seconds(5)
    gen = torch.Generator().manual_seed(7)
    latent = H3Latent(
        torch.randn(spec.video_shape(frames), generator=gen),
        torch.randn(spec.audio_shape(frames), generator=gen),
        {"clip_id": f"bench-{spec_name}", "seed": "7", "spec": spec_name, "frames": str(frames)},
    )
    path = folder / f"{spec_name}.h3latent"
    sha = save_latent(path, latent)
    return FileRef(path, sha, path.stat().st_size)


def raw_copy(ref: FileRef, address: str, port: int) -> None:
    with socket.create_connection((address, port)) as sock, open(ref.path, "rb") as handle:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendfile(handle)
        sock.shutdown(socket.SHUT_WR)
        if sock.recv(1) != b"k":
            raise RuntimeError("raw sink did not acknowledge")


def median_ms(samples: list[float]) -> float:
    return 1000 * statistics.median(samples)


class Bench:
    """Runs of every method against one path (addresses reachable from this process)."""

    def __init__(self, name: str, address: str, wrap: tuple[str, ...], work: Path, repeat: int) -> None:
        self.name, self.address, self.wrap, self.work, self.repeat = name, address, wrap, work, repeat
        self.processes: list[subprocess.Popen[str]] = []
        self.results: dict[tuple[str, str], tuple[float, float]] = {}  # (latent, method) -> (ms, raw ratio)
        self.sshd: Any = None
        self.stores: list[Path] = []

    def spawn(self, argv: list[str], pattern: str = "") -> str:
        """Start a server process; return the first stdout line that contains ``pattern``."""
        proc = subprocess.Popen(
            [*self.wrap, *argv], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, cwd=ROOT
        )
        self.processes.append(proc)
        assert proc.stdout is not None
        while line := proc.stdout.readline():
            if pattern in line:
                return line.strip()
        raise RuntimeError(f"{argv[:3]} exited before it was ready")

    def close(self) -> None:
        if self.sshd is not None:
            self.sshd.stop()
        for proc in self.processes:
            proc.terminate()
        for proc in self.processes:
            proc.wait(timeout=10)
        for store in self.stores:
            shutil.rmtree(store, ignore_errors=True)

    def run(self, latents: dict[str, FileRef], methods: list[str]) -> None:
        raw_port = int(self.spawn([sys.executable, "-c", SINK, self.address, "null", str(self.work)]))
        disk_port = int(self.spawn([sys.executable, "-c", SINK, self.address, "disk", str(self.work)]))
        dests = {"tcp": self._receiver(self.work / f"store-{self.name}")}
        if Path(MEMORY_DISK).is_dir():  # the same receiver with its store in RAM: the cost without the disk
            dests["tcp-ram"] = self._receiver(Path(MEMORY_DISK) / f"{self.work.name}-{self.name}")
        if "local" in methods:
            dests["local"] = Destination("local", self.name, "", 0, None, self.work / "store-local", None)
        if "sftp" in methods:
            reason = self._start_sshd()
            if reason:
                print(f"  sftp skipped: {reason}")
            else:
                dests["sftp"] = Destination(
                    "sftp", self.name, "", 0, "bench", self.work / f"store-sftp-{self.name}", None, self.sshd.config
                )
        print(f"\n== {self.name} ==")
        print(f"  {'latent':<6} {'method':<9} {'median ms':>10} {'MB/s':>8} {'raw/method':>11} {'raw+disk/method':>16}")
        for spec_name, ref in latents.items():
            mb = ref.size / 1e6
            raw = self._time(lambda ref=ref: raw_copy(ref, self.address, raw_port))
            rows: list[tuple[str, list[float]]] = [("raw", raw)]
            rows.append(("raw+disk", self._time(lambda ref=ref: raw_copy(ref, self.address, disk_port))))
            for method, dest in dests.items():
                target = LatentStore(dest.store_root)

                def once(dest: Destination = dest, ref: FileRef = ref) -> None:
                    out = send(ref, dest, timeout=30)
                    assert out.sha256 == ref.sha256

                rows.append(
                    (
                        method,
                        self._time(
                            once,
                            reset=lambda t=target: t.gc(set()),
                            interleave=lambda ref=ref: raw_copy(ref, self.address, raw_port),
                            interleaved=raw,
                        ),
                    )
                )
            base, durable = median_ms(raw), median_ms(rows[1][1])
            for method, samples in rows:
                ms = median_ms(samples)
                print(
                    f"  {spec_name:<6} {method:<9} {ms:>10.2f} {mb / ms * 1000:>8.0f} {base / ms:>11.2f} "
                    f"{durable / ms:>16.2f}"
                )
                self.results[(spec_name, method)] = (ms, base / ms)
            sys.stdout.flush()

    def _receiver(self, store: Path) -> Destination:
        line = self.spawn(
            [
                sys.executable,
                "-m",
                "h3flow.cli",
                "receiver",
                "--store",
                str(store),
                "--bind",
                f"{self.address}:0",
                "--secret-env",
                "H3FLOW_BENCH_SECRET",
                "--min-free",
                "0",
            ],
            "listening on",
        )
        self.stores.append(store)
        port = int(line.split()[4].rsplit(":", 1)[1])
        return Destination("tcp", self.name, self.address, port, None, store, SECRET)

    def _time(
        self,
        action: Callable[[], None],
        reset: Callable[[], object] | None = None,
        interleave: Callable[[], None] | None = None,
        interleaved: list[float] | None = None,
    ) -> list[float]:
        samples = []
        action()  # warm-up: page cache, first connection, imports
        for _ in range(self.repeat):
            if reset:
                reset()
            start = time.perf_counter()
            action()
            samples.append(time.perf_counter() - start)
            if interleave is not None and interleaved is not None:
                start = time.perf_counter()
                interleave()
                interleaved.append(time.perf_counter() - start)
        return samples

    def _start_sshd(self) -> str | None:
        from sshd import sshd_unavailable, start_sshd

        reason = sshd_unavailable()
        if reason:
            return reason
        self.sshd = start_sshd(self.work / f"sshd-{self.name}", alias="bench", host=self.address, wrap=self.wrap)
        return None


# --------------------------------------------------------------------------- network namespace
class ShapedLink:
    """A veth pair from this namespace into a new one, shaped like the design's 10 GbE link."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 100000}"
        self.ns, self.here, self.there = f"h3bench{tag}", f"h3b{tag}a", f"h3b{tag}b"
        self.address, self.local = "10.203.77.2", "10.203.77.1"
        self.notes: list[str] = []

    def unavailable(self) -> str | None:
        if os.geteuid() != 0:
            return "needs root (network namespaces)"
        if not shutil.which("ip") or not shutil.which("tc"):
            return "needs iproute2 (ip, tc)"
        return None

    def up(self) -> None:
        ns = ["ip", "netns", "exec", self.ns]
        for argv in (
            ["ip", "netns", "add", self.ns],
            ["ip", "link", "add", self.here, "type", "veth", "peer", "name", self.there],
            ["ip", "link", "set", self.there, "netns", self.ns],
            ["ip", "addr", "add", f"{self.local}/30", "dev", self.here],
            ["ip", "link", "set", self.here, "up"],
            [*ns, "ip", "addr", "add", f"{self.address}/30", "dev", self.there],
            [*ns, "ip", "link", "set", self.there, "up"],
            [*ns, "ip", "link", "set", "lo", "up"],
        ):
            subprocess.run(argv, check=True, capture_output=True, text=True)
        for prefix, dev in (((), self.here), (tuple(ns), self.there)):
            delayed = subprocess.run(
                [*prefix, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "delay", f"{DELAY_MS}ms"],
                capture_output=True,
                text=True,
            )
            parent = ["parent", "1:1"] if delayed.returncode == 0 else ["root"]
            subprocess.run(
                [
                    *prefix,
                    "tc",
                    "qdisc",
                    "add",
                    "dev",
                    dev,
                    *parent,
                    "handle",
                    "10:",
                    "tbf",
                    "rate",
                    RATE,
                    "burst",
                    "256kb",
                    "latency",
                    "5ms",
                ],
                check=True,
                capture_output=True,
                text=True,
            )
            if delayed.returncode != 0 and not self.notes:
                self.notes.append(
                    f"netem unavailable ({delayed.stderr.strip()}): shaped to {RATE} without the "
                    f"{DELAY_MS} ms delay; each extra round trip would add {2 * DELAY_MS:.2f} ms"
                )

    def down(self) -> None:
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.here], capture_output=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=11, help="timed runs per method and size (median reported)")
    parser.add_argument("--no-netns", action="store_true", help="skip the shaped veth path")
    parser.add_argument("--methods", default="tcp,sftp,local", help="comma-separated: tcp,sftp,local")
    args = parser.parse_args()
    methods = args.methods.split(",")
    os.environ["H3FLOW_BENCH_SECRET"] = SECRET.decode()
    work = Path(tempfile.mkdtemp(prefix="h3flow-bench-"))
    print(f"cpus {os.cpu_count()}  load {os.getloadavg()[0]:.2f}  repeat {args.repeat}  work {work}")
    try:
        latents = {name: make_latent(work, name) for name in ("sd", "hd")}
        for name, ref in latents.items():
            print(f"{name}: {ref.size / 1e6:.2f} MB  sha256 {ref.sha256[:16]}…")
        bench = Bench("loopback", "127.0.0.1", (), work, args.repeat)
        try:
            bench.run(latents, methods)
        finally:
            bench.close()
        link = ShapedLink()
        reason = "--no-netns" if args.no_netns else link.unavailable()
        if reason:
            print(f"\nshaped veth path skipped: {reason}")
            return
        try:
            link.up()
            for note in link.notes:
                print(f"\nnote: {note}")
            shaped = Bench(f"veth-{RATE}", link.address, ("ip", "netns", "exec", link.ns), work, args.repeat)
            try:
                shaped.run(latents, [m for m in methods if m != "local"])
            finally:
                shaped.close()
            if ("hd", "tcp") in shaped.results:
                ms, ratio = shaped.results[("hd", "tcp")]
                print(
                    f"\ngoals on the shaped link, HD latent over tcp: {ms:.1f} ms (goal < 30 ms; the design's "
                    f"scp/socket figure: 500-900 ms), {ratio:.2f} of raw (goal >= 0.70)"
                )
        except subprocess.CalledProcessError as exc:
            print(f"\nshaped veth path skipped: {' '.join(exc.cmd)} failed: {exc.stderr.strip()}")
        finally:
            link.down()
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
