"""The ``.h3latent`` file: one sampled clip's video + audio latents in a safetensors file.

The codec is the node pack's ``h3flow_nodes.h3latent`` (torch + safetensors only, so it
runs inside ComfyUI without h3flow); this is its name on h3flow's side. See that
module for the format.
"""

from __future__ import annotations

from h3flow_nodes.h3latent import (
    COMFY_TENSOR,
    DTYPES,
    FORMAT,
    FORMAT_VERSION,
    LATENT_DTYPES,
    MASK_PREFIX,
    SUFFIX,
    VERSION_MARKER,
    H3Latent,
    frames_of,
    latent_kind,
    load_latent,
    read_header,
    save_latent,
)

__all__ = [
    "COMFY_TENSOR",
    "DTYPES",
    "FORMAT",
    "FORMAT_VERSION",
    "LATENT_DTYPES",
    "MASK_PREFIX",
    "SUFFIX",
    "VERSION_MARKER",
    "H3Latent",
    "frames_of",
    "latent_kind",
    "load_latent",
    "read_header",
    "save_latent",
]
