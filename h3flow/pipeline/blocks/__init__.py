"""Prefect blocks: one ``h3flow-host`` block per host, and the transfer secret.

They let the Prefect UI show the cluster as local.json describes it, and let hosts read
the transfer secret from the server (secret source ``prefect-secret``).
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field, SecretStr

from h3flow.config.models import LocalConfig


class H3Host(Block):
    """A host of the h3flow cluster (generated from local.json by `h3flow deploy`)."""

    _block_type_name = "h3flow host"
    _block_type_slug = "h3flow-host"
    _description = "A host of an h3flow cluster: address, SSH alias, venv, ComfyUI URLs, GPUs and roles."

    address: str
    ssh_alias: str
    venv: str
    comfy_urls: list[str] = Field(default_factory=list)
    gpus: list[str] = Field(default_factory=list, description="index: model (VRAM GB, arch)")
    roles: list[str] = Field(default_factory=list)
    work_pools: list[str] = Field(default_factory=list)


class H3TransferSecret(Block):
    """The shared secret the latent receiver and senders authenticate with."""

    _block_type_name = "h3flow transfer secret"
    _block_type_slug = "h3flow-transfer-secret"

    value: SecretStr


def block_name(host: str) -> str:
    return f"h3-{host}"


def save_host_blocks(config: LocalConfig) -> list[str]:
    names = []
    for host in config.hosts.values():
        pools = [p for p in config.pools if p.host == host.name]
        H3Host(
            address=host.address,
            ssh_alias=host.ssh_alias,
            venv=host.venv,
            comfy_urls=[p.comfy_url for p in pools],
            gpus=[f"{g.index}: {g.model} ({g.vram_gb:g} GB, {g.arch})" for g in host.gpus],
            roles=list(host.roles),
            work_pools=[p.work_pool for p in pools],
        ).save(block_name(host.name), overwrite=True)
        names.append(block_name(host.name))
    return names


def save_secret_block(config: LocalConfig) -> str | None:
    """Mirror the transfer secret into a Prefect Secret block (unless it already comes from one)."""
    from prefect.blocks.system import Secret

    from h3flow.config.secret import load_secret
    from h3flow.core.errors import ConfigError

    if config.transfer.secret.source == "prefect-secret":
        return None
    try:
        value = load_secret(config.transfer.secret).decode()
    except ConfigError:
        return None
    Secret(value=value).save("h3flow-transfer-secret", overwrite=True)
    return "h3flow-transfer-secret"
