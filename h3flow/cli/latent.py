"""What the handoff's operator commands do (``h3flow latent|transfer|receiver|store``).

The typer wrappers in :mod:`h3flow.cli` only parse options; the work and the output
are here, so the CLI module stays an index of commands.
"""

from __future__ import annotations

import json
import logging
import re
import signal
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.text import Text

from h3flow.cli.base import (
    LATENTS,
    app,
    console,
    fold_table,
    latent_app,
    operator_command,
    print_json,
    print_table,
    store_app,
)
from h3flow.core.errors import ConfigError, H3FlowError, IntegrityError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file

app.add_typer(latent_app, name="latent", rich_help_panel=LATENTS)
app.add_typer(store_app, name="store", rich_help_panel=LATENTS)

_SHA_IN_TEXT = re.compile(r"(?<![0-9a-f])[0-9a-f]{64}(?![0-9a-f])")


def inspect_latent(file: Path, as_json: bool = False) -> None:
    """Shapes, dtypes, metadata and SHA-256 of a latent file (header only: no tensor loaded)."""
    from h3flow.handoff.format import DTYPES, latent_kind, read_header

    header = read_header(file)
    sha, size = sha256_file(file), file.stat().st_size
    meta = header["__metadata__"]
    tensors = {
        name: {
            "dtype": DTYPES[e["dtype"]][1],
            "shape": e["shape"],
            "bytes": e["data_offsets"][1] - e["data_offsets"][0],
        }
        for name, e in header.items()
        if name != "__metadata__"
    }
    if as_json:
        print(
            json.dumps(
                {
                    "path": str(file),
                    "sha256": sha,
                    "size": size,
                    "kind": latent_kind(header),
                    "tensors": tensors,
                    "metadata": meta,
                },
                indent=2,
                sort_keys=True,
            )
        )
        return
    table = fold_table("tensor", "dtype", "shape", "bytes", title=f"{file} ({latent_kind(header)})", right=("bytes",))
    for name, info in tensors.items():
        table.add_row(
            Text(name), info["dtype"], Text("[" + ", ".join(map(str, info["shape"])) + "]"), f"{info['bytes']:,}"
        )
    print_table(table, short=("dtype", "bytes"))
    if meta:
        details = fold_table("key", "value", title="metadata")
        for key in sorted(meta):  # a long value is elided on purpose: --json has it whole
            details.add_row(Text(key), Text(meta[key] if len(meta[key]) <= 200 else meta[key][:200] + "…"))
        print_table(details)
    console.print(f"sha256 {sha}  size {size:,} bytes")


def verify_latent(file: Path, sha256: str | None = None) -> None:
    """Load the latent with full checks (and its hash when given); one ``ok`` line or an error."""
    from h3flow.handoff.format import load_latent
    from h3flow.handoff.store import check_sha256

    if sha256 is not None:
        sha256 = check_sha256(sha256.lower())
    latent = load_latent(file, expected_sha256=sha256)
    shapes = f"video {list(latent.video.shape)}" + (
        f" audio {list(latent.audio.shape)}" if latent.audio is not None else ""
    )
    console.print(f"ok {file} {shapes} sha256 {sha256 or sha256_file(file)}", soft_wrap=True)


def transfer_file(
    file: Path,
    host: str,
    *,
    method: str,
    address: str | None,
    port: int | None,
    store_root: Path | None,
    ssh_alias: str | None,
    ssh_config: Path | None,
    secret_env: str | None,
    secret_file: Path | None,
    attempts: int,
    timeout: float,
) -> FileRef:
    """Hash ``file``, send it with retries, print where it landed."""
    from h3flow.handoff.transfer import destination_from_options, secret_from_options, send_with_retry

    secret = secret_from_options(secret_env, secret_file) if method == "tcp" else None
    dest = destination_from_options(
        host,
        method=method,
        store_root=store_root,
        address=address,
        port=port,
        ssh_alias=ssh_alias,
        ssh_config=ssh_config,
        secret=secret,
    )
    try:
        ref = FileRef(file, sha256_file(file), file.stat().st_size)
    except OSError as exc:
        raise H3FlowError(f"cannot read {file}: {exc.strerror or exc}") from None
    remote = send_with_retry(ref, dest, attempts=attempts, timeout=timeout)
    console.print(
        f"sent {file} → {host}:{remote.path} ({remote.size:,} bytes, sha256 {remote.sha256}, verified)", soft_wrap=True
    )
    return remote


