"""Which pool encodes each sampler pool's clips: the one rule config-adapt writes into
local.json (``encoder_pool``) and the planner and the dispatcher then read from it.

A pool encodes its own clips when it can hold the text encoder: its host has the
``encode`` role and its GPUs have ``model.encoder_vram_gb`` of VRAM together (the
Qwen3-VL 32B encoder spread over 4 x T10 = 64 GB; two T10s, 32 GB, cannot hold its ~33 GB
of INT8 weights plus the vision tower). Any other pool borrows one that can: the largest
on its own host, else the largest on the main sampler host, else the largest anywhere
(first listed on ties). A topology where some pool has none to borrow cannot run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from h3flow.core.errors import ConfigError


class PoolLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def host(self) -> str: ...
    @property
    def vram_gb(self) -> float: ...


def can_encode(pool: PoolLike, roles: Mapping[str, Sequence[str]], need_gb: float) -> bool:
    return "encode" in roles.get(pool.host, ()) and pool.vram_gb >= need_gb


def assign_encoders(
    pools: Sequence[PoolLike], roles: Mapping[str, Sequence[str]], need_gb: float, main_host: str
) -> dict[str, str]:
    """Sampler pool name -> the name of the pool that encodes its clips (itself when it can)."""
    able = [p for p in pools if can_encode(p, roles, need_gb)]
    out: dict[str, str] = {}
    for pool in pools:
        if pool in able:
            out[pool.name] = pool.name
            continue
        if not able:
            raise ConfigError(
                f"no pool can hold the text encoder ({need_gb:g} GB of VRAM on a host with the 'encode' role) "
                f"to encode the clips of pool {pool.name!r}"
            )
        best = max(
            able,
            key=lambda p: (p.host == pool.host, p.host == main_host, p.vram_gb, -pools.index(p)),
        )
        out[pool.name] = best.name
    return out
