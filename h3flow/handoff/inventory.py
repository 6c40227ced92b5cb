"""What one host really holds: latents in its store and delivered MP4s, verified by SHA-256.

``resume`` trusts files, not records. This runs on the host that holds them — in-process
for the embedded default, through the host's agent over SSH on a cluster — and answers
for each file ``ok``, ``missing`` or ``damaged``. With ``repair``, a damaged file is moved
aside (a latent into the store's quarantine, an MP4 to ``<name>.damaged-<time>``) so it is
made again and never served, and nothing the user had is deleted.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from h3flow.core.errors import H3FlowError
from h3flow.core.files import file_intact
from h3flow.handoff.store import LatentStore, check_sha256

Found = Literal["ok", "missing", "damaged"]


@dataclass
class HostFiles:
    latents: dict[str, Found] = field(default_factory=dict)
    outputs: dict[str, Found] = field(default_factory=dict)
    repaired: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"latents": self.latents, "outputs": self.outputs, "repaired": self.repaired}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> HostFiles:
        return cls(dict(data["latents"]), dict(data["outputs"]), list(data["repaired"]))


def check_host_files(
    store_root: Path,
    latents: list[str],
    outputs: list[tuple[str, str]],
    *,
    repair: bool,
    outputs_root: Path | None = None,
) -> HostFiles:
    """Hash each named latent and output on this host; move damaged ones aside when ``repair``.

    Names come from a manifest, so they are checked first: a latent must be a SHA-256
    content address and, with ``outputs_root`` (a request from another machine), an output
    must lie under it — no other file of the host is ever looked at or moved.
    """
    store = LatentStore(store_root)
    for sha in latents:
        check_sha256(sha)
    for name, sha in outputs:
        check_sha256(sha)
        if outputs_root is not None and outputs_root.resolve() not in Path(name).resolve().parents:
            raise H3FlowError(f"{name!r} is not under this host's outputs ({outputs_root})")
    found = HostFiles()
    for sha in latents:
        path = store.path_for(sha)
        if not path.exists():
            found.latents[sha] = "missing"
        elif file_intact(path, sha):
            found.latents[sha] = "ok"
        else:
            found.latents[sha] = "damaged"
            if repair:
                moved = store.quarantine(sha)
                found.repaired.append(f"latent {sha[:12]} was damaged: moved to {moved}")
    for name, sha in outputs:
        path = Path(name)
        if not path.exists():
            found.outputs[name] = "missing"
        elif file_intact(path, sha):
            found.outputs[name] = "ok"
        else:
            found.outputs[name] = "damaged"
            if repair:
                aside = path.with_name(f"{path.name}.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                os.replace(path, aside)
                found.repaired.append(f"{path} no longer matched its SHA-256: moved to {aside.name}, made again")
    return found
