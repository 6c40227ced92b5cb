"""Engines do the GPU work of a stage; the flows do not care which one runs.

:func:`engine_for` builds the engine local.json names for a pool: ``local`` (the
reference model in-process) or ``comfy`` (the pool's ComfyUI over HTTP, its
templates filled from local.json's model and the pool's devices).
"""

from __future__ import annotations

import functools
import json

from h3flow.config.models import LocalConfig, Model, Pool
from h3flow.engines.base import Engine


def comfy_params(model: Model, pool: Pool) -> dict[str, object]:
    """Template parameters from local.json (devices are renumbered by the pool's visible-devices env)."""
    params: dict[str, object] = {
        "clip_name": model.text_encoder,
        "unet_name": model.dit,
        "vae_name": model.vae,
        "audio_vae_name": model.audio_vae,
        "steps": model.steps,
        "sampler_name": model.sampler,
        "scheduler": model.scheduler,
        "gpu_count": len(pool.gpus),
        "gpus": ",".join(str(i) for i in range(len(pool.gpus))),
        "ulysses_degree": pool.ulysses_degree,
    }
    if model.lora:
        params["lora_name"] = model.lora
    return params


@functools.lru_cache(maxsize=8)
def _cached(
    engine: str, comfy_url: str, degree: int, reference: bool, retain: bool, variant: str, params: str
) -> Engine:
    if engine == "local":
        from h3flow.engines.local import LocalEngine

        return LocalEngine(degree=degree, retain_cpu_weights=retain)
    from h3flow.engines.comfy import ComfyEngine

    # retries=0: the Prefect task is the one layer that retries a transient failure (docs/pipeline.md)
    return ComfyEngine(comfy_url, reference=reference, variant=variant or None, params=json.loads(params), retries=0)


def engine_for(config: LocalConfig, pool_name: str) -> Engine:
    """One engine per (pool, process): the local engine keeps its weights between clips."""
    pool = config.pool(pool_name)
    retain = pool.env.get("H3_MP_RETAIN_CPU_WEIGHTS") == "1"
    reference = config.model.kind == "reference"
    variant = "xtx" if pool.arch.startswith("gfx") and not reference else ""
    params = json.dumps(comfy_params(config.model, pool), sort_keys=True)
    return _cached(config.engine, pool.comfy_url, pool.ulysses_degree, reference, retain, variant, params)
