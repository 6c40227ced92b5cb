"""h3flow's ComfyUI node pack: MiniMax H3 handoff files, the multi-GPU text encoder,
H.264 + AAC output, and a weight-free reference model of H3.

Install: copy (or link) this folder into ``ComfyUI/custom_nodes/`` (``h3flow nodes
install --comfy-dir COMFYUI`` does that). It needs only what ComfyUI itself runs on
(torch, safetensors, numpy, av, PIL): never h3flow, Prefect or their dependencies.

ComfyUI loads it through :func:`comfy_entrypoint` (the V3 node API,
``comfy_api.latest``); nothing here imports ComfyUI at import time, so h3flow imports
the same modules (:mod:`.h3latent`, :mod:`.layout`, :mod:`.reference`, ...) outside
ComfyUI. Workflows for ComfyUI's Templates browser are in ``example_workflows/``.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


async def comfy_entrypoint() -> Any:
    """ComfyUI's V3 entry point: the extension listing this pack's nodes."""
    from .nodes import H3FlowExtension

    return H3FlowExtension()
