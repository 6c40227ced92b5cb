"""The transfer secret stays where only its owner can read it (issue 23, point 1).

It used to be copied from its 0600 file into a Prefect Secret block at ``deploy``; the
embedded default's API has no auth, so any local process could read it back
(``POST /api/block_documents/filter`` with ``include_secrets``), authenticate to the
receiver and write into the decoder's store. Now it never enters Prefect: every host
reads the file (or the environment variable) its local.json names, and ``deploy``
deletes the copy an earlier version left. Checked against a real Prefect server, as an
unauthenticated reader of every API listing a secret could hide in.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from clirun import invoke
from conftest import PrefectServer  # tests/ is on sys.path (rootdir conftest)
from test_cli import make_config

from h3flow.config.models import load_local_config
from h3flow.config.secret import ensure_secret_file, load_secret
from h3flow.core.errors import ConfigError
from h3flow.core.files import FileRef
from h3flow.core.fsutil import sha256_file
from h3flow.handoff.tcp import Receiver
from h3flow.handoff.transfer import send
from h3flow.pipeline.prefect_api import prefect_api
from h3flow.pipeline.tasks.stages import destination_for

MIRRORED_SECRET = "h3flow-transfer-secret"  # the block `deploy` used to copy the secret into

# what an unauthenticated local process can list (POST .../filter), with secrets where the API has them
LISTINGS = {
    "block_documents/filter": {"include_secrets": True},
    "variables/filter": {},
    "deployments/filter": {},
    "work_pools/filter": {},
    "flow_runs/filter": {},
    "block_types/filter": {},
}


def unauthenticated_reads(api_url: str) -> dict[str, str]:
    """Every listing's body, asked with no credential at all."""
    bodies = {}
    with httpx.Client(base_url=api_url.rstrip("/") + "/", timeout=30) as client:
        for path, body in LISTINGS.items():
            answer = client.post(path, json=body)
            assert answer.status_code == 200, (path, answer.status_code, answer.text[:300])
            bodies[path] = answer.text
    return bodies


@pytest.mark.prefect
def test_an_unauthenticated_reader_of_the_api_finds_no_secret(prefect_server: PrefectServer) -> None:
    config = prefect_server.config
    secret_file = Path(str(config.transfer.secret.path))
    ensure_secret_file(secret_file)  # what `start` makes
    secret = load_secret(config.transfer.secret).decode()
    from prefect.blocks.system import Secret

    with prefect_api(config):  # what `deploy` of an earlier version left on the server
        Secret(value=secret).save(MIRRORED_SECRET, overwrite=True)
    assert secret in unauthenticated_reads(config.prefect.api_url)["block_documents/filter"]  # the hole itself

    deployed = invoke(["deploy", "-c", str(prefect_server.config_path)])
    assert deployed.exit_code == 0, deployed.stdout + deployed.stderr

    bodies = unauthenticated_reads(config.prefect.api_url)
    for path, text in bodies.items():
        assert secret not in text, path
    assert MIRRORED_SECRET not in bodies["block_documents/filter"]
    assert '"h3-host-a"' in bodies["block_documents/filter"]  # the host blocks are there: deploy did run
    assert secret_file.read_text().strip() == secret  # the file is untouched: still the one copy
    assert (secret_file.stat().st_mode & 0o777) == 0o600


def test_the_transfer_stage_reads_the_hosts_file_not_prefect(tmp_path: Path) -> None:
    """The sender's side of a tcp route gets the secret the way a flow on that host does
    (``stages.destination_for`` → the 0600 file local.json names) and a real receiver,
    started with the same file, takes the latent: no Prefect anywhere."""
    config = load_local_config(make_config(tmp_path / "wd"))
    secret_file = Path(str(config.transfer.secret.path))
    ensure_secret_file(secret_file)
    latent = tmp_path / "probe.bin"
    latent.write_bytes(os.urandom(200_000))
    ref = FileRef(latent, sha256_file(latent), latent.stat().st_size)
    store = Path(config.hosts["host-b"].storage.root)
    with Receiver(store, "127.0.0.1", 0, secret=load_secret(config.transfer.secret), min_free=0) as receiver:
        dest = destination_for(config, "host-a", "host-b")
        assert dest.secret == secret_file.read_text().strip().encode()
        stored = send(ref, dataclasses.replace(dest, port=receiver.address[1]))
    assert sha256_file(stored.path) == ref.sha256


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_a_secret_file_others_can_read_is_refused(tmp_path: Path, mode: int) -> None:
    config = load_local_config(make_config(tmp_path / "wd"))
    secret_file = Path(str(config.transfer.secret.path))
    ensure_secret_file(secret_file)
    secret_file.chmod(mode)
    with pytest.raises(ConfigError, match=rf"can be read by others \(mode {mode:04o}\): `chmod 600 {secret_file}`"):
        load_secret(config.transfer.secret)
    secret_file.chmod(0o400)
    assert len(load_secret(config.transfer.secret)) == 64


def test_a_secret_path_that_is_a_device_reads_nothing(tmp_path: Path) -> None:
    """In a child with 1 GiB of address space: a reader that read ``/dev/zero`` whole
    would fail there, not take this machine's memory."""
    zero = tmp_path / "secrets" / "zero.key"
    zero.parent.mkdir()
    zero.symlink_to("/dev/zero")
    script = (
        "import resource, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
        "from h3flow.config.models import SecretSource\n"
        "from h3flow.config.secret import load_secret\n"
        "from h3flow.core.errors import ConfigError\n"
        "try:\n"
        "    load_secret(SecretSource(source='file', path=sys.argv[1]))\n"
        "except ConfigError as exc:\n"
        "    print(exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", script, str(zero)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == f"secret file: {zero} is not a regular file\n"
