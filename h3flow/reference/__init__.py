"""The reference model: MiniMax H3's latent layout without its weights.

A fixed orthonormal patch VAE (:mod:`.vae`, with an INT8 decoder), prompt/image
conditioning (:mod:`.conditioning`), a flow-matching Euler sampler with one real
attention block (:mod:`.sampler`) that runs Ulysses sequence-parallel
(:mod:`.ulysses`), and an audio decoder (:mod:`.audio`); :mod:`.meta` holds its
identity torch-free. See docs/reference-model.md.
"""
