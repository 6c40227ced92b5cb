"""The engine interface: what the Prefect tasks call for each stage.

An engine turns files into files. Every result is a :class:`FileRef` (path + SHA-256),
never a tensor, so results can cross hosts and be cached by content.

- ``local``: the reference model in-process (the embedded default, no GPU needed).
- ``comfy``: the pool host's ComfyUI over HTTP + websocket (production).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from h3flow.batch import Clip


@dataclass(frozen=True)
class FileRef:
    """A file a stage produced, named by content."""

    path: Path
    sha256: str
    size: int

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "sha256": self.sha256, "size": self.size}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "FileRef":
        return cls(Path(data["path"]), str(data["sha256"]), int(data["size"]))


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
