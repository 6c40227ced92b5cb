"""Conditioning: reference image -> first-frame latent; prompt -> camera path + audio params.

The reference model lives in the node pack (``h3flow_nodes.reference.conditioning``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.conditioning import *  # noqa: F403
