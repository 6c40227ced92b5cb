"""The reference model: MiniMax H3's latent layout without its weights.

It lives in the node pack (``h3flow_nodes.reference``: patch VAE, conditioning, sampler,
Ulysses, audio), so the ComfyUI nodes run it without h3flow; the modules here are its
names on h3flow's side, and :mod:`.meta` adds the provenance h3flow writes. See
docs/reference-model.md.
"""
