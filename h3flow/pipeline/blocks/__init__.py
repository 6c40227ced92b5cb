"""Prefect blocks: one ``h3flow-host`` block per host, and never a secret.

The host blocks let the Prefect UI show the cluster as local.json describes it. The
transfer secret stays out of Prefect: its API has no auth on the embedded default, so
anything in a block can be read by any local process (``POST /api/block_documents/filter``
with ``include_secrets``). Each host reads the secret from the 0600 file or the
environment its config names; :func:`remove_secret_block` deletes the copy an earlier
``deploy`` made.
"""

from __future__ import annotations

from prefect.blocks.core import Block
from pydantic import Field

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


MIRRORED_SECRET = "h3flow-transfer-secret"
"""The Secret block ``deploy`` used to copy the transfer secret into (until issue 23)."""


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


def remove_secret_block(config: LocalConfig | None = None) -> bool:
    """Delete the transfer secret's copy an earlier ``deploy`` left in Prefect; whether
    there was one. Called by ``deploy``, so upgrading is enough to take it off the server."""
    from prefect.blocks.system import Secret

    try:
        Secret.delete(MIRRORED_SECRET)
    except ValueError:  # Prefect's "Unable to find block document named ..."
        return False
    return True
