"""The reference VAE: a fixed orthonormal 16x16 patch basis with H3's 24 latent channels.

The reference model lives in the node pack (``h3flow_nodes.reference.vae``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.vae import *  # noqa: F403