def parse_bind(bind: str) -> tuple[str, int]:
    """``ADDR:PORT`` or ``[v6]:PORT`` → (address, port)."""
    address, sep, port = bind.rpartition(":")
    address = address.strip("[]")
    if not sep or not address or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ConfigError(f"--bind must be ADDR:PORT (e.g. 10.0.0.2:9410), not {bind!r}")
    return address, int(port)


def run_receiver(
    store: Path, bind: str, secret_env: str | None, secret_file: Path | None, max_bytes: int, min_free: int
) -> None:
    """The receiver service in the foreground until SIGTERM / SIGINT."""
    from h3flow.handoff.tcp import Receiver
    from h3flow.handoff.transfer import secret_from_options

    address, port = parse_bind(bind)
    secret = secret_from_options(secret_env, secret_file)
    if secret is None:
        raise ConfigError("the receiver needs the shared secret: --secret-env NAME or --secret-file FILE")
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(levelname)s %(message)s")
    receiver = Receiver(store, address, port, secret=secret, max_bytes=max_bytes, min_free=min_free)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: receiver.request_stop())
    host, real_port = receiver.address
    # One machine-readable line: supervisors and tests wait for it (and read the port when 0 was asked).
    print(f"h3flow receiver listening on {host}:{real_port} store={store}", flush=True)
    receiver.serve_forever()
    print("h3flow receiver stopped", flush=True)


def verify_store(store: Path, quarantine: bool, as_json: bool = False) -> None:
    from h3flow.handoff.store import LatentStore

    latents = LatentStore(store)
    if not latents.objects.is_dir():
        raise ConfigError(f"no latent store at {store} (no latents/ folder)")
    total = sum(1 for _ in latents)
    damaged = latents.verify(quarantine=quarantine)
    moved = f"; moved to {latents.root / 'latents-damaged'}" if quarantine and damaged else ""
    if as_json:
        print_json(
            {
                "store": str(store),
                "objects": total,
                "damaged": [{"object": item.path.name, "problem": item.problem} for item in damaged],
                "quarantined": bool(moved),
            }
        )
    elif damaged:
        table = fold_table("object", "problem", title=f"damaged objects in {store}")
        for item in damaged:
            table.add_row(Text(item.path.name), Text(item.problem))
        print_table(table)
    if damaged:
        raise IntegrityError(f"{len(damaged)} of {total} objects in {store} are damaged{moved}")
    if not as_json:
        console.print(Text(f"ok {total} objects in {store} verified"), soft_wrap=True)


def gc_store(store: Path, keep: list[str], keep_from: list[Path], dry_run: bool) -> list[str]:
    """Remove unreferenced objects; references are SHA-256s given or found in files (e.g. run manifests)."""
    from h3flow.handoff.store import LatentStore, check_sha256

    if not keep and not keep_from:
        raise ConfigError(
            "say what is still referenced (--keep SHA256 / --keep-from FILE): gc never empties a store by default"
        )
    referenced = {check_sha256(sha.lower()) for sha in keep}
    for source in keep_from:
        try:
            referenced |= set(_SHA_IN_TEXT.findall(source.read_text(errors="replace").lower()))
        except OSError as exc:
            raise ConfigError(f"cannot read {source}: {exc.strerror or exc}") from None
    removed = LatentStore(store).gc(referenced, dry_run=dry_run)
    verb = "would remove" if dry_run else "removed"
    for sha in removed:
        console.print(f"{verb} {sha}")
    console.print(f"{verb} {len(removed)} objects; {len(referenced)} references kept")
    return removed


