"""Engines do the GPU work of a stage; the flows do not care which one runs.

:func:`engine_for` builds the engine local.json names for a pool: ``local`` (the
reference model in-process) or ``comfy`` (the pool's ComfyUI over HTTP).
"""

from __future__ import annotations

import functools

from h3flow.config import LocalConfig
from h3flow.engines.base import Engine


@functools.lru_cache(maxsize=8)
def _cached(engine: str, comfy_url: str, degree: int, reference: bool, retain: bool) -> Engine:
    if engine == "local":
        from h3flow.engines.local import LocalEngine

        return LocalEngine(degree=degree, retain_cpu_weights=retain)
    from h3flow.engines.comfy import ComfyEngine

    return ComfyEngine(comfy_url, reference=reference)


def engine_for(config: LocalConfig, pool_name: str) -> Engine:
    """One engine per (pool, process): the local engine keeps its weights between clips."""
    pool = config.pool(pool_name)
    retain = pool.env.get("H3_MP_RETAIN_CPU_WEIGHTS") == "1"
    return _cached(config.engine, pool.comfy_url, pool.ulysses_degree, config.model.kind == "reference", retain)
