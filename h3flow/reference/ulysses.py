"""Ulysses sequence parallelism over torch.distributed (gloo on CPU, NCCL on CUDA).

The reference model lives in the node pack (``h3flow_nodes.reference.ulysses``), so its
ComfyUI nodes run without h3flow; this is its name on h3flow's side.
"""

from h3flow_nodes.reference.ulysses import *  # noqa: F403
