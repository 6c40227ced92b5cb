"""Flow-matching sampler of the reference model: Euler, ComfyUI's "simple" schedule.

The reference model lives in the node pack (``h3flow_nodes.reference.sampler``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.sampler import *  # noqa: F403
