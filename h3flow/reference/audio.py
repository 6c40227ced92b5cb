"""The reference audio decoder: an audio latent -> 48 kHz stereo waveform.

The reference model lives in the node pack (``h3flow_nodes.reference.audio``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.audio import *  # noqa: F403
