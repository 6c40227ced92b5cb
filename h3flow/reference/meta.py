"""The reference model's identity and the provenance it writes into an ``.h3latent``.

Kept free of torch so the ``comfy`` engine can fill a latent's metadata in a flow-run
process without importing torch (several seconds on the 2-core demo machine); the
sampling itself happens in ComfyUI.
"""

from __future__ import annotations

from h3flow.core.batch import Clip
from h3flow.core.specs import FPS
from h3flow_nodes.reference.denoiser import SAMPLER_ID, DenoiserConfig

__all__ = ["SAMPLER_ID", "DenoiserConfig", "latent_meta"]


def latent_meta(
    clip: Clip, conditioning_sha256: str, *, degree: int, config: DenoiserConfig = DenoiserConfig()
) -> dict[str, str]:
    """Provenance stored in the .h3latent (the format adds shapes, dtypes, producer, time)."""
    return {
        "clip_id": clip.id,
        "seed": str(clip.seed),
        "steps": str(clip.steps),
        "spec": clip.spec,
        "frames": str(clip.frames),
        "fps": str(FPS),
        "sampler": SAMPLER_ID,
        "model": config.model_id,
        "conditioning_sha256": conditioning_sha256,
        "ulysses_degree": str(degree),
    }
