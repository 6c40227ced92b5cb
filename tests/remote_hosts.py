"""A local.json whose hosts are reached over real SSH (the loopback ``sshd`` fixture).

Both hosts are this machine behind the test sshd's alias, so what runs "remotely"
can be checked in /proc and on disk here, while every step goes through SSH.
"""

from __future__ import annotations

import socket
import sys
from pathlib import Path

from h3flow.config.adapt import adapt, render
from h3flow.config.models import (
    Gpu,
    Host,
    HostMap,
    LocalConfig,
    Model,
    PrefectSettings,
    SecretSource,
    Storage,
    Transfer,
)
from h3flow.core.fsutil import atomic_write_json

CPU = Gpu(index=0, model="cpu", vram_gb=1, arch="cpu")
T10 = [Gpu(index=i, model="T10", vram_gb=16, arch="sm75") for i in range(4)]
REFERENCE = Model(
    kind="reference",
    text_encoder="reference",
    dit="reference",
    lora=None,
    vae="reference-int8",
    dit_vram_gb=0.1,
    vae_vram_gb=0.1,
    encoder_vram_gb=0.1,
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def host_map(
    root: Path, alias: str, *, production: bool = False, decoder_alias: str | None = None, api_url: str | None = None
) -> HostMap:
    """host-a samples, host-b decodes; both behind ``alias`` (tcp transfer, file secret).

    ``production``: engine comfy, MiniMax H3 on four T10s (sm75; the
    text encoder needs all four) — what this machine
    does not have, so preflight must say so.
    """

    def host(name: str, roles: list[str], gpus: list[Gpu], ssh_alias: str) -> Host:
        comfy = root / "ComfyUI" if production else None
        return Host(
            name=name,
            address="127.0.0.1",
            ssh_alias=ssh_alias,
            venv=sys.prefix,
            roles=roles,
            gpus=gpus,  # type: ignore[arg-type]
            comfy_dir=str(comfy) if comfy else None,
            comfy_port=free_port(),
            raylight_dir=str(root / "raylight") if production and "sample" in roles else None,
            storage=Storage(root=str(root / "store" / name)),
        )

    gpus = T10 if production else [CPU, Gpu(index=1, model="cpu", vram_gb=1, arch="cpu")]
    return HostMap(
        engine="comfy" if production else "local",
        topology="4" if production else "one_one_plus_one",
        prefect=PrefectSettings(api_url=api_url or f"http://127.0.0.1:{free_port()}/api"),
        model=Model() if production else REFERENCE,
        hosts=[
            host("host-a", ["encode", "sample"], gpus, alias),
            host("host-b", ["decode"], [T10[0]] if production else [CPU], decoder_alias or alias),
        ],
        transfer=Transfer(
            method="tcp",
            port=free_port(),
            secret=SecretSource(source="file", path=str(root / "secrets" / "transfer.key")),
        ),
        runs_dir=str(root / "runs"),
    )


def write_config(root: Path, hm: HostMap) -> tuple[LocalConfig, Path]:
    config = adapt(hm)
    path = root / "local.json"
    atomic_write_json(path, render(config))
    return config, path
