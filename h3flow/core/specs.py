"""Output specs and MiniMax H3's latent layout (defined in the node pack's ``layout``).

h3flow and the ComfyUI nodes must agree on every number here, so there is one copy:
``h3flow_nodes.layout``, which ComfyUI loads without h3flow.
"""

from __future__ import annotations

from h3flow_nodes.layout import (
    AUDIO_CHANNELS,
    AUDIO_LATENT_RATE,
    AUDIO_RATE,
    FPS,
    PATCH,
    SPECS,
    VIDEO_CHANNELS,
    Spec,
    audio_latent_steps,
    frames_for_seconds,
    get_spec,
    latent_frames,
    snap_frames,
)

__all__ = [
    "AUDIO_CHANNELS",
    "AUDIO_LATENT_RATE",
    "AUDIO_RATE",
    "FPS",
    "PATCH",
    "SPECS",
    "VIDEO_CHANNELS",
    "Spec",
    "audio_latent_steps",
    "frames_for_seconds",
    "get_spec",
    "latent_frames",
    "snap_frames",
]