@latent_app.command("inspect")
@operator_command
def latent_inspect(
    file: Annotated[Path, typer.Argument(help="An .h3latent (or a ComfyUI .latent).")],
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Shapes, dtype, metadata and SHA-256 of a latent file."""
    inspect_latent(file, as_json)


@latent_app.command("verify")
@operator_command
def latent_verify(
    file: Annotated[Path, typer.Argument(help="An .h3latent (or a ComfyUI .latent).")],
    sha256: Annotated[Optional[str], typer.Option(help="The SHA-256 the file must have.")] = None,
) -> None:
    """Check a latent file's structure and (optionally) its SHA-256."""
    verify_latent(file, sha256)


@app.command(rich_help_panel=LATENTS)
@operator_command
def transfer(
    file: Annotated[Path, typer.Argument(help="The latent file to send.")],
    to: Annotated[str, typer.Option("--to", help="Destination host name.")],
    method: Annotated[str, typer.Option(help="tcp | sftp | local.")] = "tcp",
    address: Annotated[
        Optional[str], typer.Option(help="tcp: the receiver's address (default: the host name).")
    ] = None,
    port: Annotated[Optional[int], typer.Option(help="tcp: the receiver's port.")] = None,
    store_root: Annotated[Optional[Path], typer.Option(help="The store root on the destination host.")] = None,
    ssh_alias: Annotated[Optional[str], typer.Option(help="sftp: SSH config alias (default: the host name).")] = None,
    ssh_config: Annotated[Optional[Path], typer.Option(help="sftp: SSH config file (default: ~/.ssh/config).")] = None,
    secret_env: Annotated[Optional[str], typer.Option(help="tcp: env variable holding the shared secret.")] = None,
    secret_file: Annotated[Optional[Path], typer.Option(help="tcp: file holding the shared secret.")] = None,
    attempts: Annotated[int, typer.Option(min=1, help="Tries for retryable failures.")] = 3,
    timeout: Annotated[float, typer.Option(help="Seconds without progress before giving up.")] = 60.0,
) -> None:
    """Send a latent to another host's store, verified by SHA-256 (tcp | sftp | local)."""
    transfer_file(
        file,
        to,
        method=method,
        address=address,
        port=port,
        store_root=store_root,
        ssh_alias=ssh_alias,
        ssh_config=ssh_config,
        secret_env=secret_env,
        secret_file=secret_file,
        attempts=attempts,
        timeout=timeout,
    )


@app.command(rich_help_panel=LATENTS)
@operator_command
def receiver(
    store: Annotated[Path, typer.Option(help="This host's store root.")],
    bind: Annotated[str, typer.Option(help="ADDR:PORT to listen on (port 0: any free port, printed).")],
    secret_env: Annotated[Optional[str], typer.Option(help="Env variable holding the shared secret.")] = None,
    secret_file: Annotated[Optional[Path], typer.Option(help="File holding the shared secret.")] = None,
    max_bytes: Annotated[int, typer.Option(min=1, help="Largest latent accepted.")] = 1 << 30,
    min_free: Annotated[int, typer.Option(min=0, help="Bytes to keep free on the store's disk.")] = 16 << 20,
) -> None:
    """Run the latent receiver service (tcp transfer) on a decoder host."""
    run_receiver(store, bind, secret_env, secret_file, max_bytes, min_free)


@store_app.command("verify")
@operator_command
def store_verify(
    store: Annotated[Path, typer.Option(help="The store root.")],
    quarantine: Annotated[bool, typer.Option(help="Move damaged objects aside so they can be sent again.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Machine-readable: the damaged objects as JSON.")] = False,
) -> None:
    """Rehash every object in a store and report damage (exit 2 if any)."""
    verify_store(store, quarantine, as_json)


@store_app.command("gc")
@operator_command
def store_gc(
    store: Annotated[Path, typer.Option(help="The store root.")],
    keep: Annotated[Optional[list[str]], typer.Option(help="A referenced SHA-256 (repeatable).")] = None,
    keep_from: Annotated[
        Optional[list[Path]],
        typer.Option(help="A file whose SHA-256s are referenced, e.g. a run manifest (repeatable)."),
    ] = None,
    dry_run: Annotated[bool, typer.Option(help="Only list what would be removed.")] = False,
) -> None:
    """Remove store objects that no run references."""
    gc_store(store, keep or [], keep_from or [], dry_run)
