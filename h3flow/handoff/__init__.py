"""The latent handoff: the ``.h3latent`` format, a content-addressed store, verified transfer.

Steps 5-6 of the data path: the sampler writes the latent (:mod:`.format`), the file is
named by its SHA-256 in a per-host store (:mod:`.store`) and crosses to the decoder host
by ``tcp``, ``sftp`` or ``local`` (:mod:`.transfer`), verified on arrival.

Names are imported lazily so that the receiver service and the transfer commands do
not pay for importing torch.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "H3Latent": "format", "save_latent": "format", "load_latent": "format", "read_header": "format",
    "LatentStore": "store", "Damage": "store", "check_sha256": "store",
    "Destination": "transfer", "send": "transfer", "send_with_retry": "transfer", "probe": "transfer",
    "destination_from_options": "transfer", "secret_from_options": "transfer",
    "Receiver": "tcp", "CorruptedInFlight": "tcp",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
