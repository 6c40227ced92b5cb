"""The engine interface: what the Prefect tasks call for each stage.

An engine turns files into files. Every result is a :class:`FileRef` (path + SHA-256),
never a tensor, so results can cross hosts and be cached by content.

- ``local``: the reference model in-process (the embedded default, no GPU needed).
- ``comfy``: the pool host's ComfyUI over HTTP + websocket (production).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from h3flow.core.batch import Clip
from h3flow.core.files import FileRef


@dataclass(frozen=True)
class OffloadReport:
    """What offload freed and the free memory per device afterwards (bytes)."""

    freed_bytes: int = 0
    free_per_device: dict[str, int] = field(default_factory=dict)
    kept_cpu_copy: bool = False


class Engine(Protocol):
    """One stage each; every method is idempotent for identical inputs and writes atomically."""

    name: str

    def encode(self, clip: Clip, out_path: Path) -> FileRef:
        """Prompt + reference image -> conditioning file (safetensors) at ``out_path``."""
        ...

    def offload(self) -> OffloadReport:
        """Free the encoder's device memory before sampling (keep a CPU copy if configured)."""
        ...

    def sample(self, clip: Clip, conditioning: FileRef, out_path: Path) -> FileRef:
        """Conditioning + seed + spec -> an .h3latent at ``out_path``."""
        ...

    def decode(self, latent: FileRef, out_path: Path) -> FileRef:
        """A verified .h3latent -> H.264 + AAC MP4 at ``out_path``."""
        ...
