"""The latent handoff: the ``.h3latent`` format, a content-addressed store, verified transfer.

Steps 5-6 of the data path: the sampler writes the latent (:mod:`.format`), the file is
named by its SHA-256 in a per-host store (:mod:`.store`) and crosses to the decoder host
by ``tcp``, ``sftp`` or ``local`` (:mod:`.transfer`), verified on arrival.
"""
