"""Thread count for small tensor work.

The reference model lives in the node pack (``h3flow_nodes.reference.threads``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.threads import *  # noqa: F403
