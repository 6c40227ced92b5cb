"""The reference model: MiniMax H3's latent layout without its weights.

A fixed orthonormal patch VAE (:mod:`.vae`, with an INT8 decoder), prompt/image
conditioning (:mod:`.conditioning`), a flow-matching Euler sampler with one real
attention block (:mod:`.sampler`) that runs Ulysses sequence-parallel
(:mod:`.ulysses`), and an audio decoder (:mod:`.audio`); :mod:`.denoiser` holds its
identity torch-free. The node pack carries it so its ComfyUI nodes run the whole
pipeline without H3's weights and without h3flow; h3flow's ``local`` engine imports
it from here. See docs/reference-model.md.
"""
