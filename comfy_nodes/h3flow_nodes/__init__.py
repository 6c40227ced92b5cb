"""h3flow's ComfyUI node pack: the A6 multi-GPU text encoder, conditioning and latent
handoff files (SHA-256 checked), H.264 + AAC output and the reference model's nodes.

Install with ``h3flow nodes install --comfy-dir COMFYUI`` (copies this folder into
``COMFYUI/custom_nodes/h3flow_nodes``); h3flow itself must be importable by ComfyUI's
Python (``pip install h3flow`` into its venv). Node logic lives in plain functions
(:mod:`.common`, :mod:`.multigpu`) shared with h3flow's ``local`` engine and tests.
"""

from .nodes import NODE_CLASS_MAPPINGS, NODE_DISPLAY_NAME_MAPPINGS

__all__ = ["NODE_CLASS_MAPPINGS", "NODE_DISPLAY_NAME_MAPPINGS"]
